#include "parallel/pipeline/schedule.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/error.h"

namespace loom::pipeline {

std::vector<int> Schedule::stages_of_rank(int rank) const {
  std::vector<int> stages;
  for (int stage = rank; stage < num_stages; stage += num_ranks) stages.push_back(stage);
  return stages;
}

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
                             const std::vector<std::string>& rank_lines, std::string name) {
  LOOM_CHECK(static_cast<int>(rank_lines.size()) == num_ranks,
             "Schedule::from_text: got {} lines of actions for {} ranks; give one line per rank",
             rank_lines.size(), num_ranks);
  Schedule schedule{std::move(name), num_ranks, num_stages, num_microbatches, {}};
  for (const std::string& line : rank_lines) schedule.actions.push_back(parse_actions(line));
  return schedule;
}

int peak_microbatches_in_flight(const Schedule& schedule, int rank) {
  int in_flight = 0, peak = 0;
  for (const Action& action : schedule.actions.at(rank)) {
    if (action.kind == ActionKind::kForward) peak = std::max(peak, ++in_flight);
    if (action.kind == ActionKind::kBackward) --in_flight;
  }
  return peak;
}

}  // namespace loom::pipeline
