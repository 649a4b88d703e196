#include "parallel/pipeline/communication.h"

#include <fmt/format.h>

#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <vector>

#include "base/error.h"

namespace loom::pipeline {

namespace {

struct Placement {
  int num_ranks;
  int num_stages;
  StagePlacement style;
  int rank_of(int stage) const { return rank_of_stage(style, stage, num_ranks, num_stages); }
};

// The send a compute action makes (if its neighbour stage is on another rank).
std::optional<Action> send_after(const Action& action, const Placement& placement) {
  const int s = action.stage;
  if (action.kind == ActionKind::kForward && s + 1 < placement.num_stages &&
      placement.rank_of(s + 1) != placement.rank_of(s)) {
    return Action{ActionKind::kSendF, s, action.microbatch};
  }
  if (computes_input_grad(action.kind) && s > 0 &&
      placement.rank_of(s - 1) != placement.rank_of(s)) {
    return Action{ActionKind::kSendB, s, action.microbatch};
  }
  return std::nullopt;
}

// Compute actions' finish times in a flat table by (kind, stage, microbatch): the event loop looks
// one up for every rank at every event, and a map's lookups made a 32-rank schedule of 64
// microbatches take 30 ms (the layout search builds thousands).
class FinishTimes {
 public:
  FinishTimes(int num_stages, int num_microbatches)
      : num_stages_(num_stages),
        num_microbatches_(num_microbatches),
        times_(static_cast<size_t>(kKinds * num_stages * num_microbatches), kNotYet) {}
  bool contains(const Action& a) const { return times_[index(a)] != kNotYet; }
  // The finish time, or nullopt before it finished.
  std::optional<double> find(const Action& a) const {
    const double t = times_[index(a)];
    return t == kNotYet ? std::nullopt : std::optional<double>(t);
  }
  void set(const Action& a, double t) { times_[index(a)] = t; }

 private:
  static constexpr int kKinds = static_cast<int>(ActionKind::kBackwardWeight) + 1;
  static constexpr double kNotYet = -1;  // times are never negative
  size_t index(const Action& a) const {
    LOOM_INTERNAL_ASSERT(a.stage >= 0 && a.stage < num_stages_ && a.microbatch >= 0 &&
                         a.microbatch < num_microbatches_);
    return (static_cast<size_t>(a.kind) * num_stages_ + a.stage) * num_microbatches_ + a.microbatch;
  }
  int num_stages_, num_microbatches_;
  std::vector<double> times_;
};

// The compute that produces a compute action's input (activation or gradient), if any: the
// neighbour stage's F, or its B or I (whichever `done` has).
std::optional<Action> producer(const Action& action, const FinishTimes& done,
                               const Placement& placement) {
  const int s = action.stage, mb = action.microbatch;
  if (action.kind == ActionKind::kForward && s > 0) return Action{ActionKind::kForward, s - 1, mb};
  if (computes_input_grad(action.kind) && s + 1 < placement.num_stages) {
    const Action whole{ActionKind::kBackward, s + 1, mb};
    return done.contains(whole) ? whole : Action{ActionKind::kBackwardInput, s + 1, mb};
  }
  return std::nullopt;
}

// Units of simulated time: a forward 1, a whole backward 2, its parts 1 each.
double duration(ActionKind kind) { return kind == ActionKind::kBackward ? 2.0 : 1.0; }

}  // namespace

Schedule add_communication(std::string name, int num_ranks, int num_stages, int num_microbatches,
                           const std::vector<std::vector<Action>>& compute, StagePlacement style) {
  LOOM_INTERNAL_ASSERT(static_cast<int>(compute.size()) == num_ranks);
  const Placement placement{num_ranks, num_stages, style};
  Schedule schedule{std::move(name),
                    num_ranks,
                    num_stages,
                    num_microbatches,
                    std::vector<std::vector<Action>>(num_ranks),
                    style};
  std::vector<std::deque<Action>> pending;
  for (const auto& actions : compute) pending.emplace_back(actions.begin(), actions.end());
  FinishTimes finished(num_stages, num_microbatches);
  std::vector<double> clock(num_ranks, 0.0);
  // Per rank: receives not yet placed, by (arrival time, order sent), with the sender's rank.
  std::vector<std::multimap<std::pair<double, int>, std::pair<int, Action>>> inbox(num_ranks);
  int sent = 0;
  // Places `rank`'s receives that arrived before `until`, and those arriving at `until` from a
  // rank below `from_below` (all of them with num_ranks).
  const auto flush_inbox = [&](int rank, double until, int from_below) {
    auto& box = inbox[rank];
    for (auto it = box.begin(); it != box.end() && it->first.first <= until;) {
      if (it->first.first == until && it->second.first >= from_below) {
        ++it;
        continue;
      }
      schedule.actions[rank].push_back(it->second.second);
      it = box.erase(it);
    }
  };
  // Sends of computes that finish later: (finish time, rank) -> the send.
  std::multimap<std::pair<double, int>, Action> sends;
  // Discrete events in time order. At a time t: first every message sent at t arrives; then each
  // sender posts the receives that arrived before t, and those arriving at t from lower ranks,
  // before its send. So of two ranks sending to each other at once, the lower sends first and
  // the higher receives first: no cycle of ranks each blocked in a receive before its send
  // (blocking receives), nor each blocked in a send before its receive (sends that wait for the
  // receiver, NCCL's). Then computes starting at t post every receive that arrived by t and run
  // (ties to the lower rank). Starts never decrease: a compute becomes runnable only when its
  // input's producer finishes.
  while (true) {
    int next = -1;
    double next_start = 0;
    for (int rank = 0; rank < num_ranks; ++rank) {
      if (pending[rank].empty()) continue;
      const Action& action = pending[rank].front();
      double start = clock[rank];
      if (const auto from = producer(action, finished, placement)) {
        const std::optional<double> ready = finished.find(*from);
        if (!ready) continue;  // its input is not computed yet
        start = std::max(start, *ready);
      }
      if (next < 0 || start < next_start) next = rank, next_start = start;
    }
    if (!sends.empty() && (next < 0 || sends.begin()->first.first <= next_start)) {
      const double t = sends.begin()->first.first;
      std::vector<std::pair<int, Action>> now;
      while (!sends.empty() && sends.begin()->first.first == t) {
        now.emplace_back(sends.begin()->first.second, sends.begin()->second);
        sends.erase(sends.begin());
      }
      for (const auto& [rank, send] : now) {
        const Action recv = matching_action(send);
        inbox[placement.rank_of(recv.stage)].emplace(std::make_pair(t, sent++),
                                                     std::make_pair(rank, recv));
      }
      for (const auto& [rank, send] : now) {
        flush_inbox(rank, t, rank);
        schedule.actions[rank].push_back(send);
      }
      continue;
    }
    if (next < 0) break;
    const Action action = pending[next].front();
    pending[next].pop_front();
    flush_inbox(next, next_start, num_ranks);
    schedule.actions[next].push_back(action);
    clock[next] = next_start + duration(action.kind);
    finished.set(action, clock[next]);
    if (const auto send = send_after(action, placement)) {
      sends.emplace(std::make_pair(clock[next], next), *send);
    }
  }
  std::string stuck;
  for (int rank = 0; rank < num_ranks; ++rank) {
    if (!pending[rank].empty())
      stuck += fmt::format("; rank {} at {}", rank, describe(pending[rank].front()));
  }
  LOOM_CHECK(stuck.empty(),
             "add_communication: schedule '{}' cannot run: no rank's next compute action has its "
             "input{}",
             schedule.name, stuck);
  for (int rank = 0; rank < num_ranks; ++rank) {
    flush_inbox(rank, std::numeric_limits<double>::infinity(), num_ranks);
  }
  return schedule;
}

}  // namespace loom::pipeline
