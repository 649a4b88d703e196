// Matmul strategies (dtensor/sharding/matmul.cc) against the single-rank result, forward and
// backward: the Megatron colwise/rowwise pairs in the nn.Linear form matmul(x, transpose(W)),
// the basic 2-D pairs, batched and broadcast-batch products, 1-D operands, 2-D meshes.
//
// Operands are small integers, so every partial sum of a product is an integer below 2^24 and
// f32 holds it exactly: a sharded GEMM (other blocking, other summation order, partial sums
// reduced across ranks) gives bit-identical results. Only the MLP check, whose second product
// multiplies non-integer gelu outputs, needs a tolerance.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/functions_nn.h"
#include "autograd/hooks.h"
#include "comm/testing/multi_rank.h"
#include "dtensor/comm_debug_mode.h"
#include "dtensor/dtensor.h"
#include "tests/dtensor/ops_test_util.h"
#include "tests/testing/collectives.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

using comm::ProcessGroup;
using comm::ReduceOp;
using comm::testing::run_on_ranks;
using loom::testing::check_op;
using loom::testing::expect_close;
using loom::testing::expect_collectives;
using loom::testing::integer_tensor;
using loom::testing::kGatherGrad;
using loom::testing::kReduceGrad;
using loom::testing::mesh_1d;
using loom::testing::mesh_2x2;
using loom::testing::Tolerance;
using Inputs = std::vector<Tensor>;

// nn.Linear without bias: x @ W^T with W (out_features, in_features).
Tensor linear(const Inputs& in) { return matmul(in[0], transpose(in[1], 0, 1)); }
Tensor mm(const Inputs& in) { return matmul(in[0], in[1]); }

TEST(OpsMatmulTest, MegatronColwiseAndRowwiseLinear) {
  for (int world : {2, 3}) {
    run_on_ranks(world, [world](ProcessGroup& pg) {
      auto mesh = mesh_1d(pg);
      const int64_t features = 3 * world + 1;  // uneven over the mesh
      const Tensor x = integer_tensor({2, 3, features}, 1);
      const Tensor w_up = integer_tensor({features, features}, 2);
      const Tensor w_down = integer_tensor({5, features}, 3);
      // Colwise: W sharded by output features (S(0)), x replicated -> y sharded on its last dim.
      check_op(mesh, {"colwise x R @ W^T, W S(0)",
                      {{x, {Replicate()}}, {w_up, {Shard(0)}}},
                      linear,
                      Placements{Shard(2)},
                      kReduceGrad});
      // Rowwise: W sharded by input features (S(1)), x sharded on its last dim -> Partial(sum).
      check_op(mesh, {"rowwise x S(-1) @ W^T, W S(1)",
                      {{x, {Shard(-1)}}, {w_down, {Shard(1)}}},
                      linear,
                      Placements{Partial(ReduceOp::kSum)}});
      // Data parallel: x sharded by batch, W replicated.
      check_op(mesh, {"x S(0) @ W^T, W R",
                      {{x, {Shard(0)}}, {w_down, {Replicate()}}},
                      linear,
                      Placements{Shard(0)},
                      kReduceGrad});
    });
  }
}

// loom::linear itself (bias included) on DTensors: recorded as linear, its forward composed of
// the matmul and add whose strategies exist. Values, gradients, placements and collectives as the
// composed form's; and the weight's gradient is laid out as the weight on each rank (dY^T X),
// where the composed form's is a transposed view (the transpose of X^T dY) that every gradient
// accumulation then added across rows.
TEST(OpsMatmulTest, LinearOnDTensorsRecordsLinearAndLaysTheWeightsGradientOutAsTheWeight) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = mesh_1d(pg);
    const Tensor x = integer_tensor({2, 3, 6}, 1), w_up = integer_tensor({8, 6}, 2),
                 b_up = integer_tensor({8}, 3), w_down = integer_tensor({5, 6}, 4);
    const auto lin = [](const Inputs& in) { return loom::linear(in[0], in[1], in[2]); };
    check_op(mesh, {"colwise linear, W S(0), b S(0)",
                    {{x, {Replicate()}}, {w_up, {Shard(0)}}, {b_up, {Shard(0)}}},
                    lin,
                    Placements{Shard(2)},
                    kReduceGrad});
    check_op(mesh, {"rowwise linear without bias, x S(-1), W S(1)",
                    {{x, {Shard(-1)}}, {w_down, {Shard(1)}}},
                    [](const Inputs& in) { return loom::linear(in[0], in[1], Tensor()); },
                    Placements{Partial(ReduceOp::kSum)}});
    // The gradient backward hands the weight (seen by a hook, before accumulation): contiguous
    // on each rank.
    Tensor w = distribute_tensor(w_up, mesh, {Shard(0)}, std::nullopt);
    w.set_requires_grad(true);
    bool seen = false, contiguous = false;
    autograd::register_hook(w, [&](const Tensor& grad) {
      seen = true;
      contiguous = local_shard(grad).is_contiguous();
      return Tensor();
    });
    const Tensor xd = distribute_tensor(x, mesh, {Replicate()}, std::nullopt);
    backward(sum(full_tensor(loom::linear(xd, w, Tensor()))));
    ASSERT_TRUE(seen);
    EXPECT_TRUE(contiguous) << "the weight's local gradient has the strides of a transposed view";
  });
}

TEST(OpsMatmulTest, MegatronMlpNeedsOneAllReduceForward) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = mesh_1d(pg);
    const Tensor x = integer_tensor({2, 3, 4}, 1), w_fc = integer_tensor({7, 4}, 2),
                 w_proj = integer_tensor({4, 7}, 3);
    const auto mlp = [](const Tensor& in, const Tensor& fc, const Tensor& proj) {
      return matmul(gelu(div(matmul(in, transpose(fc, 0, 1)), 16.0)), transpose(proj, 0, 1));
    };
    Tensor rx = ops::clone(x), rfc = ops::clone(w_fc), rproj = ops::clone(w_proj);
    for (Tensor* t : {&rx, &rfc, &rproj}) t->set_requires_grad(true);
    const Tensor expected = mlp(rx, rfc, rproj);
    backward(sum(expected));

    Tensor dx = distribute_tensor(x, mesh, {Replicate()}, std::nullopt);
    Tensor dfc = distribute_tensor(w_fc, mesh, {Shard(0)}, std::nullopt);
    Tensor dproj = distribute_tensor(w_proj, mesh, {Shard(1)}, std::nullopt);
    for (Tensor* t : {&dx, &dfc, &dproj}) t->set_requires_grad(true);
    Tensor y;
    {
      CommDebugMode comm;
      y = mlp(dx, dfc, dproj);
      expect_collectives(comm, {}, "mlp forward");
    }
    EXPECT_EQ(dtensor_spec(y).placements, (Placements{Partial()}));
    CommDebugMode comm;
    const Tensor full = full_tensor(y);
    expect_collectives(comm, {.all_reduce = 1}, "full_tensor of the Partial output");
    // The second GEMM sums non-integer gelu outputs, split over two ranks: f32 rounding in
    // another order, ~1e-6 relative.
    const Tolerance gemm{.rtol = 1e-5, .atol = 1e-5};
    expect_close({.actual = full, .expected = expected, .tol = gemm, .what = "mlp forward"});
    backward(sum(full));
    expect_close(
        {.actual = full_tensor(dx.grad()), .expected = rx.grad(), .tol = gemm, .what = "grad x"});
    expect_close({.actual = full_tensor(dfc.grad()),
                  .expected = rfc.grad(),
                  .tol = gemm,
                  .what = "grad w_fc"});
    expect_close({.actual = full_tensor(dproj.grad()),
                  .expected = rproj.grad(),
                  .tol = gemm,
                  .what = "grad w_proj"});
    EXPECT_EQ(dtensor_spec(dfc.grad()).placements, (Placements{Shard(0)}));
    EXPECT_EQ(dtensor_spec(dproj.grad()).placements, (Placements{Shard(1)}));
    EXPECT_EQ(dtensor_spec(dx.grad()).placements, (Placements{Replicate()}));
  });
}

TEST(OpsMatmulTest, BasicPairsOf2DOperands) {
  for (int world : {2, 3}) {
    run_on_ranks(world, [world](ProcessGroup& pg) {
      auto mesh = mesh_1d(pg);
      const int64_t m = 3 * world + 1, k = 3 * world + 2, n = 3 * world + 1;
      const Tensor a = integer_tensor({m, k}, 1), b = integer_tensor({k, n}, 2);
      check_op(mesh, {"S(0) @ R",
                      {{a, {Shard(0)}}, {b, {Replicate()}}},
                      mm,
                      Placements{Shard(0)},
                      kReduceGrad});
      check_op(mesh, {"R @ S(1)",
                      {{a, {Replicate()}}, {b, {Shard(1)}}},
                      mm,
                      Placements{Shard(1)},
                      kReduceGrad});
      check_op(mesh, {"S(1) @ S(0)",
                      {{a, {Shard(1)}}, {b, {Shard(0)}}},
                      mm,
                      Placements{Partial(ReduceOp::kSum)}});
      check_op(mesh,
               {"R @ R", {{a, {Replicate()}}, {b, {Replicate()}}}, mm, Placements{Replicate()}});
      // Bilinear: a Partial operand times a replicated one stays Partial.
      check_op(mesh, {"P @ R",
                      {{a, {Partial()}}, {b, {Replicate()}}},
                      mm,
                      Placements{Partial(ReduceOp::kSum)},
                      kReduceGrad});
      check_op(mesh, {"R @ P",
                      {{a, {Replicate()}}, {b, {Partial()}}},
                      mm,
                      Placements{Partial(ReduceOp::kSum)},
                      kReduceGrad});
    });
  }
}

TEST(OpsMatmulTest, BatchedAndBroadcastBatch) {
  run_on_ranks(3, [](ProcessGroup& pg) {
    auto mesh = mesh_1d(pg);
    const Tensor a = integer_tensor({7, 2, 5}, 1), b = integer_tensor({7, 5, 3}, 2),
                 w = integer_tensor({5, 3}, 3);
    check_op(mesh,
             {"bmm batch S(0)", {{a, {Shard(0)}}, {b, {Shard(0)}}}, mm, Placements{Shard(0)}});
    check_op(mesh, {"bmm batch S(0) @ R",
                    {{a, {Shard(0)}}, {b, {Replicate()}}},
                    mm,
                    Placements{Shard(0)},
                    {.backward = {.all_gather = 1}}});
    check_op(mesh, {"bmm contraction",
                    {{a, {Shard(2)}}, {b, {Shard(1)}}},
                    mm,
                    Placements{Partial(ReduceOp::kSum)}});
    // (B, M, K) @ (K, N): the 2-D operand broadcasts over the batch and stays replicated.
    check_op(mesh, {"broadcast batch S(0) @ R",
                    {{a, {Shard(0)}}, {w, {Replicate()}}},
                    mm,
                    Placements{Shard(0)},
                    kReduceGrad});
    // A batch that divides by the mesh: the weight's gradient is one GEMM over the flattened
    // rows of the local shard (MatmulBackward's fold), still no activation moves.
    check_op(mesh, {"broadcast batch S(0), divisible, @ R",
                    {{integer_tensor({6, 2, 5}, 5), {Shard(0)}}, {w, {Replicate()}}},
                    mm,
                    Placements{Shard(0)},
                    kReduceGrad});
    // Sharded on a dim the fold would merge: the fold is skipped rather than gathering `a`.
    check_op(mesh, {"broadcast batch S(1) @ R",
                    {{a, {Shard(1)}}, {w, {Replicate()}}},
                    mm,
                    Placements{Shard(1)},
                    kReduceGrad});
    check_op(mesh, {"broadcast batch R @ S(1)",
                    {{a, {Replicate()}}, {w, {Shard(1)}}},
                    mm,
                    Placements{Shard(2)},
                    kReduceGrad});
    // Size-1 batch dim broadcast against 7: (1, 2, 5) stays replicated, (7, 5, 3) keeps S(0).
    check_op(mesh, {"size-1 batch R @ S(0)",
                    {{integer_tensor({1, 2, 5}, 4), {Replicate()}}, {b, {Shard(0)}}},
                    mm,
                    Placements{Shard(0)},
                    kReduceGrad});
  });
}

TEST(OpsMatmulTest, OneDimensionalOperands) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = mesh_1d(pg);
    const Tensor v = integer_tensor({7}, 1), u = integer_tensor({7}, 2);
    const Tensor mat = integer_tensor({7, 5}, 3), mat_t = integer_tensor({5, 7}, 4);
    check_op(
        mesh,
        {"vec S(0) @ mat S(0)", {{v, {Shard(0)}}, {mat, {Shard(0)}}}, mm, Placements{Partial()}});
    check_op(mesh, {"vec R @ mat S(1)",
                    {{v, {Replicate()}}, {mat, {Shard(1)}}},
                    mm,
                    Placements{Shard(0)},
                    kReduceGrad});
    check_op(mesh, {"mat S(0) @ vec R",
                    {{mat_t, {Shard(0)}}, {v, {Replicate()}}},
                    mm,
                    Placements{Shard(0)},
                    kReduceGrad});
    check_op(
        mesh,
        {"mat S(1) @ vec S(0)", {{mat_t, {Shard(1)}}, {v, {Shard(0)}}}, mm, Placements{Partial()}});
    check_op(mesh,
             {"dot S(0) . S(0)", {{v, {Shard(0)}}, {u, {Shard(0)}}}, mm, Placements{Partial()}});
  });
}

// Global shapes that do not fit are refused on every rank, as the plain op refuses them, even
// where a rank's shards happen to fit (found from outside: rank 0 went on and waited for the
// others in its next collective).
TEST(OpsMatmulTest, GlobalShapesThatDoNotFitFailOnEveryRank) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = mesh_1d(pg);
    const Tensor a = distribute_tensor(integer_tensor({4, 4}, 1), mesh, {Shard(1)}, std::nullopt);
    const Tensor b = distribute_tensor(integer_tensor({3, 4}, 2), mesh, {Shard(0)}, std::nullopt);
    EXPECT_EQ(loom::testing::error_of([&] { matmul(a, b); }),
              "matmul: shapes (4, 4) and (3, 4) cannot be multiplied (4 != 3)");
    const Tensor batched_a =
        distribute_tensor(integer_tensor({2, 4, 3}, 3), mesh, {Shard(1)}, std::nullopt);
    const Tensor batched_b =
        distribute_tensor(integer_tensor({3, 3, 5}, 4), mesh, {Replicate()}, std::nullopt);
    EXPECT_THAT(loom::testing::error_of([&] { matmul(batched_a, batched_b); }),
                ::testing::HasSubstr("matmul"));
    EXPECT_EQ(loom::testing::error_of([&] { matmul(batched_a, batched_b); }),
              loom::testing::error_of([&] {
                matmul(integer_tensor({2, 4, 3}, 3), integer_tensor({3, 3, 5}, 4));
              }));
    // Any op (the sharding propagator runs the plain op on the global shapes first): rows 4 and
    // 5 split over 2 ranks as 2 + 2 and 3 + 2, so rank 1's shards alone would concatenate.
    const Tensor rows4 =
        distribute_tensor(integer_tensor({4, 3}, 5), mesh, {Shard(0)}, std::nullopt);
    const Tensor rows5 =
        distribute_tensor(integer_tensor({5, 3}, 6), mesh, {Shard(0)}, std::nullopt);
    const std::vector<Tensor> sharded{rows4, rows5},
        plain{integer_tensor({4, 3}, 5), integer_tensor({5, 3}, 6)};
    EXPECT_EQ(loom::testing::error_of([&] { ops::cat(sharded, 1); }),
              loom::testing::error_of([&] { ops::cat(plain, 1); }));
  });
}

TEST(OpsMatmulTest, TwoDimensionalMesh) {
  run_on_ranks(4, [](ProcessGroup& pg) {
    auto mesh = mesh_2x2(pg);
    const Tensor x = integer_tensor({5, 3, 7}, 1), w_up = integer_tensor({9, 7}, 2),
                 w_down = integer_tensor({4, 7}, 3);
    // dp on the batch, tp on features.
    check_op(mesh, {"dp x tp colwise",
                    {{x, {Shard(0), Replicate()}}, {w_up, {Replicate(), Shard(0)}}},
                    linear,
                    Placements{Shard(0), Shard(2)},
                    {.backward = {.all_reduce = 2}}});
    check_op(mesh, {"dp x tp rowwise",
                    {{x, {Shard(0), Shard(2)}}, {w_down, {Replicate(), Shard(1)}}},
                    linear,
                    Placements{Shard(0), Partial()},
                    kReduceGrad});
    // Both mesh dims on the contraction: Partial on both.
    check_op(mesh, {"2-D contraction",
                    {{x, {Shard(2), Shard(2)}}, {w_down, {Shard(1), Shard(1)}}},
                    linear,
                    Placements{Partial(), Partial()}});
  });
}

}  // namespace
}  // namespace loom
