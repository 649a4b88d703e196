#include "autograd/engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "autograd/function.h"
#include "autograd/functions.h"
#include "autograd/functions_nn.h"
#include "autograd/grad_mode.h"
#include "autograd/hooks.h"
#include "autograd/node.h"
#include "base/error.h"
#include "tensor/dispatch.h"
#include "tensor/memory_stats.h"
#include "tests/autograd/test_util.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

using testing::expect_close;
using testing::expect_equal;
using ::testing::HasSubstr;

TEST(EngineTest, ChainRuleThroughSeveralOps) {
  // y = sum((a * b + a)^2); dy/da = 2 (ab + a)(b + 1), dy/db = 2 (ab + a) a.
  Tensor a = ops::from_vector({1, 2, 3}, {3});
  Tensor b = ops::from_vector({4, 5, 6}, {3});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor y = sum(pow(a * b + a, 2.0));
  backward(y);
  expect_close(
      {.actual = a.grad(), .expected = {2 * 5 * 5, 2 * 12 * 6, 2 * 21 * 7}, .tol = {.atol = 1e-4}});
  expect_close(
      {.actual = b.grad(), .expected = {2 * 5 * 1, 2 * 12 * 2, 2 * 21 * 3}, .tol = {.atol = 1e-4}});
}

// A leaf's gradient goes into .grad as soon as it is computed (AccumulateGrad runs before any
// other ready node, as PyTorch's), even when its AccumulateGrad node is older than the graph (a
// parameter's is made once and reused by every later forward): the last layer's weight is
// accumulated before the first layer's backward runs, instead of every parameter's fresh
// gradient living until the end of the backward (a pipeline stage held one more microbatch's
// worth of memory for it, issue 32).
TEST(EngineTest, LeavesAccumulateAsSoonAsTheirGradientIsReady) {
  Tensor x = ops::from_vector({1, 2}, {2});
  Tensor w1 = ops::from_vector({3, 4}, {2}), w2 = ops::from_vector({5, 6}, {2});
  w1.set_requires_grad(true);
  w2.set_requires_grad(true);
  std::vector<std::string> order;
  autograd::register_post_accumulate_grad_hook(w1, [&](const Tensor&) { order.push_back("w1"); });
  autograd::register_post_accumulate_grad_hook(w2, [&](const Tensor&) { order.push_back("w2"); });
  // Microbatch 0's graph stays alive (as a pipeline keeps it until its backward), so microbatch
  // 1's graph reuses the leaves' AccumulateGrad nodes, older than all of its own nodes.
  const Tensor y0 = sum((x * w1) * w2);
  const Tensor h1 = x * w1;
  autograd::register_hook(h1, [&](const Tensor&) {
    order.push_back("h");
    return Tensor();
  });
  backward(sum(h1 * w2));
  EXPECT_EQ(order, (std::vector<std::string>{"w2", "h", "w1"}));
  backward(y0);
  expect_equal({.actual = w1.grad(), .expected = {10, 24}});  // two microbatches of x * w2
  expect_equal({.actual = w2.grad(), .expected = {6, 16}});   // two of x * w1
}

// A node's saved tensors go as soon as it has run (retain_graph off), not when the whole backward
// ends: by the time the gradient reaches the first op of a chain, the later ops' saved
// activations are freed, so a backward's memory falls as it goes (issue 32).
TEST(EngineTest, ANodesSavedTensorsAreFreedOnceItHasRun) {
  MemoryTracker tracker;  // outlives x's gradient, which it counts
  Tensor x = ops::uniform({256, 256}, 1, -1.0, 1.0);
  x.set_requires_grad(true);
  int64_t held_at_start = 0, held_at_first_op = 0;
  Tensor loss;
  {
    ScopedMemoryTracker scope(tracker);
    Tensor h = tanh(x);  // saves its output (256 KiB)
    autograd::register_hook(h, [&](const Tensor&) {
      held_at_first_op = tracker.stats().current_bytes;
      return Tensor();
    });
    for (int i = 0; i < 8; ++i) h = tanh(h);  // each saves another 256 KiB
    loss = sum(h);
    held_at_start = tracker.stats().current_bytes;
    backward(loss);
  }
  // At the start, the nine outputs the tanh nodes saved; at the first one, at most a few
  // gradients in flight: the eight later nodes' saved outputs are gone.
  EXPECT_GE(held_at_start, 9 * 256 * 256 * 4);
  EXPECT_LT(held_at_first_op, 4 * 256 * 256 * 4);
}

TEST(EngineTest, GradientsAccumulateAcrossBackwardCalls) {
  Tensor a = ops::from_vector({1, 2}, {2});
  a.set_requires_grad(true);
  backward(sum(a * 3.0));
  backward(sum(a * 3.0));
  expect_equal({.actual = a.grad(), .expected = {6, 6}});
}

TEST(EngineTest, TensorUsedTwiceGetsSummedGradient) {
  Tensor a = ops::from_vector({2}, {1});
  a.set_requires_grad(true);
  backward(sum(a * a + a));  // d/da = 2a + 1
  expect_equal({.actual = a.grad(), .expected = {5}});
}

// A tensor's gradients from several uses are summed into the first when nothing else holds it;
// a first gradient someone still sees (a hook kept it) is summed into a new tensor, and keeps
// its values. (A broadcast view, stride 0, would be summed anew too: no formula hands one on.)
TEST(EngineTest, GradientsOfSeveralUsesSumInPlaceOnlyWhenTheFirstIsFree) {
  Tensor a = ops::from_vector({1, 2, 3}, {3});
  a.set_requires_grad(true);
  const Tensor b = mul(a, 2.0);
  backward(sum(add(mul(b, 3.0), mul(b, b))));  // d/db = 3 + 2b; d/da = 2 (3 + 2b)
  expect_equal({.actual = a.grad(), .expected = {14, 22, 30}});

  // The engine runs later nodes first: the ops are ordered so that the hooked gradient reaches d
  // first.
  const Tensor weights = ops::from_vector({1, 2, 3}, {3});
  {
    Tensor c = ops::from_vector({1, 2, 3}, {3});
    c.set_requires_grad(true);
    const Tensor d = mul(c, 1.0);
    const Tensor total = sum(d);                    // its gradient reaches d second
    const Tensor passed = add(d, ops::zeros({3}));  // its backward hands d the gradient as it is
    Tensor seen;
    autograd::register_hook(passed, [&seen](const Tensor& g) {
      seen = g;
      return Tensor();
    });
    backward(sum(add(mul(passed, weights), total)));  // d/dd = weights + 3
    expect_equal({.actual = c.grad(), .expected = {4, 5, 6}});
    expect_equal({.actual = seen, .expected = {1, 2, 3}});
  }
}

// A leaf's first gradient is adopted only when nothing else can see it: two leaves fed the same
// gradient tensor (add's backward), and a seed the caller still holds, each get their own .grad.
TEST(EngineTest, FirstGradientIsNeverSharedWithAnotherLeafOrTheCaller) {
  Tensor a = testing::leaf({3}, 1), b = testing::leaf({3}, 2);
  const Tensor seed = ops::full({3}, 2.0);
  backward(add(a, b), seed);
  EXPECT_NE(a.grad().storage(), b.grad().storage());
  EXPECT_NE(a.grad().storage(), seed.storage());
  EXPECT_NE(b.grad().storage(), seed.storage());
  ops::add_(a.grad(), ops::full({3}, 1.0));  // in place into one leaf's gradient
  expect_equal({.actual = a.grad(), .expected = {3, 3, 3}});
  expect_equal({.actual = b.grad(), .expected = {2, 2, 2}});
  expect_equal({.actual = seed, .expected = {2, 2, 2}});
  // A fresh, private gradient (mul's backward) is adopted: same values either way.
  Tensor c = testing::leaf({3}, 3);
  backward(sum(c * 4.0));
  expect_equal({.actual = c.grad(), .expected = {4, 4, 4}});
}

TEST(EngineTest, NonScalarRootNeedsSeed) {
  Tensor a = testing::leaf({2, 2}, 1);
  Tensor y = a * 2.0;
  try {
    backward(y);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("a seed gradient is required for a root with more than one "
                                    "element (root shape (2, 2))"));
  }
  backward(y, ops::full({2, 2}, 0.5));
  expect_equal({.actual = a.grad(), .expected = {1, 1, 1, 1}});
}

TEST(EngineTest, SecondBackwardThroughFreedGraphThrows) {
  Tensor a = testing::leaf({3}, 2);
  Tensor y = sum(exp(a));
  backward(y);
  try {
    backward(y);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("pass retain_graph=true"));
  }
}

TEST(EngineTest, RetainGraphAllowsSecondBackward) {
  Tensor a = ops::from_vector({0, 1}, {2});
  a.set_requires_grad(true);
  Tensor y = sum(exp(a));
  backward(y, Tensor(), /*retain_graph=*/true);
  backward(y);
  expect_close(
      {.actual = a.grad(), .expected = {2 * 1.0, 2 * std::exp(1.0)}, .tol = {.atol = 1e-5}});
}

// Records whether each cross_entropy_backward call may write over its logits.
struct OverLogitsSpy : DispatchMode {
  std::vector<bool> calls;
  std::vector<Tensor> dispatch(const OpCall& call) override {
    if (call.id == OpId::cross_entropy_backward) {
      calls.push_back(call.attrs.size() > 4 && call.bool_attr(4));
    }
    return call_op(call);
  }
};

// Cross entropy writes its logits' gradient over them when the backward is its node's last and
// nothing else holds the logits (llm.c's classifier); logits a caller still holds, or a graph
// kept for another backward, keep their values. The gradient is the same either way.
TEST(EngineTest, CrossEntropyWritesItsGradientOverLogitsNobodyHolds) {
  const Tensor targets = ops::from_vector_i64({2, 0, 1}, {3});
  const auto run = [&](bool keep_logits, bool retain_graph, std::vector<bool>& over) {
    Tensor x = testing::leaf({3, 4}, 7);
    Tensor logits = mul(x, 2.0);
    const std::vector<double> before = ops::to_vector(logits);
    Tensor loss = cross_entropy(logits, targets);
    if (!keep_logits) logits = Tensor();
    OverLogitsSpy spy;
    {
      ScopedDispatchMode mode(spy);
      backward(loss, Tensor(), retain_graph);
    }
    over = spy.calls;
    if (keep_logits) EXPECT_EQ(ops::to_vector(logits), before) << "held logits changed";
    return ops::to_vector(x.grad());
  };
  std::vector<bool> dropped, held, retained;
  const std::vector<double> grad = run(/*keep_logits=*/false, /*retain_graph=*/false, dropped);
  // The gradient over the logits is a new handle, without the logits' autograd state: a leaf
  // whose producer hands it on unchanged (add) gets a plain .grad.
  {
    Tensor leaf = testing::leaf({3, 4}, 8);
    Tensor loss = cross_entropy(add(leaf, ops::zeros({3, 4})), targets);
    backward(loss);
    EXPECT_FALSE(leaf.grad().requires_grad());
    EXPECT_EQ(leaf.grad().grad_fn(), nullptr);
  }
  EXPECT_EQ(dropped, std::vector<bool>{true});
  EXPECT_EQ(run(true, false, held), grad);
  EXPECT_EQ(held, std::vector<bool>{false});
  EXPECT_EQ(run(false, true, retained), grad);
  EXPECT_EQ(retained, std::vector<bool>{false});
}

TEST(EngineTest, NoGradRecordsNothing) {
  Tensor a = testing::leaf({2}, 3);
  Tensor y;
  {
    NoGradGuard no_grad;
    y = a * 2.0;
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.grad_fn(), nullptr);
  EXPECT_THROW(backward(sum(y)), Error);
}

TEST(EngineTest, DetachCutsTheGraph) {
  Tensor a = ops::from_vector({3}, {1});
  a.set_requires_grad(true);
  Tensor d = detach(a * 2.0);
  EXPECT_FALSE(d.requires_grad());
  d.set_requires_grad(true);  // a detached tensor is a new leaf
  backward(sum(d * a));       // only a's direct use contributes: d/da = d = 6
  expect_equal({.actual = a.grad(), .expected = {6}});
  expect_equal({.actual = d.grad(), .expected = {3}});
}

TEST(EngineTest, InputsNotRequiringGradGetNoGradient) {
  Tensor a = testing::leaf({2}, 4);
  Tensor c = ops::ones({2});
  backward(sum(a * c));
  EXPECT_TRUE(a.grad().defined());
  EXPECT_FALSE(c.grad().defined());
}

TEST(EngineTest, UnusedOutputOfMultiOutputOpGetsZeroGradient) {
  Tensor a = testing::leaf({4}, 5);
  std::vector<Tensor> pieces = chunk(a, 2);
  backward(sum(pieces[1] * 2.0));
  expect_equal({.actual = a.grad(), .expected = {0, 0, 2, 2}});
}

TEST(EngineTest, SetRequiresGradOnNonLeafOrIntegerThrows) {
  Tensor a = testing::leaf({2}, 6);
  Tensor y = a * 2.0;
  EXPECT_THROW(y.set_requires_grad(false), Error);
  Tensor i = ops::arange(3);
  try {
    i.set_requires_grad(true);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("only floating tensors can require grad, got dtype i64"));
  }
}

TEST(EngineTest, GraphIsFreedWithItsOutputs) {
  // A saved tensor held by the graph must be released once the root goes away.
  std::weak_ptr<Storage> saved_storage;
  {
    Tensor a = testing::leaf({1000}, 7);
    Tensor e = exp(a);  // ExpBackward saves its output
    saved_storage = e.storage();
    Tensor y = sum(e);
    e = Tensor();
    EXPECT_FALSE(saved_storage.expired());
  }
  EXPECT_TRUE(saved_storage.expired()) << "graph kept its saved tensors alive: a reference cycle";
}

TEST(EngineTest, LeafGradientsDoNotAliasEachOther) {
  // add's backward hands the same gradient tensor to both inputs; each leaf's .grad must still
  // be its own tensor, or an in-place update of one (clip_grad_norm_, optimizers) changes both.
  Tensor a = ops::from_vector({1, 2}, {2});
  Tensor b = ops::from_vector({3, 4}, {2});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  backward(sum(a + b));
  {
    NoGradGuard no_grad;
    ops::copy_(a.grad(), ops::mul(a.grad(), 0.5));
  }
  expect_equal({.actual = a.grad(), .expected = {0.5, 0.5}});
  expect_equal({.actual = b.grad(), .expected = {1, 1}});
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// A node may hand an f32 leaf a gradient of another floating dtype (mixed precision's cast hands
// its bf16 gradient on): .grad stays f32 and holds exactly the converted values, whether it is
// made fresh, accumulated in place into a buffer the leaf owns (DDP's buckets: converted as it
// is added), accumulated out of place, or seen by a hook (which sees the leaf's dtype).
TEST(EngineTest, ALowerPrecisionGradientReachesItsF32LeafConverted) {
  const Tensor bf16_grad = ops::to(ops::normal({3, 5}, 4), kBFloat16);
  const auto hand_on = [&](const Tensor& leaf) {
    const Tensor out = autograd::record("PassOn", {leaf}, ops::to(leaf, kBFloat16),
                                        [](const std::vector<Tensor>& g) { return g; });
    backward(out, bf16_grad);
  };
  const Tensor once = ops::to(bf16_grad, kFloat32);
  const Tensor twice = ops::add(once, once);
  for (int mode = 0; mode < 3; ++mode) {  // fresh then out of place; in place; a hook
    SCOPED_TRACE(mode);
    Tensor w = ops::normal({3, 5}, 1);
    w.set_requires_grad(true);
    DType hook_saw = DType::kInt64;
    if (mode == 1) autograd::autograd_meta(w).accumulate_in_place = true;
    if (mode == 2) {
      autograd::register_hook(w, [&](const Tensor& g) {
        hook_saw = g.dtype();
        return Tensor();
      });
    }
    hand_on(w);
    ASSERT_EQ(w.grad().dtype(), kFloat32);
    testing::expect_bitwise_equal({.actual = w.grad(), .expected = once, .what = "fresh"});
    const Tensor first = w.grad();
    hand_on(w);
    testing::expect_bitwise_equal({.actual = w.grad(), .expected = twice, .what = "accumulated"});
    EXPECT_EQ(w.grad().dtype(), kFloat32);
    if (mode == 1) EXPECT_TRUE(w.grad().is_same(first)) << "not accumulated in place";
    if (mode == 2) EXPECT_EQ(hook_saw, kFloat32);
  }
}

}  // namespace
}  // namespace loom
