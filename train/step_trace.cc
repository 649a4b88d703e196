#include "train/step_trace.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <barrier>
#include <cctype>
#include <chrono>
#include <exception>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <thread>

#include "base/error.h"
#include "comm/fake/fake_process_group.h"
#include "comm/gloo/process_group_gloo.h"
#include "comm/in_memory_store.h"
#include "dtensor/comm_debug_mode.h"
#include "dtensor/dtensor.h"
#include "parallel/ft/traced_replicas.h"
#include "tensor/dispatch.h"
#include "tensor/flop_counter.h"
#include "tensor/grad_mode.h"
#include "tensor/memory_stats.h"
#include "tensor/ops.h"
#include "train/trainer.h"

namespace loom::train {

namespace {

// Whether a rank's error is another rank's failure reaching it ("... rank 3 failed"): what the
// abort of the first failing rank's group makes its peers throw.
bool failed_because_of_a_peer(const std::string& what) {
  for (size_t at = what.find("rank "); at != std::string::npos; at = what.find("rank ", at + 1)) {
    size_t end = at + 5;
    while (end < what.size() && std::isdigit(static_cast<unsigned char>(what[end]))) ++end;
    if (end > at + 5 && what.compare(end, 7, " failed") == 0) return true;
  }
  return false;
}

std::vector<int64_t> coordinate_of(const ParallelDims& dims, int rank) {
  const std::vector<int64_t> sizes = dims.sizes();
  std::vector<int64_t> coordinate(sizes.size());
  int64_t rest = rank;
  for (size_t d = sizes.size(); d-- > 0;) {
    coordinate[d] = rest % sizes[d];
    rest /= sizes[d];
  }
  return coordinate;
}

// Attributes what each op allocates on this thread to the op: the outermost call only (the
// DispatchMode contract), so a linear's GEMM and bias count as the linear.
class BytesByOp final : public DispatchMode {
 public:
  BytesByOp(MemoryTracker& memory, std::map<std::string, int64_t>& out)
      : memory_(memory), out_(out) {}
  std::vector<Tensor> dispatch(const OpCall& call) override {
    const int64_t before = memory_.stats().allocated_bytes;
    std::vector<Tensor> outputs = call_op(call);
    const int64_t bytes = memory_.stats().allocated_bytes - before;
    if (bytes > 0) {
      out_[fmt::format("{}: {}", GradMode::is_enabled() ? "forward" : "backward", call.op)] +=
          bytes;
    }
    return outputs;
  }

 private:
  MemoryTracker& memory_;
  std::map<std::string, int64_t>& out_;
};

// Two steps of the job on this rank's world group; the second measured.
TracedRank measure_rank(const ParallelDims& dims, const ModelBuilder& build,
                        const StepTraceOptions& options,
                        const std::shared_ptr<comm::ProcessGroup>& world, MemoryTracker& memory,
                        const std::function<void()>& after_first_step) {
  TracedRank out;
  out.rank = world->rank();
  out.coordinate = coordinate_of(dims, out.rank);
  ScopedMemoryTracker scope(memory);
  {
    // The model is created where the group's tensors live (meta for a fake group).
    DefaultDeviceGuard on_device(world->device());
    MetaTargetGuard allocate_like(options.target);
    auto mesh = dims.build_mesh(world);
    std::unique_ptr<ParallelModel> model = build(mesh);
    out.construction_peak_bytes = memory.stats().peak_bytes;
    for (const auto& [name, p] : model->named_parameters()) {
      out.parameters += is_dtensor(p) ? local_shard(p).numel() : p.numel();
    }
    TrainerOptions trainer_options{.lr = [](int) { return 1e-4; }};
    if (options.replicas > 1 && !options.replay) {
      LOOM_CHECK(world->device().is_meta(),
                 "a step of replicas is traced on the meta device only, not on {}",
                 world->device().str());
      trainer_options.replicas = std::make_shared<parallel::ft::TracedReplicas>(
          comm::FakeProcessGroup::create_world(
              options.replicas, {options.replica},
              {.name = parallel::ft::kTracedReplicasGroup, .timeout = options.timeout})
              .front());
      trainer_options.replica_ranks = world;
    }
    Trainer trainer(*model, mesh, std::move(trainer_options));
    // Token 0 everywhere: a valid id of every vocabulary; values change no shape or collective.
    const Tensor tokens =
        ops::zeros({options.local_batch, options.seq_len}, kInt64, world->device());
    // --replica-replay: each replica's share in turn, all of them members.
    std::vector<std::pair<Tensor, Tensor>> member_batches;
    std::vector<int> member_ids;
    if (options.replay) {
      for (int id = 0; id < options.replicas; ++id) {
        member_batches.emplace_back(tokens, tokens);
        member_ids.push_back(id);
      }
    }
    const auto step = [&] {
      if (options.replay) {
        trainer.replay_step(member_batches, member_ids, options.replicas);
      } else {
        trainer.step(tokens, tokens);
      }
    };
    step();  // creates the optimizer's moments
    // Every traced rank done with the first step: no message of it is still in flight (a send
    // the receiver has not taken yet is still the sender's memory), so what is held is the same
    // on every run.
    after_first_step();
    out.held_bytes = memory.stats().current_bytes;
    memory.reset_peak();
    CommDebugMode comm;  // this thread's operations, by group
    FlopCounter flops;
    const MemoryStats before = memory.stats();
    BytesByOp by_op(memory, out.bytes_by_op);
    std::optional<ScopedDispatchMode> attributing;
    if (options.bytes_by_op) attributing.emplace(by_op);
    const auto start = std::chrono::steady_clock::now();
    step();
    out.step_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    attributing.reset();
    out.flops = flops.total();
    out.recompute_flops = flops.recomputed();
    out.in_place_bytes = flops.in_place_bytes();
    out.allocations = memory.stats().allocations - before.allocations;
    out.allocated_bytes = memory.stats().allocated_bytes - before.allocated_bytes;
    if (options.bytes_by_op) {
      int64_t attributed = 0;
      for (const auto& [op, bytes] : out.bytes_by_op) attributed += bytes;
      out.bytes_by_op["other"] = out.allocated_bytes - attributed;
    }
    out.peak_bytes = memory.stats().peak_bytes;
    out.collectives = comm.by_group();
    if (options.validation) {
      memory.reset_peak();
      FlopCounter validation_flops;
      CommDebugMode validation_comm;
      trainer.evaluate(tokens, tokens);
      out.validation_flops = validation_flops.total();
      out.validation_collectives = validation_comm.by_group();
      out.validation_peak_bytes = memory.stats().peak_bytes;
    }
  }
  return out;
}

}  // namespace

std::vector<TracedRank> measure_training_step(const ParallelDims& dims, const ModelBuilder& build,
                                              const StepTraceOptions& options,
                                              const WorldFactory& world_of,
                                              const FailureHandler& on_failure) {
  LOOM_CHECK(!options.ranks.empty(), "measure_training_step: no rank to run");
  LOOM_CHECK(options.local_batch >= 1 && options.seq_len >= 1,
             "measure_training_step: the batch per dp rank and the sequence length must be at "
             "least 1, got {} and {}",
             options.local_batch, options.seq_len);
  const size_t n = options.ranks.size();
  // Before the groups, so they outlive every tensor a message in flight still holds.
  std::vector<std::unique_ptr<MemoryTracker>> trackers;
  for (size_t i = 0; i < n; ++i) trackers.push_back(std::make_unique<MemoryTracker>());
  std::vector<std::shared_ptr<comm::ProcessGroup>> worlds(n);
  std::vector<TracedRank> results(n);
  // Every rank's failure. The first aborts the others' waits (on_failure); the one reported is
  // the lowest rank that failed on its own, so the same job gives the same message every run.
  std::mutex failure_mutex;
  std::map<int, std::string> failures;
  std::barrier<> between_steps(static_cast<std::ptrdiff_t>(n));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      bool arrived = false;
      try {
        worlds[i] = world_of(options.ranks[i]);
        results[i] = measure_rank(dims, build, options, worlds[i], *trackers[i], [&] {
          arrived = true;
          between_steps.arrive_and_wait();
        });
      } catch (const std::exception& e) {
        // A rank that fails before the barrier leaves it, so the others do not wait for it.
        if (!arrived) between_steps.arrive_and_drop();
        std::lock_guard<std::mutex> lock(failure_mutex);
        const bool first = failures.empty();
        failures.emplace(options.ranks[i], e.what());
        if (first && on_failure) on_failure(worlds[i], options.ranks[i]);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (!failures.empty()) {
    auto cause = failures.begin();
    while (cause != failures.end() && failed_because_of_a_peer(cause->second)) ++cause;
    if (cause == failures.end()) cause = failures.begin();
    const auto& [rank, what] = *cause;
    throw Error(fmt::format("rank {} ({}: {}): {}", rank, fmt::join(dims.names(), ", "),
                            fmt::join(coordinate_of(dims, rank), ", "), what));
  }
  return results;
}

std::vector<TracedRank> trace_training_step(const ParallelDims& dims, const ModelBuilder& build,
                                            const StepTraceOptions& options) {
  const auto groups =
      comm::FakeProcessGroup::create_world(static_cast<int>(dims.world_size()), options.ranks,
                                           {.name = "default", .timeout = options.timeout});
  std::vector<TracedRank> traced;
  try {
    traced = measure_training_step(
        dims, build, options,
        [&](int rank) {
          const auto it = std::find(options.ranks.begin(), options.ranks.end(), rank);
          return groups[static_cast<size_t>(it - options.ranks.begin())];
        },
        [](const std::shared_ptr<comm::ProcessGroup>& world, int rank) {
          if (world) {
            static_cast<comm::FakeProcessGroup&>(*world).abort(
                fmt::format("traced rank {} failed", rank));
          }
        });
  } catch (const Error& e) {
    throw Error(fmt::format("tracing {}", e.what()));
  }
  // Every send received and every receive sent, between the traced ranks.
  const auto unmatched =
      static_cast<const comm::FakeProcessGroup&>(*groups.front()).unmatched_messages();
  LOOM_CHECK(unmatched.empty(), "tracing: the job's point-to-point messages do not pair up: {}",
             fmt::join(unmatched, "; "));
  return traced;
}

std::vector<TracedRank> measure_training_step_on_gloo_threads(const ParallelDims& dims,
                                                              const ModelBuilder& build,
                                                              StepTraceOptions options) {
  const int world = static_cast<int>(dims.world_size());
  options.ranks.resize(world);
  std::iota(options.ranks.begin(), options.ranks.end(), 0);
  const auto store = std::make_shared<comm::InMemoryStore>();
  return measure_training_step(
      dims, build, options,
      [&](int rank) -> std::shared_ptr<comm::ProcessGroup> {
        return comm::ProcessGroupGloo::create(store, rank, world,
                                              {.name = "default", .timeout = options.timeout},
                                              comm::GlooOptions::loopback());
      },
      [](const std::shared_ptr<comm::ProcessGroup>& group, int rank) {
        if (group) {
          static_cast<comm::ProcessGroupGloo&>(*group).abort(fmt::format("rank {} failed", rank));
        }
      });
}

bool same_collectives(const TracedRank& a, const TracedRank& b) {
  const auto covered = [](const TracedRank& x, const TracedRank& y) {
    for (const auto& [group, counters] : x.collectives) {
      const auto it = y.collectives.find(group);
      const comm::CollectiveCounters other =
          it == y.collectives.end() ? comm::CollectiveCounters{} : it->second;
      if (other.calls != counters.calls || other.bytes != counters.bytes) return false;
    }
    return true;
  };
  return covered(a, b) && covered(b, a);
}

std::vector<int> ranks_to_trace(const ParallelDims& dims, int max_ranks) {
  const int64_t world = dims.world_size();
  std::vector<int> ranks;
  if (world <= max_ranks) {
    for (int r = 0; r < world; ++r) ranks.push_back(r);
    return ranks;
  }
  std::set<int> chosen;
  for (int64_t s : {int64_t{0}, dims.dp_shard - 1}) {
    for (int64_t c : {int64_t{0}, dims.cp - 1}) {
      for (int64_t t : {int64_t{0}, dims.tp - 1}) {
        for (int64_t p = 0; p < dims.pp; ++p) {
          // Row-major over (pp, dp_replicate, dp_shard, cp, tp), dp_replicate 0.
          chosen.insert(static_cast<int>(
              (((p * dims.dp_replicate) * dims.dp_shard + s) * dims.cp + c) * dims.tp + t));
        }
      }
    }
  }
  return {chosen.begin(), chosen.end()};
}

}  // namespace loom::train
