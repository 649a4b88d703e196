// GPT <-> Hugging Face GPT-2 checkpoints (GPT2LMHeadModel / GPT2Model): the GPT family's
// StateDictAdapter (models/hf/state_dict_adapter.h) and config.json. Loading into any layout and
// saving are models/hf/checkpoint.h's.
//
// Names: Loom's "wte.weight", "h.3.attn.c_attn.weight", ... are HF's "transformer.wte.weight",
// "transformer.h.3.attn.c_attn.weight", ...; on load the "transformer." prefix is optional
// (GPT2Model files have none), and HF's non-parameter buffers "h.{i}.attn.bias" /
// "h.{i}.attn.masked_bias" are skipped.
//
// Layouts:
//   - HF's Conv1D stores Linear weights (in, out); Loom's Linear stores (out, in): c_attn,
//     c_proj and c_fc weights are transposed both ways. Embeddings, LayerNorms and biases are as
//     is.
//   - c_attn's 3C output features are [all q][all k][all v] in HF and head-major
//     ([head 0: q k v][head 1: q k v]...) in Loom (see gpt.h): c_attn's weight and bias are
//     permuted with the index maps below.
//   - lm_head: Loom ties it to wte. Save writes "lm_head.weight" (a copy of wte, as HF's
//     tied checkpoints hold). Load accepts a file with or without it; when present it must
//     equal wte exactly, since an untied head cannot be represented — otherwise an error.
//
// config.json: n_layer, n_head, n_embd, n_positions (Loom's block_size) and vocab_size (padded
// sizes such as 50304 included); what GPT-2's config can describe that Loom's GPT does not
// compute (another activation, an n_inner other than 4 x n_embd, another layer-norm epsilon,
// attention scaled otherwise, cross-attention, an untied head) is refused by its key.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/gpt/gpt.h"
#include "models/hf/checkpoint.h"
#include "models/hf/config_json.h"
#include "models/hf/state_dict_adapter.h"

namespace loom::models {

std::unique_ptr<hf::StateDictAdapter> gpt2_hf_adapter(const GPTConfig& config);

// The Hugging Face config.json "model_type" of this family's checkpoints, read and written.
inline constexpr const char* kGpt2ModelType = "gpt2";

// The GPT a GPT-2 config.json describes (errors name the file and the key).
GPTConfig gpt2_config_from_hf(const hf::ConfigJson& json);
// The config.json beside `checkpoint_path` (or in it, a folder), nullopt when there is none.
std::optional<GPTConfig> read_gpt2_hf_config(const std::string& checkpoint_path);
// Writes the config.json beside `checkpoint_path` that read_gpt2_hf_config (and transformers'
// GPT2Config.from_pretrained) reads. Throws naming the path when it cannot be written.
void write_gpt2_hf_config(const GPTConfig& config, const std::string& checkpoint_path);

// Loads what `model` (a GPT or a pipeline stage of one) holds from a GPT-2 checkpoint (the
// tensors of other stages are skipped); DTensor parameters take their own shard. All or nothing.
hf::LoadStats load_gpt2_hf(GPTStage& model, const std::string& path);
// Writes `model` as GPT-2 safetensors with its config.json beside it. DTensor parameters are
// gathered (full_tensor: every rank of their meshes calls it); only ranks with `write` write.
void save_gpt2_hf(const GPT& model, const std::string& path, bool write = true);

// The parameter names of a whole GPT of `n_layer` blocks, in named_parameters order.
std::vector<std::string> gpt_parameter_names(int64_t n_layer);

// c_attn's output features in its two orders. Feature (which, head, d) with which in
// {q = 0, k = 1, v = 2}, C = n_head * head_dim:
//   qkv-major  (HF):   which * C + head * head_dim + d
//   head-major (Loom): head * 3 * head_dim + which * head_dim + d
// c_attn_head_major_source(...)[j] = the qkv-major index of head-major feature j (HF -> Loom);
// c_attn_qkv_major_source(...)[j]  = the head-major index of qkv-major feature j (Loom -> HF).
// The two are inverse permutations of [0, 3C).
std::vector<int64_t> c_attn_head_major_source(int64_t n_head, int64_t head_dim);
std::vector<int64_t> c_attn_qkv_major_source(int64_t n_head, int64_t head_dim);

}  // namespace loom::models
