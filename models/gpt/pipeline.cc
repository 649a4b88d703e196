#include "models/gpt/pipeline.h"

#include <fmt/format.h>

#include "autograd/grad_mode.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "nn/meta_init.h"
#include "tensor/ops.h"

namespace loom::models {

using pipeline::PipelineModel;
using pipeline::PipelineModelSpec;

namespace {

Tensor local_of(const Tensor& t) { return is_dtensor(t) ? local_shard(t) : t; }

const GPTStage& gpt_stage(const nn::Module& stage) { return dynamic_cast<const GPTStage&>(stage); }

// After each step: the tied embedding's two copies (wte on the first stage, the head's on the
// last) get the sum of their gradients, so they take identical optimizer steps and stay equal.
void sum_tied_embedding_gradients(PipelineModel& model) {
  const pipeline::Schedule& schedule = model.schedule();
  if (schedule.num_stages == 1) return;  // one module holds wte and the head: one parameter
  NoGradGuard no_grad;
  std::vector<Tensor> copies;  // this rank's copies' gradients (local shards), first stage's first
  for (const auto& stage : model.stages()) {
    if (gpt_stage(*stage).wte) copies.push_back(local_of(gpt_stage(*stage).wte->weight().grad()));
  }
  for (const Tensor& grad : copies) {
    LOOM_CHECK(grad.defined(), "GPTPipeline: the tied embedding has no gradient after the step");
  }
  if (copies.empty()) return;
  if (copies.size() == 2) {  // both ends of the pipeline on this rank (one pp rank, interleaved)
    ops::add_(copies[0], copies[1]);
    ops::copy_(copies[1], copies[0]);
    return;
  }
  // first + last on the first stage's rank, last + first on the last's: float addition of two
  // operands commutes, so both copies get the same bits.
  const DeviceMesh& pp_mesh = *model.meshes().pp;
  const bool holds_first = model.local_ranges().front().first;
  const int peer_coordinate = schedule.rank_of_stage(holds_first ? schedule.num_stages - 1 : 0);
  const int peer = pp_mesh.group_ranks_by_coordinate(0)[peer_coordinate];
  const auto& group = pp_mesh.group(0);
  const Tensor mine = ops::contiguous(ops::clone(copies[0]));
  Tensor theirs = ops::empty(mine.shape(), mine.dtype(), mine.device());
  // The first stage's rank sends first and the last's receives first: never two sends facing
  // each other, which would deadlock a transport whose sends wait for the receiver (NCCL).
  std::shared_ptr<comm::Work> sent;
  if (holds_first) sent = group->send(mine, peer);
  group->recv(theirs, peer)->wait();
  if (!holds_first) sent = group->send(mine, peer);
  sent->wait();
  ops::add_(copies[0], theirs);
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
  spec.after_step = sum_tied_embedding_gradients;
  spec.not_counted = [](const PipelineModel& model) {
    // The head's copy of wte: the first stage counts the (equal, summed) gradient.
    std::vector<Tensor> out;
    for (const auto& stage : model.stages()) {
      const GPTStage& gpt = gpt_stage(*stage);
      if (gpt.wte && gpt.range().last && !gpt.range().first) out.push_back(gpt.wte->weight());
    }
    return out;
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
