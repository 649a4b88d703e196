// DeepSeek-V3 checkpoints (transformers' DeepseekV3ForCausalLM, model_type "deepseek_v3"): a
// Llama with multi-head latent attention (LlamaConfig::mla) and, from layer
// first_k_dense_replace on, a mixture of experts with sigmoid scores, shared experts and the
// routing bias (e_score_correction_bias: the MoE's expert_bias buffer, loaded and saved).
//
// Names (HF <- Loom), under model.layers.{i}.: self_attn.q_proj <- attention.wq, or
// q_a_proj, q_a_layernorm, q_b_proj <- wq_a, q_norm, wq_b; kv_a_proj_with_mqa, kv_a_layernorm,
// kv_b_proj, o_proj <- wkv_a, kv_norm, wkv_b, wo; mlp.{gate,up,down}_proj <- feed_forward.{w1,
// w3,w2} (dense layers); mlp.gate.weight <- moe.gate.weight, mlp.gate.e_score_correction_bias <-
// moe.expert_bias, mlp.experts.{e}.{gate,up,down}_proj <- expert e of moe.experts.{w1,w3,w2},
// mlp.shared_experts.{gate,up,down}_proj <- moe.shared_experts.{w1,w3,w2}. RoPE: with
// rope_interleave (DeepSeek's, the default) the file's rotary rows are Loom's pairs as they are.
//
// config.json: n_group and topk_group are group-limited routing (MoEOptions::num_expert_groups,
// num_limited_groups). What Loom does not compute is refused by its key: a rope_type other than
// default, llama3 and yarn, a partial_rotary_factor other than 1, rope_interleave false,
// num_key_value_heads other than the heads, attention_bias, scores other than sigmoid, a
// moe_layer_freq other than 1, a quantization_config. Its multi-token-prediction layers
// (num_nextn_predict_layers, as model.layers.{num_hidden_layers}.*) are skipped, as transformers
// skips them.
#pragma once

#include <memory>
#include <string>

#include "models/hf/config_json.h"
#include "models/hf/state_dict_adapter.h"
#include "models/llama/config.h"

namespace loom::models {

inline constexpr const char* kDeepSeekV3ModelType = "deepseek_v3";

std::unique_ptr<hf::StateDictAdapter> deepseek_v3_hf_adapter(const LlamaConfig& config);

// The Llama a deepseek_v3 config.json describes (errors name the file and the key).
LlamaConfig deepseek_v3_config_from_hf(const hf::ConfigJson& json);

// Why a config with latent attention has no DeepSeek-V3 format, or empty when it has one.
std::string deepseek_v3_format_gap(const LlamaConfig& config);

}  // namespace loom::models
