#include "models/llama/hf.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "autograd/grad_mode.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "models/hf/gpt2_hf.h"
#include "models/hf/safetensors.h"
#include "tensor/ops.h"

namespace loom::models {

namespace {

// Loom's parameter name -> HF's.
std::string hf_name(const std::string& name) {
  static const std::vector<std::pair<std::string, std::string>> kParts = {
      {"attention.wq", "self_attn.q_proj"},    {"attention.wk", "self_attn.k_proj"},
      {"attention.wv", "self_attn.v_proj"},    {"attention.wo", "self_attn.o_proj"},
      {"feed_forward.w1", "mlp.gate_proj"},    {"feed_forward.w3", "mlp.up_proj"},
      {"feed_forward.w2", "mlp.down_proj"},    {"attention_norm", "input_layernorm"},
      {"ffn_norm", "post_attention_layernorm"}};
  if (name == "tok_embeddings.weight") return "model.embed_tokens.weight";
  if (name == "norm.weight") return "model.norm.weight";
  if (name == "output.weight") return "lm_head.weight";
  std::string out = "model." + name;
  for (const auto& [loom, hf] : kParts) {
    const auto at = out.find(loom);
    if (at != std::string::npos) return out.replace(at, loom.size(), hf);
  }
  return out;
}

// Row sources that undo HF's rotary permutation of a q/k projection of `heads` heads of D dims:
// Loom row h*D + 2i + c <- HF row h*D + c*D/2 + i.
std::vector<int64_t> unpermute_rotary(int64_t heads, int64_t head_dim) {
  std::vector<int64_t> source;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < head_dim / 2; ++i) {
      for (int64_t c = 0; c < 2; ++c) source.push_back(h * head_dim + c * head_dim / 2 + i);
    }
  }
  return source;
}

// Row sources of HF's layout from Loom's (the inverse of unpermute_rotary): HF row
// h*D + c*D/2 + i <- Loom row h*D + 2i + c.
std::vector<int64_t> permute_rotary(int64_t heads, int64_t head_dim) {
  std::vector<int64_t> source;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t c = 0; c < 2; ++c) {
      for (int64_t i = 0; i < head_dim / 2; ++i) source.push_back(h * head_dim + 2 * i + c);
    }
  }
  return source;
}

nlohmann::json hf_config_json(const LlamaConfig& config) {
  nlohmann::json json{{"architectures", {"LlamaForCausalLM"}},
                      {"model_type", "llama"},
                      {"hidden_size", config.dim},
                      {"intermediate_size", config.ffn_hidden_dim()},
                      {"num_hidden_layers", config.n_layers},
                      {"num_attention_heads", config.n_heads},
                      {"num_key_value_heads", config.n_kv_heads},
                      {"head_dim", config.head_dim()},
                      {"vocab_size", config.vocab_size},
                      {"max_position_embeddings", config.max_seq_len},
                      {"rms_norm_eps", config.norm_eps},
                      {"rope_theta", config.rope_theta},
                      {"hidden_act", "silu"},
                      {"attention_bias", false},
                      {"mlp_bias", false},
                      {"tie_word_embeddings", false}};
  if (config.rope_scaling) {
    const RopeScaling& s = *config.rope_scaling;
    json["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", s.factor},
        {"low_freq_factor", s.low_freq_factor},
        {"high_freq_factor", s.high_freq_factor},
        {"original_max_position_embeddings", s.original_max_position_embeddings}};
  }
  return json;
}

}  // namespace

LlamaConfig read_llama_hf_config(const std::string& config_json) {
  std::ifstream in(config_json);
  LOOM_CHECK(in.good(), "read_llama_hf_config: cannot read '{}'", config_json);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    LOOM_FAIL("read_llama_hf_config: '{}' is not JSON: {}", config_json, e.what());
  }
  const auto need = [&](const char* key) -> const nlohmann::json& {
    LOOM_CHECK(json.contains(key), "read_llama_hf_config: '{}' has no \"{}\"", config_json, key);
    return json.at(key);
  };
  LlamaConfig config;
  config.dim = need("hidden_size").get<int64_t>();
  config.n_layers = need("num_hidden_layers").get<int64_t>();
  config.n_heads = need("num_attention_heads").get<int64_t>();
  config.n_kv_heads = json.value("num_key_value_heads", config.n_heads);
  config.vocab_size = need("vocab_size").get<int64_t>();
  config.norm_eps = json.value("rms_norm_eps", 1e-5);
  config.max_seq_len = need("max_position_embeddings").get<int64_t>();
  // RoPE: transformers 5 writes "rope_parameters" (rope_theta inside); 4 wrote "rope_theta" and
  // "rope_scaling".
  const nlohmann::json* rope = nullptr;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (json.contains(key) && json.at(key).is_object()) rope = &json.at(key);
  }
  config.rope_theta = rope && rope->contains("rope_theta") ? rope->at("rope_theta").get<double>()
                                                           : json.value("rope_theta", 10000.0);
  config.rope_scaling = std::nullopt;
  const std::string type =
      rope ? rope->value("rope_type", rope->value("type", std::string("default"))) : "default";
  if (type == "llama3") {
    config.rope_scaling =
        RopeScaling{rope->at("factor").get<double>(), rope->at("low_freq_factor").get<double>(),
                    rope->at("high_freq_factor").get<double>(),
                    rope->at("original_max_position_embeddings").get<int64_t>()};
  } else {
    LOOM_CHECK(type == "default",
               "read_llama_hf_config: '{}': RoPE type '{}' is not supported (Loom implements the "
               "default and Llama 3's, \"llama3\")",
               config_json, type);
  }
  // The SwiGLU width: Loom's rule with multiple_of = the width itself gives it exactly.
  const int64_t width = need("intermediate_size").get<int64_t>();
  config.ffn_dim_multiplier = std::nullopt;
  config.multiple_of = width;
  LOOM_CHECK(config.ffn_hidden_dim() == width,
             "read_llama_hf_config: '{}': intermediate_size {} is smaller than 2/3 of 4 x "
             "hidden_size; Loom's width rule cannot give it",
             config_json, width);
  LOOM_CHECK(!json.value("tie_word_embeddings", false),
             "read_llama_hf_config: '{}' ties the output head to the embeddings; Llama's head is "
             "untied here",
             config_json);
  config.validate();
  return config;
}

void load_llama_hf(LlamaStage& model, const std::string& path) {
  SafetensorsFile file = load_safetensors(path);
  const LlamaConfig& config = model.config();
  std::map<std::string, Tensor> converted;
  for (const auto& [name, p] : model.named_parameters()) {
    const std::string key = hf_name(name);
    const auto it = file.tensors.find(key);
    LOOM_CHECK(it != file.tensors.end(), "load_llama_hf: '{}' has no tensor '{}' (for {})", path,
               key, name);
    LOOM_CHECK(it->second.shape() == p.shape(),
               "load_llama_hf: '{}': tensor '{}' has shape {} but {} is {}", path, key,
               shape_str(it->second.shape()), name, shape_str(p.shape()));
    Tensor value = ops::to(it->second, p.dtype());
    if (name.find("attention.wq") != std::string::npos) {
      value = gather_rows(value, unpermute_rotary(config.n_heads, config.head_dim()));
    } else if (name.find("attention.wk") != std::string::npos) {
      value = gather_rows(value, unpermute_rotary(config.n_kv_heads, config.head_dim()));
    }
    converted.emplace(name, value);
  }
  NoGradGuard no_grad;
  for (const auto& [name, p] : model.named_parameters()) ops::copy_(p, converted.at(name));
}

void save_llama_hf(const Llama& model, const std::string& path, bool write) {
  NoGradGuard no_grad;
  const LlamaConfig& config = model.config();
  TensorMap tensors;
  // Every rank runs the same full_tensor collectives in named_parameters order.
  for (const auto& [name, p] : model.named_parameters()) {
    Tensor full = ops::contiguous(ops::to(is_dtensor(p) ? full_tensor(p) : p, Device::cpu()));
    if (!write) continue;
    if (name.find("attention.wq") != std::string::npos) {
      full = gather_rows(full, permute_rotary(config.n_heads, config.head_dim()));
    } else if (name.find("attention.wk") != std::string::npos) {
      full = gather_rows(full, permute_rotary(config.n_kv_heads, config.head_dim()));
    }
    tensors.emplace(hf_name(name), full);
  }
  if (!write) return;
  save_safetensors(path, tensors, {{"format", "pt"}});
  const std::string config_path =
      (std::filesystem::path(path).parent_path() / "config.json").string();
  std::ofstream out(config_path);
  out << hf_config_json(config).dump(2) << "\n";
  out.close();
  LOOM_CHECK(out.good(), "save_llama_hf: cannot write '{}'", config_path);
}

}  // namespace loom::models
