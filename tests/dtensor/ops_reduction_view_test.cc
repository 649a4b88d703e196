// Reduction and view strategies (dtensor/sharding/reductions.cc, views.cc) against the
// single-rank result, forward and backward: sum/mean over sharded and unsharded dims (mean over
// an uneven sharded dim exact), max(dim) with its indices; reshape/view that keep, move or lose
// a shard, transpose/permute, and the view that would cross a shard boundary.
//
// Data is integer-valued: sums are exact in any order, and the means below divide by powers of
// two, so they are exact too; views move values without arithmetic.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "base/error.h"
#include "comm/testing/multi_rank.h"
#include "dtensor/dtensor.h"
#include "tests/dtensor/ops_test_util.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

using comm::ProcessGroup;
using comm::testing::run_on_ranks;
using loom::testing::check_op;
using loom::testing::expect_equal;
using loom::testing::integer_tensor;
using loom::testing::kExact;
using loom::testing::mesh_1d;
using loom::testing::mesh_2x2;
using loom::testing::OpCollectives;
using loom::testing::Tolerance;
using ::testing::HasSubstr;
using Inputs = std::vector<Tensor>;

std::function<Tensor(const Inputs&)> sum_op(std::vector<int64_t> dims, bool keepdim = false) {
  return [dims, keepdim](const Inputs& in) { return sum(in[0], dims, keepdim); };
}
std::function<Tensor(const Inputs&)> mean_op(std::vector<int64_t> dims, bool keepdim = false) {
  return [dims, keepdim](const Inputs& in) { return mean(in[0], dims, keepdim); };
}

TEST(OpsReductionTest, SumOverShardedDimIsPartialAndOverOthersKeepsTheShard) {
  for (int world : {2, 3}) {
    run_on_ranks(world, [world](ProcessGroup& pg) {
      auto mesh = mesh_1d(pg);
      const Tensor x = integer_tensor({3 * world + 1, 5}, 1);
      check_op(mesh, {"sum dim 0 of S(0)", {{x, {Shard(0)}}}, sum_op({0}), Placements{Partial()}});
      check_op(mesh, {"sum dim 1 of S(0)", {{x, {Shard(0)}}}, sum_op({1}), Placements{Shard(0)}});
      check_op(mesh, {"sum dim 0 keepdim of S(1)",
                      {{x, {Shard(1)}}},
                      sum_op({0}, true),
                      Placements{Shard(1)}});
      check_op(mesh, {"sum dim -1 keepdim of S(1)",
                      {{x, {Shard(1)}}},
                      sum_op({-1}, true),
                      Placements{Partial()}});
      check_op(mesh, {"sum all of S(0)", {{x, {Shard(0)}}}, sum_op({}), Placements{Partial()}});
      check_op(mesh, {"sum all of P", {{x, {Partial()}}}, sum_op({}), Placements{Partial()}});
      const Tensor x3 = integer_tensor({2, 3 * world + 1, 4}, 2);
      check_op(
          mesh,
          {"sum dims {0,2} of S(1)", {{x3, {Shard(1)}}}, sum_op({0, 2}), Placements{Shard(0)}});
      check_op(
          mesh,
          {"sum dims {0,1} of S(1)", {{x3, {Shard(1)}}}, sum_op({0, 1}), Placements{Partial()}});
    });
  }
}

TEST(OpsReductionTest, MeanOverUnevenShardedDimIsExact) {
  // 8 rows over 3 ranks: 3, 3, 2; 4 rows over 3 ranks: 2, 2, 0 (an empty shard). Averaging the
  // local means would be wrong for both; (local sum) / (global count) is exact here because the
  // counts are powers of two.
  run_on_ranks(3, [](ProcessGroup& pg) {
    auto mesh = mesh_1d(pg);
    for (int64_t rows : {8, 4}) {
      const Tensor x = integer_tensor({rows, 4}, 3);
      const std::string r = std::to_string(rows);
      check_op(mesh, {"mean dim 0 of S(0), rows " + r,
                      {{x, {Shard(0)}}},
                      mean_op({0}),
                      Placements{Partial()}});
      check_op(
          mesh,
          {"mean all of S(0), rows " + r, {{x, {Shard(0)}}}, mean_op({}), Placements{Partial()}});
      check_op(mesh, {"mean dim 1 of S(0), rows " + r,
                      {{x, {Shard(0)}}},
                      mean_op({1}, true),
                      Placements{Shard(0)}});
    }
    // 7 rows over 3 ranks (3, 3, 1): the local sums divided by 7 are not exact in f32 and add up
    // in another order than the single-rank sum: ~1 ulp.
    const Tolerance ulp{.rtol = 1e-6, .atol = 1e-6};
    check_op(mesh, {"mean dim 0 of S(0), rows 7",
                    {{integer_tensor({7, 3}, 4), {Shard(0)}}},
                    mean_op({0}),
                    Placements{Partial()},
                    {},
                    ulp,
                    ulp});
  });
}

TEST(OpsReductionTest, ReductionsOn2x2Mesh) {
  run_on_ranks(4, [](ProcessGroup& pg) {
    auto mesh = mesh_2x2(pg);
    const Tensor x = integer_tensor({4, 6, 3}, 5);
    const Tensor y = integer_tensor({4, 8, 3}, 6);  // means over 4 and 8 elements: exact
    check_op(mesh, {"sum {0,1} of [S(0),S(1)]",
                    {{x, {Shard(0), Shard(1)}}},
                    sum_op({0, 1}),
                    Placements{Partial(), Partial()}});
    check_op(mesh, {"sum {2} of [S(0),S(1)]",
                    {{x, {Shard(0), Shard(1)}}},
                    sum_op({2}),
                    Placements{Shard(0), Shard(1)}});
    check_op(mesh, {"mean {1} of [S(0),S(1)]",
                    {{y, {Shard(0), Shard(1)}}},
                    mean_op({1}),
                    Placements{Shard(0), Partial()}});
    // Nested: 4 rows over both mesh dims, one per rank.
    check_op(mesh, {"mean {0} of [S(0),S(0)]",
                    {{y, {Shard(0), Shard(0)}}},
                    mean_op({0}),
                    Placements{Partial(), Partial()}});
  });
}

TEST(OpsReductionTest, MaxOverDimGivesValuesIndicesAndGradient) {
  // Distinct values (a permutation), so the maximum is unique and its gradient well defined.
  const auto distinct = [](const Shape& shape) {
    const int64_t n = shape_numel(shape);
    std::vector<float> values(n);
    for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>((i * 7) % n);
    return ops::from_vector(values, shape);
  };
  for (int world : {2, 3}) {
    run_on_ranks(world, [world, distinct](ProcessGroup& pg) {
      auto mesh = mesh_1d(pg);
      const Tensor x = distinct({3 * world + 1, 5});
      for (int64_t dim : {0, 1}) {
        for (const Placements& placements : {Placements{Shard(0)}, Placements{Shard(1)}}) {
          const std::string name =
              "max dim " + std::to_string(dim) + " of " + placements_str(placements);
          // The kept dim keeps its shard; a sharded reduced dim must be gathered first (max is
          // not linear: no Partial); on 3 ranks the shard moves to the other dim instead, and the
          // gradient moves back.
          std::optional<Placements> expected;
          OpCollectives collectives;
          if (!placements[0].is_shard(dim)) {
            const int64_t kept = placements[0].dim();
            expected = Placements{Shard(kept > dim ? kept - 1 : kept)};
          } else if (world == 2) {
            collectives = {.forward = {.all_gather = 1}};
          } else {
            collectives = {.forward = {.all_to_all = 1}, .backward = {.all_to_all = 1}};
          }
          check_op(mesh, {name,
                          {{x, placements}},
                          [dim](const Inputs& in) { return max(in[0], dim).first; },
                          expected,
                          collectives});
          // Indices, not differentiable, must match too.
          const Tensor d = distribute_tensor(x, mesh, placements, std::nullopt);
          const Tensor indices = max(d, dim).second;
          expect_equal({.actual = full_tensor(indices),
                        .expected = ops::max(x, dim).second,
                        .what = name + " indices"});
        }
      }
    });
  }
}

TEST(OpsViewTest, SplittingShardedChannelsIntoHeadsKeepsTheShard) {
  // (B, T, C) -> (B, T, H, D) with C sharded: each rank's C/k channels are H/k whole heads when
  // H is divisible by the mesh size.
  for (int world : {2, 3}) {
    run_on_ranks(world, [world](ProcessGroup& pg) {
      auto mesh = mesh_1d(pg);
      const int64_t b = 2, t = 3, h = 2 * world, d = 3;
      const Tensor x = integer_tensor({b, t, h * d}, 1);
      for (bool is_view : {false, true}) {
        const std::string op = is_view ? "view" : "reshape";
        check_op(mesh, {op + " (B,T,C) S(2) -> (B,T,H,D)",
                        {{x, {Shard(2)}}},
                        [&](const Inputs& in) {
                          return is_view ? view(in[0], {b, t, h, d}) : reshape(in[0], {b, t, h, d});
                        },
                        Placements{Shard(2)}});
        // And back: heads sharded -> channels sharded.
        const Tensor heads = integer_tensor({b, t, h, d}, 2);
        check_op(mesh, {op + " (B,T,H,D) S(2) -> (B,T,C)",
                        {{heads, {Shard(2)}}},
                        [&](const Inputs& in) {
                          return is_view ? view(in[0], {b, t, -1}) : reshape(in[0], {b, t, -1});
                        },
                        Placements{Shard(2)}});
        // Merging leading dims keeps a shard on the first of them.
        const Tensor batch = integer_tensor({world * 2, t, 4}, 3);
        check_op(mesh, {op + " (B,T,C) S(0) -> (B*T,C)",
                        {{batch, {Shard(0)}}},
                        [&](const Inputs& in) {
                          return is_view ? view(in[0], {world * 2 * t, 4})
                                         : reshape(in[0], {world * 2 * t, 4});
                        },
                        Placements{Shard(0)}});
      }
      // Size-1 dims come and go without moving the shard: (B, 1, C) <-> (B, C) with C sharded.
      const Tensor with_one = integer_tensor({2, 1, 2 * world}, 6);
      check_op(mesh, {"view (B,1,C) S(2) -> (B,C)",
                      {{with_one, {Shard(2)}}},
                      [&](const Inputs& in) {
                        return view(in[0], {2, 2 * world});
                      },
                      Placements{Shard(1)}});
      check_op(mesh, {"view (B,C) S(1) -> (B,1,C)",
                      {{integer_tensor({2, 2 * world}, 7), {Shard(1)}}},
                      [&](const Inputs& in) {
                        return view(in[0], {2, 1, 2 * world});
                      },
                      Placements{Shard(2)}});
      // Uneven: a dim that maps one to one keeps even an uneven shard.
      const Tensor uneven = integer_tensor({3 * world + 1, 4}, 4);
      check_op(mesh, {"view (7,4) S(0) -> (7,2,2)",
                      {{uneven, {Shard(0)}}},
                      [](const Inputs& in) {
                        return view(in[0], {in[0].size(0), 2, 2});
                      },
                      Placements{Shard(0)}});
    });
  }
  run_on_ranks(4, [](ProcessGroup& pg) {
    auto mesh = mesh_2x2(pg);
    // dp on the batch, tp on channels: 4 heads over the 2 tp ranks.
    const Tensor x = integer_tensor({2, 3, 12}, 5);
    check_op(mesh, {"reshape [S(0),S(2)] -> heads",
                    {{x, {Shard(0), Shard(2)}}},
                    [](const Inputs& in) {
                      return reshape(in[0], {2, 3, 4, 3});
                    },
                    Placements{Shard(0), Shard(2)}});
  });
}

TEST(OpsViewTest, ViewAcrossShardBoundariesThrowsWhileReshapeRedistributes) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = mesh_1d(pg);
    // C = 12 sharded 6/6, viewed as 3 heads of 4: rank 0's 6 channels are 1.5 heads.
    const Tensor x = integer_tensor({2, 3, 12}, 1);
    const Tensor d = distribute_tensor(x, mesh, {Shard(2)}, std::nullopt);
    try {
      view(d, {2, 3, 3, 4});
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_THAT(
          e.what(),
          HasSubstr(
              "view: a DTensor of shape (2, 3, 12) with placements [S(2)] cannot be viewed as "
              "(2, 3, 3, 4): its shard on dim 2 (mesh dim 'tp') would cross shard boundaries; "
              "use reshape, which redistributes"));
    }
    const auto to_heads = [](const Inputs& in) { return reshape(in[0], {2, 3, 3, 4}); };
    // Moving the shard to dim 0 or 1 costs what gathering does on 2 ranks: gathered.
    check_op(mesh, {"reshape across the shard boundary",
                    {{x, {Shard(2)}}},
                    to_heads,
                    std::nullopt,
                    {.forward = {.all_gather = 1}}});
    // An uneven shard merged with the next dim: (7, 4) S(0) -> (28,) would cut rank 0's 16 of 28.
    const Tensor uneven = integer_tensor({7, 4}, 2);
    try {
      view(distribute_tensor(uneven, mesh, {Shard(0)}, std::nullopt), {28});
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_THAT(
          e.what(),
          HasSubstr(
              "view: a DTensor of shape (7, 4) with placements [S(0)] cannot be viewed as (28,)"));
    }
    // (28,) has no dim to keep the shard on: gathered.
    check_op(mesh, {"reshape uneven (7,4) S(0) -> (28)",
                    {{uneven, {Shard(0)}}},
                    [](const Inputs& in) { return reshape(in[0], {28}); },
                    std::nullopt,
                    {.forward = {.all_gather = 1}}});
  });
}

TEST(OpsViewTest, TransposePermuteAndFriendsMoveTheShard) {
  for (int world : {2, 3}) {
    run_on_ranks(world, [world](ProcessGroup& pg) {
      auto mesh = mesh_1d(pg);
      const Tensor x = integer_tensor({2, 3, 3 * world + 1, 4}, 1);  // (B, T, H, D), H uneven
      check_op(mesh, {"transpose(1,2) of S(2)",
                      {{x, {Shard(2)}}},
                      [](const Inputs& in) { return transpose(in[0], 1, 2); },
                      Placements{Shard(1)}});
      check_op(mesh, {"transpose(-1,-2) of S(2)",
                      {{x, {Shard(2)}}},
                      [](const Inputs& in) { return transpose(in[0], -1, -2); },
                      Placements{Shard(3)}});
      check_op(mesh, {"permute(0,2,1,3) of S(2)",
                      {{x, {Shard(2)}}},
                      [](const Inputs& in) {
                        return permute(in[0], {0, 2, 1, 3});
                      },
                      Placements{Shard(1)}});
      check_op(mesh, {"permute(3,2,1,0) of S(0)",
                      {{x, {Shard(0)}}},
                      [](const Inputs& in) {
                        return permute(in[0], {3, 2, 1, 0});
                      },
                      Placements{Shard(3)}});
      check_op(mesh, {"unsqueeze(0) of S(2)",
                      {{x, {Shard(2)}}},
                      [](const Inputs& in) { return unsqueeze(in[0], 0); },
                      Placements{Shard(3)}});
      check_op(mesh, {"squeeze(0) of S(2)",
                      {{integer_tensor({1, 3 * world + 1, 2}, 2), {Shard(1)}}},
                      [](const Inputs& in) { return squeeze(in[0], 0); },
                      Placements{Shard(0)}});
      check_op(mesh, {"expand of S(0)",
                      {{integer_tensor({3 * world + 1, 1}, 3), {Shard(0)}}},
                      [](const Inputs& in) {
                        return expand(in[0], {2, in[0].size(0), 5});
                      },
                      Placements{Shard(1)}});
      check_op(mesh, {"narrow dim 3 of S(2)",
                      {{x, {Shard(2)}}},
                      [](const Inputs& in) { return narrow(in[0], 3, 1, 2); },
                      Placements{Shard(2)}});
      check_op(mesh, {"slice dim 1 of S(2)",
                      {{x, {Shard(2)}}},
                      [](const Inputs& in) { return slice(in[0], 1, 0, 3, 2); },
                      Placements{Shard(2)}});
      // Cutting the sharded dim itself needs it whole: gathered on 2 ranks; on 3 the shard moves
      // to dim 0, and the gradient moves back.
      const OpCollectives cut_whole_dim =
          world == 2 ? OpCollectives{.forward = {.all_gather = 1}}
                     : OpCollectives{.forward = {.all_to_all = 1}, .backward = {.all_to_all = 1}};
      check_op(mesh, {"narrow dim 2 of S(2)",
                      {{x, {Shard(2)}}},
                      [](const Inputs& in) { return narrow(in[0], 2, 1, 3); },
                      std::nullopt,
                      cut_whole_dim});
      check_op(mesh, {"chunk dim 3 of S(2)",
                      {{x, {Shard(2)}}},
                      [](const Inputs& in) { return chunk(in[0], 2, 3)[1]; },
                      Placements{Shard(2)}});
      check_op(mesh, {"cat dim 3 of S(2), S(2)",
                      {{x, {Shard(2)}}, {integer_tensor(x.shape(), 4), {Shard(2)}}},
                      [](const Inputs& in) {
                        return cat(std::vector<Tensor>{in[0], in[1]}, 3);
                      },
                      Placements{Shard(2)}});
    });
  }
}

}  // namespace
}  // namespace loom
