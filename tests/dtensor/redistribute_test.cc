// redistribute on real Gloo ranks, for EVERY pair of placements (per mesh dim one of R, S(0),
// S(1), P(sum), P(avg), P(max)) on 1-D meshes of 2, 3 and 4 ranks and 2-D meshes of 2x2 and
// 2x3, with an even and an uneven 2-D tensor. For each pair it checks
//   (a) the output placements are the target;
//   (b) values: a non-Partial target's local shard is exactly the slice of the full tensor at
//       spec.local_offset() / local_shape() (nested shards included); a target with a Partial
//       reduces to the full tensor (full_tensor(y) == X);
//   (c) the collectives issued inside redistribute() are exactly the plan's steps: per kind,
//       all_gather / all_reduce / reduce_scatter / all_to_all, and nothing else.
// And gradients: for representative pairs, the gradient of sum(full_tensor(y) * W) is W with
// the source's placements, Partial replaced by Replicate.
#include "dtensor/redistribute.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "comm/testing/multi_rank.h"
#include "dtensor/comm_debug_mode.h"
#include "dtensor/dtensor.h"
#include "dtensor/redistribute_plan.h"
#include "tests/dtensor/dtensor_test_util.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

using comm::CollectiveKind;
using comm::ProcessGroup;
using comm::ReduceOp;
using comm::testing::run_on_ranks;
using loom::testing::expect_equal;
using loom::testing::integer_tensor;
using loom::testing::make_mesh;
using StepKind = RedistributeStep::Kind;

// Every placement list of an `ndim`-D mesh over a 2-D tensor.
std::vector<Placements> all_placements(int64_t mesh_ndim) {
  const std::vector<Placement> choices{Replicate(),
                                       Shard(0),
                                       Shard(1),
                                       Partial(ReduceOp::kSum),
                                       Partial(ReduceOp::kAvg),
                                       Partial(ReduceOp::kMax)};
  std::vector<Placements> out{{}};
  for (int64_t md = 0; md < mesh_ndim; ++md) {
    std::vector<Placements> next;
    for (const auto& prefix : out) {
      for (const auto& p : choices) {
        Placements longer = prefix;
        longer.push_back(p);
        next.push_back(std::move(longer));
      }
    }
    out = std::move(next);
  }
  return out;
}

bool has_partial(const Placements& placements) {
  for (const auto& p : placements) {
    if (p.is_partial()) return true;
  }
  return false;
}

// The slice of `full` this rank holds under `spec`.
Tensor expected_local(const Tensor& full, const DTensorSpec& spec) {
  const Shape offset = spec.local_offset(), shape = spec.local_shape();
  Tensor out = full;
  for (size_t d = 0; d < shape.size(); ++d)
    out = ops::narrow(out, static_cast<int64_t>(d), offset[d], shape[d]);
  return ops::contiguous(out);
}

// The collectives a plan issues, per kind.
std::map<CollectiveKind, int64_t> plan_collectives(const RedistributePlan& plan) {
  std::map<CollectiveKind, int64_t> out;
  for (const auto& step : plan.steps) {
    switch (step.kind) {
      case StepKind::kAllGather:
        ++out[CollectiveKind::kAllGather];
        break;
      case StepKind::kAllReduce:
        ++out[CollectiveKind::kAllReduce];
        break;
      case StepKind::kReduceScatter:
        ++out[CollectiveKind::kReduceScatter];
        break;
      case StepKind::kAllToAll:
        ++out[CollectiveKind::kAllToAll];
        break;
      case StepKind::kLocalChunk:
      case StepKind::kLocalPartial:
        break;
    }
  }
  return out;
}

std::map<CollectiveKind, int64_t> observed_collectives(const CommDebugMode& comm) {
  std::map<CollectiveKind, int64_t> out;
  for (int k = 0; k < comm::kNumCollectiveKinds; ++k) {
    const auto kind = static_cast<CollectiveKind>(k);
    if (comm.count(kind) > 0) out[kind] = comm.count(kind);
  }
  return out;
}

std::string kinds_str(const std::map<CollectiveKind, int64_t>& kinds) {
  std::string out;
  for (const auto& [kind, n] : kinds)
    out += fmt::format("{}{}x{}", out.empty() ? "" : ", ", n, comm::collective_name(kind));
  return out.empty() ? "none" : out;
}

// Runs every (source, target) pair on `mesh` for `full`; returns the number of pairs run.
int64_t check_every_pair(const std::shared_ptr<const DeviceMesh>& mesh, const Tensor& full) {
  const auto placements = all_placements(mesh->ndim());
  int64_t pairs = 0;
  for (const auto& src : placements) {
    // Every rank passes the same `full`, so no broadcast is needed.
    const Tensor x = distribute_tensor(full, mesh, src, std::nullopt);
    for (const auto& tgt : placements) {
      const RedistributePlan plan = plan_redistribute(src, tgt);
      SCOPED_TRACE(fmt::format("{} {}: {}", mesh->str(), shape_str(full.shape()), plan.str()));
      Tensor y;
      std::map<CollectiveKind, int64_t> observed;
      {
        CommDebugMode comm;
        y = redistribute(x, tgt);
        observed = observed_collectives(comm);
      }
      ++pairs;
      // (a) placements and global shape.
      const DTensorSpec& spec = dtensor_spec(y);
      EXPECT_EQ(spec.placements, tgt) << placements_str(spec.placements);
      EXPECT_EQ(spec.shape, full.shape());
      // (c) collectives, per kind.
      const auto expected = plan_collectives(plan);
      EXPECT_EQ(observed, expected)
          << "issued " << kinds_str(observed) << ", plan has " << kinds_str(expected);
      // (b) values.
      if (has_partial(tgt)) {
        EXPECT_EQ(local_shard(y).shape(), spec.local_shape());
        expect_equal({.actual = full_tensor(y),
                      .expected = full,
                      .what = "full_tensor of the Partial target"});
      } else {
        expect_equal({.actual = local_shard(y),
                      .expected = expected_local(full, spec),
                      .what = "local shard"});
      }
    }
  }
  return pairs;
}

// An even shape (every nested split exact) and an uneven one: (world*3+1, 5).
void check_every_pair_both_shapes(const std::shared_ptr<const DeviceMesh>& mesh) {
  const int64_t n = mesh->numel();
  const int64_t pairs = check_every_pair(mesh, integer_tensor({2 * n, 2 * n}, 11)) +
                        check_every_pair(mesh, integer_tensor({3 * n + 1, 5}, 12));
  const int64_t per_shape = mesh->ndim() == 1 ? 36 : 36 * 36;
  EXPECT_EQ(pairs, 2 * per_shape);
}

// The all-pairs runs issue thousands of collectives; on a loaded 2-core machine they may take
// longer than run_on_ranks' default deadline of 60 s.
comm::testing::MultiRankOptions long_run() {
  comm::testing::MultiRankOptions options;
  options.deadline = std::chrono::seconds(240);
  return options;
}

TEST(CommDebugModeTest, CountsEachGroupApart) {
  // A gather along "tp" of a 2 x 2 mesh runs on the tp group only, and the per-group counts add
  // up to the totals.
  run_on_ranks(4, [](ProcessGroup& pg) {
    auto mesh = make_mesh(pg, {"dp", "tp"}, {2, 2});
    const Tensor x =
        distribute_tensor(integer_tensor({4, 2}, 1), mesh, {Replicate(), Shard(0)}, std::nullopt);
    CommDebugMode comm;
    redistribute(x, {Replicate(), Replicate()});
    const auto groups = comm.by_group();
    ASSERT_EQ(groups.size(), 1u);
    EXPECT_EQ(groups.begin()->first, "mesh/tp");
    EXPECT_EQ(groups.begin()->second.calls_of(CollectiveKind::kAllGather), 1);
    EXPECT_EQ(groups.begin()->second.bytes_of(CollectiveKind::kAllGather),
              comm.bytes(CollectiveKind::kAllGather));
    EXPECT_EQ(groups.begin()->second.total_calls(), comm.total_count());
  });
}

TEST(RedistributeTest, EveryPairOnOneDimMeshOfTwo) {
  run_on_ranks(2,
               [](ProcessGroup& pg) { check_every_pair_both_shapes(make_mesh(pg, {"x"}, {2})); });
}

TEST(RedistributeTest, EveryPairOnOneDimMeshOfThree) {
  run_on_ranks(3,
               [](ProcessGroup& pg) { check_every_pair_both_shapes(make_mesh(pg, {"x"}, {3})); });
}

TEST(RedistributeTest, EveryPairOnOneDimMeshOfFourAndTwoByTwo) {
  run_on_ranks(
      4,
      [](ProcessGroup& pg) {
        check_every_pair_both_shapes(make_mesh(pg, {"x"}, {4}));
        check_every_pair_both_shapes(make_mesh(pg, {"dp", "tp"}, {2, 2}));
      },
      long_run());
}

TEST(RedistributeTest, EveryPairOnTwoByThree) {
  run_on_ranks(
      6,
      [](ProcessGroup& pg) {
        check_every_pair_both_shapes(make_mesh(pg, {"dp", "tp"}, {2, 3}));
      },
      long_run());
}

TEST(RedistributeTest, MeshWithExplicitReversedRanks) {
  // Ranks [3, 2, 1, 0]: chunk c of a shard lives at mesh coordinate c, whatever its global rank.
  run_on_ranks(
      4,
      [](ProcessGroup& pg) {
        auto reversed = std::make_shared<const DeviceMesh>(
            pg.shared_from_this(), std::vector<std::string>{"x"}, std::vector<int64_t>{4},
            std::vector<int>{3, 2, 1, 0});
        // distribute_tensor takes the data of coordinate 0: rank 3.
        const Tensor mine =
            distribute_tensor(ops::full({2}, pg.rank() + 1.0), reversed, {Replicate()});
        expect_equal({.actual = local_shard(mine),
                      .expected = ops::full({2}, 4.0),
                      .what = "data of coordinate 0"});
        const Tensor full = integer_tensor({13, 5}, 13);
        const Tensor x = distribute_tensor(full, reversed, {Shard(0)});
        EXPECT_EQ(dtensor_spec(x).local_offset()[0], 4 * (3 - pg.rank()));
        expect_equal({.actual = local_shard(x),
                      .expected = expected_local(full, dtensor_spec(x)),
                      .what = "distribute"});
        expect_equal({.actual = full_tensor(x), .expected = full, .what = "S(0) -> R"});
        const Tensor y = redistribute(x, {Shard(1)});
        expect_equal({.actual = local_shard(y),
                      .expected = expected_local(full, dtensor_spec(y)),
                      .what = "S(0) -> S(1)"});
        const Tensor p = redistribute(y, {Partial()});
        expect_equal({.actual = local_shard(redistribute(p, {Shard(0)})),
                      .expected = local_shard(x),
                      .what = "P -> S(0)"});

        auto grid = std::make_shared<const DeviceMesh>(
            pg.shared_from_this(), std::vector<std::string>{"dp", "tp"}, std::vector<int64_t>{2, 2},
            std::vector<int>{3, 2, 1, 0});
        check_every_pair(grid, full);
      },
      long_run());
}

// ---- gradients ----

// x = distribute(X, src) requiring grad; y = redistribute(x, tgt); loss = sum(full_tensor(y) * W).
// Then x.grad() is a DTensor whose full tensor is W, placed as src with Partial -> Replicate.
void check_gradient(const std::shared_ptr<const DeviceMesh>& mesh, const Shape& shape,
                    const Placements& src, const Placements& tgt) {
  SCOPED_TRACE(fmt::format("{} {}: gradient of {}", mesh->str(), shape_str(shape),
                           plan_redistribute(src, tgt).str()));
  const Tensor full = integer_tensor(shape, 21);
  const Tensor weights = integer_tensor(shape, 22);
  Tensor x = distribute_tensor(full, mesh, src, std::nullopt);
  x.set_requires_grad(true);
  const Tensor y = redistribute(x, tgt);
  EXPECT_EQ(dtensor_spec(y).placements, tgt);
  backward(sum(mul(full_tensor(y), weights)));
  ASSERT_TRUE(x.grad().defined());
  ASSERT_TRUE(is_dtensor(x.grad()));
  Placements expected = src;
  for (auto& p : expected) {
    if (p.is_partial()) p = Replicate();
  }
  EXPECT_EQ(dtensor_spec(x.grad()).placements, expected)
      << placements_str(dtensor_spec(x.grad()).placements);
  expect_equal({.actual = full_tensor(x.grad()), .expected = weights, .what = "full gradient"});
}

TEST(RedistributeGradTest, OneDimMeshes) {
  const ReduceOp kMax = ReduceOp::kMax;
  for (int world : {2, 3, 4}) {
    run_on_ranks(world, [world, kMax](ProcessGroup& pg) {
      auto mesh = make_mesh(pg, {"x"}, {world});
      for (const Shape& shape : {Shape{2 * world, 4}, Shape{3 * world + 1, 5}}) {
        check_gradient(mesh, shape, {Partial()}, {Replicate()});
        check_gradient(mesh, shape, {Partial(kMax)}, {Replicate()});
        check_gradient(mesh, shape, {Shard(0)}, {Replicate()});
        check_gradient(mesh, shape, {Shard(1)}, {Replicate()});
        check_gradient(mesh, shape, {Partial()}, {Shard(0)});
        check_gradient(mesh, shape, {Partial(ReduceOp::kAvg)}, {Shard(1)});
        check_gradient(mesh, shape, {Shard(0)}, {Shard(1)});
        check_gradient(mesh, shape, {Shard(1)}, {Shard(0)});
        check_gradient(mesh, shape, {Replicate()}, {Partial()});
        check_gradient(mesh, shape, {Replicate()}, {Shard(1)});
        check_gradient(mesh, shape, {Shard(0)}, {Partial(kMax)});
      }
    });
  }
}

TEST(RedistributeGradTest, TwoDimMeshes) {
  for (const auto& [dp, tp] : {std::pair<int64_t, int64_t>{2, 2}, {2, 3}}) {
    run_on_ranks(static_cast<int>(dp * tp), [dp, tp](ProcessGroup& pg) {
      auto mesh = make_mesh(pg, {"dp", "tp"}, {dp, tp});
      const int64_t n = dp * tp;
      for (const Shape& shape : {Shape{2 * n, 2 * n}, Shape{3 * n + 1, 5}}) {
        check_gradient(mesh, shape, {Partial(), Partial()}, {Replicate(), Replicate()});
        check_gradient(mesh, shape, {Partial(), Shard(0)}, {Replicate(), Replicate()});
        check_gradient(mesh, shape, {Shard(0), Shard(0)}, {Replicate(), Replicate()});
        check_gradient(mesh, shape, {Shard(0), Shard(1)}, {Replicate(), Replicate()});
        check_gradient(mesh, shape, {Partial(), Replicate()}, {Shard(0), Shard(1)});
        check_gradient(mesh, shape, {Shard(0), Partial()}, {Shard(0), Shard(0)});
        check_gradient(mesh, shape, {Shard(0), Shard(1)}, {Shard(1), Shard(0)});
        check_gradient(mesh, shape, {Replicate(), Shard(0)}, {Replicate(), Shard(1)});
        check_gradient(mesh, shape, {Replicate(), Replicate()}, {Partial(), Shard(1)});
        check_gradient(mesh, shape, {Shard(1), Replicate()}, {Partial(ReduceOp::kMax), Partial()});
      }
    });
  }
}

}  // namespace
}  // namespace loom
