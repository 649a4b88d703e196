#include "models/llama/hf.h"

#include <fmt/format.h>

#include "base/error.h"
#include "models/hf/checkpoint.h"
#include "models/llama/deepseek_v3_hf.h"
#include "models/llama/hf_config_parts.h"
#include "models/llama/pipeline.h"
#include "tensor/ops.h"

namespace loom::models {

namespace {

constexpr std::string_view kLmHead = "lm_head.weight";
constexpr std::string_view kEmbeddings = "model.embed_tokens.weight";

// Loom's parameter name -> HF's.
std::string hf_name(const std::string& name) {
  static const std::vector<std::pair<std::string, std::string>> kParts = {
      {"attention.wq", "self_attn.q_proj"},     {"attention.wk", "self_attn.k_proj"},
      {"attention.wv", "self_attn.v_proj"},     {"attention.wo", "self_attn.o_proj"},
      {"feed_forward.w1", "mlp.gate_proj"},     {"feed_forward.w3", "mlp.up_proj"},
      {"feed_forward.w2", "mlp.down_proj"},     {"attention_norm", "input_layernorm"},
      {"ffn_norm", "post_attention_layernorm"}, {"moe.gate", "block_sparse_moe.gate"}};
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

// Mixtral's name of expert e's weight of a MoE layer's (experts, ., .) tensor, or empty when
// `name` is no such tensor: layers.{i}.moe.experts.w1 -> model.layers.{i}.block_sparse_moe.
// experts.{e}.w1.weight (w1 gate, w3 up, w2 down: Loom's and Mixtral's names agree).
std::string mixtral_expert_name(const std::string& name, int64_t e) {
  constexpr std::string_view kExperts = ".moe.experts.";
  const auto at = name.find(kExperts);
  if (at == std::string::npos) return "";
  const std::string weight = name.substr(at + kExperts.size());
  return fmt::format("model.{}.block_sparse_moe.experts.{}.{}.weight", name.substr(0, at), e,
                     weight);
}

class LlamaAdapter : public hf::StateDictAdapter {
 public:
  explicit LlamaAdapter(const LlamaConfig& config) : config_(config) {}

  std::vector<std::string> hf_names(const std::string& name) const override {
    return {hf_name(name)};
  }
  std::vector<std::string> stacked_names(const std::string& name) const override {
    if (!config_.moe || mixtral_expert_name(name, 0).empty()) return {};
    std::vector<std::string> out;
    for (int64_t e = 0; e < config_.moe->num_experts; ++e) {
      out.push_back(mixtral_expert_name(name, e));
    }
    return out;
  }
  std::optional<FileLayout> file_layout(const std::string& name) const override {
    if (const int64_t heads = rotary_heads(name)) {
      return FileLayout{.row_source = unpermute_rotary(heads, config_.head_dim())};
    }
    return FileLayout{};
  }
  // Older transformers saved each layer's RoPE frequencies (a buffer Loom computes). A tied
  // model's file may hold lm_head.weight (transformers leaves it out): check_file compares it with
  // the embeddings.
  bool is_buffer(const std::string& name) const override {
    return name.ends_with("rotary_emb.inv_freq") ||
           (config_.tie_word_embeddings && name == kLmHead);
  }
  std::vector<std::string> checked_tensors() const override {
    if (!config_.tie_word_embeddings) return {};
    return {std::string(kLmHead), std::string(kEmbeddings)};
  }
  void check_file(const TensorMap& file, std::vector<std::string>& problems) const override {
    if (!config_.tie_word_embeddings) return;
    hf::check_tied_head(file, std::string(kLmHead), {std::string(kEmbeddings)},
                        "config.json says tie_word_embeddings (the head reads the embeddings); set "
                        "it to false for an untied head",
                        problems);
  }
  nlohmann::json config_json() const override {
    const LlamaConfig& c = config_;
    nlohmann::json json{{"architectures", {"LlamaForCausalLM"}},
                        {"model_type", kLlamaModelType},
                        {"hidden_size", c.dim},
                        {"intermediate_size", c.moe ? c.moe->hidden_dim : c.ffn_hidden_dim()},
                        {"num_hidden_layers", c.n_layers},
                        {"num_attention_heads", c.n_heads},
                        {"num_key_value_heads", c.n_kv_heads},
                        {"head_dim", c.head_dim()},
                        {"vocab_size", c.vocab_size},
                        {"max_position_embeddings", c.max_seq_len},
                        {"rms_norm_eps", c.norm_eps},
                        {"hidden_act", "silu"},
                        {"attention_bias", false},
                        {"mlp_bias", false},
                        {"tie_word_embeddings", c.tie_word_embeddings},
                        // As trained (not read back: a Loom job's --attn-dropout decides).
                        {"attention_dropout", c.attention_dropout}};
    if (c.moe) {
      // MixtralConfig's keys. Its balancing loss is one term over every layer's routing pooled,
      // coef * E * sum_e (top_k F_e) P_e with F_e counted per slot (transformers'
      // load_balancing_loss_func); Loom's is a term per layer, coeff * E * sum_e f_e P_e each:
      // the same loss, when the layers route alike, at coef = coeff * layers / top_k.
      const nn::MoEOptions& m = *c.moe;
      json["architectures"] = {"MixtralForCausalLM"};
      json["model_type"] = kMixtralModelType;
      json["num_local_experts"] = m.num_experts;
      json["num_experts_per_tok"] = m.top_k;
      json["router_aux_loss_coef"] =
          m.aux_loss_coeff * static_cast<double>(c.n_layers) / static_cast<double>(m.top_k);
      json["output_router_logits"] = m.aux_loss_coeff > 0;
      json["router_jitter_noise"] = 0.0;
      json["sliding_window"] = nullptr;
      json.erase("attention_bias");
      json.erase("mlp_bias");
    }
    write_hf_rope(c, json);
    return json;
  }

 private:
  // The heads of a q or k projection (whose rows HF permutes), 0 for any other parameter.
  int64_t rotary_heads(const std::string& name) const {
    if (name.find("attention.wq") != std::string::npos) return config_.n_heads;
    if (name.find("attention.wk") != std::string::npos) return config_.n_kv_heads;
    return 0;
  }

  LlamaConfig config_;
};

}  // namespace

std::unique_ptr<hf::StateDictAdapter> llama_hf_adapter(const LlamaConfig& config) {
  if (config.mla) return deepseek_v3_hf_adapter(config);
  return std::make_unique<LlamaAdapter>(config);
}

std::string hf_format_gap(const LlamaConfig& config) {
  if (config.mla) return deepseek_v3_format_gap(config);
  if (!config.moe) return "";
  const nn::MoEOptions& m = *config.moe;
  // Mixtral's router: softmax over every expert, the top-k weights normalized, in every layer,
  // no shared experts, no bias.
  if (config.moe_dense_layers > 0) {
    return fmt::format(
        "dense feed-forwards in the first {} layers (--moe-dense-layers; Mixtral's "
        "every layer is a mixture of experts)",
        config.moe_dense_layers);
  }
  if (m.score_func != "softmax") {
    return fmt::format("{} router scores (--moe-score-func; Mixtral's are softmax)", m.score_func);
  }
  if (!m.route_norm) {
    return "top-k weights not normalized to sum 1 (--moe-route-norm 1 normalizes them, as "
           "Mixtral does)";
  }
  if (m.route_scale != 1.0) return fmt::format("top-k weights scaled by {}", m.route_scale);
  if (m.num_shared_experts > 0) {
    return fmt::format("{} shared experts (--moe-shared-experts; Mixtral has none)",
                       m.num_shared_experts);
  }
  if (m.bias_update_rate > 0) {
    return "an expert bias that steers routing (--moe-bias-update-rate; Mixtral's router has "
           "none)";
  }
  return "";
}

LlamaConfig llama_config_from_hf(const hf::ConfigJson& json) {
  const std::string type = json.string_or("model_type", kLlamaModelType);
  json.refuse_unless(
      type == kLlamaModelType || type == kMixtralModelType || type == kDeepSeekV3ModelType,
      "model_type",
      "not a Llama checkpoint (the Llama family reads model_type \"llama\", "
      "\"mixtral\" and \"deepseek_v3\")");
  if (type == kDeepSeekV3ModelType) return deepseek_v3_config_from_hf(json);
  LlamaConfig config;
  config.dim = json.positive_int("hidden_size");
  config.n_layers = json.positive_int("num_hidden_layers");
  config.n_heads = json.positive_int("num_attention_heads");
  config.n_kv_heads = json.positive_int_or("num_key_value_heads", config.n_heads);
  config.vocab_size = json.positive_int("vocab_size");
  // transformers' LlamaConfig default, which a config.json without the key was made with.
  config.norm_eps = json.number_or("rms_norm_eps", 1e-6);
  config.max_seq_len = json.positive_int("max_position_embeddings");
  config.ffn_dim = json.positive_int("intermediate_size");
  config.ffn_dim_multiplier = std::nullopt;
  read_hf_rope(json, config, /*partial_rotary=*/type != kMixtralModelType);
  if (type == kMixtralModelType) {
    // Every layer a mixture of experts of intermediate_size each; softmax routing, the top-k
    // weights normalized (MixtralSparseMoeBlock). router_aux_loss_coef, output_router_logits
    // and router_jitter_noise are training options, not read: a Loom job's --moe-* flags decide.
    config.moe = nn::MoEOptions{.num_experts = json.positive_int("num_local_experts"),
                                .top_k = json.positive_int("num_experts_per_tok"),
                                .hidden_dim = config.ffn_dim,
                                .score_func = "softmax",
                                .route_norm = true};
    config.moe_dense_layers = 0;
    const int64_t window = json.positive_int_or("sliding_window", 0);
    json.refuse_unless(window == 0 || window >= config.max_seq_len, "sliding_window",
                       fmt::format("Loom's attention sees every earlier position; a window "
                                   "shorter than max_position_embeddings = {} is not computed",
                                   config.max_seq_len));
  }
  // What LlamaConfig can say that Loom's Llama does not compute.
  json.refuse_unless(!json.bool_or("attention_bias", false), "attention_bias",
                     "Loom's Llama attention projections have no biases");
  json.refuse_unless(!json.bool_or("mlp_bias", false), "mlp_bias",
                     "Loom's Llama feed-forward projections have no biases");
  json.refuse_unless(json.string_or("hidden_act", "silu") == "silu", "hidden_act",
                     "Loom's Llama feed-forward is SwiGLU (silu)");
  // attention_dropout is not read: dropout is a training option (--attn-dropout), as GPT-2's
  // pdrops are; the model's function does not depend on it.
  // transformers' LlamaConfig default: untied (Llama 3); Llama 3.2's small models tie.
  config.tie_word_embeddings = json.bool_or("tie_word_embeddings", false);
  json.refuse_unless(
      config.dim % config.n_heads != 0 ||
          json.positive_int_or("head_dim", config.dim / config.n_heads) ==
              config.dim / config.n_heads,
      "head_dim",
      fmt::format("Loom's Llama heads are hidden_size / num_attention_heads = {} wide",
                  config.dim / config.n_heads));
  // The sizes' own checks, named by the file's keys.
  json.refuse_unless(
      config.dim % config.n_heads == 0, "hidden_size",
      fmt::format("it does not split into num_attention_heads = {} heads", config.n_heads));
  json.refuse_unless(config.n_heads % config.n_kv_heads == 0, "num_key_value_heads",
                     fmt::format("num_attention_heads = {} do not group over it (grouped-query "
                                 "attention needs a multiple)",
                                 config.n_heads));
  json.refuse_unless(
      config.head_dim() % 2 == 0, "hidden_size",
      fmt::format("its heads are {} wide, an odd number (RoPE rotates pairs)", config.head_dim()));
  refuse_quantized(json);
  validate_hf_config(json, config);
  return config;
}

LlamaConfig read_llama_hf_config(const std::string& config_json) {
  return llama_config_from_hf(hf::ConfigJson::read(config_json));
}

std::vector<std::string> llama_parameter_names(const LlamaConfig& config) {
  return llama_pipeline_spec(config, 0).parameter_names(
      StageRange{0, config.n_layers, /*first=*/true, /*last=*/true});
}

hf::LoadStats load_llama_hf(LlamaStage& model, const std::string& path) {
  return hf::load(model, *llama_hf_adapter(model.config()), path,
                  llama_parameter_names(model.config()), "load_llama_hf");
}

void save_llama_hf(const Llama& model, const std::string& path, bool write) {
  const auto adapter = llama_hf_adapter(model.config());
  const auto parameters = hf::whole_parameters(model, *adapter, write);  // collective
  if (write) hf::save(parameters, *adapter, path);
}

}  // namespace loom::models
