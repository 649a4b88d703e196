#include "parallel/pipeline/pipeline_model.h"

#include <algorithm>
#include <map>
#include <set>

#include "autograd/grad_mode.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "optim/clip_grad.h"
#include "parallel/pipeline/p2p.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/pipeline/split.h"
#include "tensor/ops.h"

namespace loom::pipeline {

namespace {

// Messages on the pp group carry no tag (NCCL has none): between two ranks they pair up in the
// order both issue them, which every exchange below fixes (stage order, parameter order).

std::vector<LayerRange> stage_layers(const PipelineModelSpec& spec, const ScheduleOptions& options,
                                     int num_stages) {
  if (options.layers_per_stage.empty()) return split_layers(spec.n_layers, num_stages);
  LOOM_CHECK(static_cast<int>(options.layers_per_stage.size()) == num_stages,
             "{}: the split gives {} stages' layer counts but the schedule has {} stages ({} "
             "ranks x {} virtual stages)",
             spec.name, options.layers_per_stage.size(), num_stages,
             num_stages / options.stages_per_rank(), options.stages_per_rank());
  return split_layers(spec.n_layers, options.layers_per_stage);
}

void check_spec(const PipelineModelSpec& spec) {
  LOOM_CHECK(
      spec.make_stage && spec.parallelize && spec.blocks && spec.loss && spec.parameter_names,
      "{}: the PipelineModelSpec lacks a function (make_stage, parallelize, blocks, loss "
      "and parameter_names are all needed)",
      spec.name.empty() ? "PipelineModel" : spec.name);
  LOOM_CHECK(spec.n_layers >= 1 && spec.hidden_size >= 1 && spec.vocab_size >= 1,
             "{}: n_layers, hidden_size and vocab_size must be positive, got {}, {} and {}",
             spec.name, spec.n_layers, spec.hidden_size, spec.vocab_size);
}

}  // namespace

PipelineModel::PipelineModel(PipelineModelSpec spec, const parallel::ParallelMeshes& meshes,
                             PipelineModelOptions options)
    : spec_((check_spec(spec), std::move(spec))),
      meshes_(meshes),
      schedule_(schedule_by_name(options.schedule.schedule, static_cast<int>(meshes_.pp->size(0)),
                                 options.schedule.microbatches_for(meshes_.pp->size(0)),
                                 options.schedule.virtual_stages)) {
  const int num_stages = schedule_.num_stages;
  const auto layers = stage_layers(spec_, options.schedule, num_stages);
  for (int s = 0; s < num_stages; ++s) {
    ranges_.push_back(StageRange{layers[s].begin, layers[s].end, s == 0, s == num_stages - 1});
  }
  const DeviceMesh& pp_mesh = *meshes_.pp;
  const int pp_rank = static_cast<int>(pp_mesh.coordinate(0));
  std::vector<std::shared_ptr<PipelineStage>> stages;
  for (int s : schedule_.stages_of_rank(pp_rank)) {
    // Per stage: activations cross stage boundaries in output_dtype (f32), each stage computes in
    // param_dtype. Data parallelism (DDP or FSDP) synchronizes on the last microbatch only.
    const StageRange range = ranges_[s];
    parallel::BuiltStage built =
        parallel::build_stage({.make = [&] { return spec_.make_stage(range); },
                               .blocks = spec_.blocks,
                               .parallelize = spec_.parallelize},
                              meshes_,
                              {.activation_checkpoint = options.activation_checkpoint,
                               .first_block = range.first_block,
                               .mixed_precision = options.mixed_precision,
                               .meta_init = options.meta_init});
    std::shared_ptr<nn::Module> module = built.module;
    std::shared_ptr<parallel::DataParallel> data_parallel = built.data_parallel;
    data_parallels_.push_back(data_parallel);
    StageOptions stage_options;
    stage_options.placement = schedule_.placement;
    stage_options.around_backward = [data_parallel](bool last_microbatch,
                                                    const std::function<void()>& run) {
      data_parallel->backward(last_microbatch, run);
    };
    local_stages_.push_back(s);
    modules_.push_back(module);
    stages.push_back(
        std::make_shared<PipelineStage>(module, s, num_stages, pp_mesh, stage_options));
  }
  executor_ = std::make_unique<PipelineExecutor>(schedule_, std::move(stages), spec_.loss);
}

double PipelineModel::step(const Tensor& inputs, const Tensor& targets) {
  return step(inputs, targets, PipelineExecutor::StepOptions{});
}

double PipelineModel::step(const Tensor& inputs, const Tensor& targets,
                           PipelineExecutor::StepOptions options) {
  const double loss = executor_->step(inputs, targets, options);
  // Summing tied copies' gradients (after_step) once, on the accumulated gradients.
  if (options.sync_gradients && spec_.after_step) spec_.after_step(*this);
  return loss;
}

void PipelineModel::zero_grad() {
  for (const auto& data_parallel : data_parallels_) data_parallel->zero_grad();
}

int PipelineModel::group_rank_of_stage(int stage) const {
  return meshes_.pp->group_ranks_by_coordinate(0)[schedule_.rank_of_stage(stage)];
}

Tensor PipelineModel::forward_stages(const Tensor& ids) {
  const int num_stages = schedule_.num_stages;
  const int my_pp = static_cast<int>(meshes_.pp->coordinate(0));
  const auto& group = meshes_.pp->group(0);
  Tensor x, logits;
  size_t local = 0;  // index into modules_ (this rank's stages, in order)
  for (int s = 0; s < num_stages; ++s) {
    if (schedule_.rank_of_stage(s) != my_pp) continue;
    Tensor input = ids;
    if (s > 0 && schedule_.rank_of_stage(s - 1) == my_pp) {
      input = x;
    } else if (s > 0) {
      // The hidden states' shape and dtype first, as a training step sends them (p2p.h): the
      // dtype is the mixed-precision policy's (bf16 activations cross boundaries under bf16),
      // the length this rank's sequence shard under sequence parallelism.
      const int peer = group_rank_of_stage(s - 1);
      Tensor metadata = ops::empty({detail::kMetaElements}, kInt64, group->device());
      group->recv(metadata, peer)->wait();
      const detail::BoundaryShape boundary = detail::decode_metadata(metadata);
      input = ops::empty(boundary.shape, boundary.dtype, group->device());
      group->recv(input, peer)->wait();
    }
    x = (*modules_[local++])(input);
    if (s + 1 < num_stages && schedule_.rank_of_stage(s + 1) != my_pp) {
      const Tensor payload = ops::contiguous(x);
      const int peer = group_rank_of_stage(s + 1);
      group->send(detail::encode_metadata(payload, group->device()), peer)->wait();
      group->send(payload, peer)->wait();
    }
    if (s + 1 == num_stages) logits = x;
  }
  return logits;
}

Tensor PipelineModel::logits(const Tensor& ids) {
  NoGradGuard no_grad;
  const int num_stages = schedule_.num_stages;
  const auto& group = meshes_.pp->group(0);
  Tensor logits = forward_stages(ids);
  if (logits.defined() && is_dtensor(logits)) logits = full_tensor(logits);  // vocab-sharded
  if (!logits.defined()) {
    logits = ops::empty({ids.size(0), ids.size(1), spec_.vocab_size}, kFloat32, group->device());
  }
  // f32 on every rank, whatever dtype the last stage computed in (bf16 under a bf16 policy):
  // the other ranks receive into the buffer above.
  logits = ops::contiguous(ops::to(logits, kFloat32));
  group->broadcast(logits, group_rank_of_stage(num_stages - 1))->wait();
  return logits;
}

double PipelineModel::evaluate(const Tensor& inputs, const Tensor& targets) {
  NoGradGuard no_grad;
  const int64_t microbatches = schedule_.num_microbatches;
  LOOM_CHECK(inputs.size(0) % microbatches == 0,
             "PipelineModel::evaluate: {} sequences do not split into {} microbatches",
             inputs.size(0), microbatches);
  const int64_t per = inputs.size(0) / microbatches;
  double total = 0;
  for (int64_t m = 0; m < microbatches; ++m) {
    const Tensor out = forward_stages(ops::narrow(inputs, 0, m * per, per));
    if (out.defined())
      total += spec_.loss(out, ops::narrow(targets, 0, m * per, per)).item<double>();
  }
  // The last stage's mean over the microbatches, on every pp rank.
  Tensor loss = ops::full({1}, total / static_cast<double>(microbatches), kFloat32,
                          meshes_.pp->group(0)->device());
  meshes_.pp->group(0)->broadcast(loss, group_rank_of_stage(schedule_.num_stages - 1))->wait();
  return loss.item<double>();
}

bool PipelineModel::on_first_rank() const {
  const DeviceMesh& mesh = *meshes_.mesh;
  for (int64_t d = 0; d < mesh.ndim(); ++d) {
    if (mesh.coordinate(d) != 0) return false;
  }
  return true;
}

void PipelineModel::gather_whole(nn::Module* whole) {
  NoGradGuard no_grad;
  const int my_pp = static_cast<int>(meshes_.pp->coordinate(0));
  // The ranks that talk over pp: the pp line through the mesh's first rank (coordinate 0 on every
  // other dim).
  const std::vector<int>& line = meshes_.pp->ranks();
  const bool on_first_line =
      std::find(line.begin(), line.end(), meshes_.mesh->ranks().front()) != line.end();
  const bool root = on_first_line && my_pp == 0;
  LOOM_CHECK(root == (whole != nullptr),
             "{}: gather_whole takes the whole model on the mesh's first rank and null on every "
             "other (this rank is {} the first, and was given {})",
             spec_.name, root ? "" : "not", whole ? "a model" : "null");
  std::map<std::string, Tensor> destination;
  if (root) {
    for (auto& [name, t] : whole->state_dict()) destination.emplace(name, t);
  }
  // Which stage each name comes from: the earliest that holds it (every rank computes the same),
  // in each stage's parameter order, then its buffers'.
  std::set<std::string> taken;
  std::vector<std::vector<std::string>> sent_by(schedule_.num_stages);
  for (int s = 0; s < schedule_.num_stages; ++s) {
    std::vector<std::string> names = spec_.parameter_names(ranges_[s]);
    if (spec_.buffer_names) {
      for (std::string& name : spec_.buffer_names(ranges_[s])) names.push_back(std::move(name));
    }
    for (const std::string& name : names) {
      if (taken.insert(name).second) sent_by[s].push_back(name);
    }
  }
  const auto& group = meshes_.pp->group(0);
  // Stage by stage, parameter by parameter, in an order every rank knows (sends and receives
  // between two ranks pair up in issue order).
  size_t local = 0;
  for (int s = 0; s < schedule_.num_stages; ++s) {
    if (schedule_.rank_of_stage(s) == my_pp) {
      const nn::StateDict held = modules_[local]->state_dict();
      for (const std::string& name : sent_by[s]) {
        const auto found = held.find(name);
        LOOM_CHECK(found != held.end(), "{}: stage {} does not hold '{}', which its spec names",
                   spec_.name, s, name);
        const Tensor& p = found->second;
        // Every tp (and dp_shard) rank joins the gather.
        const Tensor full = ops::contiguous(is_dtensor(p) ? full_tensor(p) : p);
        if (root) {
          const auto into = destination.find(name);
          LOOM_CHECK(into != destination.end(),
                     "{}: stage {} holds '{}', which the whole model does not have", spec_.name, s,
                     name);
          ops::copy_(into->second, full);
        } else if (on_first_line) {
          group->send(full, group_rank_of_stage(0))->wait();
        }
      }
      ++local;
    } else if (root) {
      for (const std::string& name : sent_by[s]) {
        const auto into = destination.find(name);
        LOOM_CHECK(into != destination.end(),
                   "{}: stage {} holds '{}', which the whole model does not have", spec_.name, s,
                   name);
        // The whole model is on the CPU; the message arrives on the group's device.
        const Tensor buffer =
            ops::empty(into->second.shape(), into->second.dtype(), group->device());
        group->recv(buffer, group_rank_of_stage(s))->wait();
        ops::copy_(into->second, buffer);
      }
    }
  }
}

double PipelineModel::clip_grad_norm(double max_norm) {
  optim::ClipOptions options;
  if (meshes_.pp->size(0) > 1) options.sum_over.push_back(meshes_.pp->group(0));
  if (spec_.not_counted) options.not_counted = spec_.not_counted(*this);
  return optim::clip_grad_norm_(parameters(), max_norm, options);
}

std::vector<std::pair<std::string, Tensor>> PipelineModel::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& module : modules_) {
    for (auto& entry : module->named_parameters()) out.push_back(std::move(entry));
  }
  return out;
}

std::vector<Tensor> PipelineModel::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, p] : named_parameters()) out.push_back(p);
  return out;
}

std::vector<StageRange> PipelineModel::local_ranges() const {
  std::vector<StageRange> out;
  for (int s : local_stages_) out.push_back(ranges_[s]);
  return out;
}

}  // namespace loom::pipeline
