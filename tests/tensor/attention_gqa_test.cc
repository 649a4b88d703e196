// Grouped-query attention read in place (scaled_dot_product_attention's enable_gqa,
// tensor/ops_nn.h): k and v with Hkv heads serve Hq = g Hkv query heads, query head h using
// key/value head h / g. Checked against the same call on k and v repeated to every query head
// (what Llama did before, and torch's enable_gqa means): outputs and dq bit for bit (each query
// row is computed the same way), dk and dv the repeated call's gradients summed over each group
// (bit for bit at g = 2, where the kernel adds the second head's part to the first's as the sum
// does; to f32 rounding at g = 3, whose three parts may be added in another order).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "autograd/functions_nn.h"
#include "base/error.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/ops_nn.h"
#include "tests/tensor/attention_grads.h"
#include "tests/tensor/tensor_test_util.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

using testing::autograd_grads;
using testing::error_of;
using testing::expect_close;
using testing::expect_grads_close;
using ::testing::HasSubstr;
using testing::Tolerance;

constexpr Tolerance kRounding{.rtol = 1e-6, .atol = 1e-6};  // a sum of three in another order

Tensor randn(const Shape& shape, uint64_t seed) { return ops::normal(shape, seed); }

// (B, Hkv, T, n) -> (B, Hkv g, T, n): each key/value head repeated for its g query heads.
Tensor repeat_heads(const Tensor& t, int64_t group) {
  const Shape& s = t.shape();
  return ops::reshape(
      ops::contiguous(ops::expand(ops::unsqueeze(t, 2), {s[0], s[1], group, s[2], s[3]})),
      {s[0], s[1] * group, s[2], s[3]});
}
// The repeated call's gradient (B, Hkv g, T, n) summed over each group.
Tensor sum_groups(const Tensor& t, int64_t group) {
  const Shape& s = t.shape();
  return ops::sum(ops::reshape(t, {s[0], s[1] / group, group, s[2], s[3]}), {2});
}

struct GqaCase {
  int64_t hq, hkv, tq, tk, d, dv;
  bool causal;
  double dropout;
};

TEST(AttentionGqa, EqualsKeysAndValuesRepeatedPerQueryHead) {
  const std::vector<GqaCase> cases = {
      {4, 2, 9, 9, 8, 8, true, 0.0},    // Llama's shape (g = 2)
      {6, 2, 7, 11, 4, 5, false, 0.0},  // g = 3, Tq != Tk, Dv != D
      {6, 3, 8, 8, 8, 8, true, 0.3},    // with dropout (its mask per query head)
      {3, 1, 5, 5, 4, 4, true, 0.0},    // multi-query attention (one key/value head)
  };
  uint64_t seed = 600;
  for (const GqaCase& c : cases) {
    const std::string what = fmt::format("Hq {} Hkv {} tq {} tk {} causal {} dropout {}", c.hq,
                                         c.hkv, c.tq, c.tk, c.causal, c.dropout);
    SCOPED_TRACE(what);
    const int64_t group = c.hq / c.hkv;
    const Tensor q = randn({2, c.hq, c.tq, c.d}, seed), k = randn({2, c.hkv, c.tk, c.d}, seed + 1),
                 v = randn({2, c.hkv, c.tk, c.dv}, seed + 2),
                 g = randn({2, c.hq, c.tq, c.dv}, seed + 3);
    const AttentionDropout dropout{.p = c.dropout, .seed = seed + 4};
    seed += 10;
    const Tensor kr = repeat_heads(k, group), vr = repeat_heads(v, group);
    const auto repeated = ops::scaled_dot_product_attention(q, kr, vr, c.causal, 0.0, 0, dropout);
    const auto grouped =
        ops::scaled_dot_product_attention(q, k, v, c.causal, 0.0, 0, dropout, /*enable_gqa=*/true);
    expect_close({.actual = grouped.out, .expected = repeated.out, .tol = {}, .what = "out"});
    expect_close(
        {.actual = grouped.logsumexp, .expected = repeated.logsumexp, .tol = {}, .what = "lse"});

    const auto rg = ops::scaled_dot_product_attention_backward(
        g, q, kr, vr, repeated.out, repeated.logsumexp, c.causal, 0.0, 0, false, dropout);
    const auto gg = ops::scaled_dot_product_attention_backward(
        g, q, k, v, grouped.out, grouped.logsumexp, c.causal, 0.0, 0, false, dropout, true);
    const Tolerance sums = group == 2 ? Tolerance{} : kRounding;
    expect_close({.actual = gg.dq, .expected = rg.dq, .tol = {}, .what = "dq"});
    expect_close(
        {.actual = gg.dk, .expected = sum_groups(rg.dk, group), .tol = sums, .what = "dk"});
    expect_close(
        {.actual = gg.dv, .expected = sum_groups(rg.dv, group), .tol = sums, .what = "dv"});

    // The autograd spelling records the grouping for its backward.
    Tensor ql = ops::clone(q), kl = ops::clone(k), vl = ops::clone(v);
    for (Tensor* t : {&ql, &kl, &vl}) t->set_requires_grad(true);
    const Tensor y = scaled_dot_product_attention(ql, kl, vl, c.causal, 0.0, 0, dropout, true);
    expect_grads_close(autograd_grads(y, g, ql, kl, vl), {gg.dq, gg.dk, gg.dv}, {},
                       "loom:: autograd");
  }
}

TEST(AttentionGqa, HeadsThatDoNotGroupAreNamed) {
  const Tensor q = randn({2, 4, 5, 8}, 1), k = randn({2, 2, 5, 8}, 2), k3 = randn({2, 3, 5, 8}, 3);
  EXPECT_THAT(
      error_of([&] { ops::scaled_dot_product_attention(q, k, k); }),
      HasSubstr("(k and v with fewer heads: pass enable_gqa = true), got shapes q (2, 4, 5, "
                "8), k (2, 2, 5, 8)"));
  EXPECT_THAT(
      error_of([&] { ops::scaled_dot_product_attention(q, k3, k3, false, 0, 0, {}, true); }),
      HasSubstr("grouped-query attention needs k and v with one head count dividing q's"));
  EXPECT_THAT(error_of([&] { ops::scaled_dot_product_attention(q, k, k3, false, 0, 0, {}, true); }),
              HasSubstr("grouped-query attention needs k and v with one head count"));
  const Tensor other_batch = randn({3, 2, 5, 8}, 4);
  EXPECT_THAT(error_of([&] {
                ops::scaled_dot_product_attention(q, other_batch, other_batch, false, 0, 0, {},
                                                  true);
              }),
              HasSubstr("must have the same leading (batch) dims but for the heads (dim -3)"));
}

}  // namespace
}  // namespace loom
