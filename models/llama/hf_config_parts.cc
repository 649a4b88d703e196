#include "models/llama/hf_config_parts.h"

#include <fmt/format.h>

#include "base/error.h"

namespace loom::models {

namespace {

// YaRN's settings as transformers reads them from a rope_scaling (or rope_parameters) object, and
// yarn_fields writes them; without a factor, the context's growth over the original one.
YarnScaling read_yarn(const hf::ConfigJson& rope, int64_t context) {
  YarnScaling yarn;
  yarn.original_max_position_embeddings = rope.positive_int("original_max_position_embeddings");
  yarn.factor = rope.has("factor") ? rope.number("factor")
                                   : static_cast<double>(context) /
                                         static_cast<double>(yarn.original_max_position_embeddings);
  yarn.beta_fast = rope.number_or("beta_fast", 32.0);
  yarn.beta_slow = rope.number_or("beta_slow", 1.0);
  yarn.mscale = rope.number_or("mscale", 0.0);
  yarn.mscale_all_dim = rope.number_or("mscale_all_dim", 0.0);
  if (rope.has("attention_factor")) yarn.attention_factor = rope.number("attention_factor");
  yarn.truncate = rope.bool_or("truncate", true);
  return yarn;
}

}  // namespace

void read_hf_rope(const hf::ConfigJson& json, LlamaConfig& config, bool partial_rotary) {
  std::optional<hf::ConfigJson> rope = json.object_or_none("rope_parameters");
  if (!rope) rope = json.object_or_none("rope_scaling");
  if (partial_rotary) {
    // transformers rotates only this fraction of each head's rotary dims (Llama, DeepSeek-V3).
    const hf::ConfigJson* rope_object = rope ? &*rope : nullptr;
    for (const hf::ConfigJson* where : {&json, rope_object}) {
      if (where == nullptr) continue;
      where->refuse_unless(where->number_or("partial_rotary_factor", 1.0) == 1.0,
                           "partial_rotary_factor",
                           "Loom's RoPE rotates every rotary dim of each head");
    }
  }
  config.rope_theta = rope && rope->has("rope_theta") ? rope->number("rope_theta")
                                                      : json.number_or("rope_theta", 10000.0);
  config.rope_scaling = std::nullopt;
  const std::string rope_type =
      rope ? rope->string_or("rope_type", rope->string_or("type", "default")) : "default";
  config.rope_yarn = std::nullopt;
  if (rope_type == "llama3") {
    config.rope_scaling = RopeScaling{rope->number("factor"), rope->number("low_freq_factor"),
                                      rope->number("high_freq_factor"),
                                      rope->positive_int("original_max_position_embeddings")};
  } else if (rope_type == "yarn") {
    config.rope_yarn = read_yarn(*rope, config.max_seq_len);
  } else if (rope_type != "default") {
    rope->refuse_unless(false, rope->has("rope_type") ? "rope_type" : "type",
                        fmt::format("Loom implements the default RoPE, Llama 3's (\"llama3\") and "
                                    "YaRN's (\"yarn\"), not \"{}\"",
                                    rope_type));
  }
}

void write_hf_rope(const LlamaConfig& config, nlohmann::json& json) {
  json["rope_theta"] = config.rope_theta;
  if (config.rope_yarn) {
    json["rope_scaling"] = yarn_fields(*config.rope_yarn);
    json["rope_scaling"]["rope_type"] = "yarn";
  }
  if (!config.rope_scaling) return;
  const RopeScaling& s = *config.rope_scaling;
  json["rope_scaling"] = {{"rope_type", "llama3"},
                          {"factor", s.factor},
                          {"low_freq_factor", s.low_freq_factor},
                          {"high_freq_factor", s.high_freq_factor},
                          {"original_max_position_embeddings", s.original_max_position_embeddings}};
}

nlohmann::json yarn_fields(const YarnScaling& yarn) {
  nlohmann::json out = {{"factor", yarn.factor},
                        {"original_max_position_embeddings", yarn.original_max_position_embeddings},
                        {"beta_fast", yarn.beta_fast},
                        {"beta_slow", yarn.beta_slow},
                        {"truncate", yarn.truncate}};
  if (yarn.mscale != 0) out["mscale"] = yarn.mscale;
  if (yarn.mscale_all_dim != 0) out["mscale_all_dim"] = yarn.mscale_all_dim;
  if (yarn.attention_factor) out["attention_factor"] = *yarn.attention_factor;
  return out;
}

YarnScaling yarn_from_fields(const nlohmann::json& fields, const std::string& where) {
  // yarn_fields always records the factor: no context to derive it from.
  return read_yarn(hf::ConfigJson(fields, where), /*context=*/0);
}

void refuse_quantized(const hf::ConfigJson& json) {
  json.refuse_unless(!json.has("quantization_config"), "quantization_config",
                     "quantized weights (DeepSeek-V3's fp8 blocks, GPTQ, AWQ, ...) are not read; "
                     "convert the checkpoint to bf16 or f32 first (DeepSeek's fp8_cast_bf16.py)");
}

void validate_hf_config(const hf::ConfigJson& json, const LlamaConfig& config) {
  try {
    config.validate();
  } catch (const Error& e) {
    json.fail(e.what());
  }
}

}  // namespace loom::models
