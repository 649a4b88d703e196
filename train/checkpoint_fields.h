// The job's own fields in a distributed checkpoint's metadata (its `extra`): the model's sizes
// and the layout it was saved on, so a resume checks the model and says when the layout changed.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint/metadata.h"
#include "mesh/device_mesh.h"
#include "models/gpt/config.h"

namespace loom::train {

// {"model": {n_layer, n_head, n_embd, block_size, vocab_size}, "layout": "DeviceMesh(...)"}.
nlohmann::json job_checkpoint_fields(const models::GPTConfig& config, const DeviceMesh& mesh);

// Throws loom::Error naming the checkpoint and every size that differs ("n_layer 4 there, 2
// here") when `metadata` was saved from another model config.
void check_same_model(const checkpoint::Metadata& metadata, const models::GPTConfig& config,
                      const std::string& directory);

// The layout the checkpoint was saved on ("" when it does not say).
std::string saved_layout(const checkpoint::Metadata& metadata);

}  // namespace loom::train
