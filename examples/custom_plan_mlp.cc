// A custom tensor-parallel plan for your own module: a two-layer MLP whose first Linear is
// column-parallel and second row-parallel (Megatron's MLP), checked against the same MLP on one
// rank.
//
//   bazel build //tools/loomrun //examples:custom_plan_mlp
//   bazel-bin/tools/loomrun/loomrun --nproc-per-node 2 -- bazel-bin/examples/custom_plan_mlp
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <exception>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "base/error.h"
#include "comm/init.h"
#include "comm/launch_env.h"
#include "dtensor/comm_debug_mode.h"
#include "dtensor/dtensor.h"
#include "nn/linear.h"
#include "parallel/tp/parallelize.h"
#include "tensor/ops.h"

namespace {

using namespace loom;

class Mlp : public nn::Module {
 public:
  Mlp() : Module("Mlp") {
    up = register_module("up", std::make_shared<nn::Linear>(16, 64, nn::LinearOptions{.seed = 1}));
    down =
        register_module("down", std::make_shared<nn::Linear>(64, 16, nn::LinearOptions{.seed = 3}));
  }
  Tensor forward(const Tensor& x) override { return (*down)(gelu((*up)(x))); }
  std::shared_ptr<nn::Linear> up, down;
};

}  // namespace

int main() {
  try {
    auto world = comm::init_process_group("gloo");
    auto mesh = std::make_shared<const DeviceMesh>(world, std::vector<std::string>{"tp"},
                                                   std::vector<int64_t>{world->size()});
    const Tensor x = ops::uniform({8, 16}, 7, -1.0, 1.0);
    Mlp reference;  // the same seeds: identical weights on one rank
    const Tensor expected = reference(x);

    Mlp model;
    // The plan: module-name patterns -> styles.
    tp::parallelize_module(model, mesh,
                           {{"up", std::make_shared<tp::ColwiseParallel>()},
                            {"down", std::make_shared<tp::RowwiseParallel>()}});
    CommDebugMode comm;
    const Tensor y = model(x);
    double max_diff = 0;
    const auto a = ops::to_vector(y), b = ops::to_vector(expected);
    for (size_t i = 0; i < a.size(); ++i) max_diff = std::max(max_diff, std::abs(a[i] - b[i]));
    fmt::print(
        "rank {}: up.weight local {} of {}, forward collectives: {}, max |tp - single| = {:.2e}\n",
        world->rank(), shape_str(local_shard(model.up->weight()).shape()),
        shape_str(model.up->weight().shape()), comm.summary(), max_diff);
    std::fflush(stdout);
    return max_diff < 1e-5 ? 0 : 1;
  } catch (const std::exception& error) {  // loom::Error, and anything else: never terminate
    fmt::print(stderr, "custom_plan_mlp: {}\n", error.what());
    return comm::exit_status_for(error);  // 3 when another rank's failure ended this one
  }
}
