// The parts of a Llama-family config.json every format (LlamaForCausalLM, Mixtral, DeepSeek-V3)
// reads and writes alike: RoPE's settings, and the config's own checks named by the file.
#pragma once

#include <nlohmann/json.hpp>

#include "models/hf/config_json.h"
#include "models/llama/config.h"

namespace loom::models {

// rope_theta and Llama 3's frequency scaling: transformers 5 writes "rope_parameters" (rope_theta
// inside), 4 wrote "rope_theta" and "rope_scaling". Another rope_type is refused by its key.
void read_hf_rope(const hf::ConfigJson& json, LlamaConfig& config);
// rope_theta, and rope_scaling of type "llama3" when the config scales.
void write_hf_rope(const LlamaConfig& config, nlohmann::json& json);
// config.validate(), its error naming the file.
void validate_hf_config(const hf::ConfigJson& json, const LlamaConfig& config);

}  // namespace loom::models
