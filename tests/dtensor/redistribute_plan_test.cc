#include "dtensor/redistribute_plan.h"

#include <gtest/gtest.h>

namespace loom {
namespace {

using comm::ReduceOp;

std::string plan(const Placements& from, const Placements& to) {
  return plan_redistribute(from, to).str();
}

TEST(RedistributePlanTest, OneDimTransitionsUseOneCollectiveOrNone) {
  EXPECT_EQ(plan({Shard(0)}, {Replicate()}), "S(0) -> R");
  EXPECT_EQ(plan({Replicate()}, {Shard(1)}), "R -> S(1)");
  EXPECT_EQ(plan({Partial()}, {Replicate()}), "P(sum) -> R");
  EXPECT_EQ(plan({Partial()}, {Shard(0)}), "P(sum) -> S(0)");
  EXPECT_EQ(plan({Shard(0)}, {Shard(1)}), "S(0) -> S(1)");
  EXPECT_EQ(plan({Replicate()}, {Partial(ReduceOp::kMax)}), "R -> P(max)");
  EXPECT_EQ(plan({Partial(ReduceOp::kSum)}, {Partial(ReduceOp::kAvg)}), "P(sum) -> R -> P(avg)");
  EXPECT_EQ(plan({Shard(0)}, {Partial()}), "S(0) -> R -> P(sum)");
  EXPECT_EQ(plan({Shard(0)}, {Shard(0)}), "S(0)");

  const auto p = plan_redistribute({Partial()}, {Shard(0)});
  ASSERT_EQ(p.steps.size(), 1u);
  EXPECT_EQ(p.steps[0].kind, RedistributeStep::Kind::kReduceScatter);
  EXPECT_EQ(p.collective_count(), 1);
  EXPECT_EQ(plan_redistribute({Replicate()}, {Shard(0)}).collective_count(), 0);
}

TEST(RedistributePlanTest, TwoDimPlansPrintEachIntermediateState) {
  EXPECT_EQ(plan({Shard(0), Replicate()}, {Replicate(), Shard(1)}), "S(0)R -> RR -> RS(1)");
  EXPECT_EQ(plan({Partial(), Shard(0)}, {Replicate(), Shard(0)}), "P(sum)S(0) -> RS(0)");
  EXPECT_EQ(plan({Shard(0), Shard(1)}, {Shard(1), Shard(0)}),
            "S(0)S(1) -> S(0)R -> RR -> S(1)R -> S(1)S(0)");
}

TEST(RedistributePlanTest, NestedShardOfOneTensorDimRespectsMeshOrder) {
  // [R, S(0)] -> [S(0), S(0)]: mesh dim 1's S(0) means a different chunk before and after
  // (after, it splits mesh dim 0's chunk), so it must be gathered and re-chunked.
  EXPECT_EQ(plan({Replicate(), Shard(0)}, {Shard(0), Shard(0)}),
            "RS(0) -> RR -> S(0)R -> S(0)S(0)");
  // The outer one unchanged: inner transitions run alone.
  EXPECT_EQ(plan({Shard(0), Shard(0)}, {Shard(0), Replicate()}), "S(0)S(0) -> S(0)R");
  // Partial -> Shard on a tensor dim another mesh dim shards cannot reduce-scatter directly.
  EXPECT_EQ(plan({Shard(0), Partial()}, {Shard(0), Shard(0)}), "S(0)P(sum) -> S(0)R -> S(0)S(0)");
  EXPECT_EQ(plan({Partial(), Shard(0)}, {Shard(0), Shard(0)}),
            "P(sum)S(0) -> P(sum)R -> RR -> S(0)R -> S(0)S(0)");
}

TEST(RedistributePlanTest, EveryPairOnThreeDimMeshReachesItsTarget) {
  // plan_redistribute asserts internally that each plan ends at its target; run it on every
  // pair of placements of a 3-D mesh over a 2-D tensor, and check step bookkeeping.
  std::vector<Placement> choices{Replicate(), Shard(0), Shard(1), Partial(),
                                 Partial(ReduceOp::kMax)};
  int pairs = 0;
  for (const auto& a0 : choices)
    for (const auto& a1 : choices)
      for (const auto& a2 : choices)
        for (const auto& b0 : choices)
          for (const auto& b1 : choices)
            for (const auto& b2 : choices) {
              const Placements from{a0, a1, a2}, to{b0, b1, b2};
              const auto p = plan_redistribute(from, to);
              Placements state = from;
              for (const auto& step : p.steps) {
                ASSERT_EQ(state[step.mesh_dim], step.from);
                state[step.mesh_dim] = step.to;
                ASSERT_EQ(state, step.after);
              }
              ASSERT_EQ(state, to) << p.str();
              if (from == to) {
                EXPECT_TRUE(p.steps.empty());
              }
              ++pairs;
            }
  EXPECT_EQ(pairs, 15625);
}

}  // namespace
}  // namespace loom
