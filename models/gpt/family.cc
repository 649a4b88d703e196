// The GPT family (GPT-2's layout): presets tiny, small (GPT-2 124M) and gpt3-175b, GPT-2
// checkpoints, the GPT tensor-parallel plan.
#include "models/gpt/family.h"

#include <fmt/format.h>

#include "base/error.h"
#include "models/gpt/config.h"
#include "models/gpt/hf.h"
#include "models/gpt/parameter_layout.h"
#include "models/gpt/pipeline.h"

namespace loom::models {
namespace {

class GPTArgs : public ModelArgs {
 public:
  explicit GPTArgs(const GPTConfig& config) : config_(config) {}
  std::unique_ptr<ModelArgs> clone() const override { return std::make_unique<GPTArgs>(*this); }
  std::string family() const override { return "gpt"; }
  std::string summary() const override {
    return fmt::format(
        "GPT n_layer={} n_head={} n_embd={} block_size={} vocab_size={} ({} parameters)",
        config_.n_layer, config_.n_head, config_.n_embd, config_.block_size, config_.vocab_size,
        config_.parameter_count());
  }
  int64_t parameter_count() const override { return config_.parameter_count(); }
  int64_t n_layers() const override { return config_.n_layer; }
  int64_t context() const override { return config_.block_size; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  void set_vocab_size(int64_t vocab_size) override { config_.vocab_size = vocab_size; }
  // The sizes GPT checkpoints have always recorded, and the family (checkpoints before it lack
  // it: train::check_same_model compares what both record).
  nlohmann::json fields() const override {
    return {{"family", "gpt"},
            {"n_layer", config_.n_layer},
            {"n_head", config_.n_head},
            {"n_embd", config_.n_embd},
            {"block_size", config_.block_size},
            {"vocab_size", config_.vocab_size}};
  }
  void validate() const override { config_.validate(); }
  bool supports_context_parallel() const override { return true; }
  std::pair<int64_t, int64_t> attention_heads() const override {
    return {config_.n_head, config_.n_head};
  }
  void validate_tp(int64_t tp) const override {
    LOOM_CHECK(config_.n_head % tp == 0,
               "parallelize_gpt: n_head={} is not divisible by the tp mesh size {}", config_.n_head,
               tp);
  }
  pipeline::PipelineModelSpec spec(uint64_t seed, const TPPlanOptions& plan) const override {
    return gpt_pipeline_spec(config_, seed, plan);
  }
  std::unique_ptr<hf::StateDictAdapter> hf_adapter() const override {
    return gpt2_hf_adapter(config_);
  }
  std::vector<PlannedParameter> planned_parameters(
      const pipeline::StageRange& range) const override {
    return gpt_planned_parameters(config_, range);
  }

 private:
  GPTConfig config_;
};

// The job's dropout (a training option, not part of a checkpoint's model: HF configs' pdrops
// are not read, so a checkpoint loads into the same training as before unless asked).
void set_dropout(GPTConfig& config, const ModelSizes& sizes) {
  config.dropout = dropout_probability(sizes.dropout, "--dropout");
  config.attn_dropout = dropout_probability(sizes.attn_dropout, "--attn-dropout");
}

class GPTFamily : public ModelFamily {
 public:
  std::string name() const override { return "gpt"; }
  std::vector<std::string> presets() const override { return {"tiny", "small", "gpt3-175b"}; }
  bool vocab_from_data(const std::string& preset) const override { return preset == "tiny"; }
  bool takes_dropout() const override { return true; }
  std::unique_ptr<ModelArgs> from_preset(const std::string& preset,
                                         const ModelSizes& sizes) const override {
    GPTConfig config = GPTConfig::preset(preset);
    refuse_size(sizes.n_kv_heads, "--n-kv-heads", name());
    refuse_size(sizes.ffn_dim, "--ffn-dim", name());
    LOOM_CHECK(sizes.rope_theta == 0, "--rope-theta: the gpt family has no rotary embeddings");
    LOOM_CHECK(sizes.moe.first_given().empty(),
               "{}: the gpt family has no mixture of experts; use a llama preset "
               "(llama-moe-tiny, or --moe-experts on any llama)",
               sizes.moe.first_given());
    if (sizes.n_layer) config.n_layer = sizes.n_layer;
    if (sizes.n_head) config.n_head = sizes.n_head;
    if (sizes.n_embd) config.n_embd = sizes.n_embd;
    if (sizes.block_size) config.block_size = sizes.block_size;
    if (sizes.vocab_size) config.vocab_size = sizes.vocab_size;
    set_dropout(config, sizes);
    return std::make_unique<GPTArgs>(config);
  }
  std::unique_ptr<ModelArgs> from_fields(const nlohmann::json& fields,
                                         const std::string& where) const override {
    GPTConfig config{.n_layer = int_field(fields, "n_layer", where),
                     .n_head = int_field(fields, "n_head", where),
                     .n_embd = int_field(fields, "n_embd", where),
                     .block_size = int_field(fields, "block_size", where),
                     .vocab_size = int_field(fields, "vocab_size", where)};
    config.validate();
    return std::make_unique<GPTArgs>(config);
  }
  std::string hf_model_type() const override { return kGpt2ModelType; }
  std::unique_ptr<ModelArgs> from_hf_config(const hf::ConfigJson& json,
                                            const ModelSizes& sizes) const override {
    GPTConfig config = gpt2_config_from_hf(json);
    set_dropout(config, sizes);
    refuse_size(sizes.n_kv_heads, "--n-kv-heads", name());
    refuse_size(sizes.ffn_dim, "--ffn-dim", name());
    LOOM_CHECK(sizes.rope_theta == 0, "--rope-theta: the gpt family has no rotary embeddings");
    check_sizes_agree(json, {{sizes.n_layer, "--n-layer", "n_layer", config.n_layer},
                             {sizes.n_head, "--n-head", "n_head", config.n_head},
                             {sizes.n_embd, "--n-embd", "n_embd", config.n_embd},
                             {sizes.block_size, "--block-size", "n_positions", config.block_size},
                             {sizes.vocab_size, "--vocab-size", "vocab_size", config.vocab_size}});
    return std::make_unique<GPTArgs>(config);
  }
};

LOOM_REGISTER_MODEL_FAMILY(GPTFamily);

}  // namespace

std::unique_ptr<ModelArgs> gpt_args(const GPTConfig& config) {
  return std::make_unique<GPTArgs>(config);
}

}  // namespace loom::models
