// Property test of redistribute: over 10,000+ random cases, a tensor distributed with one
// placement list and redistributed through a random chain of others comes back bit for bit
// (full_tensor equals the original), and every intermediate step has its target placements and,
// when it has no Partial, exactly the slice of the original at its local offset/shape.
//
// Cases: tensor rank 1-3 with sizes 0-13 per dim (empty and uneven shards included); meshes of
// 1-8 ranks, 1-D and every 2-D factorization (size-1 mesh dims included); chains of 1-4
// placement lists, each placement R, S(d) for a valid d, P(sum) or P(max). Every rank thread
// draws the same cases from the same seeded std::mt19937; all cases of a world size run inside
// one run_on_ranks call.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <iostream>
#include <random>
#include <vector>

#include "comm/testing/multi_rank.h"
#include "dtensor/dtensor.h"
#include "dtensor/redistribute_plan.h"
#include "tensor/ops.h"
#include "tests/dtensor/dtensor_test_util.h"

namespace loom {
namespace {

using comm::ProcessGroup;
using comm::ReduceOp;
using comm::testing::run_on_ranks;

struct Case {
  Shape shape;
  size_t mesh;                    // index into the world's meshes
  std::vector<Placements> chain;  // chain[0]: distribute_tensor; then redistribute to each
  uint64_t seed;
};

// Every mesh of `world` ranks: 1-D, and 2-D for every factorization a x (world / a).
std::vector<std::vector<int64_t>> mesh_shapes(int64_t world) {
  std::vector<std::vector<int64_t>> out{{world}};
  for (int64_t a = 1; a <= world; ++a) {
    if (world % a == 0) out.push_back({a, world / a});
  }
  return out;
}

Placement random_placement(std::mt19937& rng, int64_t tensor_ndim) {
  // R, S(0) .. S(ndim - 1), P(sum), P(max), equally likely.
  const int64_t pick = std::uniform_int_distribution<int64_t>(0, tensor_ndim + 2)(rng);
  if (pick == 0) return Replicate();
  if (pick <= tensor_ndim) return Shard(pick - 1);
  return pick == tensor_ndim + 1 ? Partial(ReduceOp::kSum) : Partial(ReduceOp::kMax);
}

Case random_case(std::mt19937& rng, size_t mesh_count,
                 const std::vector<std::vector<int64_t>>& shapes) {
  Case c;
  const int64_t ndim = std::uniform_int_distribution<int64_t>(1, 3)(rng);
  for (int64_t d = 0; d < ndim; ++d)
    c.shape.push_back(std::uniform_int_distribution<int64_t>(0, 13)(rng));
  c.mesh = std::uniform_int_distribution<size_t>(0, mesh_count - 1)(rng);
  const int64_t length = std::uniform_int_distribution<int64_t>(1, 4)(rng);
  for (int64_t k = 0; k < length; ++k) {
    Placements placements;
    for (size_t md = 0; md < shapes[c.mesh].size(); ++md)
      placements.push_back(random_placement(rng, ndim));
    c.chain.push_back(std::move(placements));
  }
  c.seed = rng();
  return c;
}

std::string describe(int64_t index, const Case& c, const DeviceMesh& mesh) {
  std::vector<std::string> chain;
  for (const auto& p : c.chain) chain.push_back(placements_str(p));
  return fmt::format("case {}: shape {} on {}: {}", index, shape_str(c.shape), mesh.str(),
                     fmt::join(chain, " -> "));
}

bool has_partial(const Placements& placements) {
  for (const auto& p : placements) {
    if (p.is_partial()) return true;
  }
  return false;
}

// Bit patterns of the values (f32 widened to f64 exactly), so -0 and NaN payloads count too.
std::vector<uint64_t> bits(const Tensor& t) {
  std::vector<uint64_t> out;
  for (double v : ops::to_vector(t)) out.push_back(std::bit_cast<uint64_t>(v));
  return out;
}

Tensor slice_of(const Tensor& full, const DTensorSpec& spec) {
  const Shape offset = spec.local_offset(), shape = spec.local_shape();
  Tensor out = full;
  for (size_t d = 0; d < shape.size(); ++d)
    out = ops::narrow(out, static_cast<int64_t>(d), offset[d], shape[d]);
  return out;
}

// Runs `count` cases on `world` ranks; returns the number run (counted on rank 0).
int64_t run_cases(int world, int64_t count) {
  std::atomic<int64_t> ran{0};
  comm::testing::MultiRankOptions options;
  options.deadline = std::chrono::seconds(300);
  run_on_ranks(
      world,
      [world, count, &ran](ProcessGroup& pg) {
        const auto shapes = mesh_shapes(world);
        std::vector<std::shared_ptr<const DeviceMesh>> meshes;
        for (const auto& shape : shapes) {
          std::vector<std::string> names;
          for (size_t md = 0; md < shape.size(); ++md) names.push_back(md == 0 ? "a" : "b");
          meshes.push_back(loom::testing::make_mesh(pg, names, shape));
        }
        std::mt19937 rng(20261202u + static_cast<unsigned>(world));  // the same cases on every rank
        int64_t failures = 0;
        for (int64_t i = 0; i < count; ++i) {
          const Case c = random_case(rng, meshes.size(), shapes);
          const auto& mesh = meshes[c.mesh];
          const Tensor original = ops::uniform(c.shape, c.seed, -4.0, 4.0);
          bool ok = true;
          try {
            Tensor x = distribute_tensor(original, mesh, c.chain[0], std::nullopt);
            for (size_t k = 0; k < c.chain.size(); ++k) {
              if (k > 0) x = redistribute(x, c.chain[k]);
              const DTensorSpec& spec = dtensor_spec(x);
              ok = ok && spec.placements == c.chain[k] && spec.shape == c.shape;
              if (!has_partial(spec.placements))
                ok = ok && bits(local_shard(x)) == bits(slice_of(original, spec));
            }
            ok = ok && bits(full_tensor(x)) == bits(original);
          } catch (const std::exception& e) {
            throw std::runtime_error(fmt::format("{}: {}", describe(i, c, *mesh), e.what()));
          }
          if (!ok && ++failures <= 5)
            ADD_FAILURE() << describe(i, c, *mesh) << ": values or placements differ";
          if (pg.rank() == 0) ++ran;
        }
        EXPECT_EQ(failures, 0) << "failed cases on rank " << pg.rank();
      },
      options);
  return ran.load();
}

TEST(RedistributePropertyTest, RandomChainsComeBackBitForBit) {
  // Cases per world size: weighted toward small worlds, where each collective is cheaper.
  const std::vector<std::pair<int, int64_t>> plan{{1, 2000}, {2, 2000}, {3, 1200}, {4, 1400},
                                                  {5, 700},  {6, 1000}, {7, 600},  {8, 1100}};
  int64_t total = 0;
  for (const auto& [world, count] : plan) {
    SCOPED_TRACE(fmt::format("world {}", world));
    const auto start = std::chrono::steady_clock::now();
    const int64_t ran = run_cases(world, count);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << fmt::format("world {}: {} cases in {:.1f} s", world, ran, seconds) << std::endl;
    EXPECT_EQ(ran, count);
    total += ran;
  }
  std::cout << "total: " << total << " cases" << std::endl;
  RecordProperty("cases", static_cast<int>(total));
  ASSERT_GE(total, 10000);
}

}  // namespace
}  // namespace loom
