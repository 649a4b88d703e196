// A downstream user's own module and own tensor-parallel plan, built against @loom from another
// workspace: a gated MLP whose gate is a module of the user's, sharded by a ParallelStyle the
// user wrote (with the tp::detail pieces Loom keeps reachable for that), trained one step on
// 2 ranks and compared with the same model on one rank.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "comm/testing/multi_rank.h"
#include "dtensor/comm_debug_mode.h"
#include "dtensor/dtensor.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "parallel/tp/layouts.h"
#include "parallel/tp/parallelize.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/ops.h"

namespace {

using namespace loom;

// The user's module: one learned weight per hidden feature.
class Gate : public nn::Module {
 public:
  explicit Gate(int64_t width)
      : Module("Gate"),
        weight_(register_parameter("weight", ops::uniform({width}, 21, 0.5, 1.5))) {}
  Tensor forward(const Tensor& x) override { return mul(x, weight_); }

 private:
  const Tensor& weight_;
};

class GatedMlp : public nn::Module {
 public:
  GatedMlp() : Module("GatedMlp") {
    up = register_module("up", std::make_shared<nn::Linear>(8, 32, nn::LinearOptions{.seed = 3}));
    gate = register_module("gate", std::make_shared<Gate>(32));
    down =
        register_module("down", std::make_shared<nn::Linear>(32, 8, nn::LinearOptions{.seed = 5}));
  }
  Tensor forward(const Tensor& x) override { return (*down)((*gate)(gelu((*up)(x)))); }
  std::shared_ptr<nn::Linear> up, down;
  std::shared_ptr<Gate> gate;
};

// The user's style: the gate's weight sharded like the hidden features it scales.
class ShardedGate : public tp::ParallelStyle {
 public:
  void apply(nn::Module& module, const std::string& fqn,
             std::shared_ptr<const DeviceMesh> mesh) const override {
    tp::detail::check_one_dim(*mesh, name());
    tp::detail::distribute_parameter(module, fqn, "weight", mesh, Shard(0));
  }
  std::string name() const override { return "ShardedGate"; }
};

// Sharded matmuls sum in another order than the full one: f32 rounding, 1e-5 relative.
constexpr double kTolerance = 1e-5;

void expect_near(const Tensor& actual, const Tensor& expected, const std::string& what) {
  const std::vector<double> a = ops::to_vector(actual), e = ops::to_vector(expected);
  ASSERT_EQ(a.size(), e.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], e[i], kTolerance * (1 + std::abs(e[i]))) << what << " at " << i;
  }
}

TEST(UserPlanTest, GatedMlpWithAUserStyleMatchesOneRank) {
  const Tensor x = ops::uniform({4, 8}, 7, -1.0, 1.0);
  GatedMlp reference;
  const Tensor expected = reference(x);
  backward(sum(mul(expected, expected)));

  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{pg.size()});
    GatedMlp model;
    tp::parallelize_module(model, mesh,
                           {{"up", std::make_shared<tp::ColwiseParallel>(
                                       tp::LayoutOptions{.use_local_output = false})},
                            {"gate", std::make_shared<ShardedGate>()},
                            {"down", std::make_shared<tp::RowwiseParallel>()}});
    EXPECT_EQ(dtensor_spec(model.gate->parameter("weight")).placements, (Placements{Shard(0)}));
    Tensor out;
    {
      CommDebugMode comm;
      out = model(x);
      // The gate runs on each rank's hidden shard: still one all-reduce, the row-parallel one.
      EXPECT_EQ(comm.total_count(), 1) << comm.summary();
    }
    expect_near(out, expected, "output");
    backward(sum(mul(out, out)));
    for (const auto& [name, p] : model.named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << name;
      expect_near(full_tensor(p.grad()), reference.state_dict().at(name).grad(), "grad of " + name);
    }
  });
}

// Built with --config=cpu (what downstream_workspace_test does), GPU entry points fail naming
// the flag; built without it, CUDA is there (or says why not: no device, no driver).
TEST(UserPlanTest, CpuOnlyBuildNamesTheFlagAtGpuEntryPoints) {
#ifdef EXPECT_CPU_ONLY_LOOM
  EXPECT_FALSE(cuda::kernels_built());
  EXPECT_EQ(cuda::device_count(), 0);
  try {
    Tensor::empty({4}, kFloat32, Device::cuda());
    FAIL() << "a CUDA tensor in a CPU-only build";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("--config=cpu"));
  }
#else
  EXPECT_TRUE(cuda::kernels_built());
#endif
}

}  // namespace
