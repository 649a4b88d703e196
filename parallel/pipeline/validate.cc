// Rules 1-5 of validate_schedule (validate.h); rule 6 is deadlock.cc.
#include "parallel/pipeline/validate.h"

#include <fmt/format.h>

#include <map>

#include "base/error.h"

namespace loom::pipeline {

namespace detail {
std::string where(int rank, int index, const Action& action) {
  return fmt::format("schedule: rank {} action {} {}", rank, index, describe(action));
}
}  // namespace detail

namespace {

using detail::where;

// Where each action of each rank stands in that rank's list.
using Positions = std::vector<std::map<Action, int>>;

void check_shape(const Schedule& schedule) {
  LOOM_CHECK(schedule.num_ranks >= 1 && schedule.num_stages >= 1 && schedule.num_microbatches >= 1,
             "schedule '{}': needs at least 1 rank, stage and microbatch; got {} ranks, {} stages, "
             "{} microbatches",
             schedule.name, schedule.num_ranks, schedule.num_stages, schedule.num_microbatches);
  LOOM_CHECK(static_cast<int>(schedule.actions.size()) == schedule.num_ranks,
             "schedule '{}': has action lists for {} ranks but num_ranks is {}", schedule.name,
             schedule.actions.size(), schedule.num_ranks);
  LOOM_CHECK(
      schedule.placement != StagePlacement::kV || schedule.num_stages == 2 * schedule.num_ranks,
      "schedule '{}': the V placement holds two stages per rank, so {} ranks need {} "
      "stages; got {}",
      schedule.name, schedule.num_ranks, 2 * schedule.num_ranks, schedule.num_stages);
}

// Rule 1.
void check_placement(const Schedule& schedule, int rank, int index, const Action& action) {
  const int last = schedule.num_stages - 1;
  LOOM_CHECK(action.stage >= 0 && action.stage <= last,
             "{}: stage {} is out of range; the schedule has {} stages (0..{})",
             where(rank, index, action), action.stage, schedule.num_stages, last);
  LOOM_CHECK(action.microbatch >= 0 && action.microbatch < schedule.num_microbatches,
             "{}: microbatch {} is out of range; the schedule has {} microbatches (0..{})",
             where(rank, index, action), action.microbatch, schedule.num_microbatches,
             schedule.num_microbatches - 1);
  LOOM_CHECK(schedule.rank_of_stage(action.stage) == rank,
             "{}: stage {} lives on rank {} ({} placement: {}), not on rank {}",
             where(rank, index, action), action.stage, schedule.rank_of_stage(action.stage),
             placement_name(schedule.placement),
             placement_rule(schedule.placement, schedule.num_ranks), rank);
  if (is_compute(action.kind)) return;
  const int peer_stage = matching_action(action).stage;
  LOOM_CHECK(peer_stage >= 0 && peer_stage <= last,
             "{}: stage {} has no stage {} to {} (stages are 0..{})", where(rank, index, action),
             action.stage, peer_stage, is_send(action.kind) ? "send to" : "receive from", last);
  LOOM_CHECK(schedule.rank_of_stage(peer_stage) != rank,
             "{}: stages {} and {} are both on rank {}; they hand tensors over locally, without "
             "SEND/RECV",
             where(rank, index, action), action.stage, peer_stage, rank);
}

// Rules 1 and 2; returns the positions.
Positions index_actions(const Schedule& schedule) {
  Positions positions(schedule.num_ranks);
  for (int rank = 0; rank < schedule.num_ranks; ++rank) {
    const auto& actions = schedule.actions[rank];
    for (int index = 0; index < static_cast<int>(actions.size()); ++index) {
      const Action& action = actions[index];
      check_placement(schedule, rank, index, action);
      const auto [it, inserted] = positions[rank].emplace(action, index);
      LOOM_CHECK(inserted, "{} repeats action {}", where(rank, index, action), it->second);
    }
  }
  return positions;
}

// Rule 3.
void check_complete(const Schedule& schedule, const Positions& positions) {
  for (int stage = 0; stage < schedule.num_stages; ++stage) {
    const int rank = schedule.rank_of_stage(stage);
    for (int mb = 0; mb < schedule.num_microbatches; ++mb) {
      const auto has = [&](ActionKind kind) {
        return positions[rank].contains(Action{kind, stage, mb});
      };
      const Action forward{ActionKind::kForward, stage, mb};
      LOOM_CHECK(has(ActionKind::kForward),
                 "schedule: rank {} never runs {} (every stage runs F and B, or I and W, of each "
                 "of the {} microbatches)",
                 rank, describe(forward), schedule.num_microbatches);
      const bool whole = has(ActionKind::kBackward), input = has(ActionKind::kBackwardInput),
                 weight = has(ActionKind::kBackwardWeight);
      LOOM_CHECK(!(whole && (input || weight)),
                 "schedule: rank {} runs both B and I/W of microbatch {} on stage {}; a backward "
                 "is whole (B) or split (I then W), once",
                 rank, mb, stage);
      LOOM_CHECK(whole || input,
                 "schedule: rank {} never runs {} nor {} (every stage runs F and B, or I and W, "
                 "of each of the {} microbatches)",
                 rank, describe({ActionKind::kBackward, stage, mb}),
                 describe({ActionKind::kBackwardInput, stage, mb}), schedule.num_microbatches);
      LOOM_CHECK(!input || weight,
                 "schedule: rank {} runs {} but never its {} (a split backward's weight part "
                 "must run)",
                 rank, describe({ActionKind::kBackwardInput, stage, mb}),
                 describe({ActionKind::kBackwardWeight, stage, mb}));
      LOOM_CHECK(!weight || input, "schedule: rank {} runs {} without its {}", rank,
                 describe({ActionKind::kBackwardWeight, stage, mb}),
                 describe({ActionKind::kBackwardInput, stage, mb}));
    }
  }
}

// Rule 4.
void check_matching(const Schedule& schedule, const Positions& positions) {
  for (int rank = 0; rank < schedule.num_ranks; ++rank) {
    for (int index = 0; index < static_cast<int>(schedule.actions[rank].size()); ++index) {
      const Action& action = schedule.actions[rank][index];
      if (is_compute(action.kind)) continue;
      const Action match = matching_action(action);
      const int peer = schedule.rank_of_stage(match.stage);
      LOOM_CHECK(positions[peer].contains(match), "{} has no matching {} on rank {} ({})",
                 where(rank, index, action), kind_name(match.kind), peer, describe(match));
    }
  }
}

// Rule 4b: between two ranks, the k-th send one lists is the message the other's k-th receive
// from it names. Transports without tags (NCCL) match messages in issue order, and the stages use
// no tags on any backend, so this order is what pairs them.
void check_issue_order(const Schedule& schedule) {
  // (from, to) -> indices of `from`'s sends to `to` in list order; likewise `to`'s receives.
  std::map<std::pair<int, int>, std::vector<int>> sends, recvs;
  for (int rank = 0; rank < schedule.num_ranks; ++rank) {
    const auto& actions = schedule.actions[rank];
    for (int index = 0; index < static_cast<int>(actions.size()); ++index) {
      const Action& action = actions[index];
      if (is_compute(action.kind)) continue;
      const int peer = schedule.rank_of_stage(matching_action(action).stage);
      if (is_send(action.kind)) {
        sends[{rank, peer}].push_back(index);
      } else {
        recvs[{peer, rank}].push_back(index);
      }
    }
  }
  for (const auto& [pair, receive_indices] : recvs) {
    const auto [from, to] = pair;
    const std::vector<int>& send_indices = sends[pair];  // as many (rule 4)
    for (size_t k = 0; k < receive_indices.size() && k < send_indices.size(); ++k) {
      const Action& recv = schedule.actions[to][receive_indices[k]];
      const Action& send = schedule.actions[from][send_indices[k]];
      LOOM_CHECK(matching_action(send) == recv,
                 "{} is rank {}'s receive #{} from rank {}, but rank {}'s send #{} to rank {} is "
                 "action {} {}; "
                 "messages between two ranks pair up in the order they are issued (no tags, as on "
                 "NCCL), so "
                 "both ranks must list them in the same order",
                 where(to, receive_indices[k], recv), to, k, from, from, k, to, send_indices[k],
                 describe(send));
    }
  }
}

// Rule 5: `action` (at `index`) must come after `before`, which `why` explains.
void check_after(const Schedule& schedule, const Positions& positions, int rank, int index,
                 const Action& action, const Action& before, const char* why) {
  const auto it = positions[rank].find(before);
  LOOM_CHECK(it != positions[rank].end(), "{} needs {} before it ({}), but rank {} has none",
             where(rank, index, action), describe(before), why, rank);
  LOOM_CHECK(it->second < index, "{} runs before {} (action {}), {}", where(rank, index, action),
             describe(before), it->second, why);
}

void check_order(const Schedule& schedule, const Positions& positions) {
  const int last = schedule.num_stages - 1;
  for (int rank = 0; rank < schedule.num_ranks; ++rank) {
    for (int index = 0; index < static_cast<int>(schedule.actions[rank].size()); ++index) {
      const Action& action = schedule.actions[rank][index];
      const int s = action.stage, mb = action.microbatch;
      auto after = [&](ActionKind kind, int stage, const char* why) {
        check_after(schedule, positions, rank, index, action, {kind, stage, mb}, why);
      };
      auto local = [&](int stage) { return schedule.rank_of_stage(stage) == rank; };
      switch (action.kind) {
        case ActionKind::kForward:
          if (s > 0 && local(s - 1)) after(ActionKind::kForward, s - 1, "which computes its input");
          if (s > 0 && !local(s - 1)) after(ActionKind::kRecvF, s, "which receives its input");
          break;
        case ActionKind::kBackward:
        case ActionKind::kBackwardInput: {
          after(ActionKind::kForward, s, "its forward");
          if (s < last && local(s + 1)) {
            // The next stage's B, or its I, computes this one's output gradient.
            const bool split_next =
                positions[rank].contains(Action{ActionKind::kBackwardInput, s + 1, mb});
            after(split_next ? ActionKind::kBackwardInput : ActionKind::kBackward, s + 1,
                  "which computes its output's gradient");
          }
          if (s < last && !local(s + 1))
            after(ActionKind::kRecvB, s, "which receives its output's gradient");
          break;
        }
        case ActionKind::kBackwardWeight:
          after(ActionKind::kBackwardInput, s, "its input part, which keeps what it needs");
          break;
        case ActionKind::kRecvB:
          after(ActionKind::kForward, s, "whose output's shape the gradient buffer takes");
          break;
        case ActionKind::kSendF:
          after(ActionKind::kForward, s, "which computes what it sends");
          break;
        case ActionKind::kSendB: {
          const bool split = positions[rank].contains(Action{ActionKind::kBackwardInput, s, mb});
          after(split ? ActionKind::kBackwardInput : ActionKind::kBackward, s,
                "which computes what it sends");
          break;
        }
        case ActionKind::kRecvF:
          break;  // may be posted as early as the schedule likes
      }
    }
  }
}

}  // namespace

void validate_schedule(const Schedule& schedule, ValidateOptions options) {
  check_shape(schedule);
  const Positions positions = index_actions(schedule);
  check_complete(schedule, positions);
  check_matching(schedule, positions);
  check_issue_order(schedule);
  check_order(schedule, positions);
  detail::check_no_deadlock(schedule, options.sends);
}

}  // namespace loom::pipeline
