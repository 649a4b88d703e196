#include "models/llama/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/error.h"

namespace loom::models {

std::vector<std::string> LlamaConfig::preset_names() {
  return {"llama-tiny",  "llama3-8b",      "llama3-70b",       "llama3.2-1b",
          "llama3.2-3b", "llama-moe-tiny", "deepseek-v3-shape"};
}

LlamaConfig LlamaConfig::preset(const std::string& name) {
  if (name == "llama3-8b") return LlamaConfig{};
  if (name == "llama3-70b") {
    return LlamaConfig{.dim = 8192,
                       .n_layers = 80,
                       .n_heads = 64,
                       .n_kv_heads = 8,
                       .vocab_size = 128256,
                       .multiple_of = 4096,
                       .ffn_dim_multiplier = 1.3};
  }
  if (name == "llama3.2-1b" || name == "llama3.2-3b") {
    // Llama 3.2's small models: tied embeddings, 128k context (RoPE scaled by 32 from 8192).
    const bool one = name == "llama3.2-1b";
    return LlamaConfig{.dim = one ? 2048 : 3072,
                       .n_layers = one ? 16 : 28,
                       .n_heads = one ? 32 : 24,
                       .n_kv_heads = 8,
                       .vocab_size = 128256,
                       .ffn_dim_multiplier = std::nullopt,
                       .ffn_dim = 8192,
                       .rope_scaling = RopeScaling{.factor = 32.0,
                                                   .low_freq_factor = 1.0,
                                                   .high_freq_factor = 4.0,
                                                   .original_max_position_embeddings = 8192},
                       .max_seq_len = 131072,
                       .tie_word_embeddings = true};
  }
  if (name == "llama-tiny") {
    // Odd on purpose: a vocabulary no tp divides, GQA (4 heads over 2 kv heads), a short RoPE
    // scaling window so the scaled frequencies are exercised.
    return LlamaConfig{.dim = 64,
                       .n_layers = 2,
                       .n_heads = 4,
                       .n_kv_heads = 2,
                       .vocab_size = 257,
                       .multiple_of = 16,
                       .ffn_dim_multiplier = std::nullopt,
                       .norm_eps = 1e-5,
                       .rope_theta = 10000.0,
                       .rope_scaling = RopeScaling{.factor = 4.0,
                                                   .low_freq_factor = 1.0,
                                                   .high_freq_factor = 4.0,
                                                   .original_max_position_embeddings = 32},
                       .max_seq_len = 128};
  }
  if (name == "llama-moe-tiny") {
    // llama-tiny with 8 experts, top-2, in every layer but the first (the CPU test size).
    LlamaConfig config = preset("llama-tiny");
    config.moe =
        nn::MoEOptions{.num_experts = 8, .top_k = 2, .hidden_dim = 48, .aux_loss_coeff = 0.01};
    config.moe_dense_layers = 1;
    return config;
  }
  if (name == "deepseek-v3-shape") {
    // DeepSeek-V3's sizes (for `loom plan`): 61 layers of width 7168 (the first 3 dense, 18432
    // wide), multi-head latent attention (128 heads; q rank 1536, kv rank 512, 128 + 64 query
    // and key dims, 128 value dims), 256 routed experts of 2048 with top-8 and one shared, sigmoid
    // scores normalized and scaled by 2.5 from the best 4 of 8 expert groups, the bias-based
    // balancing, a 129280 vocabulary; no multi-token-prediction module (DeepSeek's 671B leaves
    // its 14B out too) and plain RoPE.
    return LlamaConfig{.dim = 7168,
                       .n_layers = 61,
                       .n_heads = 128,
                       .n_kv_heads = 128,
                       .vocab_size = 129280,
                       .ffn_dim = 18432,
                       .rope_theta = 10000.0,
                       .rope_scaling = std::nullopt,
                       .max_seq_len = 4096,
                       .moe = nn::MoEOptions{.num_experts = 256,
                                             .top_k = 8,
                                             .hidden_dim = 2048,
                                             .num_shared_experts = 1,
                                             .score_func = "sigmoid",
                                             .num_expert_groups = 8,
                                             .num_limited_groups = 4,
                                             .route_norm = true,
                                             .route_scale = 2.5,
                                             .aux_loss_coeff = 1e-4,
                                             .bias_update_rate = 1e-3},
                       .moe_dense_layers = 3,
                       .mla = MLAOptions{.q_lora_rank = 1536,
                                         .kv_lora_rank = 512,
                                         .qk_nope_head_dim = 128,
                                         .qk_rope_head_dim = 64,
                                         .v_head_dim = 128}};
  }
  LOOM_FAIL("LlamaConfig: unknown preset '{}'; the presets are {}", name,
            fmt::join(preset_names(), ", "));
}

int64_t LlamaConfig::ffn_hidden_dim() const {
  if (ffn_dim > 0) return ffn_dim;
  int64_t hidden = 4 * dim;
  hidden = 2 * hidden / 3;
  if (ffn_dim_multiplier) hidden = static_cast<int64_t>(*ffn_dim_multiplier * hidden);
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

namespace {

// One layer's feed-forward parameters: dense SwiGLU, or the MoE's router, `experts` of its
// experts (all of them, or the top_k a token uses) and the shared experts.
int64_t feed_forward_parameters(const LlamaConfig& c, int64_t layer, bool active) {
  if (!c.is_moe_layer(layer)) return 3 * c.dim * c.ffn_hidden_dim();
  const nn::MoEOptions& m = *c.moe;
  const int64_t experts = active ? m.top_k : m.num_experts;
  return c.dim * m.num_experts /*router*/ + experts * 3 * c.dim * m.hidden_dim +
         m.num_shared_experts * 3 * c.dim * m.hidden_dim;
}

int64_t count_parameters(const LlamaConfig& c, bool active) {
  const int64_t attention = c.attention_parameters();
  const int64_t norms = 2 * c.dim;
  int64_t total = c.vocab_size * c.dim /*embeddings*/ + c.dim /*final norm*/ +
                  (c.tie_word_embeddings ? 0 : c.vocab_size * c.dim) /*output head*/;
  for (int64_t layer = 0; layer < c.n_layers; ++layer) {
    total += attention + norms + feed_forward_parameters(c, layer, active);
  }
  return total;
}

}  // namespace

int64_t LlamaConfig::attention_parameters() const {
  if (!mla) {
    const int64_t kv_dim = n_kv_heads * head_dim();
    return dim * dim /*q*/ + 2 * dim * kv_dim /*k, v*/ + dim * dim /*o*/;
  }
  const MLAOptions& m = *mla;
  const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
  const int64_t q = m.q_lora_rank > 0 ? dim * m.q_lora_rank + m.q_lora_rank /*norm*/ +
                                            m.q_lora_rank * n_heads * qk
                                      : dim * n_heads * qk;
  return q + dim * (m.kv_lora_rank + m.qk_rope_head_dim) /*wkv_a*/ + m.kv_lora_rank /*norm*/ +
         m.kv_lora_rank * n_heads * (m.qk_nope_head_dim + m.v_head_dim) /*wkv_b*/ +
         n_heads * m.v_head_dim * dim /*wo*/;
}

int64_t LlamaConfig::parameter_count() const { return count_parameters(*this, false); }

int64_t LlamaConfig::active_parameter_count() const { return count_parameters(*this, true); }

namespace {

double yarn_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

double YarnScaling::cos_sin_factor() const {
  if (attention_factor) return *attention_factor;
  if (mscale != 0 && mscale_all_dim != 0) {
    return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim);
  }
  return yarn_mscale(factor, 1.0);
}

double YarnScaling::softmax_factor() const {
  if (mscale_all_dim == 0) return 1.0;
  const double m = yarn_mscale(factor, mscale_all_dim);
  return m * m;
}

std::vector<double> YarnScaling::frequencies(int64_t rotary_dim, double theta) const {
  // transformers' _compute_yarn_parameters, in f64 (its ramp in f32 rounds the same here).
  const double dim = static_cast<double>(rotary_dim);
  const auto correction_dim = [&](double rotations) {
    return dim *
           std::log(static_cast<double>(original_max_position_embeddings) /
                    (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(theta));
  };
  double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // no singular ramp
  const int64_t half = rotary_dim / 2;
  std::vector<double> out(half);
  for (int64_t i = 0; i < half; ++i) {
    const double kept = 1.0 / std::pow(theta, static_cast<double>(2 * i) / dim);
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolation = 1 - ramp;  // the share of the kept frequency
    out[i] = kept / factor * (1 - extrapolation) + kept * extrapolation;
  }
  return out;
}

void LlamaConfig::validate() const {
  for (const auto& [value, field] :
       std::vector<std::pair<int64_t, const char*>>{{dim, "dim"},
                                                    {n_layers, "n_layers"},
                                                    {n_heads, "n_heads"},
                                                    {n_kv_heads, "n_kv_heads"},
                                                    {vocab_size, "vocab_size"},
                                                    {multiple_of, "multiple_of"},
                                                    {ffn_hidden_dim(), "ffn_dim"},
                                                    {max_seq_len, "max_seq_len"}}) {
    LOOM_CHECK(value >= 1, "LlamaConfig: {} must be at least 1, got {}", field, value);
  }
  LOOM_CHECK(dim % n_heads == 0, "LlamaConfig: dim {} does not split into n_heads {}", dim,
             n_heads);
  if (mla) {
    LOOM_CHECK(mla->q_lora_rank >= 0 && mla->kv_lora_rank >= 1 && mla->qk_nope_head_dim >= 1 &&
                   mla->qk_rope_head_dim >= 2 && mla->qk_rope_head_dim % 2 == 0 &&
                   mla->v_head_dim >= 1,
               "LlamaConfig: MLA sizes q_lora_rank {} (>= 0), kv_lora_rank {}, qk_nope_head_dim "
               "{}, v_head_dim {} (>= 1) and qk_rope_head_dim {} (even, >= 2) out of range",
               mla->q_lora_rank, mla->kv_lora_rank, mla->qk_nope_head_dim, mla->v_head_dim,
               mla->qk_rope_head_dim);
  }
  LOOM_CHECK(!(rope_scaling && rope_yarn),
             "LlamaConfig: RoPE takes one scaling, Llama 3's (rope_scaling) or YaRN's (rope_yarn), "
             "not both");
  if (rope_yarn) {
    LOOM_CHECK(rope_yarn->factor > 0 && rope_yarn->original_max_position_embeddings >= 1 &&
                   rope_yarn->beta_fast > 0 && rope_yarn->beta_slow > 0,
               "LlamaConfig: YaRN's factor ({}), original context ({}) and betas ({}, {}) must be "
               "positive",
               rope_yarn->factor, rope_yarn->original_max_position_embeddings, rope_yarn->beta_fast,
               rope_yarn->beta_slow);
  }
  LOOM_CHECK(n_heads % n_kv_heads == 0,
             "LlamaConfig: n_heads {} do not group over n_kv_heads {} (grouped-query attention "
             "needs n_heads to be a multiple of n_kv_heads)",
             n_heads, n_kv_heads);
  LOOM_CHECK(mla || head_dim() % 2 == 0,
             "LlamaConfig: head_dim {} (dim {} / n_heads {}) is odd; RoPE rotates pairs",
             head_dim(), dim, n_heads);
  if (moe) {
    moe->validate();
    LOOM_CHECK(
        moe_dense_layers >= 0 && moe_dense_layers <= n_layers,
        "LlamaConfig: moe_dense_layers (the preset's, or --moe-dense-layers) must be between 0 "
        "and n_layers {} (the preset's, or --n-layer), got {}",
        n_layers, moe_dense_layers);
  }
  LOOM_CHECK(norm_eps > 0 && rope_theta > 0,
             "LlamaConfig: norm_eps and rope_theta must be positive, got {} and {}", norm_eps,
             rope_theta);
  LOOM_CHECK(attention_dropout >= 0.0 && attention_dropout < 1.0,
             "LlamaConfig: attention_dropout must be in [0, 1), got {}", attention_dropout);
}

}  // namespace loom::models
