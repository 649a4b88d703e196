// `loom plan` (train/job_plan.h) against the job it plans: on each layout the real GPT is built
// on thread ranks (build_parallel_model, as the job builds it) and every rank's parameter elements
// (the local shards of its named_parameters) must equal the plan's, exactly. Layouts: tp with an
// even and an uneven vocabulary, pipeline stages (1f1b and interleaved), DDP, FSDP (uneven
// chunks), HSDP and pp x dp_shard x tp. The planned parameter list is checked name by name and
// shape by shape against the model's own. Bad layouts fail with the job's own messages.
#include "train/job_plan.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "comm/testing/multi_rank.h"
#include "dtensor/dtensor.h"
#include "models/gpt/family.h"
#include "models/gpt/gpt.h"
#include "models/gpt/parameter_layout.h"
#include "models/llama/family.h"
#include "models/llama/llama.h"
#include "parallel/ft/traced_replicas.h"
#include "tests/testing/errors.h"

namespace loom::train {
namespace {

using testing::error_of;

models::GPTConfig config(int64_t vocab = 40) {
  return {.n_layer = 4, .n_head = 2, .n_embd = 8, .block_size = 16, .vocab_size = vocab};
}

constexpr int64_t kBatch = 8, kSeq = 16;

// Each rank's parameter elements on the real model.
std::map<int, int64_t> measured_parameters(const models::ModelArgs& model,
                                           const ParallelConfig& parallel) {
  std::map<int, int64_t> out;
  std::mutex mutex;
  comm::testing::run_on_ranks(static_cast<int>(parallel.dims.world_size()),
                              [&](comm::ProcessGroup& pg) {
                                const auto mesh = parallel.dims.build_mesh(pg.shared_from_this());
                                const auto built = build_parallel_model(model, 3, mesh, parallel);
                                int64_t n = 0;
                                for (const auto& [name, p] : built->named_parameters()) {
                                  n += is_dtensor(p) ? local_shard(p).numel() : p.numel();
                                }
                                std::lock_guard<std::mutex> lock(mutex);
                                out[pg.rank()] = n;
                              });
  return out;
}

void expect_plan_matches(const models::ModelArgs& model, const ParallelConfig& parallel,
                         int64_t batch = kBatch) {
  SCOPED_TRACE(parallel.dims.str());
  const JobPlan plan = plan_job(model, parallel, batch, kSeq);
  const auto measured = measured_parameters(model, parallel);
  ASSERT_EQ(plan.ranks.size(), measured.size());
  for (const auto& [rank, n] : measured)
    EXPECT_EQ(plan.rank(rank).parameters, n) << "rank " << rank;
  // Roles cover every rank once.
  size_t covered = 0;
  for (const RankRole& role : plan.roles) covered += role.ranks.size();
  EXPECT_EQ(covered, measured.size());
}

TEST(JobPlan, PlannedParametersAreTheModelsOwn) {
  for (const models::StageRange range :
       {models::StageRange{0, 4, true, true}, models::StageRange{0, 2, true, false},
        models::StageRange{2, 3, false, false}, models::StageRange{3, 4, false, true}}) {
    const models::GPTStage stage(config(), 1, range);
    const auto planned = models::gpt_planned_parameters(config(), range);
    const auto actual = stage.named_parameters();
    ASSERT_EQ(planned.size(), actual.size());
    for (size_t i = 0; i < planned.size(); ++i) {
      EXPECT_EQ(planned[i].name, actual[i].first);
      EXPECT_EQ(planned[i].shape, actual[i].second.shape()) << planned[i].name;
    }
  }
}

// Llama's planned parameters (models/llama/family.h) are its stages' own, and its plan's
// per-rank shares match the real model under tp (GQA: kv heads over tp), FSDP and a pipeline.
TEST(JobPlan, LlamaPlannedParametersAreTheModelsOwn) {
  models::LlamaConfig llama = models::LlamaConfig::preset("llama-tiny");
  llama.n_layers = 4;
  for (const pipeline::StageRange range :
       {pipeline::StageRange{0, 4, true, true}, pipeline::StageRange{0, 2, true, false},
        pipeline::StageRange{2, 4, false, true}}) {
    const models::LlamaStage stage(llama, 1, range);
    const auto planned = models::llama_planned_parameters(llama, range);
    const auto actual = stage.named_parameters();
    ASSERT_EQ(planned.size(), actual.size());
    for (size_t i = 0; i < planned.size(); ++i) {
      EXPECT_EQ(planned[i].name, actual[i].first);
      EXPECT_EQ(planned[i].shape, actual[i].second.shape()) << planned[i].name;
    }
  }
  const auto args = models::llama_args(llama);
  expect_plan_matches(*args, {.dims = {.tp = 2}});
  expect_plan_matches(*args, {.dims = {.dp_shard = 2, .tp = 2}});
  expect_plan_matches(*args, {.dims = {.pp = 2}, .pipeline = {.microbatches = 2}});
}

TEST(JobPlan, TensorParallelEvenAndUnevenVocabulary) {
  expect_plan_matches(*models::gpt_args(config()), {.dims = {.tp = 2}});
  // 41 rows over tp=2: 21 and 20.
  const JobPlan uneven = plan_job(*models::gpt_args(config(41)), {.dims = {.tp = 2}}, kBatch, kSeq);
  EXPECT_EQ(uneven.rank(0).parameters - uneven.rank(1).parameters, 8);
  ASSERT_EQ(uneven.notes.size(), 1u);
  EXPECT_NE(uneven.notes[0].find("21 on the first tp ranks and 20 on the last"), std::string::npos);
  expect_plan_matches(*models::gpt_args(config(41)), {.dims = {.tp = 2}});
}

TEST(JobPlan, PipelineStages) {
  expect_plan_matches(*models::gpt_args(config()),
                      {.dims = {.pp = 2}, .pipeline = {.microbatches = 2}});
  expect_plan_matches(*models::gpt_args(config()),
                      {.dims = {.pp = 2, .tp = 2}, .pipeline = {.microbatches = 2}});
  expect_plan_matches(
      *models::gpt_args(config()),
      {.dims = {.pp = 2}, .pipeline = {.schedule = "interleaved", .virtual_stages = 2}});
  // The V schedules: rank 0 holds the first and the last stage (the embedding and the head).
  for (const std::string schedule : {"zbv", "dualpipev"}) {
    expect_plan_matches(*models::gpt_args(config()),
                        {.dims = {.pp = 2}, .pipeline = {.schedule = schedule, .microbatches = 4}});
  }
}

// The pipeline section: the schedule's own timeline and peaks per pp rank, the traced activation
// peak beside them (1F1B: p - r on rank r; ZBV: 2p on every rank of its half-depth stages).
TEST(JobPlan, PipelineScheduleSection) {
  const auto plan_of = [](const std::string& schedule) {
    return plan_job(*models::gpt_args(config()),
                    {.dims = {.pp = 2}, .pipeline = {.schedule = schedule, .microbatches = 4}},
                    kBatch, kSeq);
  };
  const JobPlan ofob = plan_of("1f1b"), zbv = plan_of("zbv");
  ASSERT_TRUE(ofob.pipeline && zbv.pipeline);
  EXPECT_EQ(ofob.pipeline->schedule, "1F1B");
  EXPECT_EQ(ofob.pipeline->peak_microbatches, (std::vector<int>{2, 1}));
  EXPECT_NEAR(ofob.pipeline->idle_share, 1.0 / 5.0, 1e-12);  // (p-1)/(m+p-1)
  EXPECT_EQ(zbv.pipeline->stages, (std::vector<std::vector<int>>{{0, 3}, {1, 2}}));
  EXPECT_EQ(zbv.pipeline->peak_microbatches, (std::vector<int>{4, 4}));
  EXPECT_LT(zbv.pipeline->idle_share, ofob.pipeline->idle_share / 3);
  const std::string text = format_job_plan(zbv);
  EXPECT_NE(text.find("Pipeline schedule ZBV (stage s on rank s for s < 2 and on rank 3 - s after "
                      "(a V); 4 stages, 4 microbatches)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("| 0 | 0,3 | 4 | "), std::string::npos) << text;
  EXPECT_FALSE(plan_job(*models::gpt_args(config()), {}, kBatch, kSeq).pipeline);
}

TEST(JobPlan, DataParallel) {
  expect_plan_matches(*models::gpt_args(config()), {.dims = {.dp_replicate = 2, .tp = 2}});
  // FSDP over 3 ranks: 40 vocabulary rows in chunks of 14, 14 and 12; widths 8 and 24 likewise.
  expect_plan_matches(*models::gpt_args(config()), {.dims = {.dp_shard = 3}}, /*batch=*/6);
  expect_plan_matches(*models::gpt_args(config()), {.dims = {.dp_replicate = 2, .dp_shard = 2}});
  expect_plan_matches(*models::gpt_args(config()),
                      {.dims = {.pp = 2, .dp_shard = 2, .tp = 2}, .pipeline = {.microbatches = 2}});
}

TEST(JobPlan, RolesGroupIdenticalRanks) {
  const JobPlan plan =
      plan_job(*models::gpt_args(config()), {.dims = {.dp_replicate = 2, .tp = 2}}, kBatch, kSeq);
  // Every rank holds the same shares under DDP x tp with an even vocabulary: one role.
  ASSERT_EQ(plan.roles.size(), 1u);
  EXPECT_EQ(plan.roles[0].ranks, (std::vector<int>{0, 1, 2, 3}));
  const std::string text = format_job_plan(plan);
  EXPECT_NE(text.find("| 0-3 | 0 |"), std::string::npos) << text;
}

// Activation checkpointing's recompute runs products again: they count in the step's FLOPs (its
// time) and apart as recompute FLOPs, so the model FLOPs (MFU's numerator) are the same whatever
// the checkpointing.
TEST(JobPlan, RecomputeFlopsAreCountedApart) {
  std::map<std::string, TracedRank> traced;
  for (const char* mode : {"none", "selective-op", "full"}) {
    const ParallelConfig parallel{
        .dims = {.tp = 2},
        .activation_checkpoint = parallel::ActivationCheckpointing::parse(mode, "test")};
    const JobPlan plan =
        plan_job(*models::gpt_args(config()), parallel, kBatch, kSeq, {.target = Device::cpu()});
    traced[mode] = plan.traced.front();
  }
  EXPECT_EQ(traced["none"].recompute_flops, 0);
  EXPECT_GT(traced["full"].recompute_flops, traced["selective-op"].recompute_flops);
  EXPECT_GT(traced["selective-op"].recompute_flops, 0);  // its norms are not products, its MLP's
  for (const char* mode : {"selective-op", "full"}) {
    EXPECT_EQ(traced[mode].flops - traced[mode].recompute_flops, traced["none"].flops) << mode;
  }
}

// A replica job (--replicas 2) traces its share of the global batch — the step of a job given
// that share alone, FLOP for FLOP — plus the replicas' gradient all_reduce; a replay traces
// both shares in turn.
TEST(JobPlan, AReplicaTracesItsShareOfTheBatch) {
  const ParallelConfig parallel{.dims = {.tp = 2}};
  const auto plan = [&](int64_t batch, PlanOptions::Replicas replicas) {
    return plan_job(*models::gpt_args(config()), parallel, batch, kSeq,
                    {.target = Device::cpu(), .replicas = replicas})
        .traced.front();
  };
  const TracedRank share = plan(kBatch / 2, {});
  const TracedRank replica = plan(kBatch, {.count = 2, .replica = 1});
  const TracedRank replay = plan(kBatch, {.count = 2, .replay = true});
  EXPECT_EQ(replica.flops, share.flops);
  EXPECT_EQ(replay.flops, 2 * share.flops);
  EXPECT_TRUE(replica.collectives.count(parallel::ft::kTracedReplicasGroup));
  EXPECT_FALSE(replay.collectives.count(parallel::ft::kTracedReplicasGroup));
  EXPECT_LT(replica.peak_bytes, plan(kBatch, {}).peak_bytes);
}

TEST(JobPlan, BadLayoutsFailAsTheJobWould) {
  EXPECT_NE(error_of([] {
              plan_job(*models::gpt_args(config()), {.dims = {.tp = 4}}, kBatch, kSeq);
            }).find("n_head=2 is not divisible by the tp mesh size 4"),
            std::string::npos);
  // 4 blocks cannot fill 2 ranks x 3 virtual stages.
  EXPECT_NE(error_of([] {
              plan_job(
                  *models::gpt_args(config()),
                  {.dims = {.pp = 2}, .pipeline = {.schedule = "interleaved", .virtual_stages = 3}},
                  12, kSeq);
            }).find("stage"),
            std::string::npos);
  // A batch of 8 does not split over dp=3.
  EXPECT_NE(error_of([] {
              plan_job(*models::gpt_args(config()), {.dims = {.dp_replicate = 3}}, kBatch, kSeq);
            }).find("8"),
            std::string::npos);
}

}  // namespace
}  // namespace loom::train
