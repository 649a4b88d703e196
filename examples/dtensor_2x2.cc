// Shards a 4x6 matrix on a 2x2 mesh (dp x tp) and walks it through several placements,
// printing each rank's local shard at every step.
//
//   bazel build //tools/loomrun //examples:dtensor_2x2
//   bazel-bin/tools/loomrun/loomrun --nproc-per-node 4 -- bazel-bin/examples/dtensor_2x2
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <exception>

#include "base/error.h"
#include "comm/init.h"
#include "comm/launch_env.h"
#include "dtensor/dtensor.h"
#include "dtensor/redistribute_plan.h"
#include "tensor/ops.h"

namespace {

using namespace loom;

void show(const std::string& label, const Tensor& x) {
  const Tensor local = local_shard(x);
  const DTensorSpec& spec = dtensor_spec(x);
  const auto values = ops::to_vector(local);
  std::string rows;
  const int64_t cols = local.dim() == 2 ? local.size(1) : 1;
  for (int64_t r = 0; r < (cols ? local.numel() / cols : 0); ++r) {
    std::vector<double> row(values.begin() + r * cols, values.begin() + (r + 1) * cols);
    rows += fmt::format(" [{}]", fmt::join(row, " "));
  }
  fmt::print("{:<28} coord ({}) local {}:{}\n", label, fmt::join(spec.mesh->coordinate(), ","),
             shape_str(local.shape()), rows.empty() ? " (empty)" : rows);
  std::fflush(stdout);
}

}  // namespace

int main() {
  try {
    auto world = comm::init_process_group("gloo");
    LOOM_CHECK(world->size() == 4,
               "dtensor_2x2: run with 4 ranks (loomrun --nproc-per-node 4), got {}", world->size());
    auto mesh = std::make_shared<const DeviceMesh>(world, std::vector<std::string>{"dp", "tp"},
                                                   std::vector<int64_t>{2, 2});
    const Tensor matrix = ops::reshape(ops::arange(0.0, 24.0, 1.0, kFloat32), {4, 6});
    if (world->rank() == 0) fmt::print("{} over a 4x6 matrix 0..23\n", mesh->str());

    Tensor x = distribute_tensor(matrix, mesh, {Shard(0), Shard(1)});
    show("[S(0), S(1)]", x);
    const std::vector<Placements> walk{{Replicate(), Shard(1)},
                                       {Shard(1), Shard(0)},
                                       {Shard(0), Shard(0)},
                                       {Partial(), Replicate()},
                                       {Replicate(), Replicate()}};
    Placements current{Shard(0), Shard(1)};
    for (const Placements& next : walk) {
      const auto plan = plan_redistribute(current, next);
      world->barrier()->wait();
      x = redistribute(x, next);
      show(fmt::format("{} via {}", placements_str(next), plan.str()), x);
      current = next;
    }
    const bool same = ops::to_vector(full_tensor(x)) == ops::to_vector(matrix);
    if (world->rank() == 0)
      fmt::print("full_tensor equals the original: {}\n", same ? "yes" : "NO");
    return same ? 0 : 1;
  } catch (const std::exception& error) {  // loom::Error, and anything else: never terminate
    fmt::print(stderr, "dtensor_2x2: {}\n", error.what());
    return comm::exit_status_for(error);  // 3 when another rank's failure ended this one
  }
}
