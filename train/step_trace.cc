#include "train/step_trace.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <barrier>
#include <exception>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "base/error.h"
#include "comm/fake/fake_process_group.h"
#include "dtensor/dtensor.h"
#include "tensor/flop_counter.h"
#include "tensor/memory_stats.h"
#include "tensor/ops.h"
#include "train/trainer.h"

namespace loom::train {

namespace {

// The collectives of the traced step, per rank thread: the observer is process-wide, the record
// it adds to is the calling thread's.
thread_local std::map<std::string, CollectiveTallies>* recording = nullptr;

class CollectiveRecorder {
 public:
  CollectiveRecorder()
      : id_(comm::ProcessGroup::add_observer(
            [](comm::CollectiveKind kind, int64_t bytes, const std::string& group) {
              if (recording == nullptr) return;
              CollectiveTally& tally = (*recording)[group][static_cast<size_t>(kind)];
              ++tally.calls;
              tally.bytes += bytes;
            })) {}
  ~CollectiveRecorder() { comm::ProcessGroup::remove_observer(id_); }
  CollectiveRecorder(const CollectiveRecorder&) = delete;
  CollectiveRecorder& operator=(const CollectiveRecorder&) = delete;

 private:
  int id_;
};

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

TracedRank trace_rank(const ParallelDims& dims, const ModelBuilder& build,
                      const StepTraceOptions& options,
                      const std::shared_ptr<comm::ProcessGroup>& world, MemoryTracker& memory,
                      const std::function<void()>& after_first_step) {
  TracedRank out;
  out.rank = world->rank();
  out.coordinate = coordinate_of(dims, out.rank);
  ScopedMemoryTracker scope(memory);
  {
    DefaultDeviceGuard on_meta(Device::meta());
    auto mesh = dims.build_mesh(world);
    std::unique_ptr<ParallelModel> model = build(mesh);
    for (const auto& [name, p] : model->named_parameters()) {
      out.parameters += is_dtensor(p) ? local_shard(p).numel() : p.numel();
    }
    Trainer trainer(*model, mesh, {.lr = [](int) { return 1e-4; }});
    const Tensor tokens =
        ops::zeros({options.local_batch, options.seq_len}, kInt64, Device::meta());
    trainer.step(tokens, tokens);  // creates the optimizer's moments
    // Every traced rank done with the first step: no message of it is still in flight (a send
    // the receiver has not taken yet is still the sender's memory), so what is held is the same
    // on every run.
    after_first_step();
    out.held_bytes = memory.stats().current_bytes;
    memory.reset_peak();
    std::map<std::string, CollectiveTallies> collectives;
    recording = &collectives;
    struct StopRecording {
      ~StopRecording() { recording = nullptr; }
    } stop;
    FlopCounter flops;
    trainer.step(tokens, tokens);
    out.flops = flops.total();
    out.peak_bytes = memory.stats().peak_bytes;
    out.collectives = std::move(collectives);
  }
  return out;
}

}  // namespace

std::vector<TracedRank> trace_training_step(const ParallelDims& dims, const ModelBuilder& build,
                                            const StepTraceOptions& options) {
  LOOM_CHECK(!options.ranks.empty(), "trace_training_step: no rank to trace");
  LOOM_CHECK(options.local_batch >= 1 && options.seq_len >= 1,
             "trace_training_step: the batch per dp rank and the sequence length must be at least "
             "1, got {} and {}",
             options.local_batch, options.seq_len);
  const int world_size = static_cast<int>(dims.world_size());
  // Before the groups, so they outlive every tensor a message in flight still holds.
  std::vector<std::unique_ptr<MemoryTracker>> trackers;
  for (size_t i = 0; i < options.ranks.size(); ++i)
    trackers.push_back(std::make_unique<MemoryTracker>());
  const auto groups = comm::FakeProcessGroup::create_world(
      world_size, options.ranks, {.name = "default", .timeout = options.timeout});
  CollectiveRecorder recorder;
  std::vector<TracedRank> results(groups.size());
  // The first failure is the cause; the peers it leaves waiting fail after it.
  std::mutex failure_mutex;
  std::optional<std::pair<int, std::string>> first_failure;
  std::barrier<> between_steps(static_cast<std::ptrdiff_t>(groups.size()));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < groups.size(); ++i) {
    threads.emplace_back([&, i] {
      bool arrived = false;
      try {
        results[i] = trace_rank(dims, build, options, groups[i], *trackers[i], [&] {
          arrived = true;
          between_steps.arrive_and_wait();
        });
      } catch (const std::exception& e) {
        // A rank that fails before the barrier leaves it, so the others do not wait for it.
        if (!arrived) between_steps.arrive_and_drop();
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (first_failure) return;
        first_failure.emplace(options.ranks[i], e.what());
        static_cast<comm::FakeProcessGroup&>(*groups[i])
            .abort(fmt::format("traced rank {} failed", options.ranks[i]));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (first_failure) {
    const auto& [rank, what] = *first_failure;
    throw Error(fmt::format("tracing rank {} ({}: {}): {}", rank, fmt::join(dims.names(), ", "),
                            fmt::join(coordinate_of(dims, rank), ", "), what));
  }
  return results;
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
    for (int64_t t : {int64_t{0}, dims.tp - 1}) {
      for (int64_t p = 0; p < dims.pp; ++p) {
        // Row-major over (pp, dp_replicate, dp_shard, tp), dp_replicate 0.
        chosen.insert(
            static_cast<int>(((p * dims.dp_replicate) * dims.dp_shard + s) * dims.tp + t));
      }
    }
  }
  return {chosen.begin(), chosen.end()};
}

}  // namespace loom::train
