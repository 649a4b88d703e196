#include "parallel/pipeline/communication.h"

#include <fmt/format.h>

#include <deque>
#include <optional>
#include <set>

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

// Whether a compute action's input (activation or gradient) is already on this rank: received,
// or produced by a local neighbour stage.
bool input_ready(const Action& action, const std::set<Action>& done, const Placement& placement) {
  const int s = action.stage, mb = action.microbatch;
  if (action.kind == ActionKind::kForward && s > 0) {
    return done.contains({ActionKind::kRecvF, s, mb}) ||
           done.contains({ActionKind::kForward, s - 1, mb});
  }
  if (computes_input_grad(action.kind) && s + 1 < placement.num_stages) {
    return done.contains({ActionKind::kRecvB, s, mb}) ||
           done.contains({ActionKind::kBackward, s + 1, mb}) ||
           done.contains({ActionKind::kBackwardInput, s + 1, mb});
  }
  return true;
}

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
  std::vector<std::set<Action>> done(num_ranks);
  auto place = [&](int rank, const Action& action) {
    schedule.actions[rank].push_back(action);
    done[rank].insert(action);
  };
  for (bool any_left = true; any_left;) {
    any_left = false;
    bool progress = false;
    for (int rank = 0; rank < num_ranks; ++rank) {
      if (pending[rank].empty()) continue;
      any_left = true;
      const Action action = pending[rank].front();
      if (!input_ready(action, done[rank], placement)) continue;
      place(rank, action);
      if (const auto send = send_after(action, placement)) {
        place(rank, *send);
        const Action recv = matching_action(*send);
        place(placement.rank_of(recv.stage), recv);
      }
      pending[rank].pop_front();
      progress = true;
    }
    if (any_left && !progress) {
      std::string stuck;
      for (int rank = 0; rank < num_ranks; ++rank) {
        if (!pending[rank].empty())
          stuck += fmt::format("; rank {} at {}", rank, describe(pending[rank].front()));
      }
      LOOM_FAIL(
          "add_communication: schedule '{}' cannot run: no rank's next compute action has its "
          "input{}",
          schedule.name, stuck);
    }
  }
  return schedule;
}

}  // namespace loom::pipeline
