// Step time predicted from a traced step (train/step_trace.h): compute from the step's
// matrix-product FLOPs at a measured rate, communication from an alpha-beta model per operation,
// overlapped as the job's design allows, and the pipeline's bubble from its schedule.
//
//   compute        = FLOPs / GEMM rate per rank
//                    + bytes the step's ops wrote x seconds per written byte (the memory-bound
//                      ops: elementwise, norms, softmax, copies; measured on a large add, whose
//                      output byte costs two read and one written)
//                    + bytes the in-place ops moved (FlopCounter::in_place_bytes: DDP's bucket
//                      copies, zeroing, the optimizer) x seconds per written byte / 3 (the add
//                      moves three bytes per byte it writes)
//                    + the step's storage allocations (about one per op) x seconds per op (the
//                      dispatch, autograd and launch overhead of a small op)
//   an operation   = latency x steps + bytes moved / bandwidth, with the ring algorithms' steps
//                    and bytes for a group of n ranks (B: this rank's input bytes, as counted):
//                    all_reduce 2(n-1) steps, 2(n-1)/n B; all_gather n-1, (n-1) B;
//                    reduce_scatter n-1, (n-1)/n B; all_to_all n-1, (n-1)/n B; broadcast
//                    ceil(log2 n), B; a barrier 1 step; a send p2p_latency + B beta and a
//                    receive p2p_latency (the hand-off, paid on both sides; the bytes are the
//                    sender's)
//   exposed comm   = tp and pp operations in full (they sit between the ops that need them);
//                    dp_replicate (DDP's buckets reduce while backward runs) and dp_shard (FSDP
//                    prefetches the next unit's all-gather, reduce-scatters during backward)
//                    beyond what compute hides: max(0, dp - overlap x compute), overlap 1
//                    where links and copy engines work beside the cores (GPUs), 0 for CPU ranks
//                    with no core to spare (Gloo's copies and sums then take the cores the
//                    compute needs)
//   rank time      = compute + exposed comm
//   step           = the slowest traced rank's time x the schedule's bubble (pipeline_bubble: the
//                    job's own schedule simulated), where ranks share cores only beyond what the
//                    idle ranks' cores absorb (step_bubble)
// The rates come from `loom plan --calibrate` on this machine (MachineModel::load), or from the
// plan's flags for another (a GPU's TFLOP/s, a link's GB/s and latency).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "train/parallel_model.h"
#include "train/step_trace.h"

namespace loom::train {

struct MachineModel {
  double rank_flops_per_s = 0;          // matrix-product FLOP/s of one rank
  double seconds_per_written_byte = 0;  // memory-bound ops, one rank (0: not modelled)
  double seconds_per_op = 0;            // one small op's overhead on one rank (0: not modelled)
  double latency_s = 0;                 // alpha: one step of a collective
  double p2p_latency_s = 0;             // a send's or a receive's hand-off (0: latency_s)
  double bytes_per_s = 0;               // 1 / beta: bandwidth of one link
  // Per mesh dim ("dp_shard", "pp", ...): the bandwidth of the links its groups use, where it is
  // not bytes_per_s (NVLink within a host, InfiniBand between hosts). A group over several dims
  // takes the slowest of theirs.
  std::map<std::string, double> dim_bytes_per_s;
  double peak_flops_per_s = 0;  // one rank's peak (for MFU); 0: MFU not printed
  // The share of a step's compute under which data-parallel communication runs hidden.
  double data_parallel_overlap = 1;
  // Ranks per core where ranks share cores (CPU ranks beyond the host's cores; 1 otherwise): a
  // rank idle in the pipeline's bubble lends its core to the busy ones, so the bubble costs time
  // only beyond what the spare ranks absorb (step_bubble).
  double ranks_per_core = 1;
  std::string source;  // where the figures came from

  // This host's figures for a CPU job of `ranks` ranks sharing it: the calibrated host GEMM rate
  // and memory bandwidth divided among the ranks, the op overhead stretched when there are more
  // ranks than cores, each rank's link the calibrated one (two ranks) scaled by the core share
  // that moves its bytes, no overlap of communication with compute unless cores are spare, and
  // the calibrated point-to-point hand-off times the ranks per core (its thread wake-ups wait
  // for a core that many ranks share).
  static MachineModel for_cpu_ranks(const nlohmann::json& calibration, int64_t ranks);
};

// Measures this machine (the project's GEMM on one core, Gloo all-reduces between two thread
// ranks at a small and a large size, a large and a small add, a send/receive hand-off between
// two thread ranks that compute between them) and returns the figures as JSON:
// gemm_flops_per_s, seconds_per_written_byte, seconds_per_op, cores, latency_s, bytes_per_s,
// p2p_handoff_s, host, when.
nlohmann::json calibrate_machine();
// Where `loom plan --calibrate` keeps them: loom_cache_dir() (base/cache_dir.h), plan_machine.json.
std::string calibration_path();
// The stored calibration, or nullopt when there is none.
std::optional<nlohmann::json> load_calibration();

// The pipeline's factor on a rank's time: 1 / (1 - the idle share of the job's own schedule on a
// timeline with B twice F, half of it the weights'); 1 without a pipeline.
double pipeline_bubble(const ParallelConfig& parallel);
// The bubble's factor on the step where `machine`'s ranks share cores: the cores stay busy while
// at least one rank in ranks_per_core has work, so max(1, bubble / ranks_per_core) (the step is
// the larger of the cores' total work and the schedule's critical path at a core per rank); the
// bubble itself where each rank has its own cores.
double step_bubble(double bubble, const MachineModel& machine);

struct StepTimeEstimate {
  double compute_ms = 0;       // the slowest rank's
  double exposed_comm_ms = 0;  // the slowest rank's
  double bubble = 1;           // the schedule's factor (1 without a pipeline)
  double step_ms = 0;
  double tokens_per_s = 0;
  // Model FLOP/s (the slowest rank's products less what activation checkpointing recomputed)
  // over peak, when the peak is known.
  double mfu = 0;
};

// The step time of `traced` (the plan's traced ranks) under `parallel`, for a global batch of
// `tokens` tokens on `world_size` ranks; with `replicas` > 1 the job is one of that many replica
// jobs (--replicas), whose gradients' group (parallel/ft/traced_replicas.h) has that many ranks.
StepTimeEstimate estimate_step_time(const std::vector<TracedRank>& traced,
                                    const ParallelConfig& parallel, int64_t tokens,
                                    int64_t world_size, const MachineModel& machine,
                                    int64_t replicas = 1);

}  // namespace loom::train
