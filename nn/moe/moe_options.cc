#include "nn/moe/moe_options.h"

#include "base/error.h"

namespace loom::nn {

void MoEOptions::validate() const {
  LOOM_CHECK(num_experts >= 1 && num_experts <= kMaxExperts,
             "MoE: num_experts must be between 1 and {} (--moe-experts), got {}", kMaxExperts,
             num_experts);
  LOOM_CHECK(
      top_k >= 1 && top_k <= num_experts,
      "MoE: top_k must be between 1 and num_experts = {} (--moe-experts), got {} (--moe-top-k; "
      "without it, the preset's or 2)",
      num_experts, top_k);
  LOOM_CHECK(hidden_dim >= 1,
             "MoE: each expert's hidden_dim must be >= 1 (--moe-hidden-dim), got {}", hidden_dim);
  LOOM_CHECK(num_shared_experts >= 0,
             "MoE: num_shared_experts must be >= 0 (--moe-shared-experts), got {}",
             num_shared_experts);
  LOOM_CHECK(score_func == "softmax" || score_func == "sigmoid",
             "MoE: score_func '{}' (--moe-score-func) is not one of softmax, sigmoid", score_func);
  LOOM_CHECK(route_scale > 0, "MoE: route_scale must be > 0, got {}", route_scale);
  LOOM_CHECK(aux_loss_coeff >= 0, "MoE: aux_loss_coeff must be >= 0 (--moe-aux-loss-coeff), got {}",
             aux_loss_coeff);
  LOOM_CHECK(bias_update_rate >= 0,
             "MoE: bias_update_rate must be >= 0 (--moe-bias-update-rate), got {}",
             bias_update_rate);
  LOOM_CHECK(num_expert_groups >= 1 && num_experts % num_expert_groups == 0,
             "MoE: num_expert_groups {} must be >= 1 and divide num_experts = {} (n_group)",
             num_expert_groups, num_experts);
  LOOM_CHECK(num_limited_groups >= 0 && num_limited_groups <= num_expert_groups,
             "MoE: num_limited_groups {} must be between 0 (every group) and num_expert_groups = "
             "{} (topk_group)",
             num_limited_groups, num_expert_groups);
  LOOM_CHECK(!limits_groups() || top_k <= num_limited_groups * (num_experts / num_expert_groups),
             "MoE: top_k {} is more than the {} experts of num_limited_groups = {} groups of {}",
             top_k, num_limited_groups * (num_experts / num_expert_groups), num_limited_groups,
             num_experts / num_expert_groups);
  LOOM_CHECK(capacity_factor >= 0,
             "MoE: capacity_factor must be >= 0 (--moe-capacity-factor; 0: dropless), got {}",
             capacity_factor);
}

}  // namespace loom::nn
