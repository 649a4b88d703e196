// The training step driver every job uses: one optimizer step of a ParallelModel.
//
// Trainer::step(inputs, targets) on this dp rank's batch:
//   1. zero the gradients;
//   2. forward and backward (gradient accumulation or the pipeline schedule: the model knows);
//   3. clip the global gradient norm, over every dim of the mesh; a norm that is not finite (a NaN
//      or infinite loss, or weights already NaN) throws on every rank alike, before the update
//      (Megatron's check_for_nan_in_loss_and_grad), so no parameter or checkpoint turns NaN;
//   4. AdamW at the schedule's learning rate: decoupled weight decay on matrices (dim >= 2)
//      only, none on biases, norms' weights and other vectors (nanoGPT's and torchtitan's
//      grouping);
//   5. the loss averaged over dp (the global batch's mean loss, the same on every rank), and a
//      mixture of experts' router statistics over the global batch;
// then runs the step hooks (metrics, checkpoints) with the step's figures.
//
// Batches are a pure function of (data, seed, step): local_batch() cuts this dp rank's share of
// the global batch, so changing only the layout leaves the math unchanged.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "checkpoint/distributed_checkpoint.h"
#include "data/token_data.h"
#include "mesh/device_mesh.h"
#include "optim/optimizer.h"
#include "parallel/cp/context_parallel.h"
#include "parallel/cp/sequence_layout.h"
#include "parallel/ft/replicas.h"
#include "train/parallel_model.h"
#include "train/router_stats.h"

namespace loom::train {

struct TrainerOptions {
  // Learning rate of step `step` (e.g. an optim::WarmupCosine); required.
  std::function<double(int step)> lr;
  double weight_decay = 0.1;                      // on matrices only
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // torch.optim.AdamW's defaults
  double clip = 1.0;  // max global gradient norm; <= 0: no clipping (the norm is still reported)
  // Fault tolerance across replicas (parallel/ft/replica_group.h; CPU ranks): before each step its
  // quorum — a replica behind (one that joins) first gets the whole training state from a member
  // —, after backward the gradients averaged over the step's members (the step retried without
  // one that fails meanwhile). None: no replicas beyond this job.
  std::shared_ptr<parallel::ft::Replicas> replicas;
  // With replicas of several ranks: this replica's ranks (its job's world), which settle each
  // exchange with the others alike (Replicas::Agreement). None: a replica of one rank.
  std::shared_ptr<comm::ProcessGroup> replica_ranks;
};

struct StepResult {
  int step = 0;
  double loss = 0;       // the global batch's mean loss
  double grad_norm = 0;  // before clipping
  double lr = 0;
  double ms = 0;     // wall time of the step on this rank
  int replicas = 1;  // with TrainerOptions::replicas: the replicas the step's gradient averaged
  std::vector<int> replica_members;  // ... and which (ascending)
  // A mixture of experts' routers over the step's global batch (train/router_stats.h), taken by
  // every rank after the optimizer step; none for a dense model.
  std::optional<RouterSummary> router;
};

class Trainer {
 public:
  using StepHook = std::function<void(const StepResult&)>;

  // Collective over `mesh` in step(): every rank constructs its Trainer and steps together.
  Trainer(ParallelModel& model, std::shared_ptr<const DeviceMesh> mesh, TrainerOptions options);

  // One optimizer step on this dp rank's batch (B, T), on the mesh's device. Steps count from 0.
  // The batch is local_batch's cut: with replicas, share replica() of max_replicas() of the
  // global batch, then this dp rank's share of that (where dropout places its masks).
  StepResult step(const Tensor& inputs, const Tensor& targets);
  // The reference for replicas: one step whose gradient is the mean of the gradients of
  // `member_batches` (each a replica's share, in member order) — what replicas that took part
  // with those batches average to, computed here on one job (each share's backward accumulated,
  // then scaled by 1 / their count). No TrainerOptions::replicas. `member_ids` (optional, one
  // per batch) and `replicas` say whose share each batch is (ReplicaShare{id, replicas}), so
  // dropout draws the masks each replica drew.
  StepResult replay_step(const std::vector<std::pair<Tensor, Tensor>>& member_batches,
                         const std::vector<int>& member_ids = {}, int replicas = 0);
  // The step the next step() runs, which with replicas is settled first — its quorum, and for a
  // replica that joins the state and step count of the running job — so call it before cutting
  // the step's batch (step() calls it when the caller did not).
  int begin_step();
  // Called after every step, in the order added (all ranks run them; hooks decide who writes).
  void add_step_hook(StepHook hook);
  // Validation: the mean loss over the global batch whose dp-rank share is (inputs, targets),
  // forward only (ParallelModel::evaluate), averaged over dp as step()'s loss is: the same on
  // every rank. Changes no state (parameters, optimizer, step count, dropout's call counts).
  double evaluate(const Tensor& inputs, const Tensor& targets);
  int steps_done() const { return next_step_; }

  // Checkpoints (checkpoint/distributed_checkpoint.h) of the whole training state:
  //   model/<param>                    the parameters as the model holds them (DTensors: shards)
  //   optim/<param>/exp_avg, .../exp_avg_sq   AdamW's moments, laid out as their parameter
  //   optim/<param>/step               its step count (i64, (1))
  //   rng/<module>/calls               each dropout's mask count (i64, (1)): its RNG state
  // and extra["trainer"]["step"], the steps done: the LR schedule's position and the data
  // position (batches are a pure function of the step). A resumed run's losses are therefore
  // bit-identical to an uninterrupted run's on the same layout.
  // save_checkpoint: collective over `world`; saves as step steps_done() under `root`, with
  // `extra` (the job's fields) beside the trainer's.
  std::string save_checkpoint(const std::string& root, comm::ProcessGroup& world,
                              nlohmann::json extra = nlohmann::json::object(),
                              const checkpoint::SaveOptions& options = {});
  // The state save_checkpoint saves (its tensors are the live ones: stage or save it before the
  // next step), for checkpoint::AsyncSaver.
  checkpoint::StateDict checkpoint_state(nlohmann::json extra = nlohmann::json::object());
  // Loads a committed step directory, saved on any layout, and continues from its step; every
  // rank of `world` calls it. Returns the metadata (extra: the job's fields). A dropout module
  // whose state the checkpoint lacks (a model saved without attention dropout has no such module)
  // starts its mask stream afresh, as a new module would (the job's resume check warns, naming
  // them).
  checkpoint::Metadata load_checkpoint(const std::string& directory, comm::ProcessGroup& world);
  // A dropout module's state in a checkpoint: "rng/<module>/calls", its masks drawn so far.
  static std::string dropout_state_key(const std::string& module);
  // A MoE's routing bias in a checkpoint: "moe/<module>/expert_bias".
  static std::string expert_bias_key(const std::string& module);
  // The steps done that a checkpoint's metadata records (extra["trainer"]["step"]), checked
  // against the step the save was made as (metadata.step, its folder's name): throws naming
  // `directory` when it is missing or differs (the metadata was edited).
  static int64_t saved_step(const checkpoint::Metadata& metadata, const std::string& directory);
  // The entries state_dict saves for the parameter `name` (as named_parameters names it) of a
  // shape and dtype: model/<name>, then AdamW's optim/<name>/exp_avg, exp_avg_sq and step (one
  // i64). What a resume checks a checkpoint's metadata against before any rank starts.
  struct SavedEntry {
    std::string key;
    Shape shape;
    DType dtype;
    bool optional = false;  // a checkpoint may lack it (state_dict's StateDict::optional)
  };
  static std::vector<SavedEntry> parameter_entries(const std::string& name, const Shape& shape,
                                                   DType dtype);
  // The entries state_dict saves for `model`'s modules besides their parameters: each MoE's
  // routing bias ("moe/<module>/expert_bias", the buffer's shape and dtype) and each dropout
  // module's mask count (dropout_state_key: one i64, optional). Works on a meta-device model.
  static std::vector<SavedEntry> module_entries(nn::Module& model);

 private:
  double mean_over_data_parallel(double local_loss) const;
  // With replicas: the step's quorum (a joining replica takes the state and its step count).
  void begin_replica_step();
  // With replicas: the gradients averaged over the members, retrying without a failed one.
  int average_over_replicas();
  // `value` reduced over this replica's ranks (itself alone without replica_ranks).
  int64_t reduce_over_replica_ranks(int64_t value, comm::ReduceOp op) const;
  // Whether every rank of this replica succeeded (Replicas::Agreement).
  bool replica_ranks_agree(bool ok) const;
  // The local tensors of the parameters' gradients (DTensors' shards), in parameter order.
  std::vector<Tensor> local_gradients() const;
  // A step's start (its learning rate set, the gradients zeroed) and its end (clipping, AdamW,
  // the loss over dp, the hooks): what step() and replay_step() share.
  StepResult start_step_result();
  StepResult finish_step(StepResult& result, double local_loss,
                         std::chrono::steady_clock::time_point start);
  // The entries above, and what to apply once a load has filled them.
  checkpoint::StateDict state_dict(std::vector<std::function<void()>>* after_load);

  ParallelModel& model_;
  std::shared_ptr<const DeviceMesh> mesh_;
  TrainerOptions options_;
  std::unique_ptr<optim::AdamW> decay_, no_decay_;
  std::vector<StepHook> hooks_;
  int next_step_ = 0;
  bool step_begun_ = false;  // begin_step() ran for next_step_
  int replica_attempt_ = 0;  // with replicas: the attempt of next_step_'s quorum
  // With replicas, when begin_step() ran: the step's wall time starts there.
  std::chrono::steady_clock::time_point step_start_;
};

// This dp rank's share of step `step`'s global batch of `global_batch` sequences of `seq_len`
// tokens, on the mesh's device.
// With context parallelism (the mesh's cp > 1) each sequence is this rank's chunks of it
// (parallel/cp/sequence_layout.h, split as `cp` says).
// With replicas (TrainerOptions::replicas), the global batch splits over the replicas first:
// replica `index` of `count` takes its share, which its own dp ranks split.
struct ReplicaShare {
  int64_t index = 0;
  int64_t count = 1;
};
data::Batch local_batch(const data::TokenCorpus& data, uint64_t seed, int step,
                        const DeviceMesh& mesh, int64_t global_batch, int64_t seq_len,
                        const parallel::cp::ContextParallelOptions& cp = {},
                        ReplicaShare replica = {});

// This dp rank's share of validation batch `index` (data/token_data.h's fixed windows), on the
// mesh's device.
data::Batch validation_batch(const data::TokenCorpus& data, int64_t index, const DeviceMesh& mesh,
                             int64_t global_batch, int64_t seq_len,
                             const parallel::cp::ContextParallelOptions& cp = {});

}  // namespace loom::train
