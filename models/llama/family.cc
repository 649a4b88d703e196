// The Llama family (Llama 3's architecture): presets llama-tiny, llama3-8b and llama3-70b,
// LlamaForCausalLM checkpoints, torchtitan's tensor-parallel plan.
#include "models/llama/family.h"

#include <fmt/format.h>

#include "base/error.h"
#include "models/llama/hf.h"
#include "models/llama/hf_config_parts.h"
#include "models/llama/pipeline.h"

namespace loom::models {
namespace {

// The recorded MoE settings, and back.
nlohmann::json moe_fields(const nn::MoEOptions& m, int64_t dense_layers) {
  nlohmann::json fields = {{"num_experts", m.num_experts},
                           {"top_k", m.top_k},
                           {"hidden_dim", m.hidden_dim},
                           {"num_shared_experts", m.num_shared_experts},
                           {"score_func", m.score_func},
                           {"route_norm", m.route_norm},
                           {"route_scale", m.route_scale},
                           {"aux_loss_coeff", m.aux_loss_coeff},
                           {"bias_update_rate", m.bias_update_rate},
                           {"capacity_factor", m.capacity_factor},
                           {"dense_layers", dense_layers}};
  // Group-limited routing only where it limits: other models' fields stay as they were recorded
  // before it existed, so their checkpoints resume.
  if (m.limits_groups()) {
    fields["num_expert_groups"] = m.num_expert_groups;
    fields["num_limited_groups"] = m.num_limited_groups;
  }
  return fields;
}

void read_moe_fields(const nlohmann::json& f, const std::string& where, LlamaConfig& config) {
  LOOM_CHECK(f.contains("score_func") && f.at("score_func").is_string() &&
                 f.contains("route_norm") && f.at("route_norm").is_boolean(),
             "{}: the recorded moe settings lack score_func or route_norm", where);
  config.moe = nn::MoEOptions{.num_experts = int_field(f, "num_experts", where),
                              .top_k = int_field(f, "top_k", where),
                              .hidden_dim = int_field(f, "hidden_dim", where),
                              .num_shared_experts = int_field(f, "num_shared_experts", where),
                              .score_func = f.at("score_func").get<std::string>(),
                              .route_norm = f.at("route_norm").get<bool>(),
                              .route_scale = number_field(f, "route_scale", where),
                              .aux_loss_coeff = number_field(f, "aux_loss_coeff", where),
                              .bias_update_rate = number_field(f, "bias_update_rate", where),
                              .capacity_factor = number_field(f, "capacity_factor", where)};
  // Recorded since routing could be group-limited; earlier checkpoints' is not.
  if (f.contains("num_expert_groups")) {
    config.moe->num_expert_groups = int_field(f, "num_expert_groups", where);
    config.moe->num_limited_groups = int_field(f, "num_limited_groups", where);
  }
  config.moe_dense_layers = int_field(f, "dense_layers", where);
}

// The job's --moe-* settings over the preset's (models/family.h: MoESizes).
void apply_moe_sizes(const MoESizes& sizes, LlamaConfig& config) {
  if (sizes.first_given().empty()) return;
  if (!config.moe) {
    LOOM_CHECK(sizes.experts > 0,
               "{}: the preset has no mixture of experts; give --moe-experts N to make one",
               sizes.first_given());
    config.moe = nn::MoEOptions{.hidden_dim = config.ffn_hidden_dim()};
  }
  nn::MoEOptions& m = *config.moe;
  if (sizes.experts) m.num_experts = sizes.experts;
  if (sizes.top_k) m.top_k = sizes.top_k;
  if (sizes.hidden_dim) m.hidden_dim = sizes.hidden_dim;
  if (sizes.shared_experts >= 0) m.num_shared_experts = sizes.shared_experts;
  if (!sizes.score_func.empty()) {
    m.score_func = sizes.score_func;
    m.route_norm = sizes.score_func == "sigmoid";  // DeepSeek-V3's pairing
  }
  if (sizes.route_norm >= 0) m.route_norm = sizes.route_norm == 1;
  if (sizes.aux_loss_coeff >= 0) m.aux_loss_coeff = sizes.aux_loss_coeff;
  if (sizes.bias_update_rate >= 0) m.bias_update_rate = sizes.bias_update_rate;
  if (sizes.capacity_factor >= 0) m.capacity_factor = sizes.capacity_factor;
  if (sizes.dense_layers >= 0) config.moe_dense_layers = sizes.dense_layers;
}

// A Hugging Face checkpoint's model with the job's --moe-* flags: the structure (experts, top-k,
// widths, routing) is the file's, which a flag given must equal; the training options (the
// auxiliary loss, the bias balancing, the capacity) are the job's.
void apply_checkpoint_moe_sizes(const MoESizes& sizes, const hf::ConfigJson& json,
                                LlamaConfig& config) {
  if (sizes.first_given().empty()) return;
  LOOM_CHECK(config.moe.has_value(),
             "{}: {} describes a dense Llama (model_type \"llama\"); a mixture of experts comes "
             "from a Mixtral or DeepSeek-V3 checkpoint's config.json, or from a preset without "
             "--init-from",
             sizes.first_given(), json.where());
  nn::MoEOptions& m = *config.moe;
  const auto agree = [&](bool same, std::string_view flag, std::string_view what, auto file) {
    LOOM_CHECK(same,
               "{}: contradicts the checkpoint: {} describes {} {}; drop the flag (the "
               "checkpoint's routing is used)",
               flag, json.where(), what, file);
  };
  agree(sizes.experts == 0 || sizes.experts == m.num_experts, "--moe-experts",
        "routed experts:", m.num_experts);
  agree(sizes.top_k == 0 || sizes.top_k == m.top_k, "--moe-top-k", "experts per token:", m.top_k);
  agree(sizes.hidden_dim == 0 || sizes.hidden_dim == m.hidden_dim, "--moe-hidden-dim",
        "experts of width", m.hidden_dim);
  agree(sizes.shared_experts < 0 || sizes.shared_experts == m.num_shared_experts,
        "--moe-shared-experts", "shared experts:", m.num_shared_experts);
  agree(sizes.score_func.empty() || sizes.score_func == m.score_func, "--moe-score-func",
        "router scores by", m.score_func);
  agree(sizes.route_norm < 0 || (sizes.route_norm == 1) == m.route_norm, "--moe-route-norm",
        "top-k weights normalized:", m.route_norm ? 1 : 0);
  agree(sizes.dense_layers < 0 || sizes.dense_layers == config.moe_dense_layers,
        "--moe-dense-layers", "dense layers first:", config.moe_dense_layers);
  if (sizes.aux_loss_coeff >= 0) m.aux_loss_coeff = sizes.aux_loss_coeff;
  if (sizes.bias_update_rate >= 0) m.bias_update_rate = sizes.bias_update_rate;
  if (sizes.capacity_factor >= 0) m.capacity_factor = sizes.capacity_factor;
}

class LlamaArgs : public ModelArgs {
 public:
  explicit LlamaArgs(const LlamaConfig& config) : config_(config) {}
  std::unique_ptr<ModelArgs> clone() const override { return std::make_unique<LlamaArgs>(*this); }
  std::string family() const override { return "llama"; }
  std::string summary() const override {
    std::string moe;
    if (config_.moe) {
      const nn::MoEOptions& m = *config_.moe;
      moe = fmt::format(
          " moe: {} experts top-{} hidden {} shared {} {}{}{} from layer {} ({} active per token)",
          m.num_experts, m.top_k, m.hidden_dim, m.num_shared_experts, m.score_func,
          m.limits_groups() ? fmt::format(" of the best {} of {} groups", m.num_limited_groups,
                                          m.num_expert_groups)
                            : "",
          m.capacity_factor > 0 ? fmt::format(" capacity {}", m.capacity_factor) : "",
          config_.moe_dense_layers, config_.active_parameter_count());
    }
    return fmt::format(
        "Llama n_layers={} dim={} n_heads={} n_kv_heads={} ffn_dim={} max_seq_len={} "
        "vocab_size={}{} ({} parameters){}{}",
        config_.n_layers, config_.dim, config_.n_heads, config_.n_kv_heads,
        config_.ffn_hidden_dim(), config_.max_seq_len, config_.vocab_size,
        config_.tie_word_embeddings ? " tied" : "", config_.parameter_count(),
        config_.mla
            ? fmt::format(" mla: q rank {} kv rank {} qk {}+{} v {}", config_.mla->q_lora_rank,
                          config_.mla->kv_lora_rank, config_.mla->qk_nope_head_dim,
                          config_.mla->qk_rope_head_dim, config_.mla->v_head_dim)
            : "",
        moe);
  }
  int64_t parameter_count() const override { return config_.parameter_count(); }
  int64_t n_layers() const override { return config_.n_layers; }
  int64_t context() const override { return config_.max_seq_len; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  void set_vocab_size(int64_t vocab_size) override { config_.vocab_size = vocab_size; }
  nlohmann::json fields() const override {
    nlohmann::json out = {{"family", "llama"},
                          {"dim", config_.dim},
                          {"n_layers", config_.n_layers},
                          {"n_heads", config_.n_heads},
                          {"n_kv_heads", config_.n_kv_heads},
                          {"ffn_hidden_dim", config_.ffn_hidden_dim()},
                          {"max_seq_len", config_.max_seq_len},
                          {"vocab_size", config_.vocab_size},
                          {"norm_eps", config_.norm_eps},
                          {"rope_theta", config_.rope_theta},
                          {"rope_scaling", rope_scaling()},
                          {"tie_word_embeddings", config_.tie_word_embeddings}};
    // Only when set: other models' fields stay as recorded before YaRN, so they resume.
    if (config_.rope_yarn) out["rope_yarn"] = yarn_fields(*config_.rope_yarn);
    if (config_.moe) out["moe"] = moe_fields(*config_.moe, config_.moe_dense_layers);
    if (config_.mla) {
      const MLAOptions& m = *config_.mla;
      out["mla"] = {{"q_lora_rank", m.q_lora_rank},
                    {"kv_lora_rank", m.kv_lora_rank},
                    {"qk_nope_head_dim", m.qk_nope_head_dim},
                    {"qk_rope_head_dim", m.qk_rope_head_dim},
                    {"v_head_dim", m.v_head_dim}};
    }
    return out;
  }
  std::vector<TrainingField> training_fields() const override {
    // The balancing loss's weight, the bias balancing's rate and the capacity: coefficients of
    // training, which torchtitan reads from each run's config.
    if (!config_.moe) return {};
    return {{"/moe/aux_loss_coeff", "--moe-aux-loss-coeff"},
            {"/moe/bias_update_rate", "--moe-bias-update-rate"},
            {"/moe/capacity_factor", "--moe-capacity-factor"}};
  }
  void validate() const override { config_.validate(); }
  bool supports_context_parallel() const override { return true; }
  int64_t num_experts() const override {
    // moe_dense_layers = n_layers keeps every layer dense: a dense model, whose --ep is refused.
    const bool routes = config_.moe && config_.moe_dense_layers < config_.n_layers;
    return routes ? config_.moe->num_experts : 0;
  }
  std::pair<int64_t, int64_t> attention_heads() const override {
    // Latent attention expands its latent into every head's keys and values.
    return {config_.n_heads, config_.mla ? config_.n_heads : config_.n_kv_heads};
  }
  void validate_tp(int64_t tp) const override {
    if (config_.mla) {
      LOOM_CHECK(config_.n_heads % tp == 0,
                 "parallelize_llama: tp {} must divide n_heads {} (latent attention splits whole "
                 "heads)",
                 tp, config_.n_heads);
      return;
    }
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
    // LlamaForCausalLM's layout, MixtralForCausalLM's or DeepseekV3ForCausalLM's.
    if (!hf_format_gap(config_).empty()) return nullptr;
    return llama_hf_adapter(config_);
  }
  std::string layout_dependence() const override {
    if (num_experts() == 0) return "";
    const bool aux = config_.moe->aux_loss_coeff > 0, capacity = config_.moe->capacity_factor > 0;
    if (!aux && !capacity) return "";
    return fmt::format(
        "mixture of experts: {}{}{} (as Megatron's), so a layout that splits a step into other "
        "microbatches (--grad-accum, a pipeline's), other ranks or replicas (--replicas) balances "
        "over other tokens and its losses differ slightly from one rank's; {} every layout equal "
        "to one rank",
        aux ? "the auxiliary loss is over each microbatch's tokens on the data-parallel ranks "
              "together"
            : "",
        aux && capacity ? ", and " : "",
        capacity ? "an expert's capacity over each rank's microbatch" : "",
        aux && capacity ? "--moe-aux-loss-coeff 0 and --moe-capacity-factor 0 keep"
        : aux ? "--moe-aux-loss-coeff 0 (balancing by --moe-bias-update-rate instead) keeps"
              : "--moe-capacity-factor 0 (dropless) keeps");
  }
  std::string no_hf_format() const override {
    return fmt::format(
        "a Llama with {} has no Hugging Face checkpoint format in Loom yet (a dense Llama has "
        "LlamaForCausalLM's, a mixture of experts routed as Mixtral's MixtralForCausalLM's, "
        "latent attention with sigmoid-routed and shared experts DeepseekV3ForCausalLM's)",
        hf_format_gap(config_));
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
  // Attention dropout only (HF's LlamaConfig has no other).
  bool takes_attention_dropout() const override { return true; }
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
    config.attention_dropout = dropout_probability(sizes.attn_dropout, "--attn-dropout");
    apply_moe_sizes(sizes.moe, config);
    // More heads than the preset's kv heads allow keeps grouped-query attention only when they
    // still group: a user giving --n-head alone on a preset gets multi-head attention otherwise.
    if (sizes.n_head && !sizes.n_kv_heads && config.n_heads % config.n_kv_heads != 0) {
      config.n_kv_heads = config.n_heads;
    }
    if (config.mla) {
      // Latent attention expands keys and values for every head from one latent.
      LOOM_CHECK(sizes.n_kv_heads == 0 || sizes.n_kv_heads == config.n_heads,
                 "--n-kv-heads {}: {} has multi-head latent attention, whose keys and values "
                 "come from one latent for each of its {} heads; drop the flag",
                 sizes.n_kv_heads, preset, config.n_heads);
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
    // Recorded since Loom's Llama could tie; earlier checkpoints are untied.
    config.tie_word_embeddings = fields.value("tie_word_embeddings", false);
    config.ffn_dim_multiplier = std::nullopt;
    config.rope_scaling = std::nullopt;
    if (const nlohmann::json& s = fields.at("rope_scaling"); !s.is_null()) {
      config.rope_scaling =
          RopeScaling{number_field(s, "factor", where), number_field(s, "low_freq_factor", where),
                      number_field(s, "high_freq_factor", where),
                      int_field(s, "original_max_position_embeddings", where)};
    }
    if (fields.contains("rope_yarn")) {
      config.rope_yarn = yarn_from_fields(fields.at("rope_yarn"), where);
    }
    if (fields.contains("moe")) read_moe_fields(fields.at("moe"), where, config);
    if (fields.contains("mla")) {
      const nlohmann::json& m = fields.at("mla");
      config.mla = MLAOptions{.q_lora_rank = int_field(m, "q_lora_rank", where),
                              .kv_lora_rank = int_field(m, "kv_lora_rank", where),
                              .qk_nope_head_dim = int_field(m, "qk_nope_head_dim", where),
                              .qk_rope_head_dim = int_field(m, "qk_rope_head_dim", where),
                              .v_head_dim = int_field(m, "v_head_dim", where)};
    }
    config.validate();
    return std::make_unique<LlamaArgs>(config);
  }
  std::vector<std::string> hf_model_types() const override {
    return {kLlamaModelType, kMixtralModelType, kDeepSeekV3ModelType};
  }
  std::unique_ptr<ModelArgs> from_hf_config(const hf::ConfigJson& json,
                                            const ModelSizes& sizes) const override {
    LlamaConfig config = llama_config_from_hf(json);
    // The job's, as GPT's pdrops: a training option (the file's attention_dropout is not read).
    config.attention_dropout = dropout_probability(sizes.attn_dropout, "--attn-dropout");
    apply_checkpoint_moe_sizes(sizes.moe, json, config);
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
  const auto add = [&](std::string name, Shape shape, std::optional<int64_t> dim, int64_t block,
                       bool expert = false) {
    out.push_back({std::move(name), std::move(shape), dim, block, expert});
  };
  if (range.first || (range.last && config.tie_word_embeddings)) {
    add("tok_embeddings.weight", {config.vocab_size, d}, 0, -1);
  }
  for (int64_t i = range.first_block; i < range.end_block; ++i) {
    const std::string l = fmt::format("layers.{}.", i);
    if (config.mla) {
      const MLAOptions& m = *config.mla;
      const int64_t h = config.n_heads, qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
      if (m.q_lora_rank > 0) {
        add(l + "attention.wq_a.weight", {m.q_lora_rank, d}, std::nullopt, i);
        add(l + "attention.q_norm.weight", {m.q_lora_rank}, std::nullopt, i);
        add(l + "attention.wq_b.weight", {h * qk, m.q_lora_rank}, 0, i);
      } else {
        add(l + "attention.wq.weight", {h * qk, d}, 0, i);
      }
      add(l + "attention.wkv_a.weight", {m.kv_lora_rank + m.qk_rope_head_dim, d}, std::nullopt, i);
      add(l + "attention.kv_norm.weight", {m.kv_lora_rank}, std::nullopt, i);
      add(l + "attention.wkv_b.weight", {h * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank},
          0, i);
      add(l + "attention.wo.weight", {d, h * m.v_head_dim}, 1, i);
    } else {
      add(l + "attention.wq.weight", {config.n_heads * hd, d}, 0, i);
      add(l + "attention.wk.weight", {config.n_kv_heads * hd, d}, 0, i);
      add(l + "attention.wv.weight", {config.n_kv_heads * hd, d}, 0, i);
      add(l + "attention.wo.weight", {d, config.n_heads * hd}, 1, i);
    }
    if (config.is_moe_layer(i)) {
      const nn::MoEOptions& m = *config.moe;
      add(l + "moe.gate.weight", {m.num_experts, d}, std::nullopt, i);
      // Over tp (expert tensor parallelism, without ep): each expert's hidden width.
      add(l + "moe.experts.w1", {m.num_experts, m.hidden_dim, d}, 1, i, true);
      add(l + "moe.experts.w2", {m.num_experts, d, m.hidden_dim}, 2, i, true);
      add(l + "moe.experts.w3", {m.num_experts, m.hidden_dim, d}, 1, i, true);
      if (m.num_shared_experts > 0) {
        const int64_t shared = m.hidden_dim * m.num_shared_experts;
        add(l + "moe.shared_experts.w1.weight", {shared, d}, 0, i);
        add(l + "moe.shared_experts.w2.weight", {d, shared}, 1, i);
        add(l + "moe.shared_experts.w3.weight", {shared, d}, 0, i);
      }
    } else {
      add(l + "feed_forward.w1.weight", {ffn, d}, 0, i);
      add(l + "feed_forward.w2.weight", {d, ffn}, 1, i);
      add(l + "feed_forward.w3.weight", {ffn, d}, 0, i);
    }
    add(l + "attention_norm.weight", {d}, std::nullopt, i);
    add(l + "ffn_norm.weight", {d}, std::nullopt, i);
  }
  if (range.last) {
    add("norm.weight", {d}, std::nullopt, -1);
    if (!config.tie_word_embeddings) add("output.weight", {config.vocab_size, d}, 0, -1);
  }
  return out;
}

}  // namespace loom::models
