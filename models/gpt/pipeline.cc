#include "models/gpt/pipeline.h"

#include <climits>

#include "autograd/grad_mode.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "optim/clip_grad.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/pipeline/split.h"
#include "tensor/ops.h"

namespace loom::models {

namespace {

// Tag of the tied-embedding gradient exchange on the pp group: beyond any pipeline message's.
constexpr int kTiedEmbeddingTag = INT_MAX - 1;

std::vector<pipeline::LayerRange> stage_layers(const GPTConfig& config, const GPTPipelineOptions& options,
                                               int num_stages) {
  if (options.layers_per_stage.empty()) return pipeline::split_layers(config.n_layer, num_stages);
  LOOM_CHECK(static_cast<int>(options.layers_per_stage.size()) == num_stages,
             "GPTPipeline: the split gives {} stages' layer counts but the schedule has {} stages ({} ranks x {} "
             "virtual stages)",
             options.layers_per_stage.size(), num_stages, num_stages / options.virtual_stages, options.virtual_stages);
  return pipeline::split_layers(config.n_layer, options.layers_per_stage);
}

Tensor local_of(const Tensor& t) { return is_dtensor(t) ? local_shard(t) : t; }

}  // namespace

GPTPipeline::GPTPipeline(const GPTConfig& config, uint64_t seed, std::shared_ptr<const DeviceMesh> mesh,
                         GPTPipelineOptions options)
    : mesh_(std::move(mesh)),
      schedule_(pipeline::schedule_by_name(options.schedule, static_cast<int>(mesh_->size("pp")),
                                           options.microbatches, options.virtual_stages)) {
  const int num_stages = schedule_.num_stages;
  const auto ranges = stage_layers(config, options, num_stages);
  const DeviceMesh pp_mesh = (*mesh_)["pp"];
  const auto tp_mesh = std::make_shared<const DeviceMesh>((*mesh_)["tp"]);
  const int pp_rank = static_cast<int>(mesh_->coordinate(mesh_->dim_index("pp")));
  std::vector<std::shared_ptr<pipeline::PipelineStage>> stages;
  for (int s : schedule_.stages_of_rank(pp_rank)) {
    auto module = std::make_shared<GPTStage>(
        config, seed, GPTStageRange{ranges[s].begin, ranges[s].end, s == 0, s == num_stages - 1});
    if (tp_mesh->size(0) > 1) parallelize_gpt(*module, tp_mesh, options.tp_plan);
    pipeline::StageOptions stage_options;
    if (mesh_->size("dp") > 1) {
      auto ddp = std::make_shared<ddp::DistributedDataParallel>(module, mesh_->group("dp"));
      ddps_.push_back(ddp);
      stage_options.around_backward = [ddp](bool last_microbatch, const std::function<void()>& run) {
        if (last_microbatch) return run();
        auto guard = ddp->no_sync();
        run();
      };
    } else {
      ddps_.push_back(nullptr);
    }
    modules_.push_back(module);
    stages.push_back(std::make_shared<pipeline::PipelineStage>(module, s, num_stages, pp_mesh, stage_options));
  }
  executor_ = std::make_unique<pipeline::PipelineExecutor>(
      schedule_, std::move(stages), [](const Tensor& logits, const Tensor& targets) { return gpt_loss(logits, targets); });
}

double GPTPipeline::step(const Tensor& inputs, const Tensor& targets) {
  const double loss = executor_->step(inputs, targets);
  sum_tied_embedding_gradients();
  return loss;
}

void GPTPipeline::zero_grad() {
  for (size_t i = 0; i < modules_.size(); ++i) {
    if (ddps_[i]) {
      ddps_[i]->zero_grad();
    } else {
      modules_[i]->zero_grad();
    }
  }
}

void GPTPipeline::sum_tied_embedding_gradients() {
  if (schedule_.num_stages == 1) return;  // one module holds wte and the head: one parameter
  NoGradGuard no_grad;
  std::vector<Tensor> copies;  // this rank's copies' gradients (local shards), first stage's first
  for (const auto& module : modules_) {
    if (module->wte) copies.push_back(local_of(module->wte->weight().grad()));
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
  const bool holds_first = modules_.front()->range().first;
  const int pp_dim = static_cast<int>(mesh_->dim_index("pp"));
  const int peer_coordinate = schedule_.rank_of_stage(holds_first ? schedule_.num_stages - 1 : 0);
  const int peer = mesh_->group_ranks_by_coordinate(pp_dim)[peer_coordinate];
  const auto& group = mesh_->group(pp_dim);
  const Tensor mine = ops::contiguous(ops::clone(copies[0]));
  Tensor theirs = ops::empty(mine.shape(), mine.dtype());
  auto sent = group->send(mine, peer, kTiedEmbeddingTag);
  group->recv(theirs, peer, kTiedEmbeddingTag)->wait();
  sent->wait();
  ops::add_(copies[0], theirs);
}

double GPTPipeline::clip_grad_norm(double max_norm) {
  optim::ClipOptions options;
  if (mesh_->size("pp") > 1) options.sum_over.push_back(mesh_->group("pp"));
  for (const auto& module : modules_) {
    // The head's copy of wte: the first stage counts the (equal, summed) gradient.
    if (module->wte && module->range().last && !module->range().first) options.not_counted.push_back(module->wte->weight());
  }
  return optim::clip_grad_norm_(parameters(), max_norm, options);
}

std::vector<std::pair<std::string, Tensor>> GPTPipeline::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& module : modules_) {
    for (auto& entry : module->named_parameters()) out.push_back(std::move(entry));
  }
  return out;
}

std::vector<Tensor> GPTPipeline::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, p] : named_parameters()) out.push_back(p);
  return out;
}

}  // namespace loom::models
