// Activation checkpointing (nn/checkpoint.h) against the same computation without it: losses and
// every gradient bitwise equal (the recompute runs the same kernels on the same values), dropout
// drawing the same masks on recompute, under mixed precision too, with an input that needs no
// gradient, nested checkpointed modules, and activations not kept: the bytes held between
// forward and backward drop to the checkpointed modules' inputs and outputs.
#include "nn/checkpoint.h"

#include <gtest/gtest.h>

#include <memory>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/hooks.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "nn/mixed_precision.h"
#include "tensor/memory_stats.h"
#include "tensor/ops.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_checks.h"

namespace loom::nn {
namespace {

using testing::expect_bitwise_equal;

// A residual MLP block with dropout: x + fc2(dropout(gelu(fc1(x)))).
class Block : public Module {
 public:
  Block(int64_t width, uint64_t seed) : Module("Block") {
    fc1 = register_module("fc1",
                          std::make_shared<Linear>(width, 4 * width, LinearOptions{.seed = seed}));
    fc2 = register_module(
        "fc2", std::make_shared<Linear>(4 * width, width, LinearOptions{.seed = seed + 1}));
    gelu = register_module("gelu", std::make_shared<GELU>());
    drop = register_module("drop", std::make_shared<Dropout>(0.2, seed + 2));
  }
  Tensor forward(const Tensor& x) override { return add(x, (*fc2)((*drop)((*gelu)((*fc1)(x))))); }
  std::shared_ptr<Linear> fc1, fc2;
  std::shared_ptr<GELU> gelu;
  std::shared_ptr<Dropout> drop;
};

class Net : public Module {
 public:
  explicit Net(int64_t width) : Module("Net") {
    for (int i = 0; i < 3; ++i) {
      blocks.push_back(
          register_module("b" + std::to_string(i), std::make_shared<Block>(width, 10 * (i + 1))));
    }
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (const auto& block : blocks) h = (*block)(h);
    return h;
  }
  std::vector<std::shared_ptr<Block>> blocks;
};

struct TrainedRun {
  std::vector<Tensor> losses;
  std::vector<std::pair<std::string, Tensor>> grads;
  int64_t held_after_forward = 0;  // tensor bytes between the last forward and its backward
};

// Two steps (dropout draws anew each call), gradients accumulated over both; each step calls the
// net once, as training calls each block once per (micro)batch.
TrainedRun train(bool checkpoint, bool mixed, bool input_requires_grad, bool selective = false,
                 const CheckpointPolicy& policy = CheckpointPolicy::selective_op()) {
  Net net(16);
  for (const auto& block : net.blocks) {
    block->set_checkpointed(checkpoint);
    if (checkpoint && selective) {
      block->set_checkpoint_policy(std::make_shared<const CheckpointPolicy>(policy));
    }
  }
  if (mixed) apply_mixed_precision(net);
  TrainedRun run;
  for (int step = 0; step < 2; ++step) {
    Tensor x = ops::uniform({8, 16}, 100 + step, -1.0, 1.0);
    if (input_requires_grad) x.set_requires_grad(true);
    MemoryTracker tracker;  // what it counts (the forward's tensors) goes before it does
    Tensor y;
    {
      ScopedMemoryTracker scope(tracker);
      y = net(x);
      run.held_after_forward = tracker.stats().current_bytes;
    }
    const Tensor loss = sum(mul(y, y));  // kept past the tracker: not counted
    backward(loss);
    run.losses.push_back(detach(loss));
    if (input_requires_grad) run.grads.emplace_back("x", x.grad());
  }
  for (auto& [name, p] : net.named_parameters()) run.grads.emplace_back(name, p.grad());
  return run;
}

void expect_same(const TrainedRun& checkpointed, const TrainedRun& plain, const std::string& what) {
  ASSERT_EQ(checkpointed.losses.size(), plain.losses.size());
  for (size_t i = 0; i < plain.losses.size(); ++i) {
    expect_bitwise_equal({.actual = checkpointed.losses[i],
                          .expected = plain.losses[i],
                          .what = what + " loss " + std::to_string(i)});
  }
  ASSERT_EQ(checkpointed.grads.size(), plain.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    ASSERT_EQ(checkpointed.grads[i].first, plain.grads[i].first);
    ASSERT_TRUE(plain.grads[i].second.defined()) << plain.grads[i].first;
    expect_bitwise_equal({.actual = checkpointed.grads[i].second,
                          .expected = plain.grads[i].second,
                          .what = what + " grad of " + plain.grads[i].first});
  }
}

TEST(Checkpoint, GradientsAndDropoutMasksEqualThePlainRunBitwise) {
  const TrainedRun plain = train(false, false, true), checkpointed = train(true, false, true);
  expect_same(checkpointed, plain, "f32");
  // Kept between forward and backward: the blocks' inputs and outputs, not their 4x-wide
  // activations (GELU's input and output, the dropout mask and output of each block).
  EXPECT_LT(checkpointed.held_after_forward * 3, plain.held_after_forward)
      << "checkpointed " << checkpointed.held_after_forward << " bytes, plain "
      << plain.held_after_forward;
}

// Selective (torchtitan's op mode): fc1's output (each block's first matrix product) kept from
// the forward and handed back in the recompute, fc2, GELU, dropout and the residual add
// recomputed: bitwise again, holding more than full checkpointing and less than none; keeping
// every matrix product holds more again.
TEST(Checkpoint, SelectiveKeepsEveryOtherMatrixProductAndRecomputesTheRest) {
  const TrainedRun plain = train(false, false, true), full = train(true, false, true);
  const TrainedRun selective = train(true, false, true, /*selective=*/true);
  expect_same(selective, plain, "selective-op");
  EXPECT_GT(selective.held_after_forward, full.held_after_forward);
  EXPECT_LT(selective.held_after_forward, plain.held_after_forward);
  expect_same(train(true, true, true, true), train(false, true, true), "selective-op bf16");
  const TrainedRun every_product =
      train(true, false, true, /*selective=*/true, CheckpointPolicy::matmuls_and_attention());
  expect_same(every_product, plain, "matmuls-and-attention");
  EXPECT_GT(every_product.held_after_forward, selective.held_after_forward);
}

// A policy is any predicate over ops: keeping the nonlinearity's output instead.
TEST(Checkpoint, AUserPolicyKeepsWhatItNames) {
  Block plain_block(16, 9), kept_block(16, 9);
  kept_block.set_checkpoint_policy(std::make_shared<const CheckpointPolicy>(
      CheckpointPolicy{.name = "gelu", .keep = [](OpId op, int64_t) { return op == OpId::gelu; }}));
  const Tensor x = ops::uniform({4, 16}, 2, -1.0, 1.0);
  backward(sum(plain_block(x)));
  backward(sum(kept_block(x)));
  expect_bitwise_equal({.actual = kept_block.fc1->weight().grad(),
                        .expected = plain_block.fc1->weight().grad(),
                        .what = "fc1.weight with gelu kept"});
}

TEST(Checkpoint, UnderMixedPrecisionTheRecomputeUsesTheForwardsCasts) {
  expect_same(train(true, true, true), train(false, true, true), "bf16");
}

TEST(Checkpoint, AnInputThatNeedsNoGradientStillGivesTheParametersTheirs) {
  expect_same(train(true, false, false), train(false, false, false), "no input grad");
}

// Where checkpointing is not bitwise: a checkpointed module whose input feeds it twice in one
// graph. Its recompute sums each call's gradient contributions before handing them on, where the
// plain graph sums all of them at the input in arrival order: the same terms, another
// association, so the input's gradient differs by rounding only (bounded here to 1e-6 of its
// largest element); the parameters' gradients stay bitwise.
TEST(Checkpoint, AModuleCalledTwiceInOneGraphDiffersByTheSumsAssociationOnly) {
  std::vector<Tensor> grads[2];
  for (int checkpointed = 0; checkpointed < 2; ++checkpointed) {
    Block block(16, 5);
    block.drop->set_calls(0);
    block.set_checkpointed(checkpointed == 1);
    Tensor x = ops::uniform({8, 16}, 3, -1.0, 1.0);
    x.set_requires_grad(true);
    backward(sum(mul(block(x), block(x))));
    grads[checkpointed] = {x.grad(), block.fc1->weight().grad(), block.fc2->weight().grad()};
  }
  testing::expect_close({.actual = grads[1][0],
                         .expected = grads[0][0],
                         .tol = {.rtol = 1e-6, .relative_to = testing::RelativeTo::kLargest},
                         .what = "the input's gradient"});
  expect_bitwise_equal({.actual = grads[1][1], .expected = grads[0][1], .what = "fc1.weight"});
  expect_bitwise_equal({.actual = grads[1][2], .expected = grads[0][2], .what = "fc2.weight"});
}

TEST(Checkpoint, NestedCheckpointsAndInferenceRunPlainly) {
  Net plain_net(16), nested(16);
  nested.set_checkpointed(true);
  for (const auto& block : nested.blocks) block->set_checkpointed(true);
  const Tensor x = ops::uniform({4, 16}, 7, -1.0, 1.0);
  backward(sum(plain_net(x)));
  backward(sum(nested(x)));
  const auto want = plain_net.named_parameters(), got = nested.named_parameters();
  for (size_t i = 0; i < want.size(); ++i) {
    expect_bitwise_equal({.actual = got[i].second.grad(),
                          .expected = want[i].second.grad(),
                          .what = "nested: grad of " + want[i].first});
  }
  NoGradGuard no_grad;  // inference: nothing to recompute, the forward runs as usual
  expect_bitwise_equal({.actual = nested(x), .expected = plain_net(x), .what = "inference"});
}

// A checkpoint's backward gives up what it saved (the input, the forward's parameter slots, the
// kept outputs) as it runs, so a second backward through it is refused by name rather than
// recomputing from state that is gone.
TEST(Checkpoint, ASecondBackwardThroughACheckpointIsRefusedByName) {
  Net net(16);
  for (const auto& block : net.blocks) block->set_checkpointed(true);
  const Tensor x = ops::uniform({4, 16}, 7, -1.0, 1.0);
  const Tensor loss = sum(net(x));
  backward(loss, Tensor(), /*retain_graph=*/true);
  const std::string message = testing::error_of([&] { backward(loss); });
  EXPECT_NE(message.find("checkpoint(Block)"), std::string::npos) << message;
  EXPECT_NE(message.find("second backward"), std::string::npos) << message;
}

}  // namespace
// A checkpointed module inside a split backward's B recomputes and splits its own backward: its
// input's gradient in B, its weights' when the outer W runs — bitwise the plain backward's.
TEST(Checkpoint, InsideASplitBackwardItsWeightsWaitForW) {
  const auto build = [] {
    auto linear = std::make_shared<Linear>(4, 3, LinearOptions{.seed = 1});
    linear->set_checkpointed(true);
    return linear;
  };
  const auto input = [] {
    Tensor x = ops::normal({2, 4}, 2);
    x.set_requires_grad(true);
    return x;
  };
  auto plain = build();
  const Tensor xp = input();
  backward(sum(relu((*plain)(xp))));
  auto split = build();
  const Tensor xs = input();
  autograd::WeightBackward w =
      autograd::backward_input({sum(relu((*split)(xs)))}, {Tensor()}, {xs});
  testing::expect_bitwise_equal({.actual = xs.grad(), .expected = xp.grad(), .what = "dx in B"});
  EXPECT_FALSE(split->weight().grad().defined()) << "the weight's gradient came in B";
  w.run();
  testing::expect_bitwise_equal(
      {.actual = split->weight().grad(), .expected = plain->weight().grad(), .what = "dw in W"});
  testing::expect_bitwise_equal(
      {.actual = split->bias().grad(), .expected = plain->bias().grad(), .what = "db in W"});
}

// The checkpointed block's weights get their gradients inside the outer W, before its callbacks
// run: a callback queued during W (DDP's end-of-backward wait) finds them. (Before the fix they
// came after the callbacks, and DDP under ZB-H1 with activation checkpointing failed with
// "parameters ... received no gradient in this backward".)
TEST(Checkpoint, ItsWeightsGradientsComeBeforeWsCallbacks) {
  auto inner = std::make_shared<Linear>(4, 4, LinearOptions{.seed = 1});
  inner->set_checkpointed(true);
  auto outer = std::make_shared<Linear>(4, 3, LinearOptions{.seed = 2});
  Tensor x = ops::normal({2, 4}, 3);
  x.set_requires_grad(true);
  bool seen_by_callback = false;
  autograd::register_post_accumulate_grad_hook(outer->weight(), [&](const Tensor&) {
    autograd::queue_backward_callback([&] { seen_by_callback = inner->weight().grad().defined(); });
  });
  autograd::WeightBackward w =
      autograd::backward_input({sum((*outer)(relu((*inner)(x))))}, {Tensor()}, {x});
  EXPECT_FALSE(inner->weight().grad().defined());
  w.run();
  EXPECT_TRUE(inner->weight().grad().defined());
  EXPECT_TRUE(seen_by_callback) << "W's callback ran before the checkpointed block's weights";
}

}  // namespace loom::nn
