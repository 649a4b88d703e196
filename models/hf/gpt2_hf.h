// GPT <-> Hugging Face GPT-2 safetensors checkpoints (GPT2LMHeadModel / GPT2Model).
//
// Names: Loom's "wte.weight", "h.3.attn.c_attn.weight", ... are written as HF's
// "transformer.wte.weight", "transformer.h.3.attn.c_attn.weight", ...; on load the
// "transformer." prefix is optional (GPT2Model files have none), and HF's non-parameter buffers
// "h.{i}.attn.bias" / "h.{i}.attn.masked_bias" are skipped.
//
// Layouts:
//   - HF's Conv1D stores Linear weights (in, out); Loom's Linear stores (out, in): c_attn,
//     c_proj and c_fc weights are transposed both ways. Embeddings, LayerNorms and biases are as
//     is.
//   - c_attn's 3C output features are [all q][all k][all v] in HF and head-major
//     ([head 0: q k v][head 1: q k v]...) in Loom (see gpt.h): c_attn's weight and bias are
//     permuted with the index maps below.
//   - lm_head: Loom ties it to wte. save writes "lm_head.weight" (a copy of wte, as HF's
//     tied checkpoints hold). load accepts a file with or without it; when present it must
//     equal wte exactly, since an untied head cannot be represented — otherwise an error.
//
// Dtypes: stored in each parameter's dtype on save; on load F32/BF16/F16 tensors are converted
// to the parameter's dtype.
//
// Load is all-or-nothing: the file is read, every name and shape is checked against the
// model (errors list missing tensors, unexpected tensors, and shape mismatches with both
// shapes), everything is converted into temporaries, and only then copied into the parameters.
// On any error the model is untouched.
//
// DTensor parameters (after parallelize_gpt) are supported:
//   - save gathers each parameter with full_tensor(): a collective, so every rank of the
//     parameters' meshes must call save_gpt2_hf, in the same order; only ranks with
//     `write` = true write the file (pass rank == 0).
//   - load needs no communication: every rank reads the file and copies the slice of each full
//     tensor its local shard holds (by the spec's local_offset/local_shape).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "models/gpt/gpt.h"

namespace loom::models {

void save_gpt2_hf(const GPT& model, const std::string& path, bool write = true);

// The model a Hugging Face checkpoint was saved from, from the config.json beside it (as
// save_pretrained writes it): n_layer, n_head, n_embd, n_positions (the context, Loom's
// block_size) and vocab_size (padded sizes such as 50304 included). nullopt when there is no
// config.json beside `checkpoint_path`. Throws naming the file and the key for JSON that does not
// parse or lacks a key, and for a value that is not a positive integer.
std::optional<GPTConfig> read_gpt2_hf_config(const std::string& checkpoint_path);
// Writes the config.json beside `checkpoint_path` that read_gpt2_hf_config (and transformers'
// GPT2Config.from_pretrained) reads: model_type gpt2, GPT2LMHeadModel, the sizes. Throws naming
// the path when it cannot be written.
void write_gpt2_hf_config(const GPTConfig& config, const std::string& checkpoint_path);
// `model` may be a pipeline stage (GPTStage): it loads the tensors it holds from a whole
// model's file (the last stage's head copy of wte included) and ignores the other stages'.
void load_gpt2_hf(GPTStage& model, const std::string& path);

// c_attn's output features in its two orders. Feature (which, head, d) with which in
// {q = 0, k = 1, v = 2}, C = n_head * head_dim:
//   qkv-major  (HF):   which * C + head * head_dim + d
//   head-major (Loom): head * 3 * head_dim + which * head_dim + d
// c_attn_head_major_source(...)[j] = the qkv-major index of head-major feature j (HF -> Loom);
// c_attn_qkv_major_source(...)[j]  = the head-major index of qkv-major feature j (Loom -> HF).
// The two are inverse permutations of [0, 3C).
std::vector<int64_t> c_attn_head_major_source(int64_t n_head, int64_t head_dim);
std::vector<int64_t> c_attn_qkv_major_source(int64_t n_head, int64_t head_dim);

// A copy of `tensor` whose row j along dim 0 is row source[j] of `tensor` (index_select on dim 0).
Tensor gather_rows(const Tensor& tensor, const std::vector<int64_t>& source);

}  // namespace loom::models
