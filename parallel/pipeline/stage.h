// PipelineStage: one stage of a pipeline on this rank — the stage's module (only its own
// layers and parameters), its index among num_stages, and the pp process group it talks to its
// neighbour stages over (torch.distributed.pipelining.PipelineStage).
//
// Placement: stage s lives on pp rank s % pp_size, or in a V for ZBV and DualPipeV
// (StageOptions::placement, placement.h; the schedule's). With a 1-D DeviceMesh "pp", pp rank =
// the mesh coordinate.
//
// Data flow for microbatch i on stage s (driven by PipelineExecutor, one action at a time):
//   F: input (the microbatch on stage 0; else the received activation, as a fresh leaf that
//      requires grad, through wrap_input) -> module -> output; saved until B.
//   SEND_F: unwrap_output(output), contiguous, sent to stage s+1 asynchronously.
//   B: backward from the output with the received gradient (the last stage: from its loss),
//      accumulating into the parameters' .grad; the input leaf's gradient goes back by SEND_B.
// Activations are plain tensors on the wire. wrap_input / unwrap_output are the hook for
// tensor parallelism inside a stage (e.g. from_local to make a DTensor of the received local
// shard, to_local before sending); both must be differentiable so gradients flow through them.
//
// Shapes: the receiver of an activation learns its shape and dtype from a small metadata
// message sent before the first activation across the boundary in each step (p2p.h), so it
// allocates before the data arrives and batch shapes may change between steps. Gradient
// buffers take the shape of the stage's own output.
//
// Messages carry no tag: each is issued at its schedule action, so two ranks pair them up in
// issue order (p2p.h), on Gloo as on NCCL. Buffers live on the pp group's device.
//
// Sends are asynchronous (ProcessGroup::send returns a Work); finish_step() waits for them.
// Receives are posted at RECV actions and waited for by the compute that needs them (on GPU
// ranks the compute stream waits, not the host: Work::block_current_stream); the time spent
// waiting on the host is counted in recv_wait_seconds().
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "autograd/engine.h"
#include "comm/process_group.h"
#include "mesh/device_mesh.h"
#include "nn/batch_part.h"
#include "nn/module.h"
#include "parallel/pipeline/p2p.h"
#include "parallel/pipeline/placement.h"

namespace loom::pipeline {

struct StageOptions {
  // Which pp rank holds which stage: the schedule's placement (Schedule::placement).
  StagePlacement placement = StagePlacement::kLoop;
  // Received activation (plain tensor) -> the module's input, on every stage but the first
  // (whose input is the caller's microbatch, which the caller prepares). Default: as is.
  std::function<Tensor(const Tensor& received)> wrap_input;
  // The module's output -> the plain tensor sent to the next stage. Default: as is.
  std::function<Tensor(const Tensor& output)> unwrap_output;
  // Runs one microbatch's backward (`run` calls the autograd engine). `last_microbatch` is true
  // for the step's last backward of this stage: where a DDP-wrapped stage lets its gradients
  // sync, running the others under no_sync (as torch's PipelineStage does). Default: run().
  std::function<void(bool last_microbatch, const std::function<void()>& run)> around_backward;
};

class PipelineStage {
 public:
  // `pp_group`: every rank of the pipeline, pp rank = group rank.
  PipelineStage(std::shared_ptr<nn::Module> module, int stage_index, int num_stages,
                std::shared_ptr<comm::ProcessGroup> pp_group, StageOptions options = {});
  // `pp_mesh`: a 1-D mesh (e.g. mesh["pp"]); pp rank = this rank's coordinate.
  PipelineStage(std::shared_ptr<nn::Module> module, int stage_index, int num_stages,
                const DeviceMesh& pp_mesh, StageOptions options = {});

  nn::Module& module() const { return *module_; }
  const std::shared_ptr<nn::Module>& module_ptr() const { return module_; }
  int stage_index() const { return stage_; }
  StagePlacement placement() const { return options_.placement; }
  int num_stages() const { return num_stages_; }
  bool is_first() const { return stage_ == 0; }
  bool is_last() const { return stage_ == num_stages_ - 1; }
  comm::ProcessGroup& group() const { return *group_; }
  int pp_rank() const { return pp_rank_; }
  int pp_size() const { return group_->size(); }
  // The group rank of the pp rank holding `stage`.
  int group_rank_of_stage(int stage) const;

  // ---- the executor's per-action calls ----
  // Forgets the last step's activation shapes, receive timings and anything a failed step
  // left; call at the start of a step of `num_microbatches`.
  // `sync_gradients` false: this step's last microbatch does not synchronize data parallelism
  // either (gradient accumulation over several steps; the last one does).
  void begin_step(int num_microbatches, bool sync_gradients = true);
  // RECV_F: posts the receive of microbatch `mb`'s input (the step's first one first receives
  // and waits for the boundary's shape metadata).
  void post_recv_input(int mb);
  // F: `input` is the microbatch (first stage), the previous stage's sent tensor when that stage
  // is on this rank, or undefined to take the posted receive (waits for it). Returns the module
  // output (the last stage's goes to the loss function).
  Tensor forward(int mb, const Tensor& input);
  // SEND_F.
  void send_output(int mb);
  // What SEND_F would send (for a next stage on this rank).
  Tensor output_to_send(int mb) const;
  // RECV_B.
  void post_recv_grad(int mb);
  // B: `output_grad` is the gradient of this stage's sent output (from a next stage on this
  // rank), or undefined to take the posted receive; on the last stage, the (scaled) loss.
  void backward(int mb, const Tensor& output_grad_or_loss);
  // I and W (zero-bubble schedules): the input's gradient now (autograd::backward_input: for a
  // previous stage, or SEND_B), the weights' later — data parallelism's reduction, on the step's
  // last microbatch, runs with W.
  void backward_input(int mb, const Tensor& output_grad_or_loss);
  void backward_weight(int mb);
  // SEND_B.
  void send_input_grad(int mb);
  // The gradient of microbatch mb's input after B (for a previous stage on this rank); taken
  // once.
  Tensor take_input_grad(int mb);
  // Waits for every send of the step (rethrowing a failed one's error).
  void finish_step();

  // Microbatches whose forward ran and backward did not, and the bytes of their boundary
  // tensors (input and output) this stage holds for them.
  int microbatches_in_flight() const { return static_cast<int>(saved_.size()); }
  int64_t saved_bytes() const;
  // Time this step spent waiting for receives (activations, gradients, metadata).
  double recv_wait_seconds() const { return recv_wait_seconds_; }

 private:
  struct Saved {
    Tensor input;  // the leaf the module saw (before wrap_input)
    // The module's output's size (the tensor is not kept: on the last stage it is the logits,
    // whose gradient the loss's backward writes over them when nothing else holds them).
    int64_t output_bytes = 0;
    Tensor sent;  // unwrap_output(output): what crosses the boundary (undefined on the last stage)
  };
  struct Pending {
    Tensor buffer;
    std::shared_ptr<comm::Work> work;
  };
  PipelineStage(std::shared_ptr<nn::Module> module, int stage_index, int num_stages,
                std::shared_ptr<comm::ProcessGroup> group, int pp_rank,
                std::vector<int> group_rank_by_pp_rank, StageOptions options);
  // Waits for a posted receive (on the device where the backend can), counting the time.
  Tensor wait_for(std::map<int, Pending>& pending, int mb, const char* what);
  void wait_timed(comm::Work& work, bool on_host);
  void isend(const Tensor& tensor, int stage);
  const Saved& saved(int mb, const char* what) const;

  std::shared_ptr<nn::Module> module_;
  int stage_;
  int num_stages_;
  std::shared_ptr<comm::ProcessGroup> group_;
  int pp_rank_;
  std::vector<int> group_rank_by_pp_rank_;
  StageOptions options_;

  std::map<int, Saved> saved_;
  std::map<int, Pending> pending_inputs_;
  std::map<int, Pending> pending_grads_;
  std::map<int, Tensor> input_grads_;
  std::vector<std::shared_ptr<comm::Work>> sends_;
  std::optional<detail::BoundaryShape> input_shape_;  // this step's, once its metadata arrived
  bool sent_metadata_ = false;
  double recv_wait_seconds_ = 0;
  int num_microbatches_ = 0;
  nn::BatchParts microbatches_;  // the step's, with its dropout counts at its start
  bool sync_gradients_ = true;
  std::map<int, autograd::WeightBackward> weight_backwards_;  // I's, waiting for their W
  // A backward's shared steps: the weights' gradients (B, or W) with data parallelism's
  // reduction on the step's last; the input's gradient kept for SEND_B or the previous stage;
  // the output's gradient, given or received.
  void finish_weights(int mb, const std::function<void()>& run);
  void keep_input_grad(int mb, const Tensor& input);
  Tensor output_grad(int mb, const Tensor& given);
  int backwards_done_ = 0;
};

}  // namespace loom::pipeline
