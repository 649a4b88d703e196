// Llama <-> Hugging Face LlamaForCausalLM checkpoints (safetensors + config.json).
//
// Names: HF's model.embed_tokens, model.layers.{i}.self_attn.{q,k,v,o}_proj,
// model.layers.{i}.mlp.{gate,up,down}_proj, input_layernorm, post_attention_layernorm,
// model.norm and lm_head are Loom's tok_embeddings, layers.{i}.attention.{wq,wk,wv,wo},
// layers.{i}.feed_forward.{w1,w3,w2}, attention_norm, ffn_norm, norm and output.
// Rotary: HF rotates half-dims (rotate_half), Meta and Loom rotate pairs (2i, 2i+1), so HF's
// conversion script permutes q_proj and k_proj rows per head; the import undoes it: Loom row
// h * D + 2i + c is HF row h * D + c * D/2 + i.
#pragma once

#include <string>

#include "models/llama/config.h"
#include "models/llama/llama.h"

namespace loom::models {

// The config in `config_json` (HF's LlamaConfig: hidden_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, vocab_size, intermediate_size, rms_norm_eps,
// rope_theta, rope_scaling of type "llama3", max_position_embeddings). Throws naming the file and
// the key for a missing key, and an intermediate_size Loom's width rule cannot give.
LlamaConfig read_llama_hf_config(const std::string& config_json);

// Loads every parameter of `model` (a Llama, or a pipeline stage of one: the parameters it holds)
// from a LlamaForCausalLM safetensors file (the file's names and shapes checked, errors naming
// the tensor). All or nothing.
void load_llama_hf(LlamaStage& model, const std::string& path);

// Writes `model` as a LlamaForCausalLM safetensors file (q_proj/k_proj permuted back to HF's
// rotary layout) with the config.json transformers reads beside it. DTensor parameters are
// gathered (full_tensor: every rank of their meshes calls it); only ranks with `write` write.
void save_llama_hf(const Llama& model, const std::string& path, bool write = true);

}  // namespace loom::models
