#include "models/llama/hf_config_parts.h"

#include <fmt/format.h>

#include "base/error.h"

namespace loom::models {

void read_hf_rope(const hf::ConfigJson& json, LlamaConfig& config) {
  std::optional<hf::ConfigJson> rope = json.object_or_none("rope_parameters");
  if (!rope) rope = json.object_or_none("rope_scaling");
  config.rope_theta = rope && rope->has("rope_theta") ? rope->number("rope_theta")
                                                      : json.number_or("rope_theta", 10000.0);
  config.rope_scaling = std::nullopt;
  const std::string rope_type =
      rope ? rope->string_or("rope_type", rope->string_or("type", "default")) : "default";
  if (rope_type == "llama3") {
    config.rope_scaling = RopeScaling{rope->number("factor"), rope->number("low_freq_factor"),
                                      rope->number("high_freq_factor"),
                                      rope->positive_int("original_max_position_embeddings")};
  } else if (rope_type != "default") {
    rope->refuse_unless(
        false, rope->has("rope_type") ? "rope_type" : "type",
        fmt::format("Loom implements the default RoPE and Llama 3's (\"llama3\"), not \"{}\"",
                    rope_type));
  }
}

void write_hf_rope(const LlamaConfig& config, nlohmann::json& json) {
  json["rope_theta"] = config.rope_theta;
  if (!config.rope_scaling) return;
  const RopeScaling& s = *config.rope_scaling;
  json["rope_scaling"] = {{"rope_type", "llama3"},
                          {"factor", s.factor},
                          {"low_freq_factor", s.low_freq_factor},
                          {"high_freq_factor", s.high_freq_factor},
                          {"original_max_position_embeddings", s.original_max_position_embeddings}};
}

void validate_hf_config(const hf::ConfigJson& json, const LlamaConfig& config) {
  try {
    config.validate();
  } catch (const Error& e) {
    json.fail(e.what());
  }
}

}  // namespace loom::models
