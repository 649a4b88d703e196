// A user's own sharding plan for a Llama-style pre-norm gated block, with a style of their own.
//
//   bazel build //tools/loomrun //examples:gated_mlp_plan
//   bazel-bin/tools/loomrun/loomrun --nproc-per-node 2 -- bazel-bin/examples/gated_mlp_plan
//
// The block: x + w2(silu(w1 n) * w3 n) with n = norm(x), every projection bias-free. The plan:
//   "norm" -> tp::SequenceParallel: the norm runs on each rank's tokens;
//   "ffn"  -> GatedFeedForwardParallel, written below with the public style helpers
//             (parallel/tp/layouts.h): w1 and w3 column-parallel and w2 row-parallel, and the
//             feed-forward's input gathered once and shared by w1 and w3 — one all-gather in
//             forward and one reduce-scatter of its gradient in backward, where a Colwise per
//             projection would gather (and reduce) twice.
// The input is a sequence-sharded DTensor of 5 tokens (3 + 2 on 2 ranks: torch.chunk's split);
// output and gradients are checked against the same block on one rank.
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
#include "nn/layers.h"
#include "nn/linear.h"
#include "parallel/tp/layouts.h"
#include "parallel/tp/parallelize.h"
#include "tensor/ops.h"

namespace {

using namespace loom;

class FeedForward : public nn::Module {
 public:
  FeedForward() : Module("FeedForward") {
    w1 = register_module("w1", linear(16, 40, 1));
    w3 = register_module("w3", linear(16, 40, 2));
    w2 = register_module("w2", linear(40, 16, 3));
  }
  Tensor forward(const Tensor& x) override { return (*w2)(mul(silu((*w1)(x)), (*w3)(x))); }
  std::shared_ptr<nn::Linear> w1, w2, w3;

 private:
  static std::shared_ptr<nn::Linear> linear(int64_t in, int64_t out, uint64_t seed) {
    return std::make_shared<nn::Linear>(in, out, nn::LinearOptions{.bias = false, .seed = seed});
  }
};

class Block : public nn::Module {
 public:
  Block() : Module("Block") {
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(Shape{16}));
    ffn = register_module("ffn", std::make_shared<FeedForward>());
  }
  Tensor forward(const Tensor& x) override { return add(x, (*ffn)((*norm)(x))); }
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<FeedForward> ffn;
};

// The user's style: a whole gated feed-forward at once. Its input arrives as sequence shards
// (Shard(1)) and is gathered once (Replicate) for both w1 and w3; its output leaves as sequence
// shards again (w2's Partial sums reduce-scattered).
class GatedFeedForwardParallel : public tp::ParallelStyle {
 public:
  std::string name() const override { return "GatedFeedForwardParallel"; }

  void validate(const nn::Module& module, const std::string& fqn,
                const DeviceMesh& mesh) const override {
    tp::check_one_dim(mesh, name());
    const auto* ffn = dynamic_cast<const FeedForward*>(&module);
    LOOM_CHECK(ffn != nullptr, "parallelize_module: {} applies to FeedForward, but '{}' is a {}",
               name(), fqn, module.type_name());
    tp::check_parameter(*ffn->w1, fqn + ".w1", "weight", mesh, Shard(0), name(), true);
    tp::check_parameter(*ffn->w3, fqn + ".w3", "weight", mesh, Shard(0), name(), true);
    tp::check_parameter(*ffn->w2, fqn + ".w2", "weight", mesh, Shard(1), name(), true);
  }

  void apply(nn::Module& module, const std::string& fqn,
             std::shared_ptr<const DeviceMesh> mesh) const override {
    validate(module, fqn, *mesh);
    auto& ffn = dynamic_cast<FeedForward&>(module);
    tp::distribute_parameter(*ffn.w1, fqn + ".w1", "weight", mesh, Shard(0));
    tp::distribute_parameter(*ffn.w3, fqn + ".w3", "weight", mesh, Shard(0));
    tp::distribute_parameter(*ffn.w2, fqn + ".w2", "weight", mesh, Shard(1));
    // The input: sequence shards in, gathered once; DTensor ops carry the layouts inside.
    module.register_forward_pre_hook([mesh](nn::Module&, const Tensor& input) {
      return tp::prepare_input(input, mesh, Shard(1), Replicate());
    });
    // The output: w2's Partial product, reduce-scattered back to sequence shards.
    module.register_forward_hook([mesh](nn::Module&, const Tensor&, const Tensor& output) {
      return tp::prepare_output(output, mesh, Shard(1), Shard(1), /*use_local_output=*/false);
    });
  }
};

double max_difference(const Tensor& a, const Tensor& b) {
  const auto x = ops::to_vector(a), y = ops::to_vector(b);
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

}  // namespace

int main() {
  try {
    auto world = comm::init_process_group("gloo");
    auto mesh = std::make_shared<const DeviceMesh>(world, std::vector<std::string>{"tp"},
                                                   std::vector<int64_t>{world->size()});
    const Tensor x = ops::uniform({2, 5, 16}, 7, -1.0, 1.0);  // (batch, 5 tokens, features)
    Block reference;  // the same seeds: identical weights on one rank
    const Tensor expected = reference(x);
    backward(sum(mul(expected, expected)));

    Block model;
    tp::parallelize_module(model, mesh,
                           {{"norm", std::make_shared<tp::SequenceParallel>()},
                            {"ffn", std::make_shared<GatedFeedForwardParallel>()}});
    const Tensor input = distribute_tensor(x, mesh, {Shard(1)});  // this rank's tokens
    Tensor y;
    std::string forward_collectives, backward_collectives;
    {
      CommDebugMode comm;
      y = model(input);
      forward_collectives = comm.summary();
    }
    {
      CommDebugMode comm;
      backward(sum(mul(y, y)));
      backward_collectives = comm.summary();
    }
    double worst = max_difference(full_tensor(y), expected);
    const auto want = reference.state_dict();
    for (const auto& [name, p] : model.named_parameters()) {
      worst = std::max(worst, max_difference(full_tensor(p.grad()), want.at(name).grad()));
    }
    fmt::print(
        "rank {}: {} tokens here; forward: {}; backward: {}; max |tp - single| over the "
        "output and every gradient = {:.2e}\n",
        world->rank(), local_shard(input).size(1), forward_collectives, backward_collectives,
        worst);
    std::fflush(stdout);
    return worst < 1e-5 ? 0 : 1;
  } catch (const std::exception& error) {  // loom::Error, and anything else: never terminate
    fmt::print(stderr, "gated_mlp_plan: {}\n", error.what());
    return comm::exit_status_for(error);  // 3 when another rank's failure ended this one
  }
}
