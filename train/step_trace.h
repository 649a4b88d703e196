// A training step traced on the meta device (tensor/device.h) over fake process groups
// (comm/fake/fake_process_group.h): the job's own code — its mesh, its model builder, the Trainer's
// step with clipping and AdamW — runs on every traced rank with shapes and no values, at any model
// size, in seconds. What it measures is therefore what that code does, not a second description
// of it:
//   - memory: the bytes of tensor storage each rank holds between steps (parameters, gradients,
//     optimizer moments, persistent buffers) and the most it holds during a step (plus the
//     activations, communication buffers and temporaries alive at the worst moment), counted by a
//     MemoryTracker per rank (tensor/memory_stats.h);
//   - communication: each collective and point-to-point operation of one step, by process group
//     (mesh dim: "mesh/tp", ...) and kind, with its bytes (this rank's input, as the groups'
//     counters count);
//   - compute: the step's matrix-product FLOPs (tensor/flop_counter.h).
// The step measured is the second: the first creates the optimizer's moments (and anything else a
// job makes lazily), as a real job's first step does.
//
// Meta ops allocate as the job's device's kernels do (options.target: a CPU's f32 staging copies
// of bf16 operands and in-place updates, or a GPU's temporaries). Not counted: kernel workspaces
// and backend buffers outside tensor storage (tensor/memory_stats.h).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "comm/types.h"
#include "mesh/device_mesh.h"
#include "train/parallel_dims.h"
#include "train/parallel_model.h"

namespace loom::train {

struct TracedRank {
  int rank = 0;
  std::vector<int64_t> coordinate;  // on the (pp, dp_replicate, dp_shard, cp, tp) mesh
  int64_t parameters = 0;           // parameter elements it holds (its shards)
  int64_t held_bytes = 0;           // storage held between steps
  int64_t peak_bytes = 0;           // the most held at once during a step
  // The most held at once while the model was built (parallel/build_stage.h): its shards when
  // built on the meta device, the whole stage first when not.
  int64_t construction_peak_bytes = 0;
  int64_t flops = 0;            // matrix-product FLOPs of one step
  int64_t recompute_flops = 0;  // the part activation checkpointing ran again (not model FLOPs)
  int64_t allocations = 0;      // storage allocations of one step (about one per op output)
  int64_t allocated_bytes = 0;  // their bytes: what the step's ops wrote
  // Bytes read and written by the ops that wrote existing storage (FlopCounter::in_place_bytes:
  // DDP's bucket copies, zeroed gradients, the optimizer), which allocate nothing.
  int64_t in_place_bytes = 0;
  double step_ms = 0;  // the step's wall time (meaningful on real groups only)
  // With StepTraceOptions::bytes_by_op: allocated_bytes by op ("forward: linear", "backward:
  // layer_norm_backward"; backward includes the optimizer and anything else run without grad
  // mode), each op's outputs and temporaries, an op counted where it was called from outside
  // any other op (tensor/dispatch.h's DispatchMode). What no dispatched op allocated (mixed
  // precision's multi-tensor casts, communication buffers, ops under an activation checkpoint's
  // own mode) is "other".
  std::map<std::string, int64_t> bytes_by_op;
  // One step's operations by group name (CommDebugMode::by_group).
  std::map<std::string, comm::CollectiveCounters> collectives;
  // With StepTraceOptions::validation: one validation batch (Trainer::evaluate) after the steps.
  int64_t validation_peak_bytes = 0;  // the most held at once during it
  int64_t validation_flops = 0;       // its matrix-product FLOPs
  std::map<std::string, comm::CollectiveCounters> validation_collectives;  // its operations
};

// Builds the job's model on `mesh` (the rank's device is the mesh's: meta here). Called on each
// traced rank's thread with the meta device as the default device, so parameters are created
// there.
using ModelBuilder =
    std::function<std::unique_ptr<ParallelModel>(std::shared_ptr<const DeviceMesh> mesh)>;

struct StepTraceOptions {
  int64_t local_batch = 1;  // sequences per dp rank per step
  int64_t seq_len = 1;
  // Global ranks to trace; every rank a traced rank exchanges point-to-point messages with should
  // be traced too (its pipeline line), or those messages are dropped.
  std::vector<int> ranks;
  std::chrono::milliseconds timeout{60000};  // a receive whose send never comes fails after it
  // Whose kernels' allocations a trace follows (tensor/device.h, meta_target): the job's device.
  Device target = Device::cuda();
  // Also trace one validation batch (forward only) after the measured step.
  bool validation = false;
  // Also break the measured step's allocated bytes down by op (TracedRank::bytes_by_op): where
  // a step's memory traffic goes, so the fusions that pay can be told apart.
  bool bytes_by_op = false;  // A job that is replica `replica` of `replicas` (--replicas):
                             // local_batch is its share; the
  // step runs the Trainer's replica path with every replica a member (its agreements over the
  // world, the gradients' all_reduce over the replicas' group, parallel/ft/traced_replicas.h;
  // the meta device only). With `replay` (--replica-replay) the one job runs each replica's
  // share in turn (Trainer::replay_step), every replica a member.
  int replicas = 1;
  int replica = 0;
  bool replay = false;
};

// Traces two steps on each rank of options.ranks (one thread each) and returns their figures in
// that order. Throws loom::Error naming the rank and its coordinate when the job's code fails on
// it (a layout the job rejects fails here with the job's message).
std::vector<TracedRank> trace_training_step(const ParallelDims& dims, const ModelBuilder& build,
                                            const StepTraceOptions& options);

// The same two steps and measurements on real process groups: how a test or a benchmark checks
// a trace against the run it predicts. `world_of(rank)` makes rank's world group and is called on
// that rank's thread (a Gloo group's creation is collective: every rank's thread calls it at
// once); the model is made on the group's device. `on_failure(world, rank)`, when given, is
// called once, for the first rank that fails, with its world group (null when world_of failed),
// e.g. to abort the group so the others stop waiting.
using WorldFactory = std::function<std::shared_ptr<comm::ProcessGroup>(int rank)>;
using FailureHandler =
    std::function<void(const std::shared_ptr<comm::ProcessGroup>& world, int rank)>;
std::vector<TracedRank> measure_training_step(const ParallelDims& dims, const ModelBuilder& build,
                                              const StepTraceOptions& options,
                                              const WorldFactory& world_of,
                                              const FailureHandler& on_failure = {});

// The same on Gloo thread ranks of this process (loopback), every rank of the world run: how
// step_trace_test and //tools/bench:plan_grid_bench measure the real step a trace predicts.
std::vector<TracedRank> measure_training_step_on_gloo_threads(const ParallelDims& dims,
                                                              const ModelBuilder& build,
                                                              StepTraceOptions options);

// Whether two ranks issued the same operations: group by group, kind by kind, calls and bytes.
bool same_collectives(const TracedRank& a, const TracedRank& b);

// The ranks a plan traces: every rank of a world of at most `max_ranks`; otherwise, for the first
// and the last coordinate of each of dp_shard and tp (where uneven shards differ) at dp_replicate
// 0, the whole pipeline line through it.
std::vector<int> ranks_to_trace(const ParallelDims& dims, int max_ranks = 32);

}  // namespace loom::train
