// One context-parallel attention call against the whole sequence's attention on one rank, for
// every variant (allgather, ring, alltoall), balanced and contiguous, cp 2 and 4: this rank's
// output rows and the gradients of its q, k and v (an upstream gradient on every row) against
// one rank's and against the exact answer (f64, written out here) — the per-call check the
// model-level equivalence rests on.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/functions_nn.h"
#include "autograd/sequence_context.h"
#include "comm/testing/multi_rank.h"
#include "mesh/device_mesh.h"
#include "parallel/cp/context_parallel.h"
#include "tensor/ops.h"
#include "tensor/rng.h"
#include "tests/testing/tensor_checks.h"

namespace loom::parallel::cp {
namespace {

constexpr int64_t kB = 2, kH = 4, kT = 32, kD = 8;

// Causal attention and its gradients (upstream gradient g) computed in f64 from the f32 inputs,
// written out here (the library computes in f32): the exact answer both the one-rank kernel and
// every variant are rounded versions of.
struct Exact {
  Tensor out, dq, dk, dv;  // f32 roundings of the f64 results, (B, H, T, D)
};
Exact exact_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g) {
  const std::vector<double> qv = ops::to_vector(q), kv = ops::to_vector(k), vv = ops::to_vector(v),
                            gv = ops::to_vector(g);
  const size_t n = qv.size();
  std::vector<double> out(n, 0), dq(n, 0), dk(n, 0), dv(n, 0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kD));
  std::vector<double> p(kT), dp(kT);
  for (int64_t e = 0; e < kB * kH; ++e) {
    const auto at = [&](int64_t row) { return static_cast<size_t>((e * kT + row) * kD); };
    for (int64_t i = 0; i < kT; ++i) {
      double top = -INFINITY, sum = 0, delta = 0;
      for (int64_t j = 0; j <= i; ++j) {
        p[j] = 0;
        for (int64_t d = 0; d < kD; ++d) p[j] += qv[at(i) + d] * kv[at(j) + d] * scale;
        top = std::max(top, p[j]);
      }
      for (int64_t j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - top));
      for (int64_t j = 0; j <= i; ++j) {
        p[j] /= sum;
        dp[j] = 0;
        for (int64_t d = 0; d < kD; ++d) {
          out[at(i) + d] += p[j] * vv[at(j) + d];
          dp[j] += gv[at(i) + d] * vv[at(j) + d];
        }
        delta += p[j] * dp[j];
      }
      for (int64_t j = 0; j <= i; ++j) {
        const double ds = p[j] * (dp[j] - delta) * scale;
        for (int64_t d = 0; d < kD; ++d) {
          dq[at(i) + d] += ds * kv[at(j) + d];
          dk[at(j) + d] += ds * qv[at(i) + d];
          dv[at(j) + d] += p[j] * gv[at(i) + d];
        }
      }
    }
  }
  const auto tensor = [&](const std::vector<double>& values) {
    return ops::from_vector(std::vector<float>(values.begin(), values.end()), q.shape());
  };
  return {tensor(out), tensor(dq), tensor(dk), tensor(dv)};
}

void check(int cp, const std::string& attention, bool balance) {
  SCOPED_TRACE(fmt::format("cp {} {} {}", cp, attention, balance ? "balanced" : "contiguous"));
  comm::testing::run_on_ranks(cp, [&](comm::ProcessGroup& pg) {
    SCOPED_TRACE(fmt::format("cp {} {} {}", cp, attention, balance ? "balanced" : "contiguous"));
    const auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"cp"}, std::vector<int64_t>{cp});
    ContextParallel context(mesh, {.load_balance = balance, .attention = attention});
    const SequenceLayout layout = context.layout(kT);
    // The whole sequence, the same on every rank.
    const Tensor q = ops::normal({kB, kH, kT, kD}, 1), k = ops::normal({kB, kH, kT, kD}, 2),
                 v = ops::normal({kB, kH, kT, kD}, 3), g = ops::normal({kB, kH, kT, kD}, 4);
    // One rank's reference over all of it.
    Tensor qf = ops::clone(q), kf = ops::clone(k), vf = ops::clone(v);
    for (Tensor* t : {&qf, &kf, &vf}) t->set_requires_grad(true);
    const Tensor whole = scaled_dot_product_attention(qf, kf, vf, /*is_causal=*/true);
    backward(sum(mul(whole, g)));
    // This rank's shards through the context.
    Tensor ql = ops::contiguous(layout.shard(q, 2)), kl = ops::contiguous(layout.shard(k, 2)),
           vl = ops::contiguous(layout.shard(v, 2));
    for (Tensor* t : {&ql, &kl, &vl}) t->set_requires_grad(true);
    Tensor local;
    {
      SequenceContextGuard sharded(&context);
      local = scaled_dot_product_attention(ql, kl, vl, /*is_causal=*/true);
    }
    backward(sum(mul(local, ops::contiguous(layout.shard(g, 2)))));
    const Exact exact = exact_attention(q, k, v, g);
    // Against the exact answer, relative to the largest element (a gradient's small elements
    // carry the absolute rounding of its large ones): the one-rank kernel and every variant,
    // measured within 5e-7.
    const testing::Tolerance exact_tol{.rtol = 1e-6, .relative_to = testing::RelativeTo::kLargest};
    const auto expect_exact = [&](const Tensor& got, const Tensor& exact, const std::string& what,
                                  bool sharded) {
      testing::expect_close({.actual = got,
                             .expected = sharded ? layout.shard(exact, 2) : exact,
                             .tol = exact_tol,
                             .what = what + " against the exact answer"});
    };
    expect_exact(whole, exact.out, "one rank's output", false);
    expect_exact(qf.grad(), exact.dq, "one rank's dq", false);
    expect_exact(kf.grad(), exact.dk, "one rank's dk", false);
    expect_exact(vf.grad(), exact.dv, "one rank's dv", false);
    expect_exact(local, exact.out, "output", true);
    expect_exact(ql.grad(), exact.dq, "dq", true);
    expect_exact(kl.grad(), exact.dk, "dk", true);
    expect_exact(vl.grad(), exact.dv, "dv", true);
    // Against one rank: allgather and alltoall compute each query row as one rank does (the whole
    // row in one kernel call), so element by element within 1e-6. Ring merges the row from blocks
    // and takes the softmax's row sum from the output (delta_from_out, FlashAttention's
    // identity) where the kernel sums P * dP: rounded differently, each within 5e-7 of the exact
    // answer, so the two differ by up to the sum of their roundings, relative to the largest.
    const testing::Tolerance tol =
        attention == "ring" ? exact_tol : testing::Tolerance{.rtol = 1e-6, .atol = 1e-6};
    testing::expect_close(
        {.actual = local, .expected = layout.shard(whole, 2), .tol = tol, .what = "output"});
    testing::expect_close(
        {.actual = ql.grad(), .expected = layout.shard(qf.grad(), 2), .tol = tol, .what = "dq"});
    testing::expect_close(
        {.actual = kl.grad(), .expected = layout.shard(kf.grad(), 2), .tol = tol, .what = "dk"});
    testing::expect_close(
        {.actual = vl.grad(), .expected = layout.shard(vf.grad(), 2), .tol = tol, .what = "dv"});
  });
}

TEST(CpAttentionTest, EveryVariantEqualsTheWholeSequencesAttention) {
  for (const char* attention : {"allgather", "ring", "alltoall"}) {
    for (int cp : {2, 4}) {
      for (bool balance : {true, false}) check(cp, attention, balance);
    }
  }
}

}  // namespace
}  // namespace loom::parallel::cp
