#include "parallel/pipeline/stage.h"

#include <fmt/format.h>

#include <chrono>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "base/error.h"
#include "parallel/pipeline/p2p.h"
#include "tensor/ops.h"

namespace loom::pipeline {

namespace {

std::vector<int> identity(int size) {
  std::vector<int> ranks(size);
  for (int r = 0; r < size; ++r) ranks[r] = r;
  return ranks;
}

std::shared_ptr<comm::ProcessGroup> group_of(const DeviceMesh& mesh) {
  LOOM_CHECK(mesh.ndim() == 1,
             "PipelineStage: the pipeline mesh must be 1-D, got {}; pass the pipeline dim's slice",
             mesh.str());
  return mesh.group(0);
}

}  // namespace

PipelineStage::PipelineStage(std::shared_ptr<nn::Module> module, int stage_index, int num_stages,
                             std::shared_ptr<comm::ProcessGroup> pp_group, StageOptions options)
    : PipelineStage(std::move(module), stage_index, num_stages, pp_group,
                    pp_group ? pp_group->rank() : 0, identity(pp_group ? pp_group->size() : 0),
                    std::move(options)) {}

PipelineStage::PipelineStage(std::shared_ptr<nn::Module> module, int stage_index, int num_stages,
                             const DeviceMesh& pp_mesh, StageOptions options)
    : PipelineStage(std::move(module), stage_index, num_stages, group_of(pp_mesh),
                    static_cast<int>(pp_mesh.coordinate(0)), pp_mesh.group_ranks_by_coordinate(0),
                    std::move(options)) {}

PipelineStage::PipelineStage(std::shared_ptr<nn::Module> module, int stage_index, int num_stages,
                             std::shared_ptr<comm::ProcessGroup> group, int pp_rank,
                             std::vector<int> group_rank_by_pp_rank, StageOptions options)
    : module_(std::move(module)),
      stage_(stage_index),
      num_stages_(num_stages),
      group_(std::move(group)),
      pp_rank_(pp_rank),
      group_rank_by_pp_rank_(std::move(group_rank_by_pp_rank)),
      options_(std::move(options)) {
  LOOM_CHECK(module_ != nullptr, "PipelineStage: stage {}: the module is null", stage_index);
  LOOM_CHECK(group_ != nullptr, "PipelineStage: stage {}: the pp group is null", stage_index);
  LOOM_CHECK(num_stages >= 1 && stage_index >= 0 && stage_index < num_stages,
             "PipelineStage: stage index {} is not in [0, {})", stage_index, num_stages);
  LOOM_CHECK(options_.placement != StagePlacement::kV || num_stages == 2 * pp_size(),
             "PipelineStage: the V placement holds two stages per rank: {} pp ranks need {} "
             "stages, got {}",
             pp_size(), 2 * pp_size(), num_stages);
  const int owner = rank_of_stage(options_.placement, stage_index, pp_size(), num_stages);
  LOOM_CHECK(owner == pp_rank_,
             "PipelineStage: stage {} belongs on pp rank {} ({} placement: {}), but this is pp "
             "rank {}",
             stage_index, owner, placement_name(options_.placement),
             placement_rule(options_.placement, pp_size()), pp_rank_);
}

int PipelineStage::group_rank_of_stage(int stage) const {
  return group_rank_by_pp_rank_.at(
      rank_of_stage(options_.placement, stage, pp_size(), num_stages_));
}

void PipelineStage::begin_step(int num_microbatches, bool sync_gradients) {
  num_microbatches_ = num_microbatches;
  sync_gradients_ = sync_gradients;
  backwards_done_ = 0;
  // Normally empty already; after a failed step, what it left behind is dropped (its sends'
  // Works keep their tensors alive until the group finishes or fails them).
  saved_.clear();
  pending_inputs_.clear();
  pending_grads_.clear();
  input_grads_.clear();
  sends_.clear();
  input_shape_.reset();
  sent_metadata_ = false;
  recv_wait_seconds_ = 0;
  microbatches_ = nn::BatchParts(nn::DropoutCalls::of(*module_), num_microbatches);
}

void PipelineStage::wait_timed(comm::Work& work, bool on_host) {
  const auto start = std::chrono::steady_clock::now();
  if (on_host) {
    work.wait();
  } else {
    work.block_current_stream();
  }
  recv_wait_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Tensor PipelineStage::wait_for(std::map<int, Pending>& pending, int mb, const char* what) {
  const auto it = pending.find(mb);
  LOOM_CHECK(it != pending.end(),
             "stage {}: microbatch {}'s {} was never received (no RECV before it)", stage_, mb,
             what);
  wait_timed(*it->second.work, /*on_host=*/false);
  Tensor buffer = it->second.buffer;
  pending.erase(it);
  return buffer;
}

void PipelineStage::isend(const Tensor& tensor, int stage) {
  sends_.push_back(group_->send(tensor, group_rank_of_stage(stage)));
}

const PipelineStage::Saved& PipelineStage::saved(int mb, const char* what) const {
  const auto it = saved_.find(mb);
  LOOM_CHECK(it != saved_.end(), "stage {}: {} of microbatch {} before its forward", stage_, what,
             mb);
  return it->second;
}

void PipelineStage::post_recv_input(int mb) {
  LOOM_CHECK(!is_first(), "stage 0 has no previous stage to receive from");
  const int peer = group_rank_of_stage(stage_ - 1);
  const Device device = group_->device();
  if (!input_shape_) {
    // The step's first activation across this boundary: its shape comes first, and is waited
    // for here, so every receive is issued at its RECV action, in schedule order (p2p.h). The
    // schedule puts this RECV where the peer's send happens, so the wait is short.
    Tensor metadata = ops::empty({detail::kMetaElements}, kInt64, device);
    wait_timed(*group_->recv(metadata, peer), /*on_host=*/true);
    input_shape_ = detail::decode_metadata(metadata);
  }
  Tensor buffer = ops::empty(input_shape_->shape, input_shape_->dtype, device);
  pending_inputs_[mb] = {buffer, group_->recv(buffer, peer)};
}

Tensor PipelineStage::forward(int mb, const Tensor& input) {
  LOOM_CHECK(mb >= 0 && mb < num_microbatches_,
             "stage {}: forward of microbatch {}, but the step has {} (begin_step sets them)",
             stage_, mb, num_microbatches_);
  LOOM_CHECK(!saved_.contains(mb), "stage {}: microbatch {} ran forward twice", stage_, mb);
  Tensor leaf;
  if (is_first()) {
    LOOM_CHECK(input.defined(), "stage 0: forward of microbatch {} got no input", mb);
    leaf = input;
  } else {
    // A fresh leaf: backward stops here, and its .grad is what goes back to the previous stage.
    leaf = input.defined() ? detach(input) : wait_for(pending_inputs_, mb, "activation");
    if (is_floating(leaf.dtype())) leaf.set_requires_grad(true);
  }
  const bool wrap = !is_first() && options_.wrap_input;
  // Every microbatch draws the dropout masks the step's one forward of the whole batch would
  // draw for its rows (nn/batch_part.h): from the step's call counts, at its rows.
  const nn::BatchPart rows = microbatches_.part(mb);
  const Tensor output = (*module_)(wrap ? options_.wrap_input(leaf) : leaf);
  Tensor sent;
  if (!is_last()) {
    sent = options_.unwrap_output ? options_.unwrap_output(output) : output;
    LOOM_CHECK(sent.defined() && sent.extension() == nullptr,
               "stage {}: the output sent to stage {} must be a plain tensor (got {}); convert a "
               "DTensor with StageOptions::unwrap_output",
               stage_, stage_ + 1, sent.defined() ? sent.description() : "undefined");
  }
  saved_[mb] = {leaf, output.numel() * static_cast<int64_t>(element_size(output.dtype())), sent};
  return output;
}

Tensor PipelineStage::output_to_send(int mb) const { return saved(mb, "send").sent; }

void PipelineStage::send_output(int mb) {
  const Tensor payload = ops::contiguous(output_to_send(mb));
  if (!sent_metadata_) {
    isend(detail::encode_metadata(payload, group_->device()), stage_ + 1);
    sent_metadata_ = true;
  }
  isend(payload, stage_ + 1);
}

void PipelineStage::post_recv_grad(int mb) {
  const Tensor& sent = saved(mb, "receive the gradient").sent;
  Tensor buffer = ops::empty(sent.shape(), sent.dtype(), group_->device());
  auto work = group_->recv(buffer, group_rank_of_stage(stage_ + 1));
  pending_grads_[mb] = {buffer, std::move(work)};
}

void PipelineStage::finish_weights(int mb, const std::function<void()>& run) {
  // Data parallelism's reduction rides on the step's last weight gradients.
  const bool last_microbatch = ++backwards_done_ == num_microbatches_ && sync_gradients_;
  if (options_.around_backward) {
    options_.around_backward(last_microbatch, run);
  } else {
    run();
  }
  saved_.erase(mb);
}

void PipelineStage::keep_input_grad(int mb, const Tensor& input) {
  if (is_first()) return;
  const Tensor input_grad = input.requires_grad() ? input.grad() : Tensor();
  input_grads_[mb] = input_grad.defined() ? input_grad : ops::zeros_like(input);
}

Tensor PipelineStage::output_grad(int mb, const Tensor& given) {
  return given.defined() ? given : wait_for(pending_grads_, mb, "output gradient");
}

void PipelineStage::backward(int mb, const Tensor& output_grad_or_loss) {
  const Saved state = saved(mb, "backward");
  std::function<void()> run;
  if (is_last()) {
    run = [&] { loom::backward(output_grad_or_loss); };
  } else {
    const Tensor grad = output_grad(mb, output_grad_or_loss);
    run = [&state, grad] {
      if (state.sent.requires_grad()) loom::backward(state.sent, grad);
    };
  }
  finish_weights(mb, run);
  keep_input_grad(mb, state.input);
}

void PipelineStage::backward_input(int mb, const Tensor& output_grad_or_loss) {
  const Saved state = saved(mb, "backward (I)");
  const Tensor root = is_last() ? output_grad_or_loss : state.sent;  // the scaled loss, or output
  const Tensor grad = is_last() ? Tensor() : output_grad(mb, output_grad_or_loss);
  std::vector<Tensor> inputs;
  if (!is_first() && state.input.requires_grad()) inputs.push_back(state.input);
  if (root.defined() && root.requires_grad()) {
    weight_backwards_[mb] = autograd::backward_input({root}, {grad}, inputs);
  }
  keep_input_grad(mb, state.input);
}

void PipelineStage::backward_weight(int mb) {
  autograd::WeightBackward weights;
  if (auto it = weight_backwards_.find(mb); it != weight_backwards_.end()) {
    weights = std::move(it->second);
    weight_backwards_.erase(it);
  }
  finish_weights(mb, [&weights] {
    if (!weights.done()) weights.run();
  });
}

Tensor PipelineStage::take_input_grad(int mb) {
  const auto it = input_grads_.find(mb);
  LOOM_CHECK(it != input_grads_.end(), "stage {}: microbatch {}'s input gradient is not ready",
             stage_, mb);
  Tensor grad = it->second;
  input_grads_.erase(it);
  return grad;
}

void PipelineStage::send_input_grad(int mb) {
  isend(ops::contiguous(take_input_grad(mb)), stage_ - 1);
}

void PipelineStage::finish_step() {
  std::vector<std::shared_ptr<comm::Work>> sends = std::move(sends_);
  sends_.clear();
  for (const auto& work : sends) work->wait();
}

int64_t PipelineStage::saved_bytes() const {
  int64_t bytes = 0;
  auto add = [&](const Tensor& t) {
    if (t.defined()) bytes += t.numel() * static_cast<int64_t>(element_size(t.dtype()));
  };
  for (const auto& [mb, state] : saved_) {
    add(state.input);
    bytes += state.output_bytes;
  }
  return bytes;
}

}  // namespace loom::pipeline
