// The parts of a Llama-family config.json every format (LlamaForCausalLM, Mixtral, DeepSeek-V3)
// reads and writes alike: RoPE's settings, and the config's own checks named by the file.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "models/hf/config_json.h"
#include "models/llama/config.h"

namespace loom::models {

// rope_theta and Llama 3's or YaRN's frequency scaling: transformers 5 writes "rope_parameters"
// (rope_theta inside), 4 wrote "rope_theta" and "rope_scaling". Another rope_type is refused by its
// key.
// `partial_rotary`: the format's model rotates partial_rotary_factor of the dims (transformers'
// Llama and DeepSeek-V3; Mixtral ignores the key), so another factor than 1 is refused.
void read_hf_rope(const hf::ConfigJson& json, LlamaConfig& config, bool partial_rotary);
// rope_theta, and rope_scaling of type "llama3" or "yarn" when the config scales.
void write_hf_rope(const LlamaConfig& config, nlohmann::json& json);
// YaRN's settings as config.json and a checkpoint's model fields hold them (mscale,
// mscale_all_dim and attention_factor only when given), and back (`where` names the source).
nlohmann::json yarn_fields(const YarnScaling& yarn);
YarnScaling yarn_from_fields(const nlohmann::json& fields, const std::string& where);
// A quantized checkpoint (quantization_config) refused by its key: Loom reads float tensors.
void refuse_quantized(const hf::ConfigJson& json);
// config.validate(), its error naming the file.
void validate_hf_config(const hf::ConfigJson& json, const LlamaConfig& config);

}  // namespace loom::models
