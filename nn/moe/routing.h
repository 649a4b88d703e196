// Token-choice top-k routing: which experts each token picks (ops::top_k_indices, on the scores'
// device in MoE::route), and, on the host, where each (token, choice) slot goes in the
// expert-sorted order the grouped GEMMs run in. Deterministic: ties between equal scores go to
// the lower expert index, and slots are ordered by (expert, token, choice), so runs repeat bit for
// bit.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace loom::nn {

struct Routing {
  int64_t tokens = 0, experts = 0, top_k = 0;
  std::vector<int64_t> choice;      // (tokens, top_k): the experts picked, best first
  std::vector<int64_t> routed;      // (experts): slots routed to each, before any capacity
  std::vector<int64_t> offsets;     // (experts + 1): the kept slots of expert e are rows
                                    // [offsets[e], offsets[e + 1]) of the sorted order
  std::vector<int64_t> slot_token;  // (kept): the token of each kept slot, in sorted order
  std::vector<int64_t> slot_of;     // (tokens, top_k): each choice's row in the sorted order,
                                    // or `kept()` (a zero row) when it was dropped
  int64_t kept() const { return static_cast<int64_t>(slot_token.size()); }
  int64_t dropped() const { return tokens * top_k - kept(); }
};

// `scores`: (tokens, experts) row-major, the router's scores; `bias`: (experts) added to them for
// choosing only (empty: none). `capacity`: the most slots an expert keeps (< 0: no limit), the
// earliest tokens first. Throws naming the token and expert of a score that is not finite.
Routing route_top_k(std::span<const float> scores, int64_t tokens, int64_t experts, int64_t top_k,
                    std::span<const float> bias, int64_t capacity);

// The routing of choices already made: `choice` (tokens, top_k), each token's experts best first
// (as ops::top_k_indices picks them on the scores' device, so only the choices reach the host),
// counted and placed in the expert-sorted order as route_top_k places its own. Throws naming the
// token and slot of a choice outside [0, experts) or an expert a token picked twice.
Routing place_choices(std::vector<int64_t> choice, int64_t tokens, int64_t experts, int64_t top_k,
                      int64_t capacity);

// Group-limited routing (DeepSeek-V3's): `keys` (tokens, experts) row-major, the scores plus any
// bias, the experts in `groups` equal groups. For each token the `limited` groups whose two best
// keys sum highest are kept (ties: the lower group) and every key of the other groups becomes
// -inf, so a top-k over them chooses within the kept groups. A token with a NaN key is left as
// it is (its choice names the NaN).
void limit_to_groups(std::vector<float>& keys, int64_t tokens, int64_t experts, int64_t groups,
                     int64_t limited);

// The capacity of capacity_factor (MoEOptions): ceil(factor * tokens * top_k / experts); -1 when
// the factor is 0 (dropless).
int64_t expert_capacity(double capacity_factor, int64_t tokens, int64_t top_k, int64_t experts);

}  // namespace loom::nn
