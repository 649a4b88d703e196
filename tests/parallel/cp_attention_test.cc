// One context-parallel attention call against the whole sequence's attention on one rank, for
// every variant (allgather, ring, alltoall), balanced and contiguous, cp 2 and 4: this rank's
// output rows and the gradients of its q, k and v (an upstream gradient on every row) within
// 1e-6 relative — the per-call check the model-level equivalence rests on.
#include <fmt/format.h>
#include <gtest/gtest.h>

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
    const testing::Tolerance tol{.rtol = 1e-6, .atol = 1e-6};
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
