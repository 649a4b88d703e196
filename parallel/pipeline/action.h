// Action: one step of a pipeline schedule on one rank — compute (forward/backward of one
// microbatch on one stage) or point-to-point communication between adjacent stages.
//
// Notation (what Schedule::str() prints and parse_actions() reads): <KIND><mb>s<stage>, e.g.
//   F3s1       forward of microbatch 3 on stage 1
//   B3s1       backward of microbatch 3 on stage 1
//   I3s1       the input part of that backward (the gradient stage 0 waits for)  } zero-bubble
//   W3s1       its weight part, run later (autograd::backward_input)             } schedules
//   SEND_F3s1  stage 1 sends its output for microbatch 3 to stage 2
//   RECV_F3s2  stage 2 receives its input for microbatch 3 from stage 1
//   SEND_B3s2  stage 2 sends the gradient of its input for microbatch 3 to stage 1
//   RECV_B3s1  stage 1 receives the gradient of its output for microbatch 3 from stage 2
// The stage is always the one on the rank doing the action (torch.distributed.pipelining's
// convention), so SEND_F3s1 on stage 1's rank matches RECV_F3s2 on stage 2's rank, and
// SEND_B3s2 matches RECV_B3s1. Error messages spell actions out: "RECV_F mb 3 stage 2".
#pragma once

#include <compare>
#include <string>
#include <string_view>
#include <vector>

namespace loom::pipeline {

enum class ActionKind {
  kForward,
  kBackward,
  kSendF,
  kRecvF,
  kSendB,
  kRecvB,
  kBackwardInput,   // B's input part (I): what the previous stage waits for
  kBackwardWeight,  // B's weight part (W): after its I, when the schedule likes
};

struct Action {
  ActionKind kind;
  int stage;
  int microbatch;

  // Ordered by (kind, stage, microbatch), so actions can be set and map keys.
  auto operator<=>(const Action&) const = default;
};

// "F", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "I", "W".
std::string_view kind_name(ActionKind kind);
bool is_compute(ActionKind kind);
// B, or I (the backward parts that produce the input's gradient).
bool computes_input_grad(ActionKind kind);
bool is_send(ActionKind kind);
bool is_recv(ActionKind kind);

// Compact form: "SEND_F3s1".
std::string str(const Action& action);
// Spelled out for errors: "SEND_F mb 3 stage 1".
std::string describe(const Action& action);

// The action on the peer stage's rank that a send or recv pairs with: SEND_F(s, i) <->
// RECV_F(s + 1, i), SEND_B(s, i) <-> RECV_B(s - 1, i). Only for communication actions.
Action matching_action(const Action& action);

// Reads whitespace-separated actions in the compact form; throws naming the bad token.
std::vector<Action> parse_actions(std::string_view text);

}  // namespace loom::pipeline
