#include "models/llama/deepseek_v3_hf.h"

#include <fmt/format.h>

#include <regex>
#include <vector>

#include "base/error.h"
#include "models/llama/hf_config_parts.h"
#include "nn/moe/moe_options.h"

namespace loom::models {

namespace {

// Loom's name -> DeepSeek-V3's, for every parameter and the routing bias.
std::string deepseek_name(const std::string& name) {
  if (name == "tok_embeddings.weight") return "model.embed_tokens.weight";
  if (name == "norm.weight") return "model.norm.weight";
  if (name == "output.weight") return "lm_head.weight";
  // Whole suffixes after "layers.{i}.": no part is a prefix of another's match.
  static const std::vector<std::pair<std::string, std::string>> kSuffixes = {
      {"attention.wq.weight", "self_attn.q_proj.weight"},
      {"attention.wq_a.weight", "self_attn.q_a_proj.weight"},
      {"attention.q_norm.weight", "self_attn.q_a_layernorm.weight"},
      {"attention.wq_b.weight", "self_attn.q_b_proj.weight"},
      {"attention.wkv_a.weight", "self_attn.kv_a_proj_with_mqa.weight"},
      {"attention.kv_norm.weight", "self_attn.kv_a_layernorm.weight"},
      {"attention.wkv_b.weight", "self_attn.kv_b_proj.weight"},
      {"attention.wo.weight", "self_attn.o_proj.weight"},
      {"attention_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
      {"feed_forward.w3.weight", "mlp.up_proj.weight"},
      {"feed_forward.w2.weight", "mlp.down_proj.weight"},
      {"moe.gate.weight", "mlp.gate.weight"},
      {"moe.expert_bias", "mlp.gate.e_score_correction_bias"},
      {"moe.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
      {"moe.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
      {"moe.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"}};
  const auto dot = name.find('.', std::string_view("layers.").size());
  if (name.starts_with("layers.") && dot != std::string::npos) {
    const std::string layer = name.substr(0, dot), rest = name.substr(dot + 1);
    for (const auto& [loom, hf] : kSuffixes) {
      if (rest == loom) return fmt::format("model.{}.{}", layer, hf);
    }
  }
  return "model." + name;  // no such tensor in the file: named as a missing one
}

// Expert e's file name of a MoE's (experts, ., .) weight, or empty for any other name.
std::string expert_name(const std::string& name, int64_t e) {
  static const std::vector<std::pair<std::string, std::string>> kProjections = {
      {".moe.experts.w1", "gate_proj"},
      {".moe.experts.w3", "up_proj"},
      {".moe.experts.w2", "down_proj"}};
  for (const auto& [suffix, projection] : kProjections) {
    if (name.ends_with(suffix)) {
      return fmt::format("model.{}.mlp.experts.{}.{}.weight",
                         name.substr(0, name.size() - suffix.size()), e, projection);
    }
  }
  return "";
}

class DeepSeekV3Adapter : public hf::StateDictAdapter {
 public:
  explicit DeepSeekV3Adapter(const LlamaConfig& config) : config_(config) {}

  std::vector<std::string> hf_names(const std::string& name) const override {
    return {deepseek_name(name)};
  }
  std::vector<std::string> stacked_names(const std::string& name) const override {
    if (expert_name(name, 0).empty()) return {};
    std::vector<std::string> out;
    for (int64_t e = 0; e < config_.moe->num_experts; ++e) out.push_back(expert_name(name, e));
    return out;
  }
  std::optional<FileLayout> file_layout(const std::string&) const override {
    return FileLayout{};  // as laid out: interleaved RoPE is Loom's pairs
  }
  bool loads_buffer(const std::string& name) const override {
    return name.ends_with(".moe.expert_bias");
  }
  bool is_buffer(const std::string& hf_name) const override {
    if (hf_name.ends_with(".mlp.gate.e_score_correction_bias")) return true;  // a stage's own
    // Older files' RoPE frequencies, and the multi-token-prediction layers past the last one
    // (transformers skips both).
    if (hf_name.ends_with("rotary_emb.inv_freq")) return true;
    static const std::regex kLayer(R"(model\.layers\.(\d+)\..*)");
    std::smatch match;
    return std::regex_match(hf_name, match, kLayer) && std::stoll(match[1]) >= config_.n_layers;
  }
  nlohmann::json config_json() const override {
    const LlamaConfig& c = config_;
    const MLAOptions& a = *c.mla;
    const nn::MoEOptions& m = *c.moe;
    nlohmann::json json{
        {"architectures", {"DeepseekV3ForCausalLM"}},
        {"model_type", kDeepSeekV3ModelType},
        {"hidden_size", c.dim},
        {"intermediate_size", c.ffn_hidden_dim()},
        {"moe_intermediate_size", m.hidden_dim},
        {"num_hidden_layers", c.n_layers},
        {"num_attention_heads", c.n_heads},
        {"num_key_value_heads", c.n_heads},
        {"n_routed_experts", m.num_experts},
        {"num_experts_per_tok", m.top_k},
        {"n_shared_experts", m.num_shared_experts},
        {"routed_scaling_factor", m.route_scale},
        {"norm_topk_prob", m.route_norm},
        {"n_group", m.num_expert_groups},
        {"topk_group", m.limits_groups() ? m.num_limited_groups : m.num_expert_groups},
        {"first_k_dense_replace", c.moe_dense_layers},
        {"q_lora_rank", a.q_lora_rank > 0 ? nlohmann::json(a.q_lora_rank) : nlohmann::json()},
        {"kv_lora_rank", a.kv_lora_rank},
        {"qk_nope_head_dim", a.qk_nope_head_dim},
        {"qk_rope_head_dim", a.qk_rope_head_dim},
        {"v_head_dim", a.v_head_dim},
        {"head_dim", a.qk_rope_head_dim},
        {"rope_interleave", true},
        {"num_nextn_predict_layers", 0},
        {"vocab_size", c.vocab_size},
        {"max_position_embeddings", c.max_seq_len},
        {"rms_norm_eps", c.norm_eps},
        {"hidden_act", "silu"},
        {"attention_bias", false},
        {"tie_word_embeddings", c.tie_word_embeddings},
        {"attention_dropout", c.attention_dropout}};
    write_hf_rope(c, json);
    return json;
  }

 private:
  LlamaConfig config_;
};

}  // namespace

std::unique_ptr<hf::StateDictAdapter> deepseek_v3_hf_adapter(const LlamaConfig& config) {
  LOOM_CHECK(deepseek_v3_format_gap(config).empty(),
             "deepseek_v3_hf_adapter: the config has {}, which DeepSeek-V3's format cannot hold",
             deepseek_v3_format_gap(config));
  return std::make_unique<DeepSeekV3Adapter>(config);
}

std::string deepseek_v3_format_gap(const LlamaConfig& config) {
  if (!config.moe) {
    return "multi-head latent attention without a mixture of experts (DeepSeek-V3's format "
           "holds both)";
  }
  const nn::MoEOptions& m = *config.moe;
  if (m.score_func != "sigmoid") {
    return fmt::format(
        "latent attention with {} router scores (--moe-score-func; DeepSeek-V3's "
        "are sigmoid)",
        m.score_func);
  }
  if (m.num_shared_experts < 1) {
    return "latent attention with no shared expert (--moe-shared-experts; DeepSeek-V3 has them)";
  }
  return "";
}

LlamaConfig deepseek_v3_config_from_hf(const hf::ConfigJson& json) {
  LlamaConfig config;
  config.dim = json.positive_int("hidden_size");
  config.n_layers = json.positive_int("num_hidden_layers");
  config.n_heads = json.positive_int("num_attention_heads");
  config.n_kv_heads = config.n_heads;  // latent attention expands keys and values per head
  config.vocab_size = json.positive_int("vocab_size");
  config.norm_eps = json.number_or("rms_norm_eps", 1e-6);  // DeepseekV3Config's default
  config.max_seq_len = json.positive_int("max_position_embeddings");
  config.ffn_dim = json.positive_int("intermediate_size");
  config.ffn_dim_multiplier = std::nullopt;
  config.tie_word_embeddings = json.bool_or("tie_word_embeddings", false);
  config.mla = MLAOptions{.q_lora_rank = json.positive_int_or("q_lora_rank", 0),
                          .kv_lora_rank = json.positive_int("kv_lora_rank"),
                          .qk_nope_head_dim = json.positive_int("qk_nope_head_dim"),
                          .qk_rope_head_dim = json.positive_int("qk_rope_head_dim"),
                          .v_head_dim = json.positive_int("v_head_dim")};
  json.refuse_unless(config.mla->qk_rope_head_dim % 2 == 0, "qk_rope_head_dim",
                     "RoPE rotates pairs: it must be even");
  json.refuse_unless(json.bool_or("rope_interleave", true), "rope_interleave",
                     "Loom reads DeepSeek's interleaved rotary layout (rope_interleave true)");
  config.moe = nn::MoEOptions{.num_experts = json.positive_int("n_routed_experts"),
                              .top_k = json.positive_int("num_experts_per_tok"),
                              .hidden_dim = json.positive_int("moe_intermediate_size"),
                              .num_shared_experts = json.non_negative_int_or("n_shared_experts", 0),
                              .score_func = "sigmoid",
                              .route_norm = json.bool_or("norm_topk_prob", true),
                              .route_scale = json.number_or("routed_scaling_factor", 1.0)};
  config.moe_dense_layers = json.non_negative_int_or("first_k_dense_replace", 0);
  json.refuse_unless(json.string_or("scoring_func", "sigmoid") == "sigmoid", "scoring_func",
                     "transformers' DeepSeek-V3 router scores by sigmoid, as Loom reads it");
  json.refuse_unless(json.positive_int_or("moe_layer_freq", 1) == 1, "moe_layer_freq",
                     "every layer from first_k_dense_replace on is a mixture of experts");
  // Group-limited routing: each token's experts come from its topk_group best of n_group groups.
  config.moe->num_expert_groups = json.positive_int_or("n_group", 1);
  config.moe->num_limited_groups =
      json.positive_int_or("topk_group", config.moe->num_expert_groups);
  json.refuse_unless(config.moe->num_shared_experts >= 1, "n_shared_experts",
                     "DeepSeek-V3's mixture of experts has shared experts");
  read_hf_rope(json, config, /*partial_rotary=*/true);
  // Latent attention has a key and value per head: another kv head count describes no such
  // model (transformers fails on it).
  json.refuse_unless(json.positive_int_or("num_key_value_heads", config.n_heads) == config.n_heads,
                     "num_key_value_heads",
                     fmt::format("latent attention expands keys and values for each of its "
                                 "num_attention_heads = {} heads",
                                 config.n_heads));
  json.refuse_unless(!json.bool_or("attention_bias", false), "attention_bias",
                     "Loom's latent attention projections have no biases");
  json.refuse_unless(json.string_or("hidden_act", "silu") == "silu", "hidden_act",
                     "Loom's feed-forwards and experts are SwiGLU (silu)");
  refuse_quantized(json);
  validate_hf_config(json, config);
  return config;
}

}  // namespace loom::models
