// Llama-family model configuration (Meta's ModelArgs / torchtitan's TransformerModelArgs, with
// Hugging Face LlamaConfig's names in comments), its presets and its sizes.
//
//   auto config = models::LlamaConfig::preset("llama3-8b");
//   config.parameter_count();   // 8'030'261'248
//
// The presets are the published Llama 3 configs; "llama-tiny" is the CPU test and default-job
// size (odd sizes on purpose: a vocabulary that does not divide tp, 2 kv heads under 4 heads).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nn/moe/moe_options.h"

namespace loom::models {

// Llama 3's RoPE frequency scaling (HF rope_scaling {"rope_type": "llama3", ...}).
struct RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// YaRN's RoPE scaling (HF rope_type "yarn"; DeepSeek-V3's): each frequency blended between kept
// (high frequencies) and divided by `factor` (low ones) by a linear ramp over the dims whose
// wavelengths fit beta_fast to beta_slow rotations in the original context; cos and sin times
// attention_factor; and latent attention's softmax scale times mscale(factor,
// mscale_all_dim)^2 (transformers' yarn_apply_mscale). mscale(s, m) = 0.1 m ln s + 1 (1 for
// s <= 1).
struct YarnScaling {
  double factor = 1.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;                     // 0: not given
  double mscale_all_dim = 0.0;             // 0: not given
  std::optional<double> attention_factor;  // not given: from factor, mscale and mscale_all_dim
  bool truncate = true;                    // the ramp's ends rounded outward to whole dims

  // The factor cos and sin are multiplied by: attention_factor, else mscale(factor, mscale) /
  // mscale(factor, mscale_all_dim) when both are given, else mscale(factor, 1).
  double cos_sin_factor() const;
  // The factor latent attention's softmax scale is multiplied by: mscale(factor,
  // mscale_all_dim)^2 when mscale_all_dim is given, else 1.
  double softmax_factor() const;
  // The inverse frequencies of `rotary_dim` dims (half of them) at base `theta`.
  std::vector<double> frequencies(int64_t rotary_dim, double theta) const;
};

// DeepSeek's multi-head latent attention (DeepSeek-V2/V3's q_lora_rank, kv_lora_rank, ...): keys
// and values from one low-rank latent per token, queries optionally through another, each head's
// query and key the concatenation of a part without position (nope) and a rotary part shared by
// every head's key (rope).
struct MLAOptions {
  int64_t q_lora_rank = 0;  // 0: queries straight from the input (wq), no low-rank step
  int64_t kv_lora_rank = 512;
  int64_t qk_nope_head_dim = 128;
  int64_t qk_rope_head_dim = 64;
  int64_t v_head_dim = 128;
};

struct LlamaConfig {
  int64_t dim = 4096;      // hidden_size
  int64_t n_layers = 32;   // num_hidden_layers
  int64_t n_heads = 32;    // num_attention_heads
  int64_t n_kv_heads = 8;  // num_key_value_heads (grouped-query attention; = n_heads: MHA)
  int64_t vocab_size = 128256;
  int64_t multiple_of = 1024;                      // the FFN width rounds up to a multiple of this
  std::optional<double> ffn_dim_multiplier = 1.3;  // applied to 2/3 of 4 * dim
  int64_t ffn_dim = 0;     // intermediate_size given as is (Hugging Face, --ffn-dim); 0: the rule
  double norm_eps = 1e-5;  // rms_norm_eps
  double rope_theta = 500000.0;
  std::optional<RopeScaling> rope_scaling = RopeScaling{};  // none: plain RoPE
  int64_t max_seq_len = 8192;                               // max_position_embeddings
  // A mixture of experts in place of the SwiGLU feed-forward (nn/moe), from layer
  // moe_dense_layers on (DeepSeek-V3's first_k_dense_replace: the first layers stay dense).
  std::optional<nn::MoEOptions> moe;
  int64_t moe_dense_layers = 0;
  // Multi-head latent attention in place of grouped-query attention (n_kv_heads then unused).
  std::optional<MLAOptions> mla;
  // Dropout on the attention probabilities in training (HF: attention_dropout; a training
  // option: --attn-dropout, not read from a checkpoint), drawn inside the attention kernels.
  double attention_dropout = 0.0;
  // The output head reads the token embeddings (HF: tie_word_embeddings; Llama 3.2 1B and 3B):
  // no output.weight, logits = h @ tok_embeddings.weight^T (models/tied_head.h).
  bool tie_word_embeddings = false;
  // YaRN's RoPE scaling in place of rope_scaling's (at most one of them).
  std::optional<YarnScaling> rope_yarn;

  // The named configs: "llama-tiny", "llama3-8b", "llama3-70b", "llama3.2-1b", ... Throws
  // listing them otherwise.
  static LlamaConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();

  int64_t head_dim() const { return dim / n_heads; }
  // The dims RoPE rotates per head: head_dim, or MLA's qk_rope_head_dim.
  int64_t rotary_dim() const { return mla ? mla->qk_rope_head_dim : head_dim(); }
  // One layer's attention parameters (q, k, v, o; or MLA's projections and norms).
  int64_t attention_parameters() const;
  // The SwiGLU width (intermediate_size): ffn_dim when given, else 4 * dim, times 2/3, times
  // ffn_dim_multiplier, rounded up to a multiple of multiple_of (Meta's and torchtitan's rule).
  int64_t ffn_hidden_dim() const;
  // Every parameter: embeddings, per layer q/k/v/o, w1/w2/w3 (or the MoE's router, experts and
  // shared experts) and two RMSNorm weights, the final norm and the untied output head.
  int64_t parameter_count() const;
  // The parameters one token passes through: every MoE layer counts its router, top_k experts
  // and shared experts (the rest as parameter_count). Equal to it without MoE.
  int64_t active_parameter_count() const;
  bool is_moe_layer(int64_t layer) const { return moe.has_value() && layer >= moe_dense_layers; }

  // Throws loom::Error naming the field: sizes below 1, a dim that does not split into heads,
  // heads that do not group over the kv heads, an odd head_dim (RoPE rotates pairs), MoE options
  // out of range (nn::MoEOptions::validate) or moe_dense_layers outside [0, n_layers].
  void validate() const;
};

}  // namespace loom::models
