#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "base/error.h"
#include "comm/testing/multi_rank.h"
#include "dtensor/comm_debug_mode.h"
#include "dtensor/dtensor.h"
#include "dtensor/factories.h"
#include "dtensor/sharding/propagator.h"
#include "tests/dtensor/dtensor_test_util.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

using comm::CollectiveKind;
using comm::ProcessGroup;
using comm::testing::run_on_ranks;
using loom::testing::expect_equal;
using loom::testing::integer_tensor;
using loom::testing::make_mesh;
using ::testing::HasSubstr;

TEST(DTensorApiTest, DistributeTensorKeepsEachRanksSliceAndFullTensorRestoresIt) {
  run_on_ranks(3, [](ProcessGroup& pg) {
    auto mesh = make_mesh(pg, {"tp"}, {3});
    const Tensor full = integer_tensor({10, 4}, 1);  // uneven: rows 4, 4, 2
    Tensor x = distribute_tensor(full, mesh, {Shard(0)});
    EXPECT_EQ(x.shape(), (Shape{10, 4}));
    const int64_t rows[] = {4, 4, 2};
    EXPECT_EQ(local_shard(x).shape(), (Shape{rows[pg.rank()], 4}));
    expect_equal({.actual = local_shard(x),
                  .expected = ops::narrow(full, 0, 4 * pg.rank(), rows[pg.rank()])});
    expect_equal({.actual = full_tensor(x), .expected = full});
  });
}

TEST(DTensorApiTest, DistributedShardsOwnOnlyTheirBytes) {
  // A dim-0 shard is a contiguous view of the full tensor; kept as a view it would keep the
  // whole tensor alive on every rank.
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = make_mesh(pg, {"tp"}, {2});
    const Tensor full = integer_tensor({8, 4}, 1);
    for (const Placements& placements : {Placements{Shard(0)}, Placements{Shard(1)}}) {
      for (const std::optional<int> src : {std::optional<int>(0), std::optional<int>()}) {
        const Tensor local = local_shard(distribute_tensor(full, mesh, placements, src));
        EXPECT_EQ(local.storage()->bytes(), 16 * sizeof(float)) << placements_str(placements);
      }
    }
  });
}

TEST(DTensorApiTest, DistributeTensorTakesRankZerosData) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = make_mesh(pg, {"dp"}, {2});
    const Tensor mine = ops::full({4}, pg.rank() + 1.0);
    Tensor x = distribute_tensor(mine, mesh, {Replicate()});
    expect_equal({.actual = local_shard(x), .expected = ops::full({4}, 1.0)});
    // Without src_data_rank no communication happens and each rank keeps its own values.
    CommDebugMode comm;
    Tensor y = distribute_tensor(mine, mesh, {Replicate()}, std::nullopt);
    EXPECT_EQ(comm.total_count(), 0);
    expect_equal({.actual = local_shard(y), .expected = mine});
  });
}

TEST(DTensorApiTest, FromLocalInfersEvenShapesAndTakesExplicitUnevenOnes) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = make_mesh(pg, {"tp"}, {2});
    Tensor even = from_local(ops::full({3, 2}, pg.rank()), mesh, {Shard(1)});
    EXPECT_EQ(even.shape(), (Shape{3, 4}));
    Tensor uneven =
        from_local(ops::full({pg.rank() == 0 ? 3 : 2, 2}, 1.0), mesh, {Shard(0)}, Shape{5, 2});
    EXPECT_EQ(uneven.shape(), (Shape{5, 2}));
    expect_equal({.actual = full_tensor(uneven), .expected = ops::ones({5, 2})});
    try {
      from_local(ops::ones({3, 2}), mesh, {Shard(0)}, Shape{5, 2});  // rank 1 should hold 2 rows
      if (pg.rank() == 1) ADD_FAILURE() << "expected an error on rank 1";
    } catch (const Error& e) {
      EXPECT_EQ(pg.rank(), 1);
      EXPECT_THAT(e.what(), HasSubstr("local shard of shape (3, 2) on rank 1 does not match"));
    }
  });
}

// from_local(run_check), torch's: Replicate takes the coordinate-0 rank's values (into a copy),
// and ranks that disagree on the dtype, the global shape or their shard fail together, naming
// the rank; without it nothing is communicated.
TEST(DTensorApiTest, FromLocalRunCheckBroadcastsReplicasAndNamesDisagreement) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = make_mesh(pg, {"tp"}, {2});
    const Tensor mine = ops::full({3}, pg.rank() + 1.0);
    CommDebugMode comm;
    const Tensor trusted = from_local(mine, mesh, {Replicate()});
    EXPECT_EQ(comm.total_count(), 0);
    expect_equal({.actual = local_shard(trusted), .expected = mine});
    const Tensor checked = from_local(mine, mesh, {Replicate()}, std::nullopt, /*run_check=*/true);
    expect_equal({.actual = local_shard(checked), .expected = ops::full({3}, 1.0)});
    expect_equal({.actual = mine, .expected = ops::full({3}, pg.rank() + 1.0)});  // not written
    // Uneven shards with their global shape pass; without it, the sizes differ: named.
    const Tensor rows = ops::ones({pg.rank() == 0 ? 3 : 2, 2});
    EXPECT_EQ(from_local(rows, mesh, {Shard(0)}, Shape{5, 2}, true).shape(), (Shape{5, 2}));
    EXPECT_THAT(testing::error_of([&] { from_local(rows, mesh, {Shard(0)}, std::nullopt, true); }),
                HasSubstr("from_local(run_check) on DeviceMesh(tp=2, cpu): the ranks disagree on "
                          "the global shape: rank 0 passes a global shape of (6, 2); rank 1 passes "
                          "a global shape of (4, 2); without a global shape, every rank's shard is "
                          "the same size"));
    // Another dtype on rank 1; a shard that does not fit the shape given on rank 1.
    const Tensor typed = ops::ones({2}, pg.rank() == 0 ? kFloat32 : kBFloat16);
    EXPECT_THAT(
        testing::error_of([&] { from_local(typed, mesh, {Shard(0)}, std::nullopt, true); }),
        HasSubstr("the ranks disagree on the local tensor's dtype and dims: rank 0 passes f32 of "
                  "1 dims; rank 1 passes bf16 of 1 dims"));
    EXPECT_THAT(
        testing::error_of([&] {
          from_local(ops::ones({3, 2}), mesh, {Shard(0)}, Shape{5, 2}, true);
        }),
        HasSubstr("rank 1 (coordinate (1,)) passes (3, 2), which is not its shard of the global "
                  "shape (5, 2) under"));
  });
}

// On a 2-D mesh every rank fails alike, whichever rank differs (here rank 3, then rank 0 alone),
// naming the ranks of each value; none is left waiting in a later collective.
TEST(DTensorApiTest, FromLocalRunCheckOnTwoMeshDimsFailsOnEveryRank) {
  run_on_ranks(4, [](ProcessGroup& pg) {
    auto mesh = make_mesh(pg, {"a", "b"}, {2, 2});
    for (const int odd : {3, 0}) {
      const Tensor local = ops::zeros({pg.rank() == odd ? 3 : 2, 2});
      EXPECT_THAT(
          testing::error_of([&] {
            from_local(local, mesh, {Replicate(), Replicate()}, std::nullopt, true);
          }),
          HasSubstr(odd == 3 ? "the global shape: ranks 0, 1, 2 pass a global shape of (2, 2); "
                               "rank 3 passes a global shape of (3, 2)"
                             : "the global shape: rank 0 passes a global shape of (3, 2); ranks "
                               "1, 2, 3 pass a global shape of (2, 2)"))
          << "rank " << pg.rank();
    }
    // Agreeing ranks still pass, and Replicate takes coordinate 0's values along each dim.
    const Tensor agreed = from_local(ops::full({2}, pg.rank() + 1.0), mesh,
                                     {Replicate(), Replicate()}, std::nullopt, true);
    expect_equal({.actual = local_shard(agreed), .expected = ops::full({2}, 1.0)});
  });
}

TEST(DTensorApiTest, PlacementErrorsNameMeshAndPlacements) {
  run_on_ranks(4, [](ProcessGroup& pg) {
    auto mesh = make_mesh(pg, {"dp", "tp"}, {2, 2});
    try {
      distribute_tensor(ops::ones({4, 4}), mesh, {Shard(0)});
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_THAT(
          e.what(),
          HasSubstr("distribute_tensor: got 1 placement [S(0)] for DeviceMesh(dp=2, tp=2, cpu) "
                    "with 2 dims; pass one placement per mesh dim"));
    }
    try {
      distribute_tensor(ops::ones({4, 4}), mesh, {Shard(2), Replicate()});
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_THAT(
          e.what(),
          HasSubstr("placement S(2) on mesh dim 0 ('dp') shards dim 2 of a tensor with 2 dims; "
                    "a Shard dim is in [-2, 2)"));
    }
    auto line = make_mesh(pg, {"tp"}, {4});
    try {
      distribute_tensor(ops::ones({4}), line, {Shard(0), Replicate()});
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("for DeviceMesh(tp=4, cpu) with 1 dim; pass one placement "
                                      "per mesh dim"));
    }
    const Tensor d = distribute_tensor(ops::ones({4, 4}), mesh, {Shard(0), Replicate()});
    try {
      from_local(d, mesh, {Shard(0), Replicate()});
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(),
                  HasSubstr("from_local: expected a plain local tensor, got a DTensor ("));
    }
  });
}

TEST(DTensorApiTest, OpsOnDifferentMeshesAndPlainTensorsAreRejected) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = make_mesh(pg, {"tp"}, {2});
    Tensor x = distribute_tensor(ops::ones({4}), mesh, {Shard(0)});
    try {
      ops::add(x, ops::ones({4}));
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("add: input 1 is a plain tensor"));
    }
  });
}

TEST(DTensorApiTest, GradientFlowsBackThroughRedistributeAsTheAdjoint) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = make_mesh(pg, {"tp"}, {2});
    const Tensor weights = integer_tensor({4, 6}, 2);
    // S(0) -> S(1) -> R: the gradient of sum(y * W) is W, laid out as S(0).
    Tensor x = distribute_tensor(integer_tensor({4, 6}, 3), mesh, {Shard(0)});
    x.set_requires_grad(true);
    Tensor y = full_tensor(redistribute(redistribute(x, {Shard(1)}), {Replicate()}));
    backward(sum(mul(y, weights)));
    ASSERT_TRUE(x.grad().defined());
    EXPECT_EQ(dtensor_spec(x.grad()).placements, (Placements{Shard(0)}));
    expect_equal({.actual = full_tensor(x.grad()), .expected = weights});
  });
}

TEST(DTensorApiTest, ShardedRandomInitEqualsTheSliceOfTheFullInitBitForBit) {
  for (int world : {2, 4}) {
    run_on_ranks(world, [world](ProcessGroup& pg) {
      const Shape shape{7, 5};
      const Tensor reference = ops::normal(shape, 42, 0.0, 0.02);
      auto mesh = world == 4 ? make_mesh(pg, {"dp", "tp"}, {2, 2}) : make_mesh(pg, {"tp"}, {2});
      std::vector<Placements> layouts =
          world == 4 ? std::vector<Placements>{{Shard(0), Shard(1)},
                                               {Shard(1), Shard(0)},
                                               {Shard(0), Shard(0)},
                                               {Replicate(), Shard(1)}}
                     : std::vector<Placements>{{Shard(0)}, {Shard(1)}, {Replicate()}};
      for (const auto& placements : layouts) {
        Tensor x = dtensor_normal(shape, 42, 0.0, 0.02, mesh, placements);
        const DTensorSpec& spec = dtensor_spec(x);
        Tensor expected = reference;
        for (int64_t d = 0; d < 2; ++d)
          expected = ops::narrow(expected, d, spec.local_offset()[d], spec.local_shape()[d]);
        expect_equal(
            {.actual = local_shard(x), .expected = expected, .what = placements_str(placements)});
      }
    });
  }
}

TEST(DTensorApiTest, ScalarArgumentsDoNotGrowTheDecisionCache) {
  // Learning rates and clip scales change every step; one decision must serve them all (a
  // training job once grew ~1 MiB per step here).
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = make_mesh(pg, {"tp"}, {2});
    Tensor x = distribute_tensor(integer_tensor({4, 3}, 5), mesh, {Shard(0)});
    sharding::clear_propagation_cache();
    for (int i = 0; i < 50; ++i) {
      Tensor y = ops::mul(x, 1.0 + i);
      expect_equal({.actual = local_shard(y), .expected = ops::mul(local_shard(x), 1.0 + i)});
    }
    EXPECT_EQ(sharding::propagation_stats().cache_misses, 1);
    EXPECT_EQ(sharding::propagation_stats().cache_hits, 49);
  });
}

TEST(DTensorApiTest, DropoutSeedsDoNotGrowTheDecisionCache) {
  // Every dropout call draws a new seed (nn::Dropout, GPT's attention dropout); the decision must
  // not depend on it, or a training run adds a cache entry per call.
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = make_mesh(pg, {"tp"}, {2});
    Tensor x = distribute_tensor(integer_tensor({4, 3}, 5), mesh, {Shard(0)});
    Tensor q = distribute_tensor(integer_tensor({2, 2, 3, 4}, 6), mesh, {Shard(1)});
    sharding::clear_propagation_cache();
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      const Tensor y = ops::dropout(x, 0.5, seed).out;
      const auto a =
          ops::scaled_dot_product_attention(q, q, q, true, 0.0, 0, {.p = 0.5, .seed = seed});
      const auto g = ops::scaled_dot_product_attention_backward(
          a.out, q, q, q, a.out, a.logsumexp, true, 0.0, 0, false, {.p = 0.5, .seed = seed});
      EXPECT_EQ(dtensor_spec(a.out).placements, Placements{Shard(1)});
      EXPECT_EQ(dtensor_spec(g.dq).placements, Placements{Shard(1)});
      EXPECT_EQ(dtensor_spec(y).placements, Placements{Shard(0)});
    }
    EXPECT_EQ(sharding::propagation_stats().cache_misses, 3) << "one per op, whatever the seed";
  });
}

}  // namespace
}  // namespace loom
