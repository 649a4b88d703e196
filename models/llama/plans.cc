#include "models/llama/plans.h"

#include <algorithm>

#include "autograd/functions.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "parallel/tp/gradient_regions.h"
#include "parallel/tp/parallelize.h"

namespace loom::models {

void parallelize_llama(LlamaStage& model, std::shared_ptr<const DeviceMesh> tp_mesh,
                       const LlamaPlanOptions& options) {
  LOOM_CHECK(tp_mesh != nullptr && tp_mesh->ndim() == 1,
             "parallelize_llama: needs a 1-D tensor-parallel mesh, got {}",
             tp_mesh ? tp_mesh->str() : "null");
  const LlamaConfig& config = model.config();
  const int64_t tp = tp_mesh->size(0);
  LOOM_CHECK(config.n_heads % tp == 0 && (config.mla || config.n_kv_heads % tp == 0),
             "parallelize_llama: tp {} must divide n_heads {} and n_kv_heads {} (each rank takes "
             "whole heads; replicating kv heads when tp > n_kv_heads is not supported yet)",
             tp, config.n_heads, config.n_kv_heads);
  using namespace tp;
  const bool sp = options.sequence_parallel;
  const Placement sequence = Shard(1);
  // Between blocks the residual stream is sequence shards (SP) or replicated.
  const Placement stream = sp ? sequence : Replicate();
  // A pipeline stage holds part of the model: its plan has the entries for what it holds (every
  // pattern of a plan must match).
  const StageRange& range = model.range();
  ParallelizePlan plan;
  const bool tied = model.config().tie_word_embeddings;
  // Sharded by vocabulary on the last stage too when the head reads it (tied).
  if (range.first || (range.last && tied)) {
    plan.push_back(
        {"tok_embeddings", std::make_shared<RowwiseParallel>(LayoutOptions{
                               .input_layouts = Replicate(), .output_layouts = stream})});
  }
  if (range.last && tied) {
    // The tied head's input becomes a Replicate DTensor, so h @ tok_embeddings^T (vocabulary
    // sharded) gives vocabulary-sharded logits for the loss-parallel cross entropy, as GPT's.
    plan.push_back({"output", std::make_shared<PrepareModuleInput>(PrepareInputOptions{
                                  stream, Replicate(), /*use_local_output=*/false})});
  } else if (range.last) {
    plan.push_back(
        {"output",
         std::make_shared<ColwiseParallel>(LayoutOptions{
             .input_layouts = stream, .output_layouts = Shard(-1), .use_local_output = false})});
  }
  if (range.last && sp) plan.push_back({"norm", std::make_shared<SequenceParallel>()});
  if (!range.has_blocks()) {
    parallelize_module(model, std::move(tp_mesh), plan);
    return;
  }
  bool dense = false, experts = false;  // which feed-forwards the stage's blocks have
  for (const auto& layer : model.layers) (layer->moe ? experts : dense) = true;
  // Attention splits heads over tp. Latent attention (MLA): its per-head projections (wq or wq_b,
  // wkv_b) colwise, wo rowwise; its low-rank ones (wq_a, wkv_a) and norms replicated, on the
  // gathered input as a plain tensor (the colwise projections sum their input gradients over tp);
  // the key's rotary part, shared by every head, through copy_to_tensor_parallel_region.
  ParallelizePlan blocks = {
      {"layers.*.attention.wo",
       std::make_shared<RowwiseParallel>(LayoutOptions{.output_layouts = stream})},
  };
  if (config.mla) {
    blocks.push_back(
        {config.mla->q_lora_rank > 0 ? "layers.*.attention.wq_b" : "layers.*.attention.wq",
         std::make_shared<ColwiseParallel>()});
    blocks.push_back({"layers.*.attention.wkv_b", std::make_shared<ColwiseParallel>()});
    for (const auto& layer : model.layers) {
      layer->latent_attention->set_shared_key_region(
          [tp_mesh](const Tensor& k) { return copy_to_tensor_parallel_region(k, tp_mesh); });
    }
  } else {
    for (const char* name :
         {"layers.*.attention.wq", "layers.*.attention.wk", "layers.*.attention.wv"}) {
      blocks.push_back({name, std::make_shared<ColwiseParallel>()});
    }
  }
  if (dense) {
    blocks.push_back({"layers.*.feed_forward.w1", std::make_shared<ColwiseParallel>()});
    blocks.push_back({"layers.*.feed_forward.w3", std::make_shared<ColwiseParallel>()});
    blocks.push_back({"layers.*.feed_forward.w2",
                      std::make_shared<RowwiseParallel>(LayoutOptions{.output_layouts = stream})});
  }
  plan.insert(plan.end(), blocks.begin(), blocks.end());
  if (sp) {
    const auto gather_once = std::make_shared<PrepareModuleInput>(PrepareInputOptions{
        sequence, Replicate(), /*use_local_output=*/false, options.regather_in_backward});
    for (const char* name : {"layers.*.attention_norm", "layers.*.ffn_norm"}) {
      plan.push_back({name, std::make_shared<SequenceParallel>()});
    }
    plan.push_back({"layers.*.attention",
                    config.mla ? std::make_shared<PrepareModuleInput>(PrepareInputOptions{
                                     sequence, Replicate(), /*use_local_output=*/true,
                                     options.regather_in_backward})
                               : gather_once});
    if (dense) plan.push_back({"layers.*.feed_forward", gather_once});
  }
  // A MoE layer routes the whole sequence on every tp rank (the router replicated). Under
  // sequence parallelism its input is gathered to a plain tensor and its output taken back to
  // this rank's sequence shard (plain, as the residual stream is between the TP styles).
  // Expert tensor parallelism: every expert's hidden width split over tp (w1, w3 rows; w2
  // columns), the partial outputs summed over tp.
  if (experts && options.expert_tensor_parallel) {
    for (const auto& layer : model.layers) {
      if (!layer->moe) continue;
      nn::GroupedExperts& e = *layer->moe->experts;
      const std::vector<std::pair<const char*, Placement>> splits = {
          {"w1", Shard(1)}, {"w3", Shard(1)}, {"w2", Shard(2)}};
      for (const auto& [name, placement] : splits) {
        Tensor split = distribute_tensor(detach(e.parameter(name)), tp_mesh, {placement},
                                         /*src_data_rank=*/std::nullopt);
        split.set_requires_grad(true);
        e.set_parameter(name, split);
      }
      e.set_weight_view([](const Tensor& w) { return is_dtensor(w) ? to_local(w) : w; });
      e.set_tensor_parallel_regions(
          [tp_mesh](const Tensor& x) { return copy_to_tensor_parallel_region(x, tp_mesh); },
          [tp_mesh](const Tensor& y) { return reduce_from_tensor_parallel_region(y, tp_mesh); });
    }
  }
  // The shared experts are a dense SwiGLU every token passes: split over tp as one, with or
  // without expert parallelism (which splits only the routed experts).
  if (std::any_of(model.layers.begin(), model.layers.end(),
                  [](const auto& l) { return l->moe && l->moe->shared_experts; })) {
    plan.push_back({"layers.*.moe.shared_experts.w1", std::make_shared<ColwiseParallel>()});
    plan.push_back({"layers.*.moe.shared_experts.w3", std::make_shared<ColwiseParallel>()});
    plan.push_back({"layers.*.moe.shared_experts.w2", std::make_shared<RowwiseParallel>()});
  }
  if (experts && sp) {
    plan.push_back({"layers.*.moe", std::make_shared<PrepareModuleInput>(PrepareInputOptions{
                                        sequence, Replicate(), /*use_local_output=*/true})});
    plan.push_back({"layers.*.moe", std::make_shared<PrepareModuleOutput>(PrepareOutputOptions{
                                        Replicate(), sequence, /*use_local_output=*/true})});
  }
  parallelize_module(model, std::move(tp_mesh), plan);
}

}  // namespace loom::models
