// scaled_dot_product_attention_backward's delta_from_out (tensor/ops_nn.h), ring attention's
// per-block backward: the attention of q over keys K = [K1; K2] (two blocks along the key dim)
// gives out and logsumexp; each block's backward, run with that whole attention's out and
// logsumexp and delta_from_out = true, takes the row sums delta_i = rowsum(dO_i * out_i) of the
// whole row, so the blocks' dq sum to the whole attention's dq and their dk, dv are its dk, dv's
// rows. Without delta_from_out each block subtracts only its own rowsum(P * dP): the sum is wrong
// (checked, so the identity cannot pass by accident).
//
// CPU only (the CUDA paths take the same flag; tests/tensor/cuda_attention_test.cc's cases).
// Tolerance: f32, sums of <= 9 products of O(1) values in two orders: 1e-5 (abs + rel).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tensor/ops.h"
#include "tensor/ops_nn.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

using testing::expect_close;
using testing::Tolerance;

constexpr double kTol = 1e-5;

Tolerance abs_and_rel(double tol) { return {.rtol = tol, .atol = tol}; }

Tensor randn(const Shape& shape, uint64_t seed) { return ops::normal(shape, seed); }

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = ops::to_vector(a), y = ops::to_vector(b);
  double m = 0.0;
  for (size_t n = 0; n < x.size(); ++n) m = std::max(m, std::abs(x[n] - y[n]));
  return m;
}

// One key block of the whole attention: keys [start, start + len), with the mask the block's call
// takes (is_causal, causal_offset) to see what the whole attention's queries see of them.
struct Block {
  int64_t start, len;
  bool causal;
  int64_t offset;
};

struct Case {
  std::string what;
  int64_t tq, tk;
  bool causal;     // the whole attention's mask
  int64_t offset;  // its causal_offset
  Block b1, b2;    // b1.start = 0, b2.start = b1.len, b1.len + b2.len = tk
};

void check_case(const Case& c, uint64_t seed) {
  SCOPED_TRACE(c.what);
  const double scale = 0.45;
  // q (2, 2, tq, 4), k (2, 2, tk, 4), v (2, 2, tk, 3): two batch dims, Dv != D.
  const Tensor q = randn({2, 2, c.tq, 4}, seed), k = randn({2, 2, c.tk, 4}, seed + 1),
               v = randn({2, 2, c.tk, 3}, seed + 2);
  const Tensor g = randn({2, 2, c.tq, 3}, seed + 3);
  const auto full = ops::scaled_dot_product_attention(q, k, v, c.causal, scale, c.offset);
  const auto want = ops::scaled_dot_product_attention_backward(g, q, k, v, full.out, full.logsumexp,
                                                               c.causal, scale, c.offset);
  const auto block_grads = [&](const Block& b, bool delta_from_out) {
    const Tensor kb = ops::contiguous(ops::narrow(k, 2, b.start, b.len));
    const Tensor vb = ops::contiguous(ops::narrow(v, 2, b.start, b.len));
    return ops::scaled_dot_product_attention_backward(g, q, kb, vb, full.out, full.logsumexp,
                                                      b.causal, scale, b.offset, delta_from_out);
  };
  const auto g1 = block_grads(c.b1, true), g2 = block_grads(c.b2, true);
  expect_close({.actual = ops::add(g1.dq, g2.dq),
                .expected = want.dq,
                .tol = abs_and_rel(kTol),
                .what = c.what + " dq = dq1 + dq2"});
  expect_close({.actual = ops::cat(std::vector<Tensor>{g1.dk, g2.dk}, 2),
                .expected = want.dk,
                .tol = abs_and_rel(kTol),
                .what = c.what + " dk = [dk1; dk2]"});
  expect_close({.actual = ops::cat(std::vector<Tensor>{g1.dv, g2.dv}, 2),
                .expected = want.dv,
                .tol = abs_and_rel(kTol),
                .what = c.what + " dv = [dv1; dv2]"});

  // Each block's own rowsum(P * dP) instead: the per-block sums are wrong.
  const auto w1 = block_grads(c.b1, false), w2 = block_grads(c.b2, false);
  EXPECT_GT(max_abs_diff(ops::add(w1.dq, w2.dq), want.dq), 1e-3) << c.what << " dq";
  EXPECT_GT(max_abs_diff(ops::cat(std::vector<Tensor>{w1.dk, w2.dk}, 2), want.dk), 1e-3)
      << c.what << " dk";
  // dv does not depend on delta: the same with or without the flag.
  expect_close({.actual = ops::cat(std::vector<Tensor>{w1.dv, w2.dv}, 2),
                .expected = want.dv,
                .tol = abs_and_rel(kTol),
                .what = c.what + " dv without delta_from_out"});
}

TEST(AttentionBlockBackward, NonCausalBlocksSumToTheWholeAttention) {
  check_case({.what = "non-causal, keys 4 + 3",
              .tq = 5,
              .tk = 7,
              .causal = false,
              .offset = 0,
              .b1 = {0, 4, false, 0},
              .b2 = {4, 3, false, 0}},
             100);
  check_case({.what = "non-causal, keys 1 + 8",
              .tq = 3,
              .tk = 9,
              .causal = false,
              .offset = 0,
              .b1 = {0, 1, false, 0},
              .b2 = {1, 8, false, 0}},
             110);
}

// Ring attention's causal chunk: queries at global positions [s, s + c) against keys [0, s + c)
// (the whole attention: causal, offset s). Block 1, keys [0, s), is wholly visible to them
// (is_causal = false); block 2, keys [s, s + c), is the diagonal block (is_causal, offset 0).
TEST(AttentionBlockBackward, CausalChunkBlocksSumToTheWholeAttention) {
  uint64_t seed = 200;
  for (const auto& [s, c] : std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {6, 3}, {2, 5}}) {
    check_case({.what = "causal chunk s " + std::to_string(s) + " c " + std::to_string(c),
                .tq = c,
                .tk = s + c,
                .causal = true,
                .offset = s,
                .b1 = {0, s, false, 0},
                .b2 = {s, c, true, 0}},
               seed);
    seed += 10;
  }
}

// A causal attention with a negative offset (rows 0 and 1 see no key at all) split at key 3: the
// blocks' offsets are the whole one's less their start, so some rows see none of a block's keys
// (and the first two none of either): those keep zero gradients.
TEST(AttentionBlockBackward, RowsThatSeeNoKeyKeepZeroGradients) {
  check_case({.what = "causal offset -2, keys 3 + 4",
              .tq = 7,
              .tk = 7,
              .causal = true,
              .offset = -2,
              .b1 = {0, 3, true, -2},
              .b2 = {3, 4, true, -5}},
             300);
  const Tensor q = randn({1, 4, 4}, 310), k = randn({1, 6, 4}, 311), v = randn({1, 6, 3}, 312);
  const Tensor g = randn({1, 4, 3}, 313);
  const auto full = ops::scaled_dot_product_attention(q, k, v, true, 0.0, -2);
  const auto b = ops::scaled_dot_product_attention_backward(g, q, k, v, full.out, full.logsumexp,
                                                            true, 0.0, -2, /*delta_from_out=*/true);
  expect_close({.actual = ops::narrow(b.dq, 1, 0, 2),
                .expected = ops::zeros({1, 2, 4}),
                .tol = {},
                .what = "rows 0, 1 see no key: dq 0"});
}

// With out and logsumexp of the call's own forward, rowsum(dO * out) = rowsum(P * dP): the flag
// changes nothing beyond rounding.
TEST(AttentionBlockBackward, OwnForwardMatchesTheDefault) {
  const Tensor q = randn({2, 5, 4}, 401), k = randn({2, 8, 4}, 402), v = randn({2, 8, 3}, 403);
  const Tensor g = randn({2, 5, 3}, 404);
  for (const bool causal : {false, true}) {
    const auto f = ops::scaled_dot_product_attention(q, k, v, causal, 0.0, causal ? 3 : 0);
    const auto a = ops::scaled_dot_product_attention_backward(g, q, k, v, f.out, f.logsumexp,
                                                              causal, 0.0, causal ? 3 : 0);
    const auto b = ops::scaled_dot_product_attention_backward(
        g, q, k, v, f.out, f.logsumexp, causal, 0.0, causal ? 3 : 0, /*delta_from_out=*/true);
    expect_close({.actual = b.dq, .expected = a.dq, .tol = abs_and_rel(kTol), .what = "dq"});
    expect_close({.actual = b.dk, .expected = a.dk, .tol = abs_and_rel(kTol), .what = "dk"});
    expect_close({.actual = b.dv, .expected = a.dv, .tol = {}, .what = "dv"});
  }
}

// bf16 operands: delta is summed in f32 from the bf16 out and grad_out upcast, and the identity
// holds to bf16's rounding of the results.
TEST(AttentionBlockBackward, Bf16OutIsUpcast) {
  const Tensor q = ops::to(randn({2, 4, 4}, 501), kBFloat16),
               k = ops::to(randn({2, 6, 4}, 502), kBFloat16),
               v = ops::to(randn({2, 6, 3}, 503), kBFloat16);
  const Tensor g = ops::to(randn({2, 4, 3}, 504), kBFloat16);
  const auto full = ops::scaled_dot_product_attention(q, k, v);
  const auto want = ops::scaled_dot_product_attention_backward(
      g, q, k, v, full.out, full.logsumexp, false, 0.0, 0, /*delta_from_out=*/true);
  const auto half = [&](int64_t start, int64_t len) {
    return ops::scaled_dot_product_attention_backward(
        g, q, ops::narrow(k, 1, start, len), ops::narrow(v, 1, start, len), full.out,
        full.logsumexp, false, 0.0, 0, /*delta_from_out=*/true);
  };
  const auto a = half(0, 3), b = half(3, 3);
  EXPECT_EQ(a.dq.dtype(), kBFloat16);
  expect_close(
      {.actual = ops::to(ops::add(ops::to(a.dq, kFloat32), ops::to(b.dq, kFloat32)), kBFloat16),
       .expected = want.dq,
       .tol = abs_and_rel(2e-2),
       .what = "bf16 dq"});
  expect_close({.actual = ops::cat(std::vector<Tensor>{a.dk, b.dk}, 1),
                .expected = want.dk,
                .tol = {},
                .what = "bf16 dk"});
}

}  // namespace
}  // namespace loom
