#include "models/gpt/plans.h"

#include "base/error.h"

namespace loom::models {

namespace {

template <typename Style, typename... Args>
std::shared_ptr<tp::ParallelStyle> style(Args&&... args) {
  return std::make_shared<Style>(std::forward<Args>(args)...);
}

}  // namespace

namespace {

// The entries of the plan for the whole model.
tp::ParallelizePlan whole_model_plan(const GPTPlanOptions& options) {
  using tp::ColwiseParallel, tp::RowwiseParallel, tp::SequenceParallel, tp::PrepareModuleInput,
      tp::PrepareModuleOutput;
  if (!options.sequence_parallel) {
    return {
        {"wte", style<RowwiseParallel>(tp::LayoutOptions{.input_layouts = Replicate(),
                                                         .output_layouts = Replicate()})},
        {"h.*.attn.c_attn", style<ColwiseParallel>()},
        {"h.*.attn.c_proj", style<RowwiseParallel>()},
        {"h.*.mlp.c_fc", style<ColwiseParallel>()},
        {"h.*.mlp.c_proj", style<RowwiseParallel>()},
        // The head's input becomes a Replicate DTensor, so x @ wte^T (wte vocab-sharded) gives
        // vocabulary-sharded logits.
        {"lm_head",
         style<PrepareModuleInput>(tp::PrepareInputOptions{Replicate(), Replicate(), false})},
    };
  }
  // Sequence-parallel activations: local (B, T/tp, C) tensors between the styles below.
  const tp::SequenceParallelOptions local_out{.use_local_output = true};
  // The gathered input stays a DTensor into the column-parallel layer, so backward turns its
  // Partial gradient straight into sequence shards (a reduce-scatter, not an all-reduce).
  const tp::PrepareInputOptions gather_sequence{Shard(1), Replicate(), /*use_local_output=*/false,
                                                options.regather_in_backward};
  const tp::LayoutOptions scatter_sequence{.output_layouts = Shard(1)};
  return {
      {"wte", style<RowwiseParallel>(
                  tp::LayoutOptions{.input_layouts = Replicate(), .output_layouts = Shard(1)})},
      // Each rank adds the position embeddings of its own positions.
      {"wpe", style<PrepareModuleOutput>(tp::PrepareOutputOptions{Replicate(), Shard(0), true})},
      {"drop", style<SequenceParallel>(local_out)},
      {"h.*.ln_1", style<SequenceParallel>()},
      {"h.*.attn", style<PrepareModuleInput>(gather_sequence)},
      {"h.*.attn.c_attn", style<ColwiseParallel>()},
      {"h.*.attn.c_proj", style<RowwiseParallel>(scatter_sequence)},
      {"h.*.attn.resid_dropout", style<SequenceParallel>(local_out)},
      {"h.*.ln_2", style<SequenceParallel>()},
      {"h.*.mlp", style<PrepareModuleInput>(gather_sequence)},
      {"h.*.mlp.c_fc", style<ColwiseParallel>()},
      {"h.*.mlp.c_proj", style<RowwiseParallel>(scatter_sequence)},
      {"h.*.mlp.dropout", style<SequenceParallel>(local_out)},
      {"ln_f", style<SequenceParallel>()},
      {"lm_head", style<PrepareModuleInput>(tp::PrepareInputOptions{Shard(1), Replicate(), false})},
  };
}

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.rfind(prefix, 0) == 0;
}

}  // namespace

tp::ParallelizePlan gpt_tensor_parallel_plan(const GPTPlanOptions& options,
                                             const GPTStageRange& range) {
  tp::ParallelizePlan plan;
  const bool has_blocks = range.end_block > range.first_block;
  for (auto& entry : whole_model_plan(options)) {
    const std::string& key = entry.first;
    const bool wanted = starts_with(key, "h.")              ? has_blocks
                        : key == "wte"                      ? range.first || range.last
                        : key == "wpe" || key == "drop"     ? range.first
                        : key == "ln_f" || key == "lm_head" ? range.last
                                                            : true;
    if (wanted) plan.push_back(std::move(entry));
  }
  return plan;
}

void parallelize_gpt(GPTStage& model, std::shared_ptr<const DeviceMesh> tp_mesh,
                     const GPTPlanOptions& options) {
  LOOM_CHECK(tp_mesh != nullptr && tp_mesh->ndim() == 1,
             "parallelize_gpt: expected a 1-D tp mesh, got {}", tp_mesh ? tp_mesh->str() : "null");
  const int64_t tp = tp_mesh->size(0);
  LOOM_CHECK(model.config().n_head % tp == 0,
             "parallelize_gpt: n_head={} is not divisible by the tp mesh size {}",
             model.config().n_head, tp);
  tp::parallelize_module(model, std::move(tp_mesh),
                         gpt_tensor_parallel_plan(options, model.range()));
}

}  // namespace loom::models
