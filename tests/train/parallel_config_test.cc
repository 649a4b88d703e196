// ParallelDims and ParallelConfig: every layout the job cannot run is rejected once, up front,
// naming the field and the values; the mesh is (pp, dp, tp) in that order.
#include "train/parallel_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "comm/testing/multi_rank.h"
#include "tests/testing/errors.h"
#include "train/parallel_dims.h"

namespace loom::train {
namespace {

using loom::testing::error_of;
using ::testing::HasSubstr;

TEST(ParallelDimsTest, DegreesMultiplyToTheWorld) {
  const ParallelDims dims{.pp = 2, .dp_replicate = 2, .dp_shard = 2, .tp = 2};
  EXPECT_EQ(dims.world_size(), 16);
  EXPECT_EQ(dims.dp(), 4);
  EXPECT_EQ(dims.names(), (std::vector<std::string>{"pp", "dp_replicate", "dp_shard", "cp", "tp"}));
  EXPECT_EQ(dims.sizes(), (std::vector<int64_t>{2, 2, 2, 1, 2}));
  EXPECT_NO_THROW(dims.validate(16));
  EXPECT_EQ(error_of([&] { dims.validate(6); }),
            "ParallelDims: pp=2 x dp_replicate=2 x dp_shard=2 x tp=2 = 16 ranks, but the world "
            "has 6; the degrees must multiply to the number of ranks");
  EXPECT_EQ(error_of([] { ParallelDims{.dp_replicate = 0}.validate(0); }),
            "ParallelDims: dp_replicate must be at least 1, got 0");
  EXPECT_EQ(error_of([] { ParallelDims{.dp_shard = -1}.validate(4); }),
            "ParallelDims: dp_shard must be at least 1 (or -1, resolved first: "
            "ParallelDims::resolved), got -1");
  EXPECT_EQ(ParallelDims{}.str(), "pp=1");
}

TEST(ParallelDimsTest, DpShardMinusOneTakesWhatTheOthersLeave) {
  const ParallelDims dims = ParallelDims{.pp = 2, .dp_shard = -1, .tp = 2}.resolved(16);
  EXPECT_EQ(dims.dp_shard, 4);
  EXPECT_EQ(ParallelDims{.dp_shard = 3}.resolved(16).dp_shard, 3);  // nothing to resolve
  EXPECT_EQ(error_of([] { ParallelDims{.dp_shard = -1, .tp = 3}.resolved(8); }),
            "ParallelDims: dp_shard -1 takes the ranks the other degrees leave, but pp=1 x "
            "dp_replicate=1 x cp=1 x tp=3 = 3 does not divide the world of 8");
}

TEST(ParallelDimsTest, BuildsThePpDpTpMesh) {
  comm::testing::run_on_ranks(4, [](comm::ProcessGroup& pg) {
    const auto mesh = ParallelDims{.dp_shard = 2, .tp = 2}.build_mesh(pg.shared_from_this());
    EXPECT_EQ(mesh->dim_names(),
              (std::vector<std::string>{"pp", "dp_replicate", "dp_shard", "cp", "tp"}));
    EXPECT_EQ(mesh->shape(), (std::vector<int64_t>{1, 1, 2, 1, 2}));
    // tp innermost: tensor-parallel peers are neighbouring ranks.
    EXPECT_EQ(mesh->coordinate(mesh->dim_index("tp")), pg.rank() % 2);
    EXPECT_EQ(data_parallel_size(*mesh), 2);
    EXPECT_EQ(data_parallel_rank(*mesh), pg.rank() / 2);
    // HSDP: the data-parallel rank is replicate-major.
    const auto hsdp =
        ParallelDims{.dp_replicate = 2, .dp_shard = 2}.build_mesh(pg.shared_from_this());
    EXPECT_EQ(data_parallel_size(*hsdp), 4);
    EXPECT_EQ(data_parallel_rank(*hsdp), pg.rank());
    EXPECT_THAT(
        error_of([&] { ParallelDims{.dp_replicate = 3}.build_mesh(pg.shared_from_this()); }),
        HasSubstr("= 3 ranks, but the world has 4"));
  });
}

TEST(ParallelConfigTest, RejectsLayoutsTheBatchCannotRun) {
  const auto error = [](ParallelConfig c, int64_t world, int64_t batch, int64_t seq) {
    return error_of([&] { c.validate(world, batch, seq); });
  };
  EXPECT_NO_THROW((ParallelConfig{.dims = {.dp_replicate = 2, .tp = 2}}).validate(4, 16, 64));
  EXPECT_THAT(error({.dims = {.dp_replicate = 2}}, 2, 15, 64),
              HasSubstr("a global batch of 15 sequences does not split over dp x grad_accum = "
                        "2 x 1 (dp = dp_replicate x dp_shard)"));
  EXPECT_THAT(error({.dims = {.dp_replicate = 2, .dp_shard = 2}}, 4, 6, 64),
              HasSubstr("a global batch of 6 sequences does not split over dp x grad_accum = "
                        "4 x 1"));
  EXPECT_THAT(error({.dims = {.dp_replicate = 2}, .grad_accum = 3}, 2, 16, 64),
              HasSubstr("does not split over dp x grad_accum = 2 x 3"));
  // Pipelines accumulate over several schedule runs: each run's share must split into the
  // schedule's microbatches (pp 2: 2 by default).
  EXPECT_NO_THROW((ParallelConfig{.dims = {.pp = 2}, .grad_accum = 2}).validate(2, 16, 64));
  EXPECT_THAT(error({.dims = {.pp = 2}, .grad_accum = 3}, 2, 9, 64),
              HasSubstr("each dp rank's 9 sequences over grad_accum 3 do not split into 2 "
                        "microbatches"));
  EXPECT_THAT(error({.dims = {.pp = 2}, .pipeline = {.schedule = "zigzag"}}, 2, 16, 64),
              HasSubstr("zigzag"));
  EXPECT_THAT(error({.dims = {.pp = 2}, .pipeline = {.microbatches = 3}}, 2, 16, 64),
              HasSubstr("each dp rank's 16 sequences over grad_accum 1 do not split into 3 "
                        "microbatches"));
  EXPECT_THAT(error({.pipeline = {.microbatches = 4}}, 1, 16, 64),
              HasSubstr("microbatches and virtual_stages apply to pipelines (pp > 1)"));
  EXPECT_THAT(error({.dims = {.tp = 2}}, 2, 16, 63),
              HasSubstr("a sequence length of 63 does not divide by tp 2"));
  EXPECT_NO_THROW((ParallelConfig{.dims = {.tp = 2}, .tp_plan = {.sequence_parallel = false}})
                      .validate(2, 16, 63));
  EXPECT_THAT(error({.dims = {.dp_replicate = 2}}, 4, 16, 64), HasSubstr("but the world has 4"));
}

TEST(ParallelConfigTest, MicrobatchesDefaultToEveryStageBusy) {
  EXPECT_EQ((ParallelConfig{.dims = {.pp = 4}}).microbatches(), 4);
  EXPECT_EQ((ParallelConfig{.dims = {.pp = 2}, .pipeline = {.virtual_stages = 2}}).microbatches(),
            4);
  EXPECT_EQ((ParallelConfig{.dims = {.pp = 2}, .pipeline = {.microbatches = 8}}).microbatches(), 8);
  // The V schedules hold two stages per rank without being told.
  EXPECT_EQ((ParallelConfig{.dims = {.pp = 4}, .pipeline = {.schedule = "zbv"}}).microbatches(), 8);
  EXPECT_EQ(
      (ParallelConfig{.dims = {.pp = 2}, .pipeline = {.schedule = "dualpipev"}}).microbatches(), 4);
  EXPECT_EQ(
      ParallelConfig({.dims = {.pp = 2}, .pipeline = {.schedule = "zbv"}}).stage_ranges(4).size(),
      4u);
  EXPECT_EQ(ParallelConfig{}.microbatches(), 1);
}

}  // namespace
}  // namespace loom::train
