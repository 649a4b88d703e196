// The parallel training step on GPU ranks (NCCL) against one CPU rank: the same runs as
// gpt_equivalence_test (tests/models/gpt_training_run.h), on the mesh's device, which is each
// rank's GPU here. Same tolerances: losses and gradient norms 1e-5 relative, parameters 1e-5 of
// the model's scale (f32 on both; cuBLASLt computes f32 GEMMs in f32, CUBLAS_COMPUTE_32F, not
// TF32; CUDA's expf/tanhf differ from glibc's by an ulp or so, as the summation order of
// sharded GEMMs does).
//
//   - one GPU: an NCCL world of 1 runs the whole stack on the GPU — CUDA kernels, DDP's reducer
//     (buckets on the GPU, all-reduces on the group's stream, the compute stream waiting on
//     their events), the loss all-reduce;
//   - two GPUs (one rank each, threads): dp2, tp2 with sequence parallelism, pp2 with 1F1B (stage
//     send/recv over NCCL, in issue order);
//   - eight GPUs: dp2 x tp2 x pp2;
//   - ranks sharing ONE GPU (threads over a Gloo group on cuda:0, its tensors staged through host
//     memory: comm/gloo/host_staging.h), as NCCL cannot put two ranks on one GPU: dp2 x tp2,
//     dp_shard 2 and pp2, so a one-GPU machine checks the multi-rank layouts too.
// Each case skips with the reason where the GPUs are missing (everywhere on the CPU machine).
#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/gloo/process_group_gloo.h"
#include "comm/in_memory_store.h"
#include "comm/nccl/process_group_nccl.h"
#include "comm/testing/multi_rank.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tests/models/gpt_training_run.h"
#include "tests/tensor/cuda_skip.h"

namespace loom::models {
namespace {

using gpt_run::expect_same;
using gpt_run::mesh_of;
using gpt_run::Result;
using gpt_run::train;

// Runs `body` on `world` ranks, threads of this process, rank r on cuda:r over one NCCL world;
// each rank's exception fails the test naming the rank (its peers then fail by NCCL's timeout).
void run_on_gpus(int world, const std::function<void(comm::ProcessGroup&)>& body) {
  auto store = std::make_shared<comm::InMemoryStore>();
  std::mutex mutex;
  std::vector<std::string> failures;
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        cuda::DeviceGuard on_device(rank);
        auto group = comm::ProcessGroupNccl::create(
            store, rank, world,
            comm::ProcessGroupOptions{.name = "world", .timeout = std::chrono::seconds(60)}, rank);
        body(*group);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mutex);
        failures.push_back("rank " + std::to_string(rank) + ": " + e.what());
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (const auto& failure : failures) ADD_FAILURE() << failure;
}

// Runs `body` on `world` ranks sharing cuda:0: threads of this process over a Gloo group whose
// tensors are on that GPU (GlooOptions::device). A rank's failure fails the test naming it and
// aborts its group, so its peers fail fast (comm/testing/multi_rank.h).
void run_on_one_gpu(int world, const std::function<void(comm::ProcessGroup&)>& body) {
  comm::GlooOptions on_gpu = comm::GlooOptions::loopback();
  on_gpu.device = Device::cuda(0);
  comm::testing::run_on_ranks(
      world, body,
      {.timeout = std::chrono::seconds(60), .deadline = std::chrono::seconds(600), .gloo = on_gpu});
}

// The one-rank CPU run.
const Result& cpu_reference() { return gpt_run::reference(); }

TEST(GPTCudaEquivalenceTest, OneGpuRunsTheWholeStepAsOneCpuRank) {
  LOOM_SKIP_WITHOUT_GPUS(1);
  const Result& ref = cpu_reference();
  run_on_gpus(1, [&](comm::ProcessGroup& pg) {
    ASSERT_EQ(pg.device(), Device::cuda(0));
    expect_same({.actual = train(mesh_of(pg, 1, 1)),
                 .expected = ref,
                 .layout = "1 GPU (NCCL world of 1, DDP over it)"});
  });
}

TEST(GPTCudaEquivalenceTest, DataParallelOnTwoGpus) {
  LOOM_SKIP_WITHOUT_GPUS(2);
  const Result& ref = cpu_reference();
  run_on_gpus(2, [&](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, 2, 1)), .expected = ref, .layout = "dp2 on GPUs"});
  });
}

TEST(GPTCudaEquivalenceTest, TensorParallelOnTwoGpus) {
  LOOM_SKIP_WITHOUT_GPUS(2);
  const Result& ref = cpu_reference();
  run_on_gpus(2, [&](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, 1, 2), {.plan = {.sequence_parallel = true}}),
                 .expected = ref,
                 .layout = "tp2 + SP on GPUs"});
  });
}

TEST(GPTCudaEquivalenceTest, PipelineParallelOnTwoGpus) {
  LOOM_SKIP_WITHOUT_GPUS(2);
  const Result& ref = cpu_reference();
  run_on_gpus(2, [&](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, 1, 1, 2), {.schedule = "1f1b", .microbatches = 4}),
                 .expected = ref,
                 .layout = "pp2 1f1b m4 on GPUs"});
  });
}

// FSDP on GPUs: the all-gathers and reduce-scatters on NCCL's stream, ordered by events.
TEST(GPTCudaEquivalenceTest, FullyShardedOnTwoGpus) {
  LOOM_SKIP_WITHOUT_GPUS(2);
  const Result& ref = cpu_reference();
  run_on_gpus(2, [&](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, {.dp_shard = 2})),
                 .expected = ref,
                 .layout = "dp_shard2 on GPUs"});
  });
}

TEST(GPTCudaEquivalenceTest, FullyShardedAndTensorParallelOnFourGpus) {
  LOOM_SKIP_WITHOUT_GPUS(4);
  const Result& ref = cpu_reference();
  run_on_gpus(4, [&](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, {.dp_shard = 2, .tp = 2})),
                 .expected = ref,
                 .layout = "dp_shard2 x tp2 on GPUs"});
  });
}

TEST(GPTCudaEquivalenceTest, DataTensorAndPipelineParallelOnEightGpus) {
  LOOM_SKIP_WITHOUT_GPUS(8);
  const Result& ref = cpu_reference();
  run_on_gpus(8, [&](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, 2, 2, 2), {.schedule = "1f1b", .microbatches = 2}),
                 .expected = ref,
                 .layout = "dp2 x tp2 x pp2 on GPUs"});
  });
}

TEST(GPTCudaEquivalenceTest, DataAndTensorParallelOnOneSharedGpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Result& ref = cpu_reference();
  run_on_one_gpu(4, [&](comm::ProcessGroup& pg) {
    ASSERT_EQ(pg.device(), Device::cuda(0));
    expect_same({.actual = train(mesh_of(pg, 2, 2), {.plan = {.sequence_parallel = true}}),
                 .expected = ref,
                 .layout = "dp2 x tp2 + SP, 4 ranks on one GPU (Gloo staged)"});
  });
}

TEST(GPTCudaEquivalenceTest, FullyShardedOnOneSharedGpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Result& ref = cpu_reference();
  run_on_one_gpu(2, [&](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, {.dp_shard = 2})),
                 .expected = ref,
                 .layout = "dp_shard2, 2 ranks on one GPU (Gloo staged)"});
  });
}

TEST(GPTCudaEquivalenceTest, PipelineParallelOnOneSharedGpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Result& ref = cpu_reference();
  run_on_one_gpu(2, [&](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, 1, 1, 2), {.schedule = "1f1b", .microbatches = 4}),
                 .expected = ref,
                 .layout = "pp2 1f1b m4, 2 ranks on one GPU (Gloo staged)"});
  });
}

}  // namespace
}  // namespace loom::models
