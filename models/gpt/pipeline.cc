#include "models/gpt/pipeline.h"

#include <fmt/format.h>

#include "models/tied_embedding_pipeline.h"
#include "nn/meta_init.h"

namespace loom::models {

using pipeline::PipelineModel;
using pipeline::PipelineModelSpec;

namespace {

const GPTStage& gpt_stage(const nn::Module& stage) { return dynamic_cast<const GPTStage&>(stage); }

// The stage's copy of the tied wte (the first stage's, the last's for the head).
TiedCopy wte_copy(const nn::Module& stage) {
  const GPTStage& gpt = gpt_stage(stage);
  return {gpt.wte.get(), gpt.range()};
}

}  // namespace

std::vector<parallel::DataParallel::Block> gpt_blocks(const GPTStage& module) {
  std::vector<parallel::DataParallel::Block> blocks;
  for (size_t i = 0; i < module.h.size(); ++i) {
    blocks.push_back({fmt::format("h.{}", module.range().first_block + static_cast<int64_t>(i)),
                      module.h[i].get()});
  }
  return blocks;
}

PipelineModelSpec gpt_pipeline_spec(const GPTConfig& config, uint64_t seed,
                                    const GPTPlanOptions& plan) {
  PipelineModelSpec spec;
  spec.name = "GPTPipeline";
  spec.n_layers = config.n_layer;
  spec.hidden_size = config.n_embd;
  spec.vocab_size = config.vocab_size;
  spec.make_stage = [config, seed](const StageRange& range) -> std::shared_ptr<nn::Module> {
    if (range.first && range.last && range.first_block == 0 && range.end_block == config.n_layer) {
      return std::make_shared<GPT>(config, seed);  // the whole model is its own class
    }
    return std::make_shared<GPTStage>(config, seed, range);
  };
  spec.parallelize = [plan](nn::Module& stage, std::shared_ptr<const DeviceMesh> tp_mesh) {
    parallelize_gpt(dynamic_cast<GPTStage&>(stage), std::move(tp_mesh), plan);
  };
  spec.blocks = [](nn::Module& stage) { return gpt_blocks(gpt_stage(stage)); };
  spec.loss = [](const Tensor& logits, const Tensor& targets) { return gpt_loss(logits, targets); };
  spec.parameter_names = [n_layer = config.n_layer](const StageRange& range) {
    // A stage of the same blocks, sized to nothing: the names in its order.
    nn::MetaBuildScope shapes_only;  // no bytes, and none counted as this rank's
    const GPTStage names_only(
        GPTConfig{.n_layer = n_layer, .n_head = 1, .n_embd = 1, .block_size = 1, .vocab_size = 1},
        0, range);
    std::vector<std::string> names;
    for (const auto& [name, p] : names_only.named_parameters()) names.push_back(name);
    return names;
  };
  spec.after_step = [](PipelineModel& model) { sum_tied_embedding_gradients(model, wte_copy); };
  // The head's copy of wte: the first stage counts the (equal, summed) gradient.
  spec.not_counted = [](const PipelineModel& model) {
    return tied_copies_not_counted(model, wte_copy);
  };
  return spec;
}

GPTPipeline::GPTPipeline(const GPTConfig& config, uint64_t seed,
                         const parallel::ParallelMeshes& meshes, pipeline::ScheduleOptions schedule,
                         GPTPlanOptions plan,
                         std::optional<nn::MixedPrecisionPolicy> mixed_precision)
    : model_(gpt_pipeline_spec(config, seed, plan), meshes,
             {.schedule = std::move(schedule), .mixed_precision = std::move(mixed_precision)}) {
  for (const auto& stage : model_.stages()) {
    modules_.push_back(std::dynamic_pointer_cast<GPTStage>(stage));
  }
}

std::unique_ptr<GPT> GPTPipeline::whole_model_on_first_rank() {
  std::unique_ptr<GPT> whole;
  if (model_.on_first_rank()) whole = std::make_unique<GPT>(modules_.front()->config(), 0);
  // The last stage's copy of wte is left out: the first stage's is the parameter.
  model_.gather_whole(whole.get());
  return whole;
}

}  // namespace loom::models
