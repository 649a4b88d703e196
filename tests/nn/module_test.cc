#include "nn/module.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "base/error.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/ops.h"

namespace loom::nn {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A GPT-2-shaped miniature: names must come out as "h.0.attn.c_attn.weight" etc.
class Attention : public Module {
 public:
  Attention() : Module("Attention") {
    c_attn = register_module("c_attn", std::make_shared<Linear>(4, 12, LinearOptions{.seed = 1}));
    c_proj = register_module("c_proj", std::make_shared<Linear>(4, 4, LinearOptions{.seed = 2}));
  }
  std::shared_ptr<Linear> c_attn, c_proj;
};

class Block : public Module {
 public:
  Block() : Module("Block") {
    ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(Shape{4}));
    attn = register_module("attn", std::make_shared<Attention>());
  }
  std::shared_ptr<LayerNorm> ln_1;
  std::shared_ptr<Attention> attn;
};

std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<std::string> names;
  for (const auto& [name, t] : named) names.push_back(name);
  return names;
}

TEST(ModuleTest, DottedNamesInRegistrationOrder) {
  Block block;
  EXPECT_THAT(names_of(block.named_parameters()),
              ElementsAre("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                          "attn.c_proj.weight", "attn.c_proj.bias"));
  std::vector<std::string> module_names;
  for (const auto& [name, m] : block.named_modules())
    module_names.push_back(name + ":" + m->type_name());
  EXPECT_THAT(module_names, ElementsAre(":Block", "ln_1:LayerNorm", "attn:Attention",
                                        "attn.c_attn:Linear", "attn.c_proj:Linear"));
  std::vector<Module*> in_order;
  for (const auto& [name, m] : block.named_modules()) in_order.push_back(m);
  EXPECT_EQ(block.modules(), in_order);
  EXPECT_EQ(&block.submodule("attn.c_proj"), block.attn->c_proj.get());
  EXPECT_THAT(names_of(block.named_parameters(/*recurse=*/false)), ElementsAre());
}

TEST(ModuleTest, SubmoduleErrorNamesMissingPart) {
  Block block;
  try {
    block.submodule("attn.c_fc");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("'Attention' has no submodule 'c_fc' (in path 'attn.c_fc')"));
  }
}

TEST(ModuleTest, DuplicateNameIsRejected) {
  class Twice : public Module {
   public:
    Twice() : Module("Twice") {
      register_parameter("w", ops::zeros({2}));
      register_parameter("w", ops::zeros({2}));
    }
  };
  try {
    Twice t;
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("Twice: name 'w' is already registered"));
  }
}

TEST(ModuleTest, StateDictRoundTripCopiesValues) {
  Block a, b;
  // Make b differ, then load a's state into it.
  {
    auto state = b.state_dict();
    ops::fill_(state.at("attn.c_attn.weight"), 7.0);
  }
  b.load_state_dict(a.state_dict());
  for (const auto& [name, t] : a.state_dict()) {
    EXPECT_EQ(ops::to_vector(t), ops::to_vector(b.state_dict().at(name))) << name;
  }
}

TEST(ModuleTest, StrictLoadListsMissingAndUnexpectedKeys) {
  Block block;
  StateDict state = block.state_dict();
  state.erase("ln_1.bias");
  state["ln_2.weight"] = ops::ones({4});
  try {
    block.load_state_dict(state);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("missing keys [ln_1.bias], unexpected keys [ln_2.weight]"));
  }
  state = block.state_dict();
  state["attn.c_proj.weight"] = ops::zeros({4, 5});
  try {
    block.load_state_dict(state);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(
        e.what(),
        HasSubstr(
            "'attn.c_proj.weight' has shape (4, 5) in the checkpoint but (4, 4) in the module"));
  }
}

TEST(ModuleTest, ZeroGradClearsGradients) {
  Linear linear(3, 2);
  backward(sum(linear(ops::ones({1, 3}))));
  EXPECT_TRUE(linear.weight().grad().defined());
  linear.zero_grad();
  EXPECT_FALSE(linear.weight().grad().defined());
  EXPECT_FALSE(linear.bias().grad().defined());
}

TEST(ModuleTest, SetParameterIsSeenByForward) {
  Linear linear(2, 1, LinearOptions{.bias = false});
  linear.set_parameter("weight", ops::from_vector({2, 3}, {1, 2}));
  Tensor y = linear(ops::from_vector({1, 1}, {1, 2}));
  EXPECT_EQ(ops::to_vector(y), std::vector<double>{5});
  EXPECT_THROW(linear.set_parameter("bias", ops::zeros({1})), Error);
}

TEST(ModuleTest, ForwardHooksCanReplaceInputAndOutput) {
  Linear linear(2, 2, LinearOptions{.bias = false});
  linear.set_parameter("weight", ops::from_vector({1, 0, 0, 1}, {2, 2}));
  linear.register_forward_pre_hook([](Module&, const Tensor& x) { return ops::mul(x, 2.0); });
  linear.register_forward_hook(
      [](Module&, const Tensor&, const Tensor& y) { return ops::add(y, 1.0); });
  EXPECT_EQ(ops::to_vector(linear(ops::from_vector({1, 2}, {1, 2}))), (std::vector<double>{3, 5}));
}

TEST(ModuleTest, TrainAndEvalPropagate) {
  Block block;
  block.eval();
  for (const auto& [name, m] : block.named_modules()) EXPECT_FALSE(m->is_training()) << name;
  block.train();
  for (const auto& [name, m] : block.named_modules()) EXPECT_TRUE(m->is_training()) << name;
}

}  // namespace
}  // namespace loom::nn

namespace loom::nn {
namespace {

// module.to(device): a no-op on the device the parameters are on; with a GPU the tree moves and
// its parameters stay trainable leaves; without one the error names the device.
TEST(ModuleToDeviceTest, MovesParametersOrNamesTheMissingDevice) {
  Linear linear(3, 2, LinearOptions{.seed = 1});
  const Tensor weight = linear.weight();
  linear.to(Device::cpu());
  EXPECT_EQ(linear.weight().impl(), weight.impl());
  if (!cuda::available()) {
    EXPECT_THAT([&] { linear.to(Device::cuda(0)); },
                ::testing::ThrowsMessage<Error>(HasSubstr("cuda")));
    return;
  }
  linear.to(Device::cuda(0));
  for (const auto& [name, p] : linear.named_parameters()) {
    EXPECT_EQ(p.device(), Device::cuda(0)) << name;
    EXPECT_TRUE(p.requires_grad()) << name;
    EXPECT_TRUE(p.is_leaf()) << name;
  }
  EXPECT_EQ(ops::to_vector(linear.weight()), ops::to_vector(weight));
}

}  // namespace
}  // namespace loom::nn
