// A mixture-of-experts feed-forward's settings (torchtitan's MoEArgs, DeepSeek-V3's names in
// comments): how many experts, how a token picks them, how the load is balanced, and what
// happens when an expert is full.
#pragma once

#include <cstdint>
#include <string>

namespace loom::nn {

struct MoEOptions {
  // The most experts a layer may have: far beyond any published model (DeepSeek-V3 256, Kimi K2
  // 384), and small enough that per-expert bookkeeping (counts, offsets, a plan's per-group
  // records) cannot exhaust a host's memory, as a million experts' plan did.
  static constexpr int64_t kMaxExperts = 65536;

  int64_t num_experts = 8;  // n_routed_experts
  int64_t top_k = 2;        // num_experts_per_tok: experts each token goes to
  int64_t hidden_dim = 0;   // each expert's SwiGLU width (moe_intermediate_size)
  int64_t num_shared_experts =
      0;  // n_shared_experts: a SwiGLU of num x hidden_dim every token passes
  std::string score_func = "softmax";  // "softmax" or "sigmoid" (DeepSeek-V3) over the experts
  // Group-limited routing (DeepSeek-V3's n_group and topk_group): the experts split into
  // num_expert_groups equal groups, and each token chooses among the experts of the
  // num_limited_groups groups whose two best keys (scores plus bias) sum highest. 0 limited
  // groups (or all of them): every expert is a candidate.
  int64_t num_expert_groups = 1;
  int64_t num_limited_groups = 0;
  bool route_norm = false;   // norm_topk_prob: the top-k weights rescaled to sum to 1
  double route_scale = 1.0;  // routed_scaling_factor: the top-k weights times this
  // Load balancing. aux_loss_coeff > 0: the auxiliary loss coeff * E * sum_e f_e * P_e (f_e the
  // share of routed slots expert e got, P_e its mean normalized score), added to the training
  // loss through the gradient (MoE.h). bias_update_rate > 0: DeepSeek-V3's auxiliary-loss-free
  // balancing, a per-expert bias added to the scores for choosing (never for weighting), moved
  // by rate * sign(mean load - load) after each optimizer step.
  double aux_loss_coeff = 0.0;
  double bias_update_rate = 0.0;
  // 0: dropless (every routed slot computed). > 0: each expert takes at most
  // ceil(capacity_factor * tokens * top_k / num_experts) slots, first come (token order) first
  // served; a slot beyond that is dropped: it adds nothing to its token's output, which keeps its
  // residual, its shared experts and its other experts.
  double capacity_factor = 0.0;

  // Throws loom::Error naming the field and its value: experts or top_k below 1, top_k above the
  // experts (or the limited groups' experts), hidden_dim below 1, an unknown score_func, a
  // negative coefficient or factor, groups that do not split the experts.
  void validate() const;
  // Whether routing is group-limited (some groups' experts out of every token's choice).
  bool limits_groups() const {
    return num_limited_groups > 0 && num_limited_groups < num_expert_groups;
  }
};

}  // namespace loom::nn
