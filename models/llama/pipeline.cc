#include "models/llama/pipeline.h"

#include <fmt/format.h>

#include "models/tied_embedding_pipeline.h"
#include "nn/meta_init.h"

namespace loom::models {

std::vector<parallel::DataParallel::Block> llama_blocks(const LlamaStage& stage) {
  std::vector<parallel::DataParallel::Block> blocks;
  for (size_t i = 0; i < stage.layers.size(); ++i) {
    blocks.push_back({fmt::format("layers.{}", stage.range().first_block + static_cast<int64_t>(i)),
                      stage.layers[i].get()});
  }
  return blocks;
}

pipeline::PipelineModelSpec llama_pipeline_spec(const LlamaConfig& config, uint64_t seed,
                                                const LlamaPlanOptions& plan) {
  config.validate();
  pipeline::PipelineModelSpec spec;
  spec.name = "Llama pipeline";
  spec.n_layers = config.n_layers;
  spec.hidden_size = config.dim;
  spec.vocab_size = config.vocab_size;
  spec.make_stage = [config, seed](const StageRange& range) -> std::shared_ptr<nn::Module> {
    if (range.first && range.last && range.first_block == 0 && range.end_block == config.n_layers) {
      return std::make_shared<Llama>(config, seed);  // the whole model is its own class
    }
    return std::make_shared<LlamaStage>(config, seed, range);
  };
  spec.parallelize = [plan](nn::Module& stage, std::shared_ptr<const DeviceMesh> tp_mesh) {
    parallelize_llama(dynamic_cast<LlamaStage&>(stage), std::move(tp_mesh), plan);
  };
  spec.blocks = [](nn::Module& stage) { return llama_blocks(dynamic_cast<LlamaStage&>(stage)); };
  spec.loss = [](const Tensor& logits, const Tensor& targets) {
    return llama_loss(logits, targets);
  };
  spec.parameter_names = [config](const StageRange& range) {
    // A stage of the same blocks with every width at its smallest: the names in its order.
    LlamaConfig tiny = config;
    tiny.dim = 2;
    tiny.n_heads = 1;
    tiny.n_kv_heads = 1;
    tiny.vocab_size = 1;
    tiny.max_seq_len = 1;
    tiny.multiple_of = 1;
    tiny.ffn_dim_multiplier = std::nullopt;
    nn::MetaBuildScope shapes_only;  // no bytes, and none counted as this rank's
    const LlamaStage names_only(tiny, 0, range);
    std::vector<std::string> names;
    for (const auto& [name, p] : names_only.named_parameters()) names.push_back(name);
    return names;
  };
  if (config.moe) {
    // Each MoE layer's routing bias, which a Hugging Face save of the whole model writes
    // (DeepSeek-V3's e_score_correction_bias).
    spec.buffer_names = [config](const StageRange& range) {
      std::vector<std::string> names;
      for (int64_t i = range.first_block; i < range.end_block; ++i) {
        if (config.is_moe_layer(i)) names.push_back(fmt::format("layers.{}.moe.expert_bias", i));
      }
      return names;
    };
  }
  if (config.tie_word_embeddings) {
    // The last stage's copy of tok_embeddings (for the head) follows the first stage's.
    const TiedCopyOf copy_of = [](const nn::Module& stage) {
      const auto& llama = dynamic_cast<const LlamaStage&>(stage);
      return TiedCopy{llama.tok_embeddings.get(), llama.range()};
    };
    spec.after_step = [copy_of](pipeline::PipelineModel& model) {
      sum_tied_embedding_gradients(model, copy_of);
    };
    spec.not_counted = [copy_of](const pipeline::PipelineModel& model) {
      return tied_copies_not_counted(model, copy_of);
    };
  }
  return spec;
}

}  // namespace loom::models
