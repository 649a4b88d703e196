// Which part of a layered model (a GPT, a Llama, a user's own) one pipeline stage holds: blocks
// [first_block, end_block), plus the input embeddings when it is the first stage and the final
// norm and output head when it is the last. The whole model is one stage that is both.
#pragma once

#include <cstdint>

namespace loom::pipeline {

struct StageRange {
  int64_t first_block = 0;
  int64_t end_block = 0;
  bool first = true;
  bool last = true;

  bool has_blocks() const { return end_block > first_block; }
  // The whole model of `n_layers` blocks as one stage.
  static StageRange whole(int64_t n_layers) { return {0, n_layers, true, true}; }
};

}  // namespace loom::pipeline
