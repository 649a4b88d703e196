// Which transformer blocks a job checkpoints (nn/checkpoint.h: a checkpointed block keeps only its
// input; its backward recomputes its forward), torchtitan's activation_checkpoint modes:
//   none                 every activation kept;
//   full                 every block checkpointed;
//   selective-layer:N    every N-th block (blocks 0, N, 2N, ... of the whole model), the others
//                        keeping their activations: memory between none and full;
//   selective-op         every block, keeping its matrix products' and attention's outputs and
//                        recomputing the rest (norms, activations, elementwise ops): most of
//                        full's saving for a fraction of its recompute.
// Applied to each stage's blocks (the FSDP units) before the TP plan and data parallelism, the
// same on every rank, so a layout changes nothing but where the blocks run.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "parallel/data_parallel.h"

namespace loom::parallel {

struct ActivationCheckpointing {
  enum class Mode { kNone, kFull, kSelectiveLayer, kSelectiveOp };
  Mode mode = Mode::kNone;
  int64_t every = 1;  // kSelectiveLayer: checkpoint blocks whose index divides by it

  // "none", "full", "selective-layer:N", "selective-op"; throws loom::Error naming `what` (the
  // flag) otherwise.
  static ActivationCheckpointing parse(std::string_view text, std::string_view what);
  std::string str() const;
  // Whether block `index` (in the whole model) is checkpointed.
  bool checkpoints(int64_t index) const;
  // Marks a stage's blocks (its first is block `first_block` of the whole model).
  void apply(const std::vector<DataParallel::Block>& blocks, int64_t first_block) const;
};

}  // namespace loom::parallel
