// validate_schedule: proves a schedule runs (every message matched, every dependency ordered,
// no deadlock) before any rank executes it. The executor calls it on construction.
//
// Rules, checked in this order; the first broken one throws a loom::Error naming the rank, the
// action's position in that rank's list and the action, e.g.
//   "schedule: rank 1 action 5 RECV_F mb 2 stage 1 has no matching SEND_F on rank 0"
//  1. Placement: stage and microbatch are in range; the stage lives on this rank
//     (Schedule::rank_of_stage: the loop or V placement, placement.h); a send/recv has a neighbour
//     stage, on another rank (stages on one rank hand tensors over locally, without SEND/RECV).
//  2. No action appears twice.
//  3. Every stage runs F and B of every microbatch.
//  4. Every SEND has its RECV on the peer's rank (same boundary, microbatch and direction:
//     SEND_F(s, i) <-> RECV_F(s+1, i), SEND_B(s, i) <-> RECV_B(s-1, i)), and vice versa.
//     Between two ranks, the k-th SEND one lists to the other is the message the other's k-th
//     RECV from it names: messages carry no tag (NCCL has none), so they pair up in issue order.
//  5. Order on each rank:
//     F(s, i)      after RECV_F(s, i) (s > 0; or after F(s-1, i) when stage s-1 is local);
//     B(s, i)      after F(s, i), and after RECV_B(s, i) (s < last; or B(s+1, i) when local);
//     RECV_B(s, i) after F(s, i) (the gradient buffer takes the shape of the forward's output);
//     SEND_F(s, i) after F(s, i); SEND_B(s, i) after B(s, i).
//  6. No deadlock: a simulation runs every rank's list with receives that block until the
//     peer has sent, and sends that either return at once (SendSemantics::kAsync: isend, what
//     the executor does) or block until the peer reaches the matching receive (kRendezvous: a
//     transport without buffering). If some ranks can never finish, the error names where each
//     waits and for whom, and the cycle of ranks waiting on each other. The executor posts a
//     receive at its RECV action and waits for it only at the compute that consumes it, later
//     than the simulation does, so a schedule that passes cannot deadlock the executor.
#pragma once

#include "parallel/pipeline/schedule.h"

namespace loom::pipeline {

enum class SendSemantics {
  kAsync,       // a send returns at once; only receives wait (the executor's isend)
  kRendezvous,  // a send also waits until the peer reaches the matching receive
};

struct ValidateOptions {
  SendSemantics sends = SendSemantics::kAsync;
};

void validate_schedule(const Schedule& schedule, ValidateOptions options = {});

namespace detail {
// Rule 6 alone (rules 1-5 must hold); exposed for tests.
void check_no_deadlock(const Schedule& schedule, SendSemantics sends);
// "schedule: rank 1 action 5 RECV_F mb 2 stage 1": how every validator error starts.
std::string where(int rank, int index, const Action& action);
}  // namespace detail

}  // namespace loom::pipeline
