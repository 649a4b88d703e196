#include "parallel/pipeline/action.h"

#include <fmt/format.h>

#include <array>
#include <charconv>
#include <sstream>

#include "base/error.h"

namespace loom::pipeline {

namespace {

constexpr std::array<std::pair<ActionKind, std::string_view>, 8> kNames = {{
    {ActionKind::kForward, "F"},
    {ActionKind::kBackward, "B"},
    {ActionKind::kSendF, "SEND_F"},
    {ActionKind::kRecvF, "RECV_F"},
    {ActionKind::kSendB, "SEND_B"},
    {ActionKind::kRecvB, "RECV_B"},
    {ActionKind::kBackwardInput, "I"},
    {ActionKind::kBackwardWeight, "W"},
}};

// Parses a non-negative decimal number filling all of `text`.
bool parse_index(std::string_view text, int& out) {
  if (text.empty()) return false;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), out);
  return error == std::errc() && end == text.data() + text.size() && out >= 0;
}

Action parse_action(std::string_view token) {
  const size_t digits = token.find_first_of("0123456789");
  const size_t s = token.find('s', digits == std::string_view::npos ? token.size() : digits);
  Action action{ActionKind::kForward, 0, 0};
  bool known_kind = false;
  if (digits != std::string_view::npos) {
    for (const auto& [kind, name] : kNames) {
      if (token.substr(0, digits) == name) {
        action.kind = kind;
        known_kind = true;
      }
    }
  }
  LOOM_CHECK(known_kind && s != std::string_view::npos &&
                 parse_index(token.substr(digits, s - digits), action.microbatch) &&
                 parse_index(token.substr(s + 1), action.stage),
             "parse_actions: '{}' is not an action; expected <KIND><microbatch>s<stage> with KIND "
             "one of F, B, SEND_F, RECV_F, SEND_B, RECV_B (e.g. 'SEND_F3s1')",
             token);
  return action;
}

}  // namespace

std::string_view kind_name(ActionKind kind) {
  for (const auto& [k, name] : kNames) {
    if (k == kind) return name;
  }
  LOOM_INTERNAL_ASSERT(false, "unknown ActionKind {}", static_cast<int>(kind));
  return "";
}

bool is_compute(ActionKind kind) {
  return kind == ActionKind::kForward || kind == ActionKind::kBackward ||
         kind == ActionKind::kBackwardInput || kind == ActionKind::kBackwardWeight;
}
bool computes_input_grad(ActionKind kind) {
  return kind == ActionKind::kBackward || kind == ActionKind::kBackwardInput;
}
bool is_send(ActionKind kind) { return kind == ActionKind::kSendF || kind == ActionKind::kSendB; }
bool is_recv(ActionKind kind) { return kind == ActionKind::kRecvF || kind == ActionKind::kRecvB; }

std::string str(const Action& action) {
  return fmt::format("{}{}s{}", kind_name(action.kind), action.microbatch, action.stage);
}

std::string describe(const Action& action) {
  return fmt::format("{} mb {} stage {}", kind_name(action.kind), action.microbatch, action.stage);
}

Action matching_action(const Action& action) {
  const int mb = action.microbatch;
  switch (action.kind) {
    case ActionKind::kSendF:
      return {ActionKind::kRecvF, action.stage + 1, mb};
    case ActionKind::kRecvF:
      return {ActionKind::kSendF, action.stage - 1, mb};
    case ActionKind::kSendB:
      return {ActionKind::kRecvB, action.stage - 1, mb};
    case ActionKind::kRecvB:
      return {ActionKind::kSendB, action.stage + 1, mb};
    default:
      LOOM_INTERNAL_ASSERT(false, "matching_action: {} is not a communication action", str(action));
      return action;
  }
}

std::vector<Action> parse_actions(std::string_view text) {
  std::vector<Action> actions;
  std::istringstream in{std::string(text)};
  std::string token;
  while (in >> token) actions.push_back(parse_action(token));
  return actions;
}

}  // namespace loom::pipeline
