#include "train/checkpoint_fields.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <vector>

#include "base/error.h"

namespace loom::train {

nlohmann::json model_fields(const models::GPTConfig& config) {
  return {{"n_layer", config.n_layer},
          {"n_head", config.n_head},
          {"n_embd", config.n_embd},
          {"block_size", config.block_size},
          {"vocab_size", config.vocab_size}};
}

nlohmann::json model_fields(const models::LlamaConfig& config) {
  return {{"family", "llama"},
          {"dim", config.dim},
          {"n_layers", config.n_layers},
          {"n_heads", config.n_heads},
          {"n_kv_heads", config.n_kv_heads},
          {"ffn_hidden_dim", config.ffn_hidden_dim()},
          {"max_seq_len", config.max_seq_len},
          {"vocab_size", config.vocab_size}};
}

nlohmann::json job_checkpoint_fields(const nlohmann::json& model, const DeviceMesh& mesh) {
  return {{"model", model}, {"layout", mesh.str()}};
}

void check_same_model(const checkpoint::Metadata& metadata, const nlohmann::json& here,
                      const std::string& directory) {
  const auto saved = metadata.extra.find("model");
  LOOM_CHECK(saved != metadata.extra.end() && saved->is_object(),
             "checkpoint '{}' does not record its model config; it was not saved by a GPT job",
             directory);
  std::vector<std::string> differences;
  for (const auto& [key, value] : here.items()) {
    const auto there = saved->find(key);
    if (there == saved->end() || *there != value) {
      differences.push_back(fmt::format("{} {} there, {} here", key,
                                        there == saved->end() ? "missing" : there->dump(),
                                        value.dump()));
    }
  }
  LOOM_CHECK(differences.empty(),
             "checkpoint '{}' was saved from another model config: {}; give the same model "
             "flags (or --config the run's effective config)",
             directory, fmt::join(differences, ", "));
}

std::string saved_layout(const checkpoint::Metadata& metadata) {
  const auto layout = metadata.extra.find("layout");
  return layout != metadata.extra.end() && layout->is_string() ? layout->get<std::string>() : "";
}

}  // namespace loom::train
