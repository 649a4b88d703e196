// Llama <-> Hugging Face LlamaForCausalLM checkpoints (safetensors + config.json): the Llama
// family's StateDictAdapter (models/hf/state_dict_adapter.h) and config.json. Loading into any
// layout (tp, FSDP, pipeline stages) and saving are models/hf/checkpoint.h's.
//
// Names: HF's model.embed_tokens, model.layers.{i}.self_attn.{q,k,v,o}_proj,
// model.layers.{i}.mlp.{gate,up,down}_proj, input_layernorm, post_attention_layernorm,
// model.norm and lm_head are Loom's tok_embeddings, layers.{i}.attention.{wq,wk,wv,wo},
// layers.{i}.feed_forward.{w1,w3,w2}, attention_norm, ffn_norm, norm and output.
// Rotary: HF rotates half-dims (rotate_half), Meta and Loom rotate pairs (2i, 2i+1), so HF's
// conversion script permutes q_proj and k_proj rows per head; the import undoes it: Loom row
// h * D + 2i + c is HF row h * D + c * D/2 + i.
//
// config.json (transformers 4 and 5): hidden_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads, vocab_size, intermediate_size, rms_norm_eps, rope_theta or
// rope_parameters, rope_scaling of type "llama3", max_position_embeddings. What LlamaConfig can
// describe that Loom's Llama does not compute is refused by its key: attention_bias, mlp_bias, a
// hidden_act other than silu, a head_dim other than hidden_size / num_attention_heads, attention
// dropout, tied embeddings, other RoPE types, another model_type.
//
// Mixtral (MixtralForCausalLM, model_type "mixtral"): a Llama whose every feed-forward is a
// mixture of experts (LlamaConfig::moe, moe_dense_layers 0). model.layers.{i}.block_sparse_moe.
// gate.weight is Loom's layers.{i}.moe.gate.weight, and experts.{e}.{w1,w2,w3}.weight are
// expert e's slices of layers.{i}.moe.experts.{w1,w2,w3} (one file tensor per expert:
// StateDictAdapter::stacked_names, so a rank reads only the experts it holds). config.json adds
// num_local_experts, num_experts_per_tok and intermediate_size (each expert's width); its
// sliding_window must be null (or cover max_position_embeddings). Its router's training options
// (router_aux_loss_coef, router_jitter_noise) are a job's to set, not read.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/hf/checkpoint.h"
#include "models/hf/config_json.h"
#include "models/hf/state_dict_adapter.h"
#include "models/llama/config.h"
#include "models/llama/deepseek_v3_hf.h"
#include "models/llama/llama.h"

namespace loom::models {

std::unique_ptr<hf::StateDictAdapter> llama_hf_adapter(const LlamaConfig& config);

// The Hugging Face config.json "model_type" of this family's checkpoints, read and written: a
// dense Llama's, and a mixture of experts' (Mixtral's).
inline constexpr const char* kLlamaModelType = "llama";
inline constexpr const char* kMixtralModelType = "mixtral";
// And DeepSeek-V3's (models/llama/deepseek_v3_hf.h): kDeepSeekV3ModelType, "deepseek_v3".

// Why `config` has no Hugging Face checkpoint format ("sigmoid router scores ..."), or empty
// when it has one: a dense Llama (LlamaForCausalLM), a mixture of experts in every layer with
// Mixtral's routing (MixtralForCausalLM: softmax scores, the top-k weights normalized and not
// scaled, no shared experts, no expert bias), or latent attention with sigmoid-routed and
// shared experts (DeepseekV3ForCausalLM).
std::string hf_format_gap(const LlamaConfig& config);

// The Llama a config.json describes (errors name the file and the key).
LlamaConfig llama_config_from_hf(const hf::ConfigJson& json);
LlamaConfig read_llama_hf_config(const std::string& config_json);

// The parameter names of a whole Llama of `config`'s blocks, in named_parameters order.
std::vector<std::string> llama_parameter_names(const LlamaConfig& config);

// Loads what `model` (a Llama, or a pipeline stage of one) holds from a LlamaForCausalLM
// checkpoint; DTensor parameters take their own shard. All or nothing.
hf::LoadStats load_llama_hf(LlamaStage& model, const std::string& path);

// Writes `model` as LlamaForCausalLM safetensors with config.json beside it. DTensor parameters
// are gathered (full_tensor: every rank of their meshes calls it); only ranks with `write` write.
void save_llama_hf(const Llama& model, const std::string& path, bool write = true);

}  // namespace loom::models
