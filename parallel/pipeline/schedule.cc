#include "parallel/pipeline/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "base/error.h"

namespace loom::pipeline {

std::string Schedule::str() const {
  std::string out;
  for (size_t rank = 0; rank < actions.size(); ++rank) {
    out += fmt::format("rank {}:", rank);
    for (const Action& action : actions[rank]) out += " " + pipeline::str(action);
    out += "\n";
  }
  return out;
}

Schedule Schedule::from_text(int num_ranks, int num_stages, int num_microbatches,
                             const std::vector<std::string>& rank_lines, std::string name,
                             StagePlacement placement) {
  LOOM_CHECK(static_cast<int>(rank_lines.size()) == num_ranks,
             "Schedule::from_text: got {} lines of actions for {} ranks; give one line per rank",
             rank_lines.size(), num_ranks);
  Schedule schedule{std::move(name), num_ranks, num_stages, num_microbatches, {}, placement};
  for (const std::string& line : rank_lines) schedule.actions.push_back(parse_actions(line));
  return schedule;
}

int peak_microbatches_in_flight(const Schedule& schedule, int rank) {
  int in_flight = 0, peak = 0;
  for (const Action& action : schedule.actions.at(rank)) {
    if (action.kind == ActionKind::kForward) peak = std::max(peak, ++in_flight);
    // A microbatch's activations go with its whole backward: B, or W (after its I).
    if (action.kind == ActionKind::kBackward || action.kind == ActionKind::kBackwardWeight) {
      --in_flight;
    }
  }
  return peak;
}

std::vector<std::vector<TimedAction>> simulate_timeline(const Schedule& schedule, double tf,
                                                        double tb, double tw) {
  const int p = schedule.num_ranks;
  std::map<Action, double> finished;  // compute action -> finish time
  std::vector<size_t> next(p, 0);
  std::vector<double> clock(p, 0);
  std::vector<std::vector<TimedAction>> timeline(p);
  for (bool progress = true; progress;) {
    progress = false;
    for (int rank = 0; rank < p; ++rank) {
      for (; next[rank] < schedule.actions[rank].size(); ++next[rank]) {
        const Action& a = schedule.actions[rank][next[rank]];
        if (!is_compute(a.kind)) continue;
        double ready = clock[rank];
        const bool fwd = a.kind == ActionKind::kForward;
        const bool weight = a.kind == ActionKind::kBackwardWeight;
        const int from = fwd ? a.stage - 1 : a.stage + 1;
        if (!weight && from >= 0 && from < schedule.num_stages) {
          // The neighbour's F, or its B or I (whichever it runs), produced this one's input.
          auto it = finished.find({a.kind, from, a.microbatch});
          if (!fwd && it == finished.end()) {
            it = finished.find({a.kind == ActionKind::kBackward ? ActionKind::kBackwardInput
                                                                : ActionKind::kBackward,
                                from, a.microbatch});
          }
          if (it == finished.end()) break;  // input not computed yet
          ready = std::max(ready, it->second);
        }
        if (!fwd)
          ready = std::max(ready, finished.at({ActionKind::kForward, a.stage, a.microbatch}));
        if (weight) {
          ready = std::max(ready, finished.at({ActionKind::kBackwardInput, a.stage, a.microbatch}));
        }
        const double duration = fwd                               ? tf
                                : a.kind == ActionKind::kBackward ? tb
                                : weight                          ? tw
                                                                  : tb - tw;
        clock[rank] = ready + duration;
        finished[a] = clock[rank];
        timeline[rank].push_back({a, ready, clock[rank]});
        progress = true;
      }
    }
  }
  return timeline;
}

double simulated_idle_share(const Schedule& schedule, double tf, double tb, double tw) {
  const auto timeline = simulate_timeline(schedule, tf, tb, tw);
  const int p = schedule.num_ranks;
  double step = 0;
  std::vector<double> busy(p, 0);
  for (int rank = 0; rank < p; ++rank) {
    for (const TimedAction& t : timeline[rank]) {
      busy[rank] += t.end - t.start;
      step = std::max(step, t.end);
    }
  }
  double idle = 0;
  for (int rank = 0; rank < p; ++rank) idle += (step - busy[rank]) / step / p;
  return idle;
}

std::string timeline_str(const Schedule& schedule) {
  const auto timeline = simulate_timeline(schedule, 1, 2, 1);
  std::string out;
  for (int rank = 0; rank < schedule.num_ranks; ++rank) {
    const std::vector<int> stages = schedule.stages_of_rank(rank);
    std::string line = fmt::format("rank {}:", rank);
    int column = 0;
    for (const TimedAction& t : timeline[rank]) {
      const int start = static_cast<int>(t.start), end = static_cast<int>(t.end);
      for (; column < start; ++column) line += fmt::format(" {:<3}", ".");
      const bool second = stages.size() > 1 && t.action.stage != stages.front();
      line += fmt::format(" {:<3}", fmt::format("{}{}{}", kind_name(t.action.kind),
                                                t.action.microbatch, second ? "'" : ""));
      for (++column; column < end; ++column) line += fmt::format(" {:<3}", "-");
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

}  // namespace loom::pipeline
