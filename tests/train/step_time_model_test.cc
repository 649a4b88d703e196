// The step-time model's arithmetic (train/step_time_model.h) on hand-made traces: every term of
// a rank's compute, data-parallel communication hidden or exposed, a pipeline's hand-offs and
// bubble, and a CPU host's figures shared among the ranks on it.
#include "train/step_time_model.h"

#include <gtest/gtest.h>

namespace loom::train {
namespace {

// A machine with round figures: 1 GFLOP/s, 1 ns per written byte, 1 us per op, links of 1 GB/s
// with no latency.
MachineModel round_machine() {
  return MachineModel{.rank_flops_per_s = 1e9,
                      .seconds_per_written_byte = 1e-9,
                      .seconds_per_op = 1e-6,
                      .latency_s = 0,
                      .bytes_per_s = 1e9};
}

ParallelConfig ddp(int64_t replicas) {
  ParallelConfig parallel;
  parallel.dims.dp_replicate = replicas;
  return parallel;
}

TEST(StepTimeModelTest, ComputeCountsProductsWritesInPlaceBytesAndOps) {
  TracedRank rank;
  rank.flops = 2'000'000;            // 2 ms at 1 GFLOP/s
  rank.allocated_bytes = 3'000'000;  // 3 ms at 1 ns per written byte
  rank.in_place_bytes = 6'000'000;   // 2 ms: three bytes moved cost one written byte
  rank.allocations = 1000;           // 1 ms
  const StepTimeEstimate e = estimate_step_time({rank}, ParallelConfig{}, 1000, 1, round_machine());
  EXPECT_NEAR(e.compute_ms, 8.0, 1e-9);
  EXPECT_NEAR(e.exposed_comm_ms, 0.0, 1e-12);
  EXPECT_NEAR(e.step_ms, 8.0, 1e-9);
  EXPECT_NEAR(e.tokens_per_s, 1000 / 8e-3, 1e-6);
}

TEST(StepTimeModelTest, DataParallelCommunicationHidesUnderComputeOnlyWhereItOverlaps) {
  TracedRank rank;
  rank.flops = 10'000'000;  // 10 ms
  // One all-reduce of 8 MB over 4 replicas: 2 x 3/4 x 8 MB at 1 GB/s = 12 ms.
  auto& counters = rank.collectives["mesh/dp_replicate"];
  counters.calls[static_cast<int>(comm::CollectiveKind::kAllReduce)] = 1;
  counters.bytes[static_cast<int>(comm::CollectiveKind::kAllReduce)] = 8'000'000;
  MachineModel machine = round_machine();
  const StepTimeEstimate hidden = estimate_step_time({rank}, ddp(4), 1000, 4, machine);
  EXPECT_NEAR(hidden.exposed_comm_ms, 2.0, 1e-9);  // what 10 ms of compute does not cover
  EXPECT_NEAR(hidden.step_ms, 12.0, 1e-9);
  machine.data_parallel_overlap = 0;
  const StepTimeEstimate exposed = estimate_step_time({rank}, ddp(4), 1000, 4, machine);
  EXPECT_NEAR(exposed.exposed_comm_ms, 12.0, 1e-9);
  EXPECT_NEAR(exposed.step_ms, 22.0, 1e-9);
}

// A CPU host's calibration (two ranks' all-reduce on a 2-core host) shared among the job's ranks.
TEST(StepTimeModelTest, CpuRanksShareTheHostsCoresForComputeAndCommunication) {
  const nlohmann::json calibration = {
      {"gemm_flops_per_s", 100e9}, {"seconds_per_written_byte", 1e-10},
      {"seconds_per_op", 2e-6},    {"cores", 2},
      {"latency_s", 20e-6},        {"bytes_per_s", 4e9}};
  const MachineModel one = MachineModel::for_cpu_ranks(calibration, 1);
  EXPECT_DOUBLE_EQ(one.rank_flops_per_s, 100e9);
  EXPECT_DOUBLE_EQ(one.bytes_per_s, 4e9);
  EXPECT_EQ(one.data_parallel_overlap, 1);  // a core to spare for Gloo
  const MachineModel two = MachineModel::for_cpu_ranks(calibration, 2);
  EXPECT_DOUBLE_EQ(two.rank_flops_per_s, 50e9);
  EXPECT_DOUBLE_EQ(two.bytes_per_s, 4e9);  // as calibrated: two ranks, a core each
  EXPECT_EQ(two.data_parallel_overlap, 0);
  const MachineModel four = MachineModel::for_cpu_ranks(calibration, 4);
  EXPECT_DOUBLE_EQ(four.rank_flops_per_s, 25e9);
  EXPECT_DOUBLE_EQ(four.seconds_per_written_byte, 4e-10);
  EXPECT_DOUBLE_EQ(four.seconds_per_op, 4e-6);  // twice the ranks of cores
  EXPECT_DOUBLE_EQ(four.bytes_per_s, 2e9);      // half a core each moves the bytes
  EXPECT_EQ(four.data_parallel_overlap, 0);
  EXPECT_DOUBLE_EQ(four.ranks_per_core, 2);
  EXPECT_DOUBLE_EQ(two.ranks_per_core, 1);
  // No measured hand-off (an older calibration): the collectives' latency, per rank sharing a core.
  EXPECT_DOUBLE_EQ(two.p2p_latency_s, 20e-6);
  EXPECT_DOUBLE_EQ(four.p2p_latency_s, 40e-6);
  nlohmann::json measured = calibration;
  measured["p2p_handoff_s"] = 300e-6;
  EXPECT_DOUBLE_EQ(MachineModel::for_cpu_ranks(measured, 2).p2p_latency_s, 300e-6);
  EXPECT_DOUBLE_EQ(MachineModel::for_cpu_ranks(measured, 8).p2p_latency_s, 1200e-6);
  // On a 16-core host, 8 ranks have a core each for their bytes and cores to spare.
  nlohmann::json big = calibration;
  big["cores"] = 16;
  const MachineModel eight = MachineModel::for_cpu_ranks(big, 8);
  EXPECT_DOUBLE_EQ(eight.bytes_per_s, 4e9);
  EXPECT_EQ(eight.data_parallel_overlap, 1);
}

// A pipeline's sends and receives each pay the hand-off; a send also moves its bytes.
TEST(StepTimeModelTest, SendsAndReceivesEachPayTheHandOff) {
  TracedRank rank;
  auto& counters = rank.collectives["mesh/pp"];
  counters.calls[static_cast<int>(comm::CollectiveKind::kSend)] = 3;
  counters.bytes[static_cast<int>(comm::CollectiveKind::kSend)] = 2'000'000;  // 2 ms at 1 GB/s
  counters.calls[static_cast<int>(comm::CollectiveKind::kRecv)] = 4;
  counters.bytes[static_cast<int>(comm::CollectiveKind::kRecv)] = 9'000'000;  // the sender's time
  MachineModel machine = round_machine();
  machine.latency_s = 1e-6;
  ParallelConfig pipeline;
  pipeline.dims.pp = 2;
  pipeline.pipeline.schedule = "1f1b";
  pipeline.pipeline.microbatches = 2;
  // Without a measured hand-off: the collectives' latency, 7 us.
  EXPECT_NEAR(estimate_step_time({rank}, pipeline, 1000, 2, machine).exposed_comm_ms,
              2.0 + 7 * 1e-3, 1e-9);
  machine.p2p_latency_s = 500e-6;  // 7 x 0.5 ms
  EXPECT_NEAR(estimate_step_time({rank}, pipeline, 1000, 2, machine).exposed_comm_ms, 2.0 + 3.5,
              1e-9);
}

// A bubble costs time only beyond what ranks sharing a core absorb: while one of a core's ranks
// idles, the others have the core.
TEST(StepTimeModelTest, RanksSharingCoresAbsorbTheBubbleUpToTheirShare) {
  MachineModel machine = round_machine();
  EXPECT_DOUBLE_EQ(step_bubble(1.5, machine), 1.5);  // a core (or GPU) per rank
  machine.ranks_per_core = 2;
  EXPECT_DOUBLE_EQ(step_bubble(1.5, machine), 1.0);
  EXPECT_DOUBLE_EQ(step_bubble(3.0, machine), 1.5);
  // In the estimate: pp 4 with 1F1B over 4 microbatches idles 3 / 7 of its timeline.
  ParallelConfig pipeline;
  pipeline.dims.pp = 4;
  pipeline.pipeline.schedule = "1f1b";
  pipeline.pipeline.microbatches = 4;
  const double bubble = pipeline_bubble(pipeline);
  EXPECT_NEAR(bubble, 7.0 / 4.0, 1e-9);
  TracedRank rank;
  rank.flops = 10'000'000;  // 10 ms
  machine.ranks_per_core = 1;
  EXPECT_NEAR(estimate_step_time({rank}, pipeline, 1000, 4, machine).step_ms, 17.5, 1e-9);
  machine.ranks_per_core = 4;  // 4 ranks on each core: the cores never idle
  EXPECT_NEAR(estimate_step_time({rank}, pipeline, 1000, 4, machine).step_ms, 10.0, 1e-9);
}

}  // namespace
}  // namespace loom::train
