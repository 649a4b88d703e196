// Ten bf16 training steps (the job's mixed precision: bf16 compute and logits over f32 masters,
// f32 AdamW) of GPT and Llama under the parallel layouts against the same steps on one CPU rank:
// on CPU ranks over Gloo, and on a GPU — one rank, and dp2 x tp2 + SP, dp2, dp_shard 2 and pp2 as
// ranks sharing that GPU over Gloo staged through host memory (comm/gloo/host_staging.h), the
// one-GPU multi-rank path. The GPU cases skip with the reason where there is none; the GPU check
// (tools/gpu_check.sh) runs them, and the emulated device runs them here.
//
// Each run is the job's own code: the job's ParallelConfig (train::parallel_config, so the
// job's mixed-precision policy), build_parallel_model and the Trainer, on the same batches.
//
// Tolerance: per step, the losses agree within kLossRtol (5e-3) relative. Why not less: in bf16
// a layout or a device changes where products are rounded (a sharded GEMM's partial sums,
// cuBLASLt's accumulation order against oneDNN's, the attention kernels' tiles), each rounding
// moves a value by up to 2^-9 of itself, and AdamW normalizes every update by the gradient's own
// RMS, so an early difference of a bf16 step in a small gradient grows over the steps. Measured
// (this test prints every run's losses): CPU layouts against one CPU rank up to 1.3e-3, the
// emulated GPU's runs up to 1.4e-3 (both Llama's tp2 + SP at step 10; GPT's stay below 1.1e-4);
// the bound is about 3.5x the largest.
// f32 runs of the same layouts agree to 1e-5 (gpt_equivalence_test, gpt_cuda_equivalence_test).
// The runs also must learn (the last loss below 0.9 of the first, ln 257 = 5.55).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/gloo/process_group_gloo.h"
#include "comm/testing/multi_rank.h"
#include "models/gpt/family.h"
#include "models/llama/config.h"
#include "models/llama/family.h"
#include "tests/models/gpt_training_run.h"
#include "tests/tensor/cuda_skip.h"
#include "tests/testing/tensor_checks.h"
#include "train/job_checks.h"
#include "train/job_config.h"
#include "train/parallel_model.h"
#include "train/trainer.h"

namespace loom::models {
namespace {

constexpr int kSteps = 10;
constexpr int64_t kGlobalBatch = 8, kSeqLen = 32;
constexpr uint64_t kModelSeed = 5, kDataSeed = 11;
constexpr double kLr = 3e-3, kLossRtol = 5e-3;

enum class Family { kGpt, kLlama };

std::string family_name(Family family) { return family == Family::kGpt ? "GPT" : "Llama"; }

std::unique_ptr<ModelArgs> model_args(Family family) {
  if (family == Family::kGpt) return gpt_args(gpt_run::config());
  return llama_args(LlamaConfig::preset("llama-tiny"));
}

struct Layout {
  std::string name;
  int64_t dp_replicate = 1, dp_shard = 1, tp = 1, pp = 1;
  int64_t world() const { return dp_replicate * dp_shard * tp * pp; }
};

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {.name = "dp2 x tp2 + SP", .dp_replicate = 2, .tp = 2},
      // DDP over plain masters: each bf16 gradient converted as it is added into its bucket.
      {.name = "dp2", .dp_replicate = 2},
      {.name = "dp_shard 2", .dp_shard = 2},
      {.name = "pp2 1f1b m4", .pp = 2},
  };
  return all;
}

// The job's parallel configuration for `layout` with --mixed-precision bf16.
train::ParallelConfig bf16_job(const Layout& layout) {
  train::JobConfig job;
  job.dp_replicate = layout.dp_replicate;
  job.dp_shard = layout.dp_shard;
  job.tp = layout.tp;
  job.pp = layout.pp;
  job.microbatches = layout.pp > 1 ? 4 : 0;
  job.mixed_precision = "bf16";
  return train::parallel_config(job);
}

// kSteps bf16 steps on this rank's share of `pg`'s mesh; every rank returns the global losses.
std::vector<double> train_bf16(comm::ProcessGroup& pg, Family family, const Layout& layout) {
  const train::ParallelConfig parallel = bf16_job(layout);
  parallel.validate(pg.size(), kGlobalBatch, kSeqLen);
  const auto mesh = parallel.dims.build_mesh(pg.shared_from_this());
  const auto data = gpt_run::fox_corpus(257);
  const auto model = train::build_parallel_model(*model_args(family), kModelSeed, mesh, parallel);
  train::Trainer trainer(*model, mesh, {.lr = [](int) { return kLr; }, .clip = 1.0});
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    const auto batch = train::local_batch(data, kDataSeed, step, *mesh, kGlobalBatch, kSeqLen);
    losses.push_back(trainer.step(batch.inputs, batch.targets).loss);
  }
  return losses;
}

// One CPU rank's losses, once per family and test binary.
const std::vector<double>& one_cpu_rank(Family family) {
  static std::vector<double> gpt, llama;
  std::vector<double>& losses = family == Family::kGpt ? gpt : llama;
  if (losses.empty()) {
    comm::testing::run_on_ranks(
        1, [&](comm::ProcessGroup& pg) { losses = train_bf16(pg, family, Layout{.name = "1"}); });
  }
  return losses;
}

void expect_losses_match(const std::vector<double>& got, Family family, const std::string& what) {
  const std::vector<double>& want = one_cpu_rank(family);
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  double worst = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
  }
  fmt::print("{} {}: losses {:.5f} (one CPU rank {:.5f}), largest relative difference {:.2e}\n",
             family_name(family), what, fmt::join(got, " "), fmt::join(want, " "), worst);
  testing::expect_close({.actual = got,
                         .expected = want,
                         .tol = {.rtol = kLossRtol},
                         .what = family_name(family) + " " + what + " losses"});
  // It trained: the last loss is well below the first (so a run that learned nothing fails even
  // if the reference were wrong alike).
  ASSERT_FALSE(got.empty());
  EXPECT_LT(got.back(), 0.9 * got.front()) << what;
}

class Bf16Training : public ::testing::TestWithParam<Family> {};

TEST_P(Bf16Training, CpuLayoutsMatchOneCpuRank) {
  const Family family = GetParam();
  for (const Layout& layout : layouts()) {
    std::mutex mutex;
    std::vector<double> losses;
    comm::testing::run_on_ranks(static_cast<int>(layout.world()), [&](comm::ProcessGroup& pg) {
      auto got = train_bf16(pg, family, layout);
      if (pg.rank() == 0) {
        std::lock_guard<std::mutex> lock(mutex);
        losses = std::move(got);
      }
    });
    expect_losses_match(losses, family, layout.name + " on CPU ranks");
  }
}

// Ranks sharing cuda:0 over a Gloo group whose tensors live there (GlooOptions::device).
void run_on_one_gpu(int world, const std::function<void(comm::ProcessGroup&)>& body) {
  comm::GlooOptions on_gpu = comm::GlooOptions::loopback();
  on_gpu.device = Device::cuda(0);
  comm::testing::run_on_ranks(world, body,
                              {.timeout = std::chrono::seconds(120),
                               .deadline = std::chrono::seconds(900),
                               .gloo = on_gpu});
}

TEST_P(Bf16Training, OneGpuAndRanksSharingItMatchOneCpuRank) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Family family = GetParam();
  std::vector<Layout> on_gpu = {Layout{.name = "1 rank"}};
  on_gpu.insert(on_gpu.end(), layouts().begin(), layouts().end());
  for (const Layout& layout : on_gpu) {
    std::mutex mutex;
    std::vector<double> losses;
    run_on_one_gpu(static_cast<int>(layout.world()), [&](comm::ProcessGroup& pg) {
      ASSERT_EQ(pg.device(), Device::cuda(0));
      auto got = train_bf16(pg, family, layout);
      if (pg.rank() == 0) {
        std::lock_guard<std::mutex> lock(mutex);
        losses = std::move(got);
      }
    });
    expect_losses_match(losses, family, layout.name + " on one GPU");
  }
}

INSTANTIATE_TEST_SUITE_P(Families, Bf16Training, ::testing::Values(Family::kGpt, Family::kLlama),
                         [](const ::testing::TestParamInfo<Family>& info) {
                           return family_name(info.param);
                         });

}  // namespace
}  // namespace loom::models
