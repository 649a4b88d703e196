// Dropout on attention's probabilities (AttentionDropout, tensor/ops_nn.h): the fused call
// equals dropout(softmax(scale * q k^T + mask), p, seed, region) @ v composed from other ops, its
// keep-mask is bernoulli_keep_mask's bit for bit, the backward redraws the same mask, and a
// region places a piece of the attention (heads, a block of queries) in the whole's mask.
//
// Tolerances: f32 everywhere; the fused row kernel and the composed GEMMs sum <= 40 products of
// O(1) values (times 1 / (1 - p) <= 2) in different orders: 2e-5 (abs + rel), as
// attention_offset_test.cc. Pieces of one call computed alone run the same row computations as
// the whole, so those compare bit for bit.
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
#include "tensor/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/ops_nn.h"
#include "tensor/rng.h"
#include "tests/tensor/attention_grads.h"
#include "tests/tensor/tensor_test_util.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

using testing::error_of;
using testing::expect_close;
using ::testing::HasSubstr;
using testing::Tolerance;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr Tolerance kComposed{.rtol = 2e-5, .atol = 2e-5};  // see top

Tensor randn(const Shape& shape, uint64_t seed) { return ops::normal(shape, seed); }

Tensor leaf(const Shape& shape, uint64_t seed) {
  Tensor t = ops::clone(randn(shape, seed));
  t.set_requires_grad(true);
  return t;
}

Tensor dropout_probs(const Tensor& probs, const AttentionDropout& dropout) {
  return ops::dropout(probs, dropout.p, dropout.seed, true, dropout.region).out;
}

// The identity matrix (n, n).
Tensor eye(int64_t n) {
  std::vector<float> values(static_cast<size_t>(n * n), 0.0f);
  for (int64_t i = 0; i < n; ++i) values[i * n + i] = 1.0f;
  return ops::from_vector(values, {n, n});
}

// dropout(softmax(q k^T * scale, causal keys j > i + offset hidden), p, seed) @ v, recorded by
// autograd through the composed ops (every row here sees at least one key).
Tensor reference(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal,
                 int64_t offset, const AttentionDropout& dropout) {
  const int64_t tq = q.size(-2), tk = k.size(-2);
  std::vector<float> hide(static_cast<size_t>(tq * tk));
  for (int64_t i = 0; i < tq; ++i) {
    for (int64_t j = 0; j < tk; ++j) hide[i * tk + j] = causal && j > i + offset ? 1.0f : 0.0f;
  }
  const Tensor scores = ops::masked_fill(ops::mul(ops::matmul(q, ops::transpose(k, -1, -2)), scale),
                                         ops::from_vector(hide, {tq, tk}), -kInf);
  const Tensor probs = ops::softmax(scores, -1);
  return ops::matmul(dropout_probs(probs, dropout), v);
}

using Grads = testing::AttentionGradients;
using testing::autograd_grads;
using testing::expect_grads_close;

struct DropoutCase {
  Shape batch;
  int64_t tq, tk, d, dv;
  bool causal;
  int64_t offset;
  double p;
};

TEST(AttentionDropout, ForwardAndBackwardMatchComposedDropout) {
  const std::vector<DropoutCase> cases = {
      {{2, 3}, 37, 37, 16, 16, false, 0, 0.1}, {{2, 3}, 37, 37, 16, 16, true, 0, 0.1},
      {{2, 2}, 5, 9, 4, 3, true, 4, 0.5},  // bottom-right, Dv != D
      {{3}, 8, 8, 8, 8, true, 0, 0.9},     // one batch dim, most dropped
      {{}, 6, 11, 4, 5, false, 0, 0.3},    // no batch dims
  };
  uint64_t seed = 300;
  for (const DropoutCase& c : cases) {
    const std::string what = fmt::format("batch {} tq {} tk {} causal {} offset {} p {}",
                                         shape_str(c.batch), c.tq, c.tk, c.causal, c.offset, c.p);
    SCOPED_TRACE(what);
    auto with = [&](int64_t t, int64_t n) {
      Shape s = c.batch;
      s.insert(s.end(), {t, n});
      return s;
    };
    const double scale = 0.45;
    const Tensor q = leaf(with(c.tq, c.d), seed), k = leaf(with(c.tk, c.d), seed + 1),
                 v = leaf(with(c.tk, c.dv), seed + 2);
    const Tensor g = randn(with(c.tq, c.dv), seed + 3);
    const AttentionDropout dropout{.p = c.p, .seed = seed + 4};
    seed += 10;
    const Tensor ref = reference(q, k, v, scale, c.causal, c.offset, dropout);
    const Grads ref_grads = autograd_grads(ref, g, q, k, v);

    ops::AttentionResult r;
    ops::AttentionGrads grads;
    {
      NoGradGuard no_grad;
      r = ops::scaled_dot_product_attention(q, k, v, c.causal, scale, c.offset, dropout);
      grads = ops::scaled_dot_product_attention_backward(g, q, k, v, r.out, r.logsumexp, c.causal,
                                                         scale, c.offset, false, dropout);
    }
    expect_close({.actual = r.out, .expected = ref, .tol = kComposed, .what = what + " out"});
    // The logsumexp is the undropped softmax's: as without dropout, bit for bit.
    const auto plain = ops::scaled_dot_product_attention(q, k, v, c.causal, scale, c.offset);
    expect_close(
        {.actual = r.logsumexp, .expected = plain.logsumexp, .tol = {}, .what = what + " lse"});
    expect_grads_close({grads.dq, grads.dk, grads.dv}, ref_grads, kComposed, what + " backward op");

    // The autograd spelling: its formula redraws the forward's mask from the same seed.
    const Tensor y = scaled_dot_product_attention(q, k, v, c.causal, scale, c.offset, dropout);
    expect_close({.actual = y, .expected = r.out, .tol = {}, .what = what + " loom:: out"});
    expect_grads_close(autograd_grads(y, g, q, k, v), {grads.dq, grads.dk, grads.dv}, {},
                       what + " loom:: autograd");
    // The delta_from_out spelling (ring attention's: row sums from dO . out) agrees.
    NoGradGuard no_grad;
    const auto from_out = ops::scaled_dot_product_attention_backward(
        g, q, k, v, r.out, r.logsumexp, c.causal, scale, c.offset, true, dropout);
    expect_grads_close({from_out.dq, from_out.dk, from_out.dv}, ref_grads, kComposed,
                       what + " delta_from_out");
  }
}

TEST(AttentionDropout, DropsExactlyTheBernoulliKeepMask) {
  // q = 0: every visible key has probability 1 / tk; v = I: out[i][j] is P_ij's dropped value.
  const int64_t tk = 24;
  const Tensor q = ops::zeros({2, 3, tk, 4}), k = randn({2, 3, tk, 4}, 11);
  const Tensor v = ops::contiguous(ops::expand(eye(tk), {2, 3, tk, tk}));
  const double p = 0.25;
  const uint64_t seed = 4242;
  const auto r = ops::scaled_dot_product_attention(q, k, v, false, 0.0, 0, {.p = p, .seed = seed});
  const Tensor mask = ops::bernoulli_keep_mask({2, 3, tk, tk}, seed, p);
  const float kept = (1.0f / static_cast<float>(tk)) * static_cast<float>(1.0 / (1.0 - p));
  expect_close({.actual = r.out, .expected = ops::mul(mask, kept), .tol = {}, .what = "mask"});
  // About p of them dropped (24 * 24 * 6 = 3456 draws: 4 standard deviations is 0.03).
  const double dropped = 1.0 - ops::sum(mask).item<float>() / static_cast<double>(mask.numel());
  EXPECT_NEAR(dropped, p, 0.03);
}

TEST(AttentionDropout, ZeroIsNoDropoutAndOneDropsEverything) {
  const Tensor q = leaf({2, 5, 4}, 21), k = leaf({2, 7, 4}, 22), v = leaf({2, 7, 3}, 23);
  const Tensor g = randn({2, 5, 3}, 24);
  const auto plain = ops::scaled_dot_product_attention(q, k, v, true);
  const auto zero = ops::scaled_dot_product_attention(q, k, v, true, 0.0, 0, {.p = 0.0, .seed = 9});
  expect_close({.actual = zero.out, .expected = plain.out, .tol = {}, .what = "p = 0"});
  const auto all = ops::scaled_dot_product_attention(q, k, v, true, 0.0, 0, {.p = 1.0, .seed = 9});
  expect_close({.actual = all.out, .expected = ops::zeros({2, 5, 3}), .tol = {}, .what = "p = 1"});
  const Grads grads = autograd_grads(
      scaled_dot_product_attention(q, k, v, true, 0.0, 0, {.p = 1.0, .seed = 9}), g, q, k, v);
  expect_grads_close(grads, {ops::zeros(q.shape()), ops::zeros(k.shape()), ops::zeros(v.shape())},
                     {}, "p = 1 gradients");
  // And a seed is a seed: another one drops other elements.
  const auto a = ops::scaled_dot_product_attention(q, k, v, true, 0.0, 0, {.p = 0.5, .seed = 1});
  const auto b = ops::scaled_dot_product_attention(q, k, v, true, 0.0, 0, {.p = 0.5, .seed = 2});
  EXPECT_NE(ops::to_vector(a.out), ops::to_vector(b.out));
}

TEST(AttentionDropout, ARegionPlacesAPieceInTheWholeMask) {
  // The whole: (2, 4, 10, 10), causal. Pieces: heads 1..2 of it, and queries 6..9 (against every
  // key, offset 6), each told where it sits.
  const Tensor q = randn({2, 4, 10, 8}, 31), k = randn({2, 4, 10, 8}, 32),
               v = randn({2, 4, 10, 8}, 33), g = randn({2, 4, 10, 8}, 34);
  const AttentionDropout whole_dropout{.p = 0.4, .seed = 77};
  const auto whole = ops::scaled_dot_product_attention(q, k, v, true, 0.0, 0, whole_dropout);
  const auto whole_grads = ops::scaled_dot_product_attention_backward(
      g, q, k, v, whole.out, whole.logsumexp, true, 0.0, 0, false, whole_dropout);

  auto heads = [](const Tensor& t) { return ops::contiguous(ops::narrow(t, 1, 1, 2)); };
  const AttentionDropout head_dropout{
      .p = 0.4, .seed = 77, .region = {{2, 4, 10, 10}, {0, 1, 0, 0}}};
  const auto piece =
      ops::scaled_dot_product_attention(heads(q), heads(k), heads(v), true, 0.0, 0, head_dropout);
  expect_close({.actual = piece.out, .expected = heads(whole.out), .tol = {}, .what = "heads"});
  const auto piece_grads = ops::scaled_dot_product_attention_backward(
      heads(g), heads(q), heads(k), heads(v), piece.out, piece.logsumexp, true, 0.0, 0, false,
      head_dropout);
  expect_grads_close({piece_grads.dq, piece_grads.dk, piece_grads.dv},
                     {heads(whole_grads.dq), heads(whole_grads.dk), heads(whole_grads.dv)}, {},
                     "heads' gradients");

  auto late = [](const Tensor& t) { return ops::contiguous(ops::narrow(t, 2, 6, 4)); };
  const AttentionDropout late_dropout{
      .p = 0.4, .seed = 77, .region = {{2, 4, 10, 10}, {0, 0, 6, 0}}};
  const auto rows = ops::scaled_dot_product_attention(late(q), k, v, true, 0.0, 6, late_dropout);
  expect_close({.actual = rows.out, .expected = late(whole.out), .tol = {}, .what = "queries"});
  const auto row_grads = ops::scaled_dot_product_attention_backward(
      late(g), late(q), k, v, rows.out, rows.logsumexp, true, 0.0, 6, false, late_dropout);
  expect_close(
      {.actual = row_grads.dq, .expected = late(whole_grads.dq), .tol = {}, .what = "queries' dq"});
  // Without the region the piece draws its own mask, not its slice of the whole's.
  const auto unplaced = ops::scaled_dot_product_attention(heads(q), heads(k), heads(v), true, 0.0,
                                                          0, {.p = 0.4, .seed = 77});
  EXPECT_NE(ops::to_vector(unplaced.out), ops::to_vector(heads(whole.out)));
}

TEST(AttentionDropout, BadDropoutIsNamed) {
  const Tensor q = randn({2, 3, 5, 4}, 41);
  EXPECT_THAT(error_of([&] {
                ops::scaled_dot_product_attention(q, q, q, false, 0.0, 0, {.p = 1.5, .seed = 1});
              }),
              HasSubstr("dropout probability must be in [0, 1], got 1.5"));
  EXPECT_THAT(
      error_of([&] {
        ops::scaled_dot_product_attention(q, q, q, false, 0.0, 0,
                                          {.p = 0.1, .seed = 1, .region = {{2, 3, 5}, {}}});
      }),
      HasSubstr("does not match this call's probabilities (batch..., Tq, Tk) = (2, 3, 5, 5)"));
  EXPECT_THAT(error_of([&] {
                ops::scaled_dot_product_attention(
                    q, q, q, false, 0.0, 0,
                    {.p = 0.1, .seed = 1, .region = {{2, 3, 5, 5}, {0, 1, 0, 0}}});
              }),
              HasSubstr("at offset (0, 1, 0, 0) do not fit in the dropout region's global shape"));
  const Tensor five = randn({2, 2, 2, 5, 4}, 42);
  EXPECT_THAT(error_of([&] {
                ops::scaled_dot_product_attention(
                    five, five, five, false, 0.0, 0,
                    {.p = 0.1, .seed = 1, .region = {{4, 2, 2, 5, 5}, {2, 0, 0, 0, 0}}});
              }),
              HasSubstr("a dropout region takes at most two batch dims"));
}

}  // namespace
}  // namespace loom
