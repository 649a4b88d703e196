#include "models/llama/plans.h"

#include "base/error.h"
#include "parallel/tp/parallelize.h"

namespace loom::models {

void parallelize_llama(LlamaStage& model, std::shared_ptr<const DeviceMesh> tp_mesh,
                       const LlamaPlanOptions& options) {
  LOOM_CHECK(tp_mesh != nullptr && tp_mesh->ndim() == 1,
             "parallelize_llama: needs a 1-D tensor-parallel mesh, got {}",
             tp_mesh ? tp_mesh->str() : "null");
  const LlamaConfig& config = model.config();
  const int64_t tp = tp_mesh->size(0);
  LOOM_CHECK(config.mla || (config.n_heads % tp == 0 && config.n_kv_heads % tp == 0),
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
  if (range.first) {
    plan.push_back(
        {"tok_embeddings", std::make_shared<RowwiseParallel>(LayoutOptions{
                               .input_layouts = Replicate(), .output_layouts = stream})});
  }
  if (range.last) {
    plan.push_back(
        {"output",
         std::make_shared<ColwiseParallel>(LayoutOptions{
             .input_layouts = stream, .output_layouts = Shard(-1), .use_local_output = false})});
    if (sp) plan.push_back({"norm", std::make_shared<SequenceParallel>()});
  }
  if (!range.has_blocks()) {
    parallelize_module(model, std::move(tp_mesh), plan);
    return;
  }
  bool dense = false, experts = false;  // which feed-forwards the stage's blocks have
  for (const auto& layer : model.layers) (layer->moe ? experts : dense) = true;
  // Grouped-query attention splits heads over tp. Latent attention (MLA) is replicated over tp
  // for now, as a MoE layer is: every head's key shares one rotary part computed from the
  // replicated latent, whose gradient would need a sum over tp's heads that plain tensors do
  // not carry.
  ParallelizePlan blocks;
  if (!config.mla) {
    for (const char* name :
         {"layers.*.attention.wq", "layers.*.attention.wk", "layers.*.attention.wv"}) {
      blocks.push_back({name, std::make_shared<ColwiseParallel>()});
    }
    blocks.push_back({"layers.*.attention.wo",
                      std::make_shared<RowwiseParallel>(LayoutOptions{.output_layouts = stream})});
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
    if (!config.mla) plan.push_back({"layers.*.attention", gather_once});
    if (dense) plan.push_back({"layers.*.feed_forward", gather_once});
  }
  // A MoE layer is replicated over tp: every tp rank routes the whole sequence and runs every
  // expert it holds (expert parallelism splits them over ep, not tp). Under sequence parallelism
  // its input is gathered to a plain tensor and its output taken back to this rank's sequence
  // shard (plain, as the residual stream is between the TP styles).
  if (config.mla && sp) {  // replicated: the gathered sequence in, this rank's shard out
    plan.push_back({"layers.*.attention", std::make_shared<PrepareModuleInput>(PrepareInputOptions{
                                              sequence, Replicate(), /*use_local_output=*/true})});
    plan.push_back(
        {"layers.*.attention", std::make_shared<PrepareModuleOutput>(PrepareOutputOptions{
                                   Replicate(), sequence, /*use_local_output=*/true})});
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
