#include "train/parallel_dims.h"

#include <fmt/format.h>

#include "base/error.h"

namespace loom::train {

std::vector<std::string> ParallelDims::names() const { return {"pp", "dp", "tp"}; }

std::vector<int64_t> ParallelDims::sizes() const { return {pp, dp, tp}; }

int64_t ParallelDims::world_size() const { return pp * dp * tp; }

std::string ParallelDims::str() const { return fmt::format("pp={} x dp={} x tp={}", pp, dp, tp); }

void ParallelDims::validate(int64_t world_size) const {
  const std::vector<std::string> dims = names();
  const std::vector<int64_t> degrees = sizes();
  for (size_t i = 0; i < dims.size(); ++i) {
    LOOM_CHECK(degrees[i] >= 1, "ParallelDims: {} must be at least 1, got {}", dims[i], degrees[i]);
  }
  LOOM_CHECK(this->world_size() == world_size,
             "ParallelDims: {} = {} ranks, but the world has {}; the degrees must multiply to "
             "the number of ranks",
             str(), this->world_size(), world_size);
}

std::shared_ptr<const DeviceMesh> ParallelDims::build_mesh(
    std::shared_ptr<comm::ProcessGroup> world) const {
  LOOM_CHECK(world != nullptr, "ParallelDims::build_mesh: the world group is null");
  validate(world->size());
  return std::make_shared<const DeviceMesh>(std::move(world), names(), sizes());
}

}  // namespace loom::train
