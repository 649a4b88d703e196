// Elementwise strategies (dtensor/sharding/elementwise.cc) against the single-rank result,
// forward and backward: binary ops with broadcasting, Partial linearity, unary ops,
// where/masked_fill, 0-dim operands.
//
// Data is integer-valued (or, for log/sqrt, positive values chosen per element), and an
// elementwise kernel computes each element the same way whether it sees the whole tensor or a
// shard, so forward results compare bit for bit. Gradients of broadcast operands are summed
// over a sharded dim (local sums, then an all-reduce): exact too while the values are integers.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "base/error.h"
#include "comm/testing/multi_rank.h"
#include "dtensor/dtensor.h"
#include "dtensor/sharding/propagator.h"
#include "dtensor/sharding/strategy.h"
#include "tensor/dispatch.h"
#include "tests/dtensor/ops_test_util.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

using comm::ProcessGroup;
using comm::ReduceOp;
using comm::testing::run_on_ranks;
using loom::testing::check_op;
using loom::testing::expect_equal;
using loom::testing::float_tensor;
using loom::testing::integer_tensor;
using loom::testing::kExact;
using loom::testing::kGatherGrad;
using loom::testing::kReduceGrad;
using loom::testing::make_mesh;
using loom::testing::mesh_1d;
using loom::testing::mesh_2x2;
using loom::testing::Tolerance;
using ::testing::HasSubstr;
using Inputs = std::vector<Tensor>;

// Values in [1, 9) with no zeros: safe divisors.
Tensor positive_tensor(const Shape& shape, uint64_t seed) {
  return ops::add(ops::abs(integer_tensor(shape, seed)), 1.0);
}

TEST(OpsElementwiseTest, BinaryOpsWithBroadcastingOn1DMeshes) {
  for (int world : {2, 3}) {
    run_on_ranks(world, [world](ProcessGroup& pg) {
      auto mesh = mesh_1d(pg);
      const int64_t rows = 3 * world + 1, cols = 5;  // uneven along dim 0
      const Tensor x = integer_tensor({rows, cols}, 1), y = integer_tensor({rows, cols}, 2);
      const Tensor bias = integer_tensor({cols}, 3), column = integer_tensor({rows, 1}, 4);
      const Tensor d = positive_tensor({rows, cols}, 5);
      const auto add_op = [](const Inputs& in) { return add(in[0], in[1]); };
      const auto sub_op = [](const Inputs& in) { return sub(in[0], in[1]); };
      const auto mul_op = [](const Inputs& in) { return mul(in[0], in[1]); };
      const auto div_op = [](const Inputs& in) { return div(in[0], in[1]); };
      check_op(mesh,
               {"add S(0)+S(0)", {{x, {Shard(0)}}, {y, {Shard(0)}}}, add_op, Placements{Shard(0)}});
      check_op(mesh, {"sub S(1)-R",
                      {{x, {Shard(1)}}, {y, {Replicate()}}},
                      sub_op,
                      Placements{Shard(1)},
                      kGatherGrad});
      check_op(mesh, {"mul R*S(0)",
                      {{x, {Replicate()}}, {y, {Shard(0)}}},
                      mul_op,
                      Placements{Shard(0)},
                      kGatherGrad});
      check_op(mesh,
               {"div S(0)/S(0)", {{x, {Shard(0)}}, {d, {Shard(0)}}}, div_op, Placements{Shard(0)}});
      // Broadcast operands: a bias (cols,) that lacks dim 0 stays Replicate; sharded along the
      // output's dim 1 it follows the shard.
      check_op(mesh, {"add S(0)+bias R",
                      {{x, {Shard(0)}}, {bias, {Replicate()}}},
                      add_op,
                      Placements{Shard(0)},
                      kReduceGrad});
      check_op(mesh, {"mul S(1)*bias S(0)",
                      {{x, {Shard(1)}}, {bias, {Shard(0)}}},
                      mul_op,
                      Placements{Shard(1)}});
      check_op(mesh, {"sub bias S(0)-S(1)",
                      {{bias, {Shard(0)}}, {x, {Shard(1)}}},
                      sub_op,
                      Placements{Shard(1)}});
      // A size-1 dim broadcasts: (rows, 1) S(0) * (rows, cols) S(0) -> S(0).
      check_op(mesh, {"mul column S(0)*S(0)",
                      {{column, {Shard(0)}}, {y, {Shard(0)}}},
                      mul_op,
                      Placements{Shard(0)}});
      // Division with a broadcast divisor: the divisor's gradient sums -g*a/b^2 (not integers)
      // over the sharded rows, locally per shard and then across ranks, in another order than
      // the single-rank sum: f32 rounding, ~1e-6 relative.
      const Tolerance summed{.rtol = 1e-5, .atol = 1e-5};
      check_op(mesh, {"div S(0)/bias R",
                      {{x, {Shard(0)}}, {positive_tensor({cols}, 6), {Replicate()}}},
                      div_op,
                      Placements{Shard(0)},
                      kReduceGrad,
                      kExact,
                      summed});
      // (B, T, C) + (C,) with C sharded.
      const Tensor x3 = integer_tensor({2, 3, 2 * world + 1}, 7),
                   b3 = integer_tensor({2 * world + 1}, 8);
      check_op(mesh, {"add (B,T,C) S(2) + (C) S(0)",
                      {{x3, {Shard(2)}}, {b3, {Shard(0)}}},
                      add_op,
                      Placements{Shard(2)}});
    });
  }
}

TEST(OpsElementwiseTest, BinaryOpsWithBroadcastingOn2x2Mesh) {
  run_on_ranks(4, [](ProcessGroup& pg) {
    auto mesh = mesh_2x2(pg);
    const Tensor x = integer_tensor({5, 7}, 1), y = integer_tensor({5, 7}, 2),
                 bias = integer_tensor({7}, 3);
    const auto add_op = [](const Inputs& in) { return add(in[0], in[1]); };
    const auto mul_op = [](const Inputs& in) { return mul(in[0], in[1]); };
    check_op(mesh, {"add [S(0),S(1)]+[S(0),S(1)]",
                    {{x, {Shard(0), Shard(1)}}, {y, {Shard(0), Shard(1)}}},
                    add_op,
                    Placements{Shard(0), Shard(1)}});
    check_op(mesh, {"mul [S(0),S(1)]*[R,S(1)]",
                    {{x, {Shard(0), Shard(1)}}, {y, {Replicate(), Shard(1)}}},
                    mul_op,
                    Placements{Shard(0), Shard(1)},
                    kGatherGrad});
    check_op(mesh, {"mul [S(0),S(1)]*bias [R,S(0)]",
                    {{x, {Shard(0), Shard(1)}}, {bias, {Replicate(), Shard(0)}}},
                    mul_op,
                    Placements{Shard(0), Shard(1)},
                    kReduceGrad});
    // Both mesh dims on one tensor dim (nested): 5 rows over 4 ranks -> 2, 1, 1, 1. The bias
    // gradient is Partial on both mesh dims: one all-reduce per mesh dim.
    check_op(mesh, {"add [S(0),S(0)]+R bias",
                    {{x, {Shard(0), Shard(0)}}, {bias, {Replicate(), Replicate()}}},
                    add_op,
                    Placements{Shard(0), Shard(0)},
                    {.backward = {.all_reduce = 2}}});
  });
}

// Partial inputs built from a different part per rank (not just rank 0 holding the value):
// rank r holds part r; the logical tensor is the sum of the parts.
struct PartialInput {
  Shape shape;
  bool partial;
};

void check_partial(ProcessGroup& pg, const std::string& name,
                   const std::vector<PartialInput>& specs,
                   const std::function<Tensor(const Inputs&)>& op,
                   std::optional<Placement> expected) {
  SCOPED_TRACE(name);
  auto mesh = mesh_1d(pg);
  Inputs fulls, reference, locals, inputs;
  for (size_t i = 0; i < specs.size(); ++i) {
    Tensor full = ops::zeros(specs[i].shape);
    Tensor mine;
    for (int r = 0; r < pg.size(); ++r) {
      const Tensor part = integer_tensor(specs[i].shape, 100 * i + r);
      full = ops::add(full, part);
      if (r == pg.rank()) mine = part;
    }
    Tensor ref = ops::clone(full);
    ref.set_requires_grad(true);
    reference.push_back(ref);
    if (specs[i].partial) {
      Tensor local = ops::clone(mine);
      local.set_requires_grad(true);
      locals.push_back(local);
      inputs.push_back(from_local(local, mesh, {Partial()}));
    } else {
      locals.push_back(Tensor());
      Tensor t = distribute_tensor(full, mesh, {Replicate()}, std::nullopt);
      t.set_requires_grad(true);
      inputs.push_back(t);
    }
  }
  const Tensor expected_out = op(reference);
  const Tensor weights = integer_tensor(expected_out.shape(), 77);
  backward(sum(mul(expected_out, weights)));

  const Tensor out = op(inputs);
  const Placement got = dtensor_spec(out).placements[0];
  if (expected) {
    EXPECT_EQ(got.str(), expected->str());
  } else {
    EXPECT_FALSE(got.is_partial())
        << "a non-linear op must not leave a Partial result, got " << got.str();
  }
  const Tensor full = full_tensor(out);
  expect_equal({.actual = full, .expected = expected_out, .what = name + " forward"});
  backward(sum(mul(full, weights)));
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string what = name + " grad of input " + std::to_string(i);
    // A Partial input's parts each receive the whole gradient (d(sum of parts)/d(part) = 1).
    const Tensor grad = specs[i].partial ? locals[i].grad() : full_tensor(inputs[i].grad());
    ASSERT_TRUE(grad.defined()) << what;
    expect_equal({.actual = grad, .expected = reference[i].grad(), .what = what});
  }
}

TEST(OpsElementwiseTest, PartialPassesThroughLinearOpsAndIsReducedBeforeNonLinearOnes) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    const Shape s{4, 3};
    const Placement p = Partial(ReduceOp::kSum);
    check_partial(
        pg, "P+P", {{s, true}, {s, true}}, [](const Inputs& in) { return add(in[0], in[1]); }, p);
    check_partial(
        pg, "P-P", {{s, true}, {s, true}}, [](const Inputs& in) { return sub(in[0], in[1]); }, p);
    check_partial(
        pg, "P*R", {{s, true}, {s, false}}, [](const Inputs& in) { return mul(in[0], in[1]); }, p);
    check_partial(
        pg, "R*P", {{s, false}, {s, true}}, [](const Inputs& in) { return mul(in[0], in[1]); }, p);
    check_partial(
        pg, "P*R broadcast", {{s, true}, {{3}, false}},
        [](const Inputs& in) { return mul(in[0], in[1]); }, p);
    check_partial(
        pg, "-P", {{s, true}}, [](const Inputs& in) { return neg(in[0]); }, p);
    check_partial(
        pg, "P*2", {{s, true}}, [](const Inputs& in) { return mul(in[0], 2.0); }, p);
    // Bilinear: one operand is reduced, the other may stay Partial (P * R -> P).
    check_partial(
        pg, "P*P", {{s, true}, {s, true}}, [](const Inputs& in) { return mul(in[0], in[1]); }, p);
    // Not linear in the Partial operand: the strategy reduces it first.
    check_partial(
        pg, "P+1", {{s, true}}, [](const Inputs& in) { return add(in[0], 1.0); }, std::nullopt);
    check_partial(
        pg, "relu(P)", {{s, true}}, [](const Inputs& in) { return relu(in[0]); }, std::nullopt);
    check_partial(
        pg, "exp(P)*R", {{s, true}, {s, false}},
        [](const Inputs& in) { return mul(exp(div(in[0], 8.0)), in[1]); }, std::nullopt);
  });
}

TEST(OpsElementwiseTest, PartialPlusReplicateAddsTheReplicatedValueOnce) {
  run_on_ranks(3, [](ProcessGroup& pg) {
    const Shape s{5};
    // R -> P is a local step (zeros on all but the first rank), so the sum may stay Partial; what
    // matters is that the replicated operand is counted once, not once per rank.
    check_partial(
        pg, "P+R", {{s, true}, {s, false}}, [](const Inputs& in) { return add(in[0], in[1]); },
        Partial(ReduceOp::kSum));
  });
}

TEST(OpsElementwiseTest, AveragePartialsStayAverage) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = mesh_1d(pg);
    // P(avg): every rank holds a value; the logical tensor is their mean.
    const Tensor a = ops::full({4}, 2.0 * (pg.rank() + 1)),
                 b = ops::full({4}, 4.0 * (pg.rank() + 1));
    Tensor x = from_local(a, mesh, {Partial(ReduceOp::kAvg)}),
           y = from_local(b, mesh, {Partial(ReduceOp::kAvg)});
    Tensor z = add(x, y);
    EXPECT_EQ(dtensor_spec(z).placements, (Placements{Partial(ReduceOp::kAvg)}));
    expect_equal(
        {.actual = full_tensor(z), .expected = ops::full({4}, 3.0 + 6.0), .what = "P(avg)+P(avg)"});
  });
}

TEST(OpsElementwiseTest, InPlaceOpsKeepAPartialSelfOnlyWhereTheyAreExact) {
  // Found from outside: mul_ and add_ on a Partial(max) self computed on each rank's part as if
  // it were a sum (mul_(P(max) [2, 10], -1) gave [-1, -5]). In place, self cannot move: the op
  // keeps it where it is exact and refuses it, naming the placement, where it is not.
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = mesh_1d(pg);
    const int rank = pg.rank();
    // P(max) over [1, 10] and [2, 5]: the logical tensor is [2, 10].
    const auto max_partial = [&] {
      return from_local(
          ops::from_vector(rank == 0 ? std::vector<float>{1, 10} : std::vector<float>{2, 5}, {2}),
          mesh, {Partial(ReduceOp::kMax)});
    };
    Tensor scaled = max_partial();
    ops::mul_(scaled, 3.0);  // a factor >= 0 keeps the max
    EXPECT_EQ(dtensor_spec(scaled).placements, (Placements{Partial(ReduceOp::kMax)}));
    expect_equal({.actual = full_tensor(scaled),
                  .expected = ops::from_vector({6, 30}, {2}),
                  .what = "mul_(P(max), 3)"});
    Tensor negated = max_partial();
    EXPECT_THAT(testing::error_of([&] { ops::mul_(negated, -1.0); }),
                HasSubstr("cannot write in place into a DTensor that is P(max) (DTensorSpec"));
    Tensor summed = max_partial();
    const Tensor other = max_partial();
    EXPECT_THAT(testing::error_of([&] { ops::add_(summed, other); }),
                HasSubstr("the result would not be P(max); redistribute it first"));
    // Out of place, the same ops redistribute and are exact.
    expect_equal({.actual = full_tensor(mul(max_partial(), -1.0)),
                  .expected = ops::from_vector({-2, -10}, {2}),
                  .what = "mul(P(max), -1)"});
    // A sum stays a sum in place: [1, 10] + [2, 5] = [3, 15], plus twice that.
    Tensor sum = from_local(
        ops::from_vector(rank == 0 ? std::vector<float>{1, 10} : std::vector<float>{2, 5}, {2}),
        mesh, {Partial()});
    ops::add_(sum, ops::mul(sum, 2.0));
    ops::mul_(sum, -1.0);
    EXPECT_EQ(dtensor_spec(sum).placements, (Placements{Partial()}));
    expect_equal({.actual = full_tensor(sum),
                  .expected = ops::from_vector({-9, -45}, {2}),
                  .what = "in place on P(sum)"});
  });
}

TEST(OpsElementwiseTest, ACastToAnIntegerTypeReducesAPartialSumFirst) {
  // Found from outside: 0.5 on each of 2 ranks, P(sum), cast to i64 gave 0 (each part rounded).
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = mesh_1d(pg);
    const Tensor half = from_local(ops::full({3}, 0.5), mesh, {Partial()});
    const Tensor whole = ops::to(half, kInt64);
    EXPECT_FALSE(dtensor_spec(whole).placements[0].is_partial()) << dtensor_spec(whole).str();
    EXPECT_EQ(ops::to_vector(full_tensor(whole)), (std::vector<double>{1, 1, 1}));
    // To a floating type the Partial passes through.
    EXPECT_EQ(dtensor_spec(ops::to(half, kBFloat16)).placements, (Placements{Partial()}));
  });
}

TEST(OpsElementwiseTest, UnaryOpsKeepShardsForwardAndBackward) {
  // Each element is computed the same way on a shard and on the whole tensor: exact.
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> unary = {
      {"neg", [](const Tensor& t) { return neg(t); }},
      {"exp", [](const Tensor& t) { return exp(t); }},
      {"log", [](const Tensor& t) { return log(t); }},
      {"tanh", [](const Tensor& t) { return tanh(t); }},
      {"sigmoid", [](const Tensor& t) { return sigmoid(t); }},
      {"silu", [](const Tensor& t) { return silu(t); }},
      {"sqrt", [](const Tensor& t) { return sqrt(t); }},
      {"rsqrt", [](const Tensor& t) { return rsqrt(t); }},
      {"pow3", [](const Tensor& t) { return pow(t, 3.0); }},
      {"relu", [](const Tensor& t) { return relu(t); }},
      {"gelu", [](const Tensor& t) { return gelu(t); }},
      {"add1", [](const Tensor& t) { return add(t, 1.0); }},
      {"sub1", [](const Tensor& t) { return sub(t, 1.0); }},
      {"rsub1", [](const Tensor& t) { return rsub(t, 1.0); }},
      {"mul3", [](const Tensor& t) { return mul(t, 3.0); }},
      {"div4", [](const Tensor& t) { return div(t, 4.0); }},
  };
  const auto check_all = [&](const std::shared_ptr<const DeviceMesh>& mesh,
                             const Placements& placements, const Shape& shape) {
    for (const auto& [name, fn] : unary) {
      // log/sqrt/rsqrt need positive inputs; the others get both signs.
      const bool positive = name == "log" || name == "sqrt" || name == "rsqrt";
      const Tensor x =
          positive ? ops::add(ops::abs(float_tensor(shape, 11)), 0.5) : float_tensor(shape, 11);
      check_op(mesh, {name + " " + placements_str(placements),
                      {{x, placements}},
                      [fn](const Inputs& in) { return fn(in[0]); },
                      placements});
    }
  };
  run_on_ranks(3, [&](ProcessGroup& pg) { check_all(mesh_1d(pg), {Shard(0)}, {10, 3}); });
  run_on_ranks(4, [&](ProcessGroup& pg) { check_all(mesh_2x2(pg), {Shard(1), Shard(0)}, {5, 3}); });
}

// silu_mul (SwiGLU's activation) on tensor parallelism's column shards, a 2-D mesh's shards, and
// a replicated gate with a sharded up: forward and both gradients, each element computed as on
// one rank (exact). A Partial gate is reduced first (silu is not linear); a Partial up passes.
TEST(OpsElementwiseTest, SiluMulFollowsTheShards) {
  const auto silu_mul_op = [](const Inputs& in) { return silu_mul(in[0], in[1]); };
  run_on_ranks(3, [&](ProcessGroup& pg) {
    const auto mesh = mesh_1d(pg);
    const Tensor gate = float_tensor({4, 7}, 21), up = float_tensor({4, 7}, 22);
    check_op(mesh, {"silu_mul S(1)*S(1)",
                    {{gate, {Shard(1)}}, {up, {Shard(1)}}},
                    silu_mul_op,
                    Placements{Shard(1)}});
    check_op(mesh, {"silu_mul R*S(0)",
                    {{gate, {Replicate()}}, {up, {Shard(0)}}},
                    silu_mul_op,
                    Placements{Shard(0)},
                    kGatherGrad});
  });
  run_on_ranks(4, [&](ProcessGroup& pg) {
    const Tensor gate = float_tensor({5, 6}, 23), up = float_tensor({5, 6}, 24);
    check_op(mesh_2x2(pg), {"silu_mul 2x2",
                            {{gate, {Shard(1), Shard(0)}}, {up, {Shard(1), Shard(0)}}},
                            silu_mul_op,
                            Placements{Shard(1), Shard(0)}});
  });
  run_on_ranks(2, [&](ProcessGroup& pg) {
    const auto mesh = mesh_1d(pg);
    const Tensor gate = distribute_tensor(float_tensor({3, 4}, 25), mesh, {Replicate()});
    const Tensor up =
        from_local(float_tensor({3, 4}, 26 + pg.rank()), mesh, {Partial(ReduceOp::kSum)});
    const Tensor out = silu_mul(gate, up);
    EXPECT_EQ(dtensor_spec(out, "test").placements, (Placements{Partial(ReduceOp::kSum)}));
    const Tensor partial_gate =
        from_local(float_tensor({3, 4}, 26 + pg.rank()), mesh, {Partial(ReduceOp::kSum)});
    const Tensor reduced = silu_mul(partial_gate, gate);
    EXPECT_FALSE(dtensor_spec(reduced, "test").placements[0].is_partial());
    expect_equal({.actual = full_tensor(reduced),
                  .expected = silu_mul(ops::add(float_tensor({3, 4}, 26), float_tensor({3, 4}, 27)),
                                       float_tensor({3, 4}, 25)),
                  .what = "silu_mul of a Partial gate: the sum's, reduced first"});
  });
}

TEST(OpsElementwiseTest, WhereAndMaskedFillFollowTheShards) {
  for (int world : {2, 3}) {
    run_on_ranks(world, [world](ProcessGroup& pg) {
      auto mesh = mesh_1d(pg);
      const int64_t rows = 3 * world + 1, cols = 4;
      const Tensor a = integer_tensor({rows, cols}, 1), b = integer_tensor({rows, cols}, 2);
      const Tensor cond = ops::gt(integer_tensor({rows, cols}, 3), ops::zeros({}));  // 1.0 / 0.0
      const Tensor row_mask = ops::gt(integer_tensor({cols}, 4), ops::zeros({}));
      const auto where_op = [](const Inputs& in) { return where(in[0], in[1], in[2]); };
      check_op(mesh, {"where S(0)",
                      {{cond, {Shard(0)}}, {a, {Shard(0)}}, {b, {Shard(0)}}},
                      where_op,
                      Placements{Shard(0)}});
      check_op(mesh, {"where cond R, a S(1), b R",
                      {{cond, {Replicate()}}, {a, {Shard(1)}}, {b, {Replicate()}}},
                      where_op,
                      Placements{Shard(1)},
                      kGatherGrad});
      // The mask is a tensor input too (no gradient); a broadcast row mask.
      check_op(mesh, {"masked_fill S(0), mask R",
                      {{a, {Shard(0)}}, {row_mask, {Replicate()}}},
                      [](const Inputs& in) { return masked_fill(in[0], in[1], -5.0); },
                      Placements{Shard(0)}});
      check_op(mesh, {"masked_fill S(1), mask S(0)",
                      {{a, {Shard(1)}}, {row_mask, {Shard(0)}}},
                      [](const Inputs& in) { return masked_fill(in[0], in[1], 0.0); },
                      Placements{Shard(1)}});
    });
  }
}

TEST(OpsElementwiseTest, MaskedFillKeepsPartialOnlyWhenFillingZeros) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    const Shape s{3, 4};
    auto mask_of = [](const Tensor& like) {
      return ops::gt(integer_tensor(like.shape(), 9), ops::zeros({}));
    };
    // The mask is built inside the op from the (replicated) seed, on the same mesh.
    const auto fill = [&pg, mask_of](double value) {
      return [&pg, mask_of, value](const Inputs& in) {
        Tensor mask = mask_of(in[0]);
        if (is_dtensor(in[0]))
          mask = distribute_tensor(mask, mesh_1d(pg), {Replicate()}, std::nullopt);
        return masked_fill(in[0], mask, value);
      };
    };
    check_partial(pg, "masked_fill(P, 0)", {{s, true}}, fill(0.0), Partial(ReduceOp::kSum));
    check_partial(pg, "masked_fill(P, 3)", {{s, true}}, fill(3.0), std::nullopt);
  });
}

TEST(OpsElementwiseTest, ZeroDimPartialOperandsAreReducedWhenTheOpNeedsIt) {
  // sum over a sharded dim leaves a 0-dim Partial(sum); a product of two of them must reduce
  // at least one first. Backward, each sum's gradient is the other sum as it was (Partial)
  // times the replicated incoming gradient: Partial, reduce-scattered into the S(0) input.
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = mesh_1d(pg);
    const Tensor a = integer_tensor({7}, 1), b = integer_tensor({7}, 2);
    check_op(mesh, {"sum(S(0)) * sum(S(0))",
                    {{a, {Shard(0)}}, {b, {Shard(0)}}},
                    [](const Inputs& in) { return mul(sum(in[0]), sum(in[1])); },
                    std::nullopt,
                    {.forward = {.all_reduce = 1}, .backward = {.reduce_scatter = 2}}});
    check_op(mesh, {"sum(S(0)) + 0-dim R",
                    {{a, {Shard(0)}}, {integer_tensor({}, 3), {Replicate()}}},
                    [](const Inputs& in) { return add(sum(in[0]), in[1]); },
                    std::nullopt});
    // A plain 0-dim tensor stands for a replicated scalar: added to a Partial it counts once.
    check_op(mesh, {"S(0) sum + plain scalar",
                    {{a, {Shard(0)}}},
                    [](const Inputs& in) { return add(sum(in[0]), ops::scalar_tensor(5.0)); },
                    std::nullopt});
    check_op(mesh, {"P * plain scalar",
                    {{a, {Shard(0)}}},
                    [](const Inputs& in) { return mul(sum(in[0]), ops::scalar_tensor(5.0)); },
                    std::nullopt});
  });
}

TEST(OpsElementwiseTest, MixingDTensorAndPlainTensorOrMeshesIsRejected) {
  run_on_ranks(4, [](ProcessGroup& pg) {
    auto mesh = mesh_2x2(pg);
    auto other = make_mesh(pg, {"dp_tp"}, {4});
    Tensor x = distribute_tensor(ops::ones({4, 4}), mesh, {Shard(0), Replicate()}, std::nullopt);
    Tensor y = distribute_tensor(ops::ones({4, 4}), other, {Shard(0)}, std::nullopt);
    try {
      add(x, y);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_THAT(
          e.what(),
          HasSubstr("add: DTensor inputs live on different meshes: DeviceMesh(dp=2, tp=2, cpu) and "
                    "DeviceMesh(dp_tp=4, cpu)"));
    }
    try {
      mul(x, ops::ones({4}));
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("mul: input 1 is a plain tensor"));
    }
  });
}

TEST(OpsPropagationTest, ARepeatedOpHitsTheDecisionCache) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = mesh_1d(pg);
    const Tensor x = distribute_tensor(integer_tensor({5, 3}, 1), mesh, {Shard(0)}, std::nullopt);
    const Tensor y =
        distribute_tensor(integer_tensor({5, 3}, 2), mesh, {Replicate()}, std::nullopt);
    sharding::clear_propagation_cache();
    const Tensor first = add(x, y);
    EXPECT_EQ(sharding::propagation_stats().cache_misses, 1);
    EXPECT_EQ(sharding::propagation_stats().cache_hits, 0);
    const Tensor second = add(x, y);
    EXPECT_EQ(sharding::propagation_stats().cache_misses, 1);
    EXPECT_EQ(sharding::propagation_stats().cache_hits, 1);
    expect_equal(
        {.actual = full_tensor(second), .expected = full_tensor(first), .what = "cached decision"});
    // Other placements, other attributes: new decisions.
    add(y, x);
    sum(x, {0});
    sum(x, {1});
    EXPECT_EQ(sharding::propagation_stats().cache_misses, 4);
    sum(x, {1});
    EXPECT_EQ(sharding::propagation_stats().cache_hits, 2);
  });
}

TEST(OpsPropagationTest, CachedDecisionsAreNotSharedBetweenMeshesOfDifferentSizes) {
  // Decisions depend on the mesh's sizes (costs, whether a reshape keeps a shard). A mesh freed
  // and another allocated at the same address must not inherit the first one's decisions.
  run_on_ranks(4, [](ProcessGroup& pg) {
    const Tensor x = integer_tensor({2, 3, 12}, 1);
    const Tensor expected = ops::reshape(x, {2, 3, 2, 6});
    auto grid = mesh_2x2(pg);
    const void* first_address = nullptr;
    {
      // 12 channels over 2 ranks as 2 heads of 6: one head each, the shard survives the reshape.
      auto tp = std::make_shared<const DeviceMesh>((*grid)["tp"]);
      first_address = tp.get();
      const Tensor y = reshape(distribute_tensor(x, tp, {Shard(2)}, std::nullopt), {2, 3, 2, 6});
      EXPECT_EQ(dtensor_spec(y).placements, (Placements{Shard(2)}));
      expect_equal({.actual = full_tensor(y), .expected = expected, .what = "reshape on 2 ranks"});
    }
    // Over 4 ranks the 2 heads cannot be split: the reshape must gather.
    auto line = make_mesh(pg, {"world"}, {4});
    SCOPED_TRACE(first_address == line.get() ? "the second mesh reuses the first one's address"
                                             : "the second mesh has another address");
    const Tensor z = reshape(distribute_tensor(x, line, {Shard(2)}, std::nullopt), {2, 3, 2, 6});
    expect_equal({.actual = full_tensor(z), .expected = expected, .what = "reshape on 4 ranks"});
  });
}

TEST(OpsPropagationTest, EveryOpHasAStrategyAndAnUnknownOneIsNamedInTheError) {
  // Every kExtended op of tensor/op_list.h has a sharding strategy; kPlainOnly ops never reach
  // the DTensor handler through dispatch, and have none.
  const auto& table = sharding::strategy_table();
  for (const OpInfo& info : all_ops()) {
    EXPECT_EQ(table[info.id] != nullptr, info.extensions == OpExtensions::kExtended) << info.name;
  }
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = mesh_1d(pg);
    const Tensor x = distribute_tensor(integer_tensor({4, 3}, 1), mesh, {Shard(0)}, std::nullopt);
    const Tensor y = distribute_tensor(integer_tensor({3}, 2), mesh, {Replicate()}, std::nullopt);
    try {
      sharding::dispatch_dtensor_op(OpCall(OpId::to_device, {x, y}));
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_THAT(
          e.what(),
          HasSubstr("to_device: no sharding strategy for DTensor inputs ((4, 3) [S(0)], (3,) [R]); "
                    "this op is not supported on DTensors"));
    }
  });
}

}  // namespace
}  // namespace loom
