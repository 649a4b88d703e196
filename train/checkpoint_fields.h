// The job's own fields in a distributed checkpoint's metadata (its `extra`): the model's sizes
// and the layout it was saved on, so a resume checks the model and says when the layout changed.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint/metadata.h"
#include "mesh/device_mesh.h"
#include "models/gpt/config.h"
#include "models/llama/config.h"

namespace loom::train {

// A model's sizes as the checkpoint records them: {n_layer, n_head, n_embd, block_size,
// vocab_size} for a GPT; {family: "llama", dim, n_layers, n_heads, n_kv_heads, ffn_hidden_dim,
// max_seq_len, vocab_size} for a Llama.
nlohmann::json model_fields(const models::GPTConfig& config);
nlohmann::json model_fields(const models::LlamaConfig& config);

// {"model": `model` (model_fields), "layout": "DeviceMesh(...)"}.
nlohmann::json job_checkpoint_fields(const nlohmann::json& model, const DeviceMesh& mesh);

// Throws loom::Error naming the checkpoint and every size that differs ("n_layer 4 there, 2
// here") when `metadata` was saved from another model config.
void check_same_model(const checkpoint::Metadata& metadata, const nlohmann::json& model,
                      const std::string& directory);

// The layout the checkpoint was saved on ("" when it does not say).
std::string saved_layout(const checkpoint::Metadata& metadata);

}  // namespace loom::train
