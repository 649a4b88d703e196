// The Llama family (Llama 3's architecture): presets llama-tiny, llama3-8b and llama3-70b,
// LlamaForCausalLM checkpoints, torchtitan's tensor-parallel plan.
#include "models/llama/family.h"

#include <fmt/format.h>

#include "base/error.h"
#include "models/llama/hf.h"
#include "models/llama/pipeline.h"

namespace loom::models {
namespace {

class LlamaArgs : public ModelArgs {
 public:
  explicit LlamaArgs(const LlamaConfig& config) : config_(config) {}
  std::unique_ptr<ModelArgs> clone() const override { return std::make_unique<LlamaArgs>(*this); }
  std::string family() const override { return "llama"; }
  std::string summary() const override {
    return fmt::format(
        "Llama n_layers={} dim={} n_heads={} n_kv_heads={} ffn_dim={} max_seq_len={} "
        "vocab_size={} ({} parameters)",
        config_.n_layers, config_.dim, config_.n_heads, config_.n_kv_heads,
        config_.ffn_hidden_dim(), config_.max_seq_len, config_.vocab_size,
        config_.parameter_count());
  }
  int64_t parameter_count() const override { return config_.parameter_count(); }
  int64_t n_layers() const override { return config_.n_layers; }
  int64_t context() const override { return config_.max_seq_len; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  void set_vocab_size(int64_t vocab_size) override { config_.vocab_size = vocab_size; }
  nlohmann::json fields() const override {
    return {{"family", "llama"},
            {"dim", config_.dim},
            {"n_layers", config_.n_layers},
            {"n_heads", config_.n_heads},
            {"n_kv_heads", config_.n_kv_heads},
            {"ffn_hidden_dim", config_.ffn_hidden_dim()},
            {"max_seq_len", config_.max_seq_len},
            {"vocab_size", config_.vocab_size},
            {"norm_eps", config_.norm_eps},
            {"rope_theta", config_.rope_theta},
            {"rope_scaling", rope_scaling()}};
  }
  void validate() const override { config_.validate(); }
  bool supports_context_parallel() const override { return true; }
  void validate_tp(int64_t tp) const override {
    LOOM_CHECK(config_.n_heads % tp == 0 && config_.n_kv_heads % tp == 0,
               "parallelize_llama: tp {} must divide n_heads {} and n_kv_heads {} (each rank "
               "takes whole heads; replicating kv heads when tp > n_kv_heads is not supported "
               "yet)",
               tp, config_.n_heads, config_.n_kv_heads);
  }
  pipeline::PipelineModelSpec spec(uint64_t seed, const TPPlanOptions& plan) const override {
    return llama_pipeline_spec(config_, seed, plan);
  }
  std::unique_ptr<hf::StateDictAdapter> hf_adapter() const override {
    return llama_hf_adapter(config_);
  }
  std::vector<PlannedParameter> planned_parameters(
      const pipeline::StageRange& range) const override {
    return llama_planned_parameters(config_, range);
  }

 private:
  // Llama 3's frequency scaling as recorded (null: plain RoPE).
  nlohmann::json rope_scaling() const {
    if (!config_.rope_scaling) return nullptr;
    const RopeScaling& s = *config_.rope_scaling;
    return {{"factor", s.factor},
            {"low_freq_factor", s.low_freq_factor},
            {"high_freq_factor", s.high_freq_factor},
            {"original_max_position_embeddings", s.original_max_position_embeddings}};
  }

  LlamaConfig config_;
};

class LlamaFamily : public ModelFamily {
 public:
  std::string name() const override { return "llama"; }
  std::vector<std::string> presets() const override { return LlamaConfig::preset_names(); }
  bool vocab_from_data(const std::string& preset) const override { return preset == "llama-tiny"; }
  std::unique_ptr<ModelArgs> from_preset(const std::string& preset,
                                         const ModelSizes& sizes) const override {
    LlamaConfig config = LlamaConfig::preset(preset);
    if (sizes.n_layer) config.n_layers = sizes.n_layer;
    if (sizes.n_head) config.n_heads = sizes.n_head;
    if (sizes.n_kv_heads) config.n_kv_heads = sizes.n_kv_heads;
    if (sizes.n_embd) config.dim = sizes.n_embd;
    if (sizes.ffn_dim) config.ffn_dim = sizes.ffn_dim;
    if (sizes.block_size) config.max_seq_len = sizes.block_size;
    if (sizes.vocab_size) config.vocab_size = sizes.vocab_size;
    if (sizes.rope_theta > 0) config.rope_theta = sizes.rope_theta;
    // More heads than the preset's kv heads allow keeps grouped-query attention only when they
    // still group: a user giving --n-head alone on a preset gets multi-head attention otherwise.
    if (sizes.n_head && !sizes.n_kv_heads && config.n_heads % config.n_kv_heads != 0) {
      config.n_kv_heads = config.n_heads;
    }
    return std::make_unique<LlamaArgs>(config);
  }
  std::unique_ptr<ModelArgs> from_fields(const nlohmann::json& fields,
                                         const std::string& where) const override {
    LOOM_CHECK(fields.contains("rope_theta") && fields.contains("rope_scaling"),
               "{}: the checkpoint does not record the Llama's RoPE settings (saved before Loom "
               "recorded them), so its model cannot be rebuilt from it alone",
               where);
    LlamaConfig config;
    config.dim = int_field(fields, "dim", where);
    config.n_layers = int_field(fields, "n_layers", where);
    config.n_heads = int_field(fields, "n_heads", where);
    config.n_kv_heads = int_field(fields, "n_kv_heads", where);
    config.ffn_dim = int_field(fields, "ffn_hidden_dim", where);
    config.max_seq_len = int_field(fields, "max_seq_len", where);
    config.vocab_size = int_field(fields, "vocab_size", where);
    config.norm_eps = number_field(fields, "norm_eps", where);
    config.rope_theta = number_field(fields, "rope_theta", where);
    config.ffn_dim_multiplier = std::nullopt;
    config.rope_scaling = std::nullopt;
    if (const nlohmann::json& s = fields.at("rope_scaling"); !s.is_null()) {
      config.rope_scaling =
          RopeScaling{number_field(s, "factor", where), number_field(s, "low_freq_factor", where),
                      number_field(s, "high_freq_factor", where),
                      int_field(s, "original_max_position_embeddings", where)};
    }
    config.validate();
    return std::make_unique<LlamaArgs>(config);
  }
  std::unique_ptr<ModelArgs> from_hf_config(const hf::ConfigJson& json,
                                            const ModelSizes& sizes) const override {
    const LlamaConfig config = llama_config_from_hf(json);
    check_sizes_agree(
        json, {{sizes.n_layer, "--n-layer", "num_hidden_layers", config.n_layers},
               {sizes.n_head, "--n-head", "num_attention_heads", config.n_heads},
               {sizes.n_kv_heads, "--n-kv-heads", "num_key_value_heads", config.n_kv_heads},
               {sizes.n_embd, "--n-embd", "hidden_size", config.dim},
               {sizes.ffn_dim, "--ffn-dim", "intermediate_size", config.ffn_hidden_dim()},
               {sizes.block_size, "--block-size", "max_position_embeddings", config.max_seq_len},
               {sizes.vocab_size, "--vocab-size", "vocab_size", config.vocab_size}});
    LOOM_CHECK(sizes.rope_theta == 0 || sizes.rope_theta == config.rope_theta,
               "--rope-theta: {} contradicts the checkpoint: {} has rope_theta = {}; drop the "
               "flag (the checkpoint's is used)",
               sizes.rope_theta, json.where(), config.rope_theta);
    return std::make_unique<LlamaArgs>(config);
  }
};

LOOM_REGISTER_MODEL_FAMILY(LlamaFamily);

}  // namespace

std::unique_ptr<ModelArgs> llama_args(const LlamaConfig& config) {
  return std::make_unique<LlamaArgs>(config);
}

std::vector<PlannedParameter> llama_planned_parameters(const LlamaConfig& config,
                                                       const pipeline::StageRange& range) {
  const int64_t d = config.dim, hd = config.head_dim(), ffn = config.ffn_hidden_dim();
  std::vector<PlannedParameter> out;
  const auto add = [&](std::string name, Shape shape, std::optional<int64_t> dim, int64_t block) {
    out.push_back({std::move(name), std::move(shape), dim, block});
  };
  if (range.first) add("tok_embeddings.weight", {config.vocab_size, d}, 0, -1);
  for (int64_t i = range.first_block; i < range.end_block; ++i) {
    const std::string l = fmt::format("layers.{}.", i);
    add(l + "attention.wq.weight", {config.n_heads * hd, d}, 0, i);
    add(l + "attention.wk.weight", {config.n_kv_heads * hd, d}, 0, i);
    add(l + "attention.wv.weight", {config.n_kv_heads * hd, d}, 0, i);
    add(l + "attention.wo.weight", {d, config.n_heads * hd}, 1, i);
    add(l + "feed_forward.w1.weight", {ffn, d}, 0, i);
    add(l + "feed_forward.w2.weight", {d, ffn}, 1, i);
    add(l + "feed_forward.w3.weight", {ffn, d}, 0, i);
    add(l + "attention_norm.weight", {d}, std::nullopt, i);
    add(l + "ffn_norm.weight", {d}, std::nullopt, i);
  }
  if (range.last) {
    add("norm.weight", {d}, std::nullopt, -1);
    add("output.weight", {config.vocab_size, d}, 0, -1);
  }
  return out;
}

}  // namespace loom::models
