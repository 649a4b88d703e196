// The parallel degrees of a job, one per named mesh dim (torchtitan's ParallelDims), validated
// once, and the mesh they make.
//
// Mesh order: pp outermost, then dp, tp innermost, so tensor-parallel peers are neighbouring
// ranks (on one node, on one NVLink island) and pipeline stages are the farthest apart. A later
// dimension (fully sharded data parallel, context parallel) is one more field here and one more
// name in names(): every job, test and example builds its mesh through this struct.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "mesh/device_mesh.h"

namespace loom::train {

struct ParallelDims {
  int64_t pp = 1;  // pipeline stages
  int64_t dp = 1;  // data-parallel replicas (DDP)
  int64_t tp = 1;  // tensor-parallel shards (Megatron-style, with sequence parallelism)

  // "pp", "dp", "tp": the mesh's dim names, outermost first.
  std::vector<std::string> names() const;
  // The degrees in the order of names().
  std::vector<int64_t> sizes() const;
  // pp x dp x tp.
  int64_t world_size() const;
  // "pp=2 x dp=2 x tp=2".
  std::string str() const;

  // Throws loom::Error naming the degree when one is below 1, and naming every degree when their
  // product is not `world_size` ("ParallelDims: pp=1 x dp=2 x tp=2 = 4 ranks, but the world has
  // 3").
  void validate(int64_t world_size) const;

  // The ("pp", "dp", "tp") mesh over every rank of `world` (validates first).
  std::shared_ptr<const DeviceMesh> build_mesh(std::shared_ptr<comm::ProcessGroup> world) const;
};

}  // namespace loom::train
