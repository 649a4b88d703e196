// Rule 6 of validate_schedule: simulate every rank's list with blocking receives (and, under
// kRendezvous, blocking sends) and report the ranks that can never finish.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "base/error.h"
#include "parallel/pipeline/validate.h"

namespace loom::pipeline::detail {

namespace {

class Simulation {
 public:
  Simulation(const Schedule& schedule, SendSemantics sends)
      : schedule_(schedule), sends_(sends), next_(schedule.num_ranks, 0) {}

  // Runs until every rank finished or none can move; returns whether all finished.
  bool run() {
    for (bool progress = true; progress;) {
      progress = false;
      for (int rank = 0; rank < schedule_.num_ranks; ++rank) {
        while (step(rank)) progress = true;
      }
    }
    for (int rank = 0; rank < schedule_.num_ranks; ++rank) {
      if (!finished(rank)) return false;
    }
    return true;
  }

  // Where each unfinished rank waits, and the cycle of waiting ranks.
  std::string report() const {
    std::string waits;
    int first_blocked = -1;
    for (int rank = 0; rank < schedule_.num_ranks; ++rank) {
      if (finished(rank)) continue;
      if (first_blocked < 0) first_blocked = rank;
      const Action& action = current(rank);
      waits += fmt::format("{}rank {} waits at action {} {} for rank {}", waits.empty() ? "" : "; ",
                           rank, next_[rank], describe(action), peer_of(action));
      if (finished(peer_of(action))) waits += " (which has finished)";
    }
    // Follow "waits for" from the first blocked rank until a rank repeats: that is the cycle.
    std::vector<int> path;
    for (int rank = first_blocked; !finished(rank);) {
      const auto seen = std::find(path.begin(), path.end(), rank);
      if (seen != path.end()) {
        std::string cycle;
        for (auto it = seen; it != path.end(); ++it) cycle += fmt::format("rank {} -> ", *it);
        return fmt::format("{}; cycle: {}rank {}", waits, cycle, rank);
      }
      path.push_back(rank);
      rank = peer_of(current(rank));
    }
    return waits;
  }

 private:
  bool finished(int rank) const {
    return next_[rank] >= static_cast<int>(schedule_.actions[rank].size());
  }
  const Action& current(int rank) const { return schedule_.actions[rank][next_[rank]]; }
  int peer_of(const Action& action) const {
    return schedule_.rank_of_stage(matching_action(action).stage);
  }
  // Whether `rank`'s next action is `action`.
  bool at(int rank, const Action& action) const {
    return !finished(rank) && current(rank) == action;
  }

  // Runs `rank`'s next action if it can; returns whether it did.
  bool step(int rank) {
    if (finished(rank)) return false;
    const Action& action = current(rank);
    if (is_compute(action.kind)) {
      ++next_[rank];
      return true;
    }
    const Action match = matching_action(action);
    const int peer = peer_of(action);
    if (sends_ == SendSemantics::kRendezvous) {
      // Both sides block until both are at the pair; then both move on.
      if (!at(peer, match)) return false;
      ++next_[rank];
      ++next_[peer];
      return true;
    }
    if (is_send(action.kind)) {
      sent_.insert(action);
    } else if (!sent_.contains(match)) {
      return false;
    }
    ++next_[rank];
    return true;
  }

  const Schedule& schedule_;
  SendSemantics sends_;
  std::vector<int> next_;  // per rank: the index of the next action to run
  std::set<Action> sent_;
};

}  // namespace

void check_no_deadlock(const Schedule& schedule, SendSemantics sends) {
  Simulation simulation(schedule, sends);
  LOOM_CHECK(simulation.run(), "schedule: deadlock ({}): {}",
             sends == SendSemantics::kAsync ? "blocking receives, asynchronous sends"
                                            : "blocking receives and sends",
             simulation.report());
}

}  // namespace loom::pipeline::detail
