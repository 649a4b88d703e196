#include "models/gpt/pipeline.h"

#include <map>

#include "autograd/grad_mode.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "optim/clip_grad.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/pipeline/split.h"
#include "tensor/ops.h"

namespace loom::models {

namespace {

// Messages on the pp group carry no tag (NCCL has none): between two ranks they pair up in the
// order both issue them, which every exchange below fixes (stage order, parameter order).

std::vector<pipeline::LayerRange> stage_layers(const GPTConfig& config,
                                               const GPTPipelineOptions& options, int num_stages) {
  if (options.layers_per_stage.empty()) return pipeline::split_layers(config.n_layer, num_stages);
  LOOM_CHECK(static_cast<int>(options.layers_per_stage.size()) == num_stages,
             "GPTPipeline: the split gives {} stages' layer counts but the schedule has {} stages "
             "({} ranks x {} "
             "virtual stages)",
             options.layers_per_stage.size(), num_stages, num_stages / options.virtual_stages,
             options.virtual_stages);
  return pipeline::split_layers(config.n_layer, options.layers_per_stage);
}

Tensor local_of(const Tensor& t) { return is_dtensor(t) ? local_shard(t) : t; }

}  // namespace

GPTPipeline::GPTPipeline(const GPTConfig& config, uint64_t seed,
                         std::shared_ptr<const DeviceMesh> mesh, GPTPipelineOptions options)
    : mesh_(std::move(mesh)),
      sequence_parallel_(options.tp_plan.sequence_parallel && mesh_->size("tp") > 1),
      schedule_(pipeline::schedule_by_name(options.schedule, static_cast<int>(mesh_->size("pp")),
                                           options.microbatches, options.virtual_stages)) {
  const int num_stages = schedule_.num_stages;
  const auto layers = stage_layers(config, options, num_stages);
  for (int s = 0; s < num_stages; ++s) {
    ranges_.push_back(GPTStageRange{layers[s].begin, layers[s].end, s == 0, s == num_stages - 1});
  }
  const DeviceMesh pp_mesh = (*mesh_)["pp"];
  const auto tp_mesh = std::make_shared<const DeviceMesh>((*mesh_)["tp"]);
  const int pp_rank = static_cast<int>(mesh_->coordinate(mesh_->dim_index("pp")));
  std::vector<std::shared_ptr<pipeline::PipelineStage>> stages;
  for (int s : schedule_.stages_of_rank(pp_rank)) {
    auto module = std::make_shared<GPTStage>(config, seed, ranges_[s]);
    module->to(
        mesh_->device());  // the groups' device, before the TP plan and DDP take the parameters
    if (tp_mesh->size(0) > 1) parallelize_gpt(*module, tp_mesh, options.tp_plan);
    // Per stage: activations cross stage boundaries in output_dtype (f32), each stage computes in
    // param_dtype. Data parallelism (DDP or FSDP) synchronizes on the last microbatch only.
    auto data_parallel = std::make_shared<GPTDataParallel>(module, *mesh_, options.mixed_precision);
    data_parallels_.push_back(data_parallel);
    pipeline::StageOptions stage_options;
    stage_options.around_backward = [data_parallel](bool last_microbatch,
                                                    const std::function<void()>& run) {
      data_parallel->backward(last_microbatch, run);
    };
    modules_.push_back(module);
    stages.push_back(
        std::make_shared<pipeline::PipelineStage>(module, s, num_stages, pp_mesh, stage_options));
  }
  executor_ = std::make_unique<pipeline::PipelineExecutor>(
      schedule_, std::move(stages),
      [](const Tensor& logits, const Tensor& targets) { return gpt_loss(logits, targets); });
}

double GPTPipeline::step(const Tensor& inputs, const Tensor& targets) {
  const double loss = executor_->step(inputs, targets);
  sum_tied_embedding_gradients();
  return loss;
}

void GPTPipeline::zero_grad() {
  for (const auto& data_parallel : data_parallels_) data_parallel->zero_grad();
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

Tensor GPTPipeline::logits(const Tensor& ids) {
  NoGradGuard no_grad;
  const int num_stages = schedule_.num_stages;
  const int pp_dim = static_cast<int>(mesh_->dim_index("pp"));
  const int my_pp = static_cast<int>(mesh_->coordinate(pp_dim));
  const auto& group = mesh_->group(pp_dim);
  const auto group_rank = [&](int stage) {
    return mesh_->group_ranks_by_coordinate(pp_dim)[schedule_.rank_of_stage(stage)];
  };
  const GPTConfig& config = modules_.front()->config();
  // What crosses a stage boundary: the hidden states, this rank's sequence shard under sequence
  // parallelism (the length divides by tp, as in training).
  const Shape hidden{ids.size(0),
                     sequence_parallel_ ? ids.size(1) / mesh_->size("tp") : ids.size(1),
                     config.n_embd};
  Tensor x, logits;
  size_t local = 0;  // index into modules_ (this rank's stages, in order)
  for (int s = 0; s < num_stages; ++s) {
    if (schedule_.rank_of_stage(s) != my_pp) continue;
    Tensor input = ids;
    if (s > 0 && schedule_.rank_of_stage(s - 1) == my_pp) {
      input = x;
    } else if (s > 0) {
      input = ops::empty(hidden, kFloat32, group->device());
      group->recv(input, group_rank(s - 1))->wait();
    }
    x = (*modules_[local++])(input);
    if (s + 1 < num_stages && schedule_.rank_of_stage(s + 1) != my_pp) {
      group->send(ops::contiguous(x), group_rank(s + 1))->wait();
    }
    if (s + 1 == num_stages) logits = is_dtensor(x) ? full_tensor(x) : x;
  }
  if (!logits.defined())
    logits = ops::empty({ids.size(0), ids.size(1), config.vocab_size}, kFloat32, group->device());
  logits = ops::contiguous(logits);
  group->broadcast(logits, group_rank(num_stages - 1))->wait();
  return logits;
}

std::unique_ptr<GPT> GPTPipeline::whole_model_on_first_rank() {
  NoGradGuard no_grad;
  const int pp_dim = static_cast<int>(mesh_->dim_index("pp"));
  const int my_pp = static_cast<int>(mesh_->coordinate(pp_dim));
  bool on_first_line = true;  // dp and tp coordinates 0: the ranks that talk over pp
  for (int64_t d = 0; d < mesh_->ndim(); ++d)
    on_first_line = on_first_line && (d == pp_dim || mesh_->coordinate(d) == 0);
  const bool root = on_first_line && my_pp == 0;
  const GPTConfig& config = modules_.front()->config();
  std::unique_ptr<GPT> whole;
  std::map<std::string, Tensor> destination;
  if (root) {
    whole = std::make_unique<GPT>(config, /*seed=*/0);
    for (auto& [name, p] : whole->named_parameters()) destination.emplace(name, p);
  }
  const auto& group = mesh_->group(pp_dim);
  const auto group_rank = [&](int stage) {
    return mesh_->group_ranks_by_coordinate(pp_dim)[schedule_.rank_of_stage(stage)];
  };
  // Stage by stage, parameter by parameter, in an order every rank knows (sends and receives
  // between two ranks with one tag match in issue order). The last stage's copy of wte is left
  // out: the first stage's is the parameter.
  size_t local = 0;
  for (int s = 0; s < schedule_.num_stages; ++s) {
    const auto skip = [&](const std::string& name) { return s > 0 && name == "wte.weight"; };
    if (schedule_.rank_of_stage(s) == my_pp) {
      for (const auto& [name, p] : modules_[local]->named_parameters()) {
        if (skip(name)) continue;
        const Tensor full =
            ops::contiguous(is_dtensor(p) ? full_tensor(p) : p);  // every tp rank joins
        if (root) {
          ops::copy_(destination.at(name), full);
        } else if (on_first_line) {
          group->send(full, group_rank(0))->wait();
        }
      }
      ++local;
    } else if (root) {
      // The remote stage's names in its order: a stage of the same blocks, sized to nothing.
      const GPTStage names_only(GPTConfig{.n_layer = config.n_layer,
                                          .n_head = 1,
                                          .n_embd = 1,
                                          .block_size = 1,
                                          .vocab_size = 1},
                                0, ranges_[s]);
      for (const auto& [name, p] : names_only.named_parameters()) {
        if (skip(name)) continue;
        const Tensor& into =
            destination.at(name);  // on the CPU; the message arrives on the group's device
        const Tensor buffer = ops::empty(into.shape(), into.dtype(), group->device());
        group->recv(buffer, group_rank(s))->wait();
        ops::copy_(into, buffer);
      }
    }
  }
  return whole;
}

double GPTPipeline::clip_grad_norm(double max_norm) {
  optim::ClipOptions options;
  if (mesh_->size("pp") > 1) options.sum_over.push_back(mesh_->group("pp"));
  for (const auto& module : modules_) {
    // The head's copy of wte: the first stage counts the (equal, summed) gradient.
    if (module->wte && module->range().last && !module->range().first)
      options.not_counted.push_back(module->wte->weight());
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
