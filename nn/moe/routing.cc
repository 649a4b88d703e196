#include "nn/moe/routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/error.h"
#include "tensor/ops.h"

namespace loom::nn {

Routing route_top_k(std::span<const float> scores, int64_t tokens, int64_t experts, int64_t top_k,
                    std::span<const float> bias, int64_t capacity) {
  LOOM_CHECK(static_cast<int64_t>(scores.size()) == tokens * experts,
             "route_top_k: {} scores for {} tokens x {} experts", scores.size(), tokens, experts);
  LOOM_CHECK(bias.empty() || static_cast<int64_t>(bias.size()) == experts,
             "route_top_k: {} bias entries for {} experts", bias.size(), experts);
  LOOM_CHECK(top_k >= 1 && top_k <= experts, "route_top_k: top_k {} with {} experts", top_k,
             experts);
  std::vector<float> keys(tokens * experts);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t e = 0; e < experts; ++e) {
      float& key = keys[t * experts + e];
      key = scores[t * experts + e] + (bias.empty() ? 0.0f : bias[e]);
      LOOM_CHECK(std::isfinite(key),
                 "route_top_k: token {}'s score for expert {} is {} (with its bias); the router's "
                 "scores must be finite (a diverged run?)",
                 t, e, key);
    }
  }
  // The top_k largest; equal keys: the lower expert first (a total order, so repeatable).
  const std::vector<double> picked =
      ops::to_vector(ops::top_k_indices(ops::from_vector(keys, {tokens, experts}), top_k));
  return place_choices(std::vector<int64_t>(picked.begin(), picked.end()), tokens, experts, top_k,
                       capacity);
}

void limit_to_groups(std::vector<float>& keys, int64_t tokens, int64_t experts, int64_t groups,
                     int64_t limited) {
  LOOM_CHECK(groups >= 1 && experts % groups == 0 && limited >= 1 && limited <= groups &&
                 static_cast<int64_t>(keys.size()) == tokens * experts,
             "limit_to_groups: {} keys for {} tokens x {} experts in {} groups, {} kept",
             keys.size(), tokens, experts, groups, limited);
  const int64_t size = experts / groups;
  std::vector<float> group_score(groups);
  std::vector<int64_t> order(groups);
  for (int64_t t = 0; t < tokens; ++t) {
    float* row = keys.data() + t * experts;
    if (std::any_of(row, row + experts, [](float k) { return std::isnan(k); })) continue;
    for (int64_t g = 0; g < groups; ++g) {
      // The sum of the group's two best keys (its one key, in a group of one).
      float best = -INFINITY, second = -INFINITY;
      for (int64_t e = g * size; e < (g + 1) * size; ++e) {
        if (row[e] > best) {
          second = best;
          best = row[e];
        } else if (row[e] > second) {
          second = row[e];
        }
      }
      group_score[g] = size == 1 ? best : best + second;
    }
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return group_score[a] > group_score[b]; });
    for (int64_t i = limited; i < groups; ++i) {
      std::fill(row + order[i] * size, row + (order[i] + 1) * size, -INFINITY);
    }
  }
}

Routing place_choices(std::vector<int64_t> choice, int64_t tokens, int64_t experts, int64_t top_k,
                      int64_t capacity) {
  LOOM_CHECK(top_k >= 1 && top_k <= experts, "place_choices: top_k {} with {} experts", top_k,
             experts);
  LOOM_CHECK(static_cast<int64_t>(choice.size()) == tokens * top_k,
             "place_choices: {} choices for {} tokens x top_k {}", choice.size(), tokens, top_k);
  Routing r{.tokens = tokens, .experts = experts, .top_k = top_k};
  r.choice = std::move(choice);
  r.routed.assign(experts, 0);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t k = 0; k < top_k; ++k) {
      const int64_t e = r.choice[t * top_k + k];
      LOOM_CHECK(e >= 0 && e < experts,
                 "place_choices: token {}'s choice {} is expert {}, expected one of [0, {})", t, k,
                 e, experts);
      for (int64_t before = 0; before < k; ++before) {
        LOOM_CHECK(r.choice[t * top_k + before] != e,
                   "place_choices: token {} picked expert {} twice (choices {} and {})", t, e,
                   before, k);
      }
      ++r.routed[e];
    }
  }
  // Counting sort by expert, slots in (token, choice) order within an expert; the first
  // `capacity` of each kept.
  std::vector<int64_t> kept(experts);
  for (int64_t e = 0; e < experts; ++e) {
    kept[e] = capacity < 0 ? r.routed[e] : std::min(r.routed[e], capacity);
  }
  r.offsets.assign(experts + 1, 0);
  for (int64_t e = 0; e < experts; ++e) r.offsets[e + 1] = r.offsets[e] + kept[e];
  r.slot_token.resize(r.offsets[experts]);
  r.slot_of.assign(tokens * top_k, r.offsets[experts]);
  std::vector<int64_t> filled(experts, 0);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t k = 0; k < top_k; ++k) {
      const int64_t e = r.choice[t * top_k + k];
      if (filled[e] == kept[e]) continue;  // full: dropped
      const int64_t row = r.offsets[e] + filled[e]++;
      r.slot_token[row] = t;
      r.slot_of[t * top_k + k] = row;
    }
  }
  return r;
}

int64_t expert_capacity(double capacity_factor, int64_t tokens, int64_t top_k, int64_t experts) {
  if (capacity_factor <= 0) return -1;
  return static_cast<int64_t>(std::ceil(capacity_factor * static_cast<double>(tokens * top_k) /
                                        static_cast<double>(experts)));
}

}  // namespace loom::nn
