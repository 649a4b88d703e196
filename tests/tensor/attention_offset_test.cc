// scaled_dot_product_attention's causal_offset (tensor/ops_nn.h): query i sees key j iff
// j <= i + offset. Each case is checked against a reference composed from other ops (scores =
// q k^T * scale, a mask built from the offset, softmax, @ v) for the output and logsumexp, and
// against that reference's autograd gradients for the backward op's dq, dk, dv (and for the
// autograd spelling loom::scaled_dot_product_attention, whose formula must pass the offset on).
// Then context parallelism's identity: a query chunk [s, s + c) against keys [0, s + c) with
// offset s is rows s.. of the full causal attention, forward and backward.
//
// Tolerances: f32 everywhere, the op and the reference both summing <= 9 products of O(1) values
// in f32 (the op through its fused row kernel, the reference through GEMM and softmax), so their
// results differ by a few f32 roundings: 2e-5 (abs + rel), as nn_ops_test.cc's attention cases.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/functions_nn.h"
#include "base/error.h"
#include "tensor/dispatch.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/ops_nn.h"
#include "tests/tensor/attention_grads.h"
#include "tests/tensor/tensor_test_util.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

using testing::error_of;
using testing::expect_close;
using ::testing::HasSubstr;
using testing::Tolerance;
using Vec = std::vector<double>;

constexpr double kTol = 2e-5;  // f32 op vs f32 composed reference (see top)
constexpr double kInf = std::numeric_limits<double>::infinity();

Tolerance abs_and_rel(double tol) { return {.rtol = tol, .atol = tol}; }

Tensor randn(const Shape& shape, uint64_t seed) { return ops::normal(shape, seed); }

Tensor leaf(const Shape& shape, uint64_t seed) {
  Tensor t = ops::clone(randn(shape, seed));
  t.set_requires_grad(true);
  return t;
}

// Key j is hidden from query i (causal with offset): j > i + offset.
bool hidden(int64_t i, int64_t j, int64_t offset) { return j > i + offset; }

bool row_sees_nothing(int64_t i, int64_t tk, int64_t offset) { return tk == 0 || i + offset < 0; }

struct Reference {
  Tensor out;  // records autograd when q, k, v require grad
  Vec lse;     // -inf for a row that sees no key
};

// softmax(q k^T * scale with hidden keys at -inf) @ v, a row that sees no key giving 0. Such a
// row's mask is left all visible (a softmax of -inf only would be NaN) and its probabilities are
// multiplied by 0 instead, which also gives it zero gradients.
Reference reference(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                    int64_t offset) {
  const int64_t tq = q.size(-2), tk = k.size(-2);
  std::vector<float> hide(static_cast<size_t>(tq * tk)), keep(static_cast<size_t>(tq));
  for (int64_t i = 0; i < tq; ++i) {
    const bool empty = row_sees_nothing(i, tk, offset);
    keep[i] = empty ? 0.0f : 1.0f;
    for (int64_t j = 0; j < tk; ++j) hide[i * tk + j] = !empty && hidden(i, j, offset) ? 1 : 0;
  }
  const Tensor hide_t = ops::from_vector(hide, {tq, tk});
  const Tensor keep_t = ops::from_vector(keep, {tq, 1});
  const Tensor scores =
      ops::masked_fill(ops::mul(ops::matmul(q, ops::transpose(k, -1, -2)), scale), hide_t, -kInf);
  const Tensor probs = ops::mul(ops::softmax(scores, -1), keep_t);
  Reference r{.out = ops::matmul(probs, v), .lse = {}};
  {
    NoGradGuard no_grad;
    r.lse = ops::to_vector(ops::log(ops::sum(ops::exp(scores), {-1})));
  }
  for (size_t n = 0; n < r.lse.size(); ++n) {
    if (keep[n % tq] == 0.0f) r.lse[n] = -kInf;
  }
  return r;
}

using Grads = testing::AttentionGradients;
using testing::autograd_grads;

void expect_grads_close(const Grads& actual, const Grads& expected, const std::string& what) {
  testing::expect_grads_close(actual, expected, abs_and_rel(kTol), what);
}

struct OffsetCase {
  int64_t tq, tk;
  int64_t offset;
  const char* why;
};

TEST(AttentionCausalOffset, ForwardAndBackwardMatchComposedReference) {
  // q (2, 2, tq, 4), k (2, 2, tk, 4), v (2, 2, tk, 3): two batch dims, Dv != D.
  const std::vector<OffsetCase> cases = {
      {4, 9, 0, "top-left (offset 0)"},
      {4, 9, 3, "offset 3"},
      {4, 9, 5, "bottom-right (offset tk - tq)"},
      {6, 6, 2, "square, offset 2"},
      {4, 9, 20, "offset past the keys: every key visible"},
      {5, 5, -1, "negative: row 0 sees nothing"},
      {5, 7, -3, "negative: rows 0..2 see nothing"},
      {7, 3, -2, "tq > tk, rows 0..1 see nothing"},
      {4, 6, -10, "no row sees a key"},
  };
  uint64_t seed = 100;
  for (const OffsetCase& c : cases) {
    const std::string what = fmt::format("tq {} tk {} offset {} ({})", c.tq, c.tk, c.offset, c.why);
    const double scale = 0.4;
    const Tensor q = leaf({2, 2, c.tq, 4}, seed), k = leaf({2, 2, c.tk, 4}, seed + 1),
                 v = leaf({2, 2, c.tk, 3}, seed + 2);
    const Tensor g = randn({2, 2, c.tq, 3}, seed + 3);
    seed += 10;
    const Reference ref = reference(q, k, v, scale, c.offset);
    const Grads ref_grads = autograd_grads(ref.out, g, q, k, v);

    ops::AttentionResult r;
    ops::AttentionGrads grads;
    {
      NoGradGuard no_grad;
      r = ops::scaled_dot_product_attention(q, k, v, /*is_causal=*/true, scale, c.offset);
      grads = ops::scaled_dot_product_attention_backward(g, q, k, v, r.out, r.logsumexp, true,
                                                         scale, c.offset);
    }
    expect_close(
        {.actual = r.out, .expected = ref.out, .tol = abs_and_rel(kTol), .what = what + " out"});
    expect_close({.actual = r.logsumexp,
                  .expected = ref.lse,
                  .tol = abs_and_rel(kTol),
                  .what = what + " logsumexp"});
    expect_grads_close({grads.dq, grads.dk, grads.dv}, ref_grads, what + " backward op");

    // The autograd spelling: its recorded formula must run the backward with the same offset.
    const Tensor y = scaled_dot_product_attention(q, k, v, true, scale, c.offset);
    expect_close({.actual = y, .expected = r.out, .tol = {}, .what = what + " loom:: out"});
    expect_grads_close(autograd_grads(y, g, q, k, v), ref_grads, what + " loom:: autograd");
  }
}

TEST(AttentionCausalOffset, OffsetZeroIsTheDefault) {
  const Tensor q = randn({2, 5, 4}, 201), k = randn({2, 8, 4}, 202), v = randn({2, 8, 4}, 203);
  const Tensor g = randn({2, 5, 4}, 204);
  const auto a = ops::scaled_dot_product_attention(q, k, v, true);
  const auto b = ops::scaled_dot_product_attention(q, k, v, true, 0.0, 0);
  expect_close({.actual = b.out, .expected = a.out, .tol = {}, .what = "out"});
  expect_close({.actual = b.logsumexp, .expected = a.logsumexp, .tol = {}, .what = "lse"});
  // And offset 1 is not offset 0 (the offset reaches the kernel).
  const auto c = ops::scaled_dot_product_attention(q, k, v, true, 0.0, 1);
  EXPECT_NE(ops::to_vector(c.out), ops::to_vector(a.out));
}

TEST(AttentionCausalOffset, ExtremeOffsetsMeanEveryKeyOrNone) {
  // Offsets past [-tq, tk] are the same masks as its ends (and must not overflow i + 1 + offset).
  const Tensor q = randn({2, 5, 4}, 211), k = randn({2, 8, 4}, 212), v = randn({2, 8, 3}, 213);
  const auto all = ops::scaled_dot_product_attention(q, k, v, true, 0.0, 8);
  const auto none = ops::scaled_dot_product_attention(q, k, v, true, 0.0, -5);
  const auto big =
      ops::scaled_dot_product_attention(q, k, v, true, 0.0, std::numeric_limits<int64_t>::max());
  const auto small =
      ops::scaled_dot_product_attention(q, k, v, true, 0.0, std::numeric_limits<int64_t>::min());
  expect_close({.actual = big.out, .expected = all.out, .tol = {}, .what = "max offset"});
  expect_close({.actual = all.out,
                .expected = ops::scaled_dot_product_attention(q, k, v).out,
                .tol = {},
                .what = "offset tk is no mask"});
  expect_close({.actual = small.out, .expected = ops::zeros({2, 5, 3}), .tol = {}, .what = "min"});
  expect_close({.actual = none.logsumexp,
                .expected = ops::full({2, 5}, -kInf),
                .tol = {},
                .what = "offset -tq sees nothing"});
}

// Context parallelism: the chunk of queries at global positions [s, s + c) against keys [0, s + c)
// with offset s is rows s.. of the full causal attention over [0, s + c); with the upstream
// gradient zero outside those rows, the full attention's dq is the chunk's on those rows (0 before
// them) and its dk, dv are the chunk's.
TEST(AttentionCausalOffset, QueryChunkIsRowsOfFullCausalAttention) {
  struct Split {
    int64_t s, c;
  };
  uint64_t seed = 300;
  for (const Split sp : {Split{5, 3}, Split{0, 4}, Split{6, 1}, Split{3, 6}}) {
    const std::string what = fmt::format("chunk [{}, {})", sp.s, sp.s + sp.c);
    const int64_t t = sp.s + sp.c;
    const Tensor q = randn({2, 2, t, 4}, seed), k = randn({2, 2, t, 4}, seed + 1),
                 v = randn({2, 2, t, 3}, seed + 2);
    const Tensor g_chunk = randn({2, 2, sp.c, 3}, seed + 3);
    seed += 10;
    const Tensor q_chunk = ops::contiguous(ops::narrow(q, 2, sp.s, sp.c));

    const auto full = ops::scaled_dot_product_attention(q, k, v, true);
    const auto chunk = ops::scaled_dot_product_attention(q_chunk, k, v, true, 0.0, sp.s);
    expect_close({.actual = chunk.out,
                  .expected = ops::contiguous(ops::narrow(full.out, 2, sp.s, sp.c)),
                  .tol = abs_and_rel(kTol),
                  .what = what + " out"});
    expect_close({.actual = chunk.logsumexp,
                  .expected = ops::contiguous(ops::narrow(full.logsumexp, 2, sp.s, sp.c)),
                  .tol = abs_and_rel(kTol),
                  .what = what + " logsumexp"});

    // Upstream gradient of the full attention: zero on rows [0, s), g_chunk on [s, s + c).
    const Tensor g_full =
        ops::cat(std::vector<Tensor>{ops::zeros({2, 2, sp.s, 3}), g_chunk}, /*dim=*/2);
    const auto full_grads =
        ops::scaled_dot_product_attention_backward(g_full, q, k, v, full.out, full.logsumexp, true);
    const auto chunk_grads = ops::scaled_dot_product_attention_backward(
        g_chunk, q_chunk, k, v, chunk.out, chunk.logsumexp, true, 0.0, sp.s);
    expect_close({.actual = chunk_grads.dq,
                  .expected = ops::contiguous(ops::narrow(full_grads.dq, 2, sp.s, sp.c)),
                  .tol = abs_and_rel(kTol),
                  .what = what + " dq"});
    expect_close({.actual = ops::narrow(full_grads.dq, 2, 0, sp.s),
                  .expected = ops::zeros({2, 2, sp.s, 4}),
                  .tol = {},
                  .what = what + " full dq before the chunk"});
    expect_close({.actual = chunk_grads.dk,
                  .expected = full_grads.dk,
                  .tol = abs_and_rel(kTol),
                  .what = what + " dk"});
    expect_close({.actual = chunk_grads.dv,
                  .expected = full_grads.dv,
                  .tol = abs_and_rel(kTol),
                  .what = what + " dv"});
  }
}

TEST(AttentionCausalOffset, RowsThatSeeNothingAreZeroWithInfiniteLse) {
  // offset -2: queries 0 and 1 see no key; query 2 sees key 0 only, so its output is v[0].
  const Tensor q = randn({1, 4, 3}, 401), k = randn({1, 5, 3}, 402), v = randn({1, 5, 2}, 403);
  const auto r = ops::scaled_dot_product_attention(q, k, v, true, 0.0, -2);
  const Vec out = ops::to_vector(r.out), lse = ops::to_vector(r.logsumexp), vv = ops::to_vector(v);
  EXPECT_EQ(out[0], 0.0);
  EXPECT_EQ(out[1], 0.0);
  EXPECT_EQ(out[2], 0.0);
  EXPECT_EQ(out[3], 0.0);
  EXPECT_EQ(lse[0], -kInf);
  EXPECT_EQ(lse[1], -kInf);
  EXPECT_TRUE(std::isfinite(lse[2]));
  EXPECT_NEAR(out[4], vv[0], 1e-6);  // softmax of one element: exactly 1 up to f32 rounding
  EXPECT_NEAR(out[5], vv[1], 1e-6);
  const Tensor g = randn({1, 4, 2}, 404);
  const auto grads =
      ops::scaled_dot_product_attention_backward(g, q, k, v, r.out, r.logsumexp, true, 0.0, -2);
  const Vec dq = ops::to_vector(grads.dq);
  for (int n = 0; n < 6; ++n) EXPECT_EQ(dq[n], 0.0) << "dq of a row that sees nothing, " << n;
  // Keys 2..4 are seen by no query (query 3 sees keys 0..1): their dk, dv are 0.
  const Vec dk = ops::to_vector(grads.dk), dv = ops::to_vector(grads.dv);
  for (int n = 6; n < 15; ++n) EXPECT_EQ(dk[n], 0.0) << "dk of an unseen key, " << n;
  for (int n = 4; n < 10; ++n) EXPECT_EQ(dv[n], 0.0) << "dv of an unseen key, " << n;
}

TEST(AttentionCausalOffset, OffsetWithoutCausalIsAnError) {
  const Tensor q = randn({1, 3, 4}, 501);
  EXPECT_THAT(error_of([&] { ops::scaled_dot_product_attention(q, q, q, false, 0.0, 2); }),
              HasSubstr("scaled_dot_product_attention: causal_offset 2 needs is_causal = true"));
  const auto r = ops::scaled_dot_product_attention(q, q, q);
  EXPECT_THAT(error_of([&] {
                ops::scaled_dot_product_attention_backward(q, q, q, q, r.out, r.logsumexp, false,
                                                           0.0, -1);
              }),
              HasSubstr("scaled_dot_product_attention_backward: causal_offset -1 needs is_causal"));
}

TEST(AttentionCausalOffset, CallOpReadsTheOffsetAttr) {
  const Tensor q = randn({1, 4, 3}, 601), k = randn({1, 6, 3}, 602);
  const auto with =
      call_op(OpCall(OpId::scaled_dot_product_attention, {q, k, k}, {true, 0.0, int64_t{2}}));
  ASSERT_EQ(with.size(), 2u);
  expect_close({.actual = with[0],
                .expected = ops::scaled_dot_product_attention(q, k, k, true, 0.0, 2).out,
                .tol = {},
                .what = "three attrs"});
  // Two attrs (calls made before the offset existed): offset 0.
  const auto without = call_op(OpCall(OpId::scaled_dot_product_attention, {q, k, k}, {true, 0.0}));
  expect_close({.actual = without[0],
                .expected = ops::scaled_dot_product_attention(q, k, k, true).out,
                .tol = {},
                .what = "two attrs"});
}

}  // namespace
}  // namespace loom
