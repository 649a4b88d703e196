#include "models/gpt/hf.h"

#include <cstring>
#include <filesystem>

#include "autograd/grad_mode.h"
#include "base/durable_file.h"
#include "base/error.h"
#include "models/hf/checkpoint.h"
#include "tensor/ops.h"

namespace loom::models {
namespace {

constexpr std::string_view kPrefix = "transformer.";
constexpr std::string_view kLmHead = "lm_head.weight";

// How a Loom parameter is laid out in the HF file.
enum class Layout {
  kAsIs,         // embeddings, LayerNorms, biases other than c_attn's
  kTransposed,   // Conv1D weights: (in, out) in HF, (out, in) in Loom
  kCAttnWeight,  // transposed and its 3C features permuted
  kCAttnBias,    // 3C features permuted
};

Layout layout_of(const std::string& name) {
  if (name.ends_with(".attn.c_attn.weight")) return Layout::kCAttnWeight;
  if (name.ends_with(".attn.c_attn.bias")) return Layout::kCAttnBias;
  if (name.ends_with(".c_proj.weight") || name.ends_with(".c_fc.weight"))
    return Layout::kTransposed;
  return Layout::kAsIs;
}

class GPT2Adapter : public hf::StateDictAdapter {
 public:
  explicit GPT2Adapter(const GPTConfig& config) : config_(config) {}

  std::vector<std::string> hf_names(const std::string& name) const override {
    return {std::string(kPrefix) + name, name};
  }
  std::optional<FileLayout> file_layout(const std::string& name) const override {
    switch (layout_of(name)) {
      case Layout::kAsIs:
        return FileLayout{};
      case Layout::kTransposed:
        return FileLayout{.transposed = true};
      case Layout::kCAttnWeight:
        return FileLayout{.transposed = true, .row_source = head_major()};
      case Layout::kCAttnBias:
        return FileLayout{.row_source = head_major()};
    }
    LOOM_INTERNAL_ASSERT(false, "unknown layout");
    return {};
  }
  // HF's attention-mask buffers ("h.{i}.attn.bias", "h.{i}.attn.masked_bias"), and lm_head,
  // which check_file compares with wte.
  bool is_buffer(const std::string& hf_name) const override {
    const std::string key = hf_name.starts_with(kPrefix) ? hf_name.substr(kPrefix.size()) : hf_name;
    return key == kLmHead || (key.starts_with("h.") &&
                              (key.ends_with(".attn.bias") || key.ends_with(".attn.masked_bias")));
  }
  std::vector<std::string> checked_tensors() const override {
    std::vector<std::string> out = hf_names("wte.weight");
    out.emplace_back(kLmHead);
    return out;
  }
  void check_file(const TensorMap& file, std::vector<std::string>& problems) const override {
    hf::check_tied_head(file, std::string(kLmHead), hf_names("wte.weight"),
                        "Loom ties lm_head to wte and cannot load an untied head", problems);
  }
  void add_saved(TensorMap& file) const override {
    file.emplace(std::string(kLmHead), file.at(std::string(kPrefix) + "wte.weight"));
  }
  nlohmann::json config_json() const override {
    return {{"model_type", kGpt2ModelType},
            {"architectures", {"GPT2LMHeadModel"}},
            {"n_layer", config_.n_layer},
            {"n_head", config_.n_head},
            {"n_embd", config_.n_embd},
            {"n_positions", config_.block_size},
            {"n_ctx", config_.block_size},
            {"vocab_size", config_.vocab_size},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", 1e-5},
            {"tie_word_embeddings", true},
            // The dropout the model trained with (transformers' defaults are 0.1); not read back:
            // a Loom job's dropout is its own option.
            {"resid_pdrop", config_.dropout},
            {"embd_pdrop", config_.dropout},
            {"attn_pdrop", config_.attn_dropout}};
  }

 private:
  std::vector<int64_t> head_major() const {
    return c_attn_head_major_source(config_.n_head, config_.head_dim());
  }

  GPTConfig config_;
};

}  // namespace

std::unique_ptr<hf::StateDictAdapter> gpt2_hf_adapter(const GPTConfig& config) {
  return std::make_unique<GPT2Adapter>(config);
}

std::vector<int64_t> c_attn_head_major_source(int64_t n_head, int64_t head_dim) {
  const int64_t channels = n_head * head_dim;
  std::vector<int64_t> source(static_cast<size_t>(3 * channels));
  for (int64_t head = 0; head < n_head; ++head)
    for (int64_t which = 0; which < 3; ++which)
      for (int64_t d = 0; d < head_dim; ++d)
        source[head * 3 * head_dim + which * head_dim + d] = which * channels + head * head_dim + d;
  return source;
}

std::vector<int64_t> c_attn_qkv_major_source(int64_t n_head, int64_t head_dim) {
  const std::vector<int64_t> head_major = c_attn_head_major_source(n_head, head_dim);
  std::vector<int64_t> source(head_major.size());
  for (size_t j = 0; j < head_major.size(); ++j) source[head_major[j]] = static_cast<int64_t>(j);
  return source;
}

std::vector<std::string> gpt_parameter_names(int64_t n_layer) {
  // A GPT of the same blocks with every width at its smallest: the names in its order.
  const GPT names_only(
      GPTConfig{.n_layer = n_layer, .n_head = 1, .n_embd = 1, .block_size = 1, .vocab_size = 1});
  std::vector<std::string> names;
  for (const auto& [name, p] : names_only.named_parameters()) names.push_back(name);
  return names;
}

hf::LoadStats load_gpt2_hf(GPTStage& model, const std::string& path) {
  return hf::load(model, *gpt2_hf_adapter(model.config()), path,
                  gpt_parameter_names(model.config().n_layer), "load_gpt2_hf");
}

void save_gpt2_hf(const GPT& model, const std::string& path, bool write) {
  const auto adapter = gpt2_hf_adapter(model.config());
  const auto parameters = hf::whole_parameters(model, *adapter, write);  // collective
  if (write) hf::save(parameters, *adapter, path);
}

GPTConfig gpt2_config_from_hf(const hf::ConfigJson& json) {
  const std::string type = json.string_or("model_type", kGpt2ModelType);
  json.refuse_unless(type == kGpt2ModelType, "model_type",
                     "not a GPT-2 checkpoint (the GPT family reads model_type \"gpt2\")");
  GPTConfig config{.n_layer = json.positive_int("n_layer"),
                   .n_head = json.positive_int("n_head"),
                   .n_embd = json.positive_int("n_embd"),
                   .block_size = json.positive_int("n_positions"),
                   .vocab_size = json.positive_int("vocab_size")};
  const std::string activation = json.string_or("activation_function", "gelu_new");
  json.refuse_unless(activation == "gelu_new" || activation == "gelu_pytorch_tanh",
                     "activation_function",
                     "Loom's GPT computes GELU's tanh approximation (\"gelu_new\") only");
  json.refuse_unless(json.positive_int_or("n_inner", 4 * config.n_embd) == 4 * config.n_embd,
                     "n_inner",
                     fmt::format("Loom's GPT MLP is 4 x n_embd = {} wide", 4 * config.n_embd));
  json.refuse_unless(json.number_or("layer_norm_epsilon", 1e-5) == 1e-5, "layer_norm_epsilon",
                     "Loom's GPT LayerNorms use epsilon 1e-5");
  json.refuse_unless(json.bool_or("scale_attn_weights", true), "scale_attn_weights",
                     "Loom's GPT scales attention scores by 1/sqrt(head_dim)");
  json.refuse_unless(!json.bool_or("scale_attn_by_inverse_layer_idx", false),
                     "scale_attn_by_inverse_layer_idx",
                     "Loom's GPT does not scale attention by the layer index");
  json.refuse_unless(!json.bool_or("add_cross_attention", false), "add_cross_attention",
                     "Loom's GPT has no cross-attention");
  json.refuse_unless(json.bool_or("tie_word_embeddings", true), "tie_word_embeddings",
                     "Loom's GPT ties its head to wte");
  try {
    config.validate();
  } catch (const Error& e) {
    json.fail(e.what());
  }
  return config;
}

std::optional<GPTConfig> read_gpt2_hf_config(const std::string& checkpoint_path) {
  const std::string path = hf::config_json_path(checkpoint_path);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  return gpt2_config_from_hf(hf::ConfigJson::read(path));
}

void write_gpt2_hf_config(const GPTConfig& config, const std::string& checkpoint_path) {
  write_file_atomically(hf::config_json_path(checkpoint_path),
                        gpt2_hf_adapter(config)->config_json().dump(2) + "\n", "config.json");
}

}  // namespace loom::models
