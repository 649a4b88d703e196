#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>

#include "autograd/grad_mode.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "nn/batch_part.h"
#include "nn/layers.h"
#include "tensor/ops.h"
#include "train/router_stats.h"

namespace loom::train {

Trainer::Trainer(ParallelModel& model, std::shared_ptr<const DeviceMesh> mesh,
                 TrainerOptions options)
    : model_(model), mesh_(std::move(mesh)), options_(std::move(options)) {
  LOOM_CHECK(mesh_ != nullptr, "Trainer: the mesh is null");
  LOOM_CHECK(options_.lr != nullptr,
             "Trainer: TrainerOptions.lr (the learning-rate schedule) is "
             "required, e.g. an optim::WarmupCosine");
  std::vector<Tensor> decay, no_decay;
  for (const auto& [name, p] : model_.named_parameters()) {
    (p.dim() >= 2 ? decay : no_decay).push_back(p);
  }
  const auto adamw = [&](double weight_decay) {
    return optim::AdamWOptions{.lr = options_.lr(0),
                               .beta1 = options_.beta1,
                               .beta2 = options_.beta2,
                               .eps = options_.eps,
                               .weight_decay = weight_decay};
  };
  decay_ = std::make_unique<optim::AdamW>(decay, adamw(options_.weight_decay));
  no_decay_ = std::make_unique<optim::AdamW>(no_decay, adamw(0.0));
}

int64_t Trainer::reduce_over_replica_ranks(int64_t value, comm::ReduceOp op) const {
  if (!options_.replica_ranks || options_.replica_ranks->size() == 1) return value;
  const Tensor t = ops::from_vector_i64({value}, {1}, options_.replica_ranks->device());
  options_.replica_ranks->all_reduce(t, op)->wait();
  return ops::to(t, Device::cpu()).data<int64_t>()[0];
}

bool Trainer::replica_ranks_agree(bool ok) const {
  return reduce_over_replica_ranks(ok ? 1 : 0, comm::ReduceOp::kMin) == 1;
}

std::vector<Tensor> Trainer::local_gradients() const {
  std::vector<Tensor> grads;
  for (const auto& [name, p] : model_.named_parameters()) {
    const Tensor g = p.grad();
    if (g.defined()) grads.push_back(is_dtensor(g) ? local_shard(g) : g);
  }
  return grads;
}

void Trainer::begin_replica_step() {
  parallel::ft::Replicas& replicas = *options_.replicas;
  const auto agree = [this](bool ok) { return replica_ranks_agree(ok); };
  // The round after the latest decided one — the same on all this replica's ranks (each reads the
  // latest at its own moment: the latest of their readings).
  const auto next_round = [&] {
    return reduce_over_replica_ranks(replicas.next_round(), comm::ReduceOp::kMax);
  };
  int64_t round = next_round();
  for (int attempt = 0;; ++attempt) {
    const parallel::ft::StepQuorum q = replicas.start_round(round, attempt, next_step_);
    if (!q.member()) {  // that round was decided without it: the next one
      round = next_round();
      attempt = -1;
      continue;
    }
    // The members run the newest state among them: those behind get it first.
    if (q.needs_state_sync) {
      std::vector<std::function<void()>> after_load;
      checkpoint::StateDict state = state_dict(&after_load);
      std::vector<Tensor> locals;
      for (const auto& [name, t] : state.tensors) {
        locals.push_back(is_dtensor(t) ? local_shard(t) : t);
      }
      if (!replicas.sync_state(locals, agree)) continue;  // a member failed: the next attempt
      for (const auto& apply : after_load) apply();
    }
    next_step_ = static_cast<int>(q.step);
    replica_attempt_ = attempt;
    return;
  }
}

StepResult Trainer::replay_step(const std::vector<std::pair<Tensor, Tensor>>& member_batches,
                                const std::vector<int>& member_ids, int replicas) {
  LOOM_CHECK(!options_.replicas && !member_batches.empty(),
             "Trainer::replay_step: replays a replicas' step on one job (no replicas of its own) "
             "from at least one member's batch, got {} batches",
             member_batches.size());
  LOOM_CHECK(
      member_ids.empty() || (member_ids.size() == member_batches.size() &&
                             replicas > *std::max_element(member_ids.begin(), member_ids.end())),
      "Trainer::replay_step: {} member ids (the largest {}) for {} batches of {} replicas: "
      "give each batch its replica's id, below the replicas' count",
      member_ids.size(),
      member_ids.empty() ? -1 : *std::max_element(member_ids.begin(), member_ids.end()),
      member_batches.size(), replicas);
  const auto start = std::chrono::steady_clock::now();
  StepResult result = start_step_result();
  double local_loss = 0;
  // Each member's forward draws the dropout masks its replica drew: from the same call counts,
  // at its share's rows of the global batch (nn/batch_part.h).
  std::vector<nn::Module*> modules;
  for (const auto& [name, module] : model_.named_modules()) modules.push_back(module);
  const nn::DropoutCalls calls = nn::DropoutCalls::of(modules);
  for (size_t i = 0; i < member_batches.size(); ++i) {
    calls.restore();
    std::optional<nn::BatchPart> share;
    if (!member_ids.empty()) share.emplace(member_ids[i], replicas);
    const auto& [inputs, targets] = member_batches[i];
    local_loss += model_.forward_backward(inputs, targets);  // gradients accumulate
  }
  const double count = static_cast<double>(member_batches.size());
  if (member_batches.size() > 1) {
    NoGradGuard no_grad;
    // As the replicas' sum divided by their count.
    for (const Tensor& g : local_gradients()) ops::copy_(g, ops::div(g, count));
  }
  result.replicas = static_cast<int>(member_batches.size());
  return finish_step(result, local_loss / count, start);
}

int Trainer::average_over_replicas() {
  parallel::ft::Replicas& replicas = *options_.replicas;
  std::vector<Tensor> exchanged = local_gradients();
  // The MoE loads that move the expert biases travel with the gradients, so every replica moves
  // its biases by the whole step's load, as one job over all their ranks does.
  const std::vector<Tensor> loads = expert_loads(model_, mesh_->device());
  exchanged.insert(exchanged.end(), loads.begin(), loads.end());
  const auto agree = [this](bool ok) { return replica_ranks_agree(ok); };
  for (int attempt = replica_attempt_ + 1;; ++attempt) {
    if (replicas.average(exchanged, agree)) {
      const int members = static_cast<int>(replicas.quorum().members.size());
      set_replica_summed_loads(model_, loads, members);
      return members;
    }
    // A member failed during the average: again, among those that reach this attempt (every one
    // of them holds this step's state: the round's joiners got it before their gradients).
    const parallel::ft::StepQuorum& q =
        replicas.start_round(replicas.quorum().round, attempt, next_step_);
    LOOM_CHECK(q.member(),
               "replicas: replica {} was left out of round {}'s attempt {} (it reached it after "
               "the join window): the others ran step {} without it, and its state is no longer "
               "theirs; start it again to rejoin with their state",
               replicas.replica(), q.round, attempt, next_step_);
    LOOM_CHECK(q.step == next_step_ && !q.needs_state_sync,
               "replicas: round {} attempt {} decided step {} for members at step {}: a retry "
               "must keep the step its gradients are of",
               q.round, attempt, q.step, next_step_);
  }
}

int Trainer::begin_step() {
  if (step_begun_) return next_step_;
  if (options_.replicas) {
    // The quorum's wait is part of the step's time (so is cutting its batch, which must wait
    // for the step to be settled).
    step_start_ = std::chrono::steady_clock::now();
    begin_replica_step();
  }
  step_begun_ = true;
  return next_step_;
}

StepResult Trainer::start_step_result() {
  StepResult result{.step = next_step_, .lr = options_.lr(next_step_)};
  decay_->set_lr(result.lr);
  no_decay_->set_lr(result.lr);
  model_.zero_grad();
  return result;
}

StepResult Trainer::finish_step(StepResult& result, double local_loss,
                                std::chrono::steady_clock::time_point start) {
  result.grad_norm =
      model_.clip_grad_norm(options_.clip > 0 ? options_.clip : std::numeric_limits<double>::max());
  // The norm is the same on every rank (reduced over the whole mesh): all stop here together.
  LOOM_CHECK(std::isfinite(result.grad_norm),
             "step {}: the gradient norm is {} (this rank's loss {}): the loss or a gradient is "
             "not finite. The parameters were not updated and no checkpoint of this step is "
             "saved; resume (--resume) from a checkpoint saved before the loss rose (the latest "
             "may already hold weights grown too large) with a lower --lr or a --clip, or check "
             "the weights the job started from",
             result.step, std::fabs(result.grad_norm), local_loss);  // "nan", not "-nan"
  decay_->step();
  no_decay_->step();
  update_expert_biases(model_, *mesh_);  // MoE's auxiliary-loss-free balancing, when on
  result.loss = mean_over_data_parallel(local_loss);
  // Part of the step (not a hook's), so that `loom plan`'s traced step counts its collectives.
  if (model_.num_experts() > 0) result.router = take_router_summary(model_, *mesh_);
  result.ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ++next_step_;
  step_begun_ = false;
  if (options_.replicas) options_.replicas->commit();
  for (const StepHook& hook : hooks_) hook(result);
  return result;
}

StepResult Trainer::step(const Tensor& inputs, const Tensor& targets) {
  begin_step();
  const auto start = options_.replicas ? step_start_ : std::chrono::steady_clock::now();
  StepResult result = start_step_result();
  // With replicas this rank's batch is its replica's share's (local_batch's ReplicaShare): the
  // rows dropout places its masks at (nn/batch_part.h).
  std::optional<nn::BatchPart> share;
  if (options_.replicas) {
    share.emplace(options_.replicas->replica(), options_.replicas->max_replicas());
  }
  const double local_loss = model_.forward_backward(inputs, targets);
  share.reset();
  if (options_.replicas) {
    result.replicas = average_over_replicas();
    result.replica_members = options_.replicas->quorum().members;
  }
  return finish_step(result, local_loss, start);
}

checkpoint::StateDict Trainer::state_dict(std::vector<std::function<void()>>* after_load) {
  checkpoint::StateDict state;
  // The parameters in the order the constructor split them into the two AdamW groups.
  size_t decay_index = 0, no_decay_index = 0;
  for (const auto& [name, p] : model_.named_parameters()) {
    optim::AdamW& adamw = p.dim() >= 2 ? *decay_ : *no_decay_;
    const size_t i = p.dim() >= 2 ? decay_index++ : no_decay_index++;
    adamw.init_state();
    const std::vector<SavedEntry> keys = parameter_entries(name, p.shape(), p.dtype());
    state.tensors.emplace_back(keys[0].key, p);
    state.tensors.emplace_back(keys[1].key, adamw.exp_avg(i));
    state.tensors.emplace_back(keys[2].key, adamw.exp_avg_sq(i));
    const Tensor step = ops::from_vector_i64({adamw.step_count(i)}, {1});
    state.tensors.emplace_back(keys[3].key, step);
    if (after_load) {
      after_load->push_back([&adamw, i, step] { adamw.step_count(i) = step.data<int64_t>()[0]; });
    }
  }
  for (const auto& [name, module] : model_.named_modules()) {
    // A MoE's routing bias (a buffer the optimizer does not own) resumes with the run.
    if (auto* moe = dynamic_cast<nn::MoE*>(module)) {
      state.tensors.emplace_back(expert_bias_key(name), moe->expert_bias());
      continue;
    }
    auto* dropout = dynamic_cast<nn::Dropout*>(module);
    if (!dropout) continue;
    const Tensor calls = ops::from_vector_i64({static_cast<int64_t>(dropout->calls())}, {1});
    state.tensors.emplace_back(dropout_state_key(name), calls);
    // A checkpoint without it (saved without this module): its count stays 0, a fresh stream.
    state.optional.insert(dropout_state_key(name));
    if (after_load) {
      after_load->push_back([dropout, calls] {
        dropout->set_calls(static_cast<uint64_t>(calls.data<int64_t>()[0]));
      });
    }
  }
  state.extra["trainer"] = {{"step", next_step_}};
  return state;
}

checkpoint::StateDict Trainer::checkpoint_state(nlohmann::json extra) {
  checkpoint::StateDict state = state_dict(nullptr);
  for (auto& [key, value] : extra.items()) state.extra[key] = value;
  return state;
}

std::string Trainer::save_checkpoint(const std::string& root, comm::ProcessGroup& world,
                                     nlohmann::json extra, const checkpoint::SaveOptions& options) {
  return checkpoint::save(checkpoint_state(std::move(extra)), root, next_step_, world, options);
}

checkpoint::Metadata Trainer::load_checkpoint(const std::string& directory,
                                              comm::ProcessGroup& world) {
  std::vector<std::function<void()>> after_load;
  checkpoint::StateDict state = state_dict(&after_load);
  checkpoint::Metadata metadata = checkpoint::load(state, directory, &world);
  for (const auto& apply : after_load) apply();
  next_step_ = static_cast<int>(saved_step(metadata, directory));
  return metadata;
}

std::string Trainer::expert_bias_key(const std::string& module) {
  return "moe/" + module + "/expert_bias";
}

std::string Trainer::dropout_state_key(const std::string& module) {
  return "rng/" + module + "/calls";
}

std::vector<Trainer::SavedEntry> Trainer::module_entries(nn::Module& model) {
  std::vector<SavedEntry> entries;
  for (const auto& [name, module] : model.named_modules()) {
    if (auto* moe = dynamic_cast<nn::MoE*>(module)) {
      entries.push_back(
          {expert_bias_key(name), moe->expert_bias().shape(), moe->expert_bias().dtype()});
    } else if (dynamic_cast<nn::Dropout*>(module) != nullptr) {
      entries.push_back({dropout_state_key(name), Shape{1}, kInt64, /*optional=*/true});
    }
  }
  return entries;
}

std::vector<Trainer::SavedEntry> Trainer::parameter_entries(const std::string& name,
                                                            const Shape& shape, DType dtype) {
  // AdamW keeps its moments in the parameter's dtype (the f32 masters under mixed precision).
  return {{"model/" + name, shape, dtype},
          {"optim/" + name + "/exp_avg", shape, dtype},
          {"optim/" + name + "/exp_avg_sq", shape, dtype},
          {"optim/" + name + "/step", Shape{1}, kInt64}};
}

int64_t Trainer::saved_step(const checkpoint::Metadata& metadata, const std::string& directory) {
  const auto trainer = metadata.extra.find("trainer");
  LOOM_CHECK(trainer != metadata.extra.end() && trainer->is_object() && trainer->contains("step") &&
                 trainer->at("step").is_number_integer(),
             "checkpoint '{}' has no trainer step in its metadata (extra.trainer.step); it was "
             "not saved by Trainer::save_checkpoint",
             directory);
  const int64_t step = trainer->at("step").get<int64_t>();
  LOOM_CHECK(step == metadata.step,
             "checkpoint '{}' records {} steps done (extra.trainer.step) but was saved as step {} "
             "(its metadata's step, marker and name): its metadata was edited; restore it, or "
             "resume from another step",
             directory, step, metadata.step);
  return step;
}

double Trainer::mean_over_data_parallel(double local_loss) const {
  // The global batch's loss: the mean over dp (dp_shard, then dp_replicate: equal groups, so the
  // mean of means) of each data-parallel rank's mean.
  Tensor loss = ops::full({1}, local_loss, kFloat32, mesh_->device());
  for (const auto& group : data_parallel_groups(*mesh_)) {
    group->all_reduce(loss, comm::ReduceOp::kAvg)->wait();
  }
  return loss.item<double>();
}

double Trainer::evaluate(const Tensor& inputs, const Tensor& targets) {
  // Dropout draws masks in training mode; evaluation is the model's deterministic function of
  // its input, as torch's model.eval(). The modules' call counts stay as they were.
  double local = 0;
  {
    const EvalMode eval(model_);
    local = model_.evaluate(inputs, targets);
  }
  return mean_over_data_parallel(local);
}

void Trainer::add_step_hook(StepHook hook) {
  LOOM_CHECK(hook != nullptr, "Trainer::add_step_hook: the hook is empty");
  hooks_.push_back(std::move(hook));
}

namespace {

// This rank's tokens of its sequences (its cp chunks: parallel/cp/sequence_layout.h), on the
// mesh's device.
data::Batch on_rank(data::Batch batch, const DeviceMesh& mesh, int64_t seq_len,
                    const parallel::cp::ContextParallelOptions& cp) {
  if (context_parallel_size(mesh) > 1) {
    const parallel::cp::SequenceLayout layout{.cp = context_parallel_size(mesh),
                                              .rank = context_parallel_rank(mesh),
                                              .seq_len = seq_len,
                                              .load_balance = cp.load_balance};
    layout.check("local_batch: --seq-len");
    batch = {ops::contiguous(layout.shard(batch.inputs, 1)),
             ops::contiguous(layout.shard(batch.targets, 1))};
  }
  const Device device = mesh.device();
  return {ops::to(batch.inputs, device), ops::to(batch.targets, device)};
}

}  // namespace

data::Batch local_batch(const data::TokenCorpus& data, uint64_t seed, int step,
                        const DeviceMesh& mesh, int64_t global_batch, int64_t seq_len,
                        const parallel::cp::ContextParallelOptions& cp, ReplicaShare replica) {
  const int64_t dp = data_parallel_size(mesh) * replica.count;
  LOOM_CHECK(global_batch % dp == 0,
             "local_batch: a global batch of {} sequences does not split over dp {}{}",
             global_batch, dp,
             replica.count > 1
                 ? fmt::format(" ({} replicas x dp {})", replica.count, data_parallel_size(mesh))
                 : std::string());
  const int64_t per_rank = global_batch / dp;
  const int64_t dp_rank = replica.index * data_parallel_size(mesh) + data_parallel_rank(mesh);
  return on_rank(data::batch_slice(data, seed, step, dp_rank * per_rank, per_rank, seq_len), mesh,
                 seq_len, cp);
}

data::Batch validation_batch(const data::TokenCorpus& data, int64_t index, const DeviceMesh& mesh,
                             int64_t global_batch, int64_t seq_len,
                             const parallel::cp::ContextParallelOptions& cp) {
  const int64_t per_rank = global_batch / data_parallel_size(mesh);
  const int64_t dp_rank = data_parallel_rank(mesh);
  return on_rank(
      data::validation_slice(data, index, global_batch, dp_rank * per_rank, per_rank, seq_len),
      mesh, seq_len, cp);
}

}  // namespace loom::train
