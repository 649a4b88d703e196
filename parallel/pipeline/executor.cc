#include "parallel/pipeline/executor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <chrono>

#include "autograd/functions.h"
#include "base/error.h"
#include "comm/peer_failure.h"
#include "nn/auxiliary_loss.h"
#include "parallel/pipeline/validate.h"
#include "tensor/ops.h"

namespace loom::pipeline {

PipelineExecutor::PipelineExecutor(Schedule schedule,
                                   std::vector<std::shared_ptr<PipelineStage>> stages,
                                   LossFn loss_fn)
    : schedule_(std::move(schedule)), stages_(std::move(stages)), loss_fn_(std::move(loss_fn)) {
  LOOM_CHECK(!stages_.empty() && std::none_of(stages_.begin(), stages_.end(),
                                              [](const auto& s) { return s == nullptr; }),
             "PipelineExecutor: give this rank's stages (none, or a null one, given)");
  // On GPU groups (NCCL) a send holds its stream until the peer receives it: the schedule must
  // be deadlock-free under that rule too, not only with buffered sends (Gloo).
  const bool sends_wait_for_receiver = stages_.front()->group().device().is_cuda();
  validate_schedule(schedule_, {.sends = sends_wait_for_receiver ? SendSemantics::kRendezvous
                                                                 : SendSemantics::kAsync});
  LOOM_CHECK(loss_fn_ != nullptr, "PipelineExecutor: the loss function is empty");
  const PipelineStage& first = *stages_.front();
  pp_rank_ = first.pp_rank();
  LOOM_CHECK(first.pp_size() == schedule_.num_ranks,
             "PipelineExecutor: schedule '{}' is for {} ranks but the pp group '{}' has {}",
             schedule_.name, schedule_.num_ranks, first.group().name(), first.pp_size());
  std::sort(stages_.begin(), stages_.end(),
            [](const auto& a, const auto& b) { return a->stage_index() < b->stage_index(); });
  std::vector<int> given;
  for (const auto& stage : stages_) {
    LOOM_CHECK(&stage->group() == &first.group(),
               "PipelineExecutor: stages {} and {} use different pp groups", first.stage_index(),
               stage->stage_index());
    LOOM_CHECK(stage->num_stages() == schedule_.num_stages,
               "PipelineExecutor: stage {} was built for {} stages but schedule '{}' has {}",
               stage->stage_index(), stage->num_stages(), schedule_.name, schedule_.num_stages);
    LOOM_CHECK(stage->placement() == schedule_.placement,
               "PipelineExecutor: stage {} was built for the {} placement but schedule '{}' places "
               "its stages in the {} placement ({}); build the stages with "
               "StageOptions::placement = the schedule's",
               stage->stage_index(), placement_name(stage->placement()), schedule_.name,
               placement_name(schedule_.placement),
               placement_rule(schedule_.placement, schedule_.num_ranks));
    given.push_back(stage->stage_index());
  }
  const std::vector<int> expected = schedule_.stages_of_rank(pp_rank_);
  LOOM_CHECK(given == expected,
             "PipelineExecutor: pp rank {} must hold stages [{}] under schedule '{}' ({}), got "
             "stages [{}]",
             pp_rank_, fmt::join(expected, ", "), schedule_.name,
             placement_rule(schedule_.placement, schedule_.num_ranks), fmt::join(given, ", "));
}

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

double PipelineExecutor::recv_wait_seconds() const {
  double seconds = 0;
  for (const auto& stage : stages_) seconds += stage->recv_wait_seconds();
  return seconds;
}

PipelineStage& PipelineExecutor::stage(int index) const {
  for (const auto& held : stages_) {
    if (held->stage_index() == index) return *held;
  }
  LOOM_FAIL("PipelineExecutor: pp rank {} does not hold stage {}", pp_rank_, index);
}

std::vector<Tensor> PipelineExecutor::split(const Tensor& batch, const char* what) const {
  const int m = schedule_.num_microbatches;
  LOOM_CHECK(
      batch.defined() && batch.dim() >= 1,
      "PipelineExecutor::step: pp rank {} holds the {} stage and needs the {} (a tensor with "
      "a batch dim), got {}",
      pp_rank_, what[0] == 'i' ? "first" : "last", what,
      batch.defined() ? batch.description() : "an undefined tensor");
  const int64_t rows = batch.size(0);
  LOOM_CHECK(rows % m == 0,
             "PipelineExecutor::step: the {} have {} rows along dim 0, which do not split into {} "
             "equal microbatches",
             what, rows, m);
  std::vector<Tensor> microbatches;
  for (int mb = 0; mb < m; ++mb)
    microbatches.push_back(ops::narrow(batch, 0, mb * rows / m, rows / m));
  return microbatches;
}

std::string PipelineExecutor::peer_note(const Action& action) const {
  const int s = action.stage;
  int peer = -1;
  const char* direction = "";
  switch (action.kind) {
    case ActionKind::kForward:
    case ActionKind::kRecvF:
      peer = s - 1, direction = "from";
      break;
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput:
    case ActionKind::kRecvB:
      peer = s + 1, direction = "from";
      break;
    case ActionKind::kBackwardWeight:
      return "";
    case ActionKind::kSendF:
      peer = s + 1, direction = "to";
      break;
    case ActionKind::kSendB:
      peer = s - 1, direction = "to";
      break;
  }
  if (peer < 0 || peer >= schedule_.num_stages || is_local(peer)) return "";
  return fmt::format(" ({} stage {} on pp rank {})", direction, peer,
                     schedule_.rank_of_stage(peer));
}

void PipelineExecutor::track_memory() {
  int in_flight = 0;
  int64_t bytes = 0;
  for (const auto& stage : stages_) {
    in_flight += stage->microbatches_in_flight();
    bytes += stage->saved_bytes();
  }
  stats_.peak_microbatches_in_flight = std::max(stats_.peak_microbatches_in_flight, in_flight);
  stats_.peak_activation_bytes = std::max(stats_.peak_activation_bytes, bytes);
}

void PipelineExecutor::run_action(const Action& action, const std::vector<Tensor>& inputs,
                                  const std::vector<Tensor>& targets) {
  PipelineStage& st = stage(action.stage);
  const int s = action.stage, mb = action.microbatch;
  switch (action.kind) {
    case ActionKind::kForward: {
      Tensor input;  // undefined: the stage takes its posted receive
      if (st.is_first())
        input = inputs.at(mb);
      else if (is_local(s - 1))
        input = stage(s - 1).output_to_send(mb);
      // Auxiliary losses (MoE load balancing) on any stage enter as the loss does: / m.
      Tensor output;
      {
        nn::AuxiliaryLossScale scale(loss_scale_ / schedule_.num_microbatches);
        output = st.forward(mb, input);
      }
      if (st.is_last()) {
        const Tensor loss = loss_fn_(output, targets.at(mb));
        LOOM_CHECK(loss.defined() && loss.numel() == 1,
                   "the loss function returned {} for microbatch {}; it must return a scalar",
                   loss.defined() ? loss.description() : "an undefined tensor", mb);
        losses_.at(mb) = detach(loss);  // read at the step's end: no host sync per microbatch
        scaled_losses_.at(mb) =
            mul(loss, loss_scale_ / static_cast<double>(schedule_.num_microbatches));
      }
      track_memory();
      break;
    }
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput: {
      const bool split = action.kind == ActionKind::kBackwardInput;
      Tensor seed;
      if (st.is_last()) {
        seed = scaled_losses_.at(mb);
        scaled_losses_.at(mb) = Tensor();  // the graph's root goes with its backward
      } else {
        seed = is_local(s + 1) ? stage(s + 1).take_input_grad(mb) : Tensor();
      }
      if (split) {
        st.backward_input(mb, seed);
      } else {
        st.backward(mb, seed);
      }
      break;
    }
    case ActionKind::kBackwardWeight:
      st.backward_weight(mb);
      break;
    case ActionKind::kSendF:
      st.send_output(mb);
      break;
    case ActionKind::kRecvF:
      st.post_recv_input(mb);
      break;
    case ActionKind::kSendB:
      st.send_input_grad(mb);
      break;
    case ActionKind::kRecvB:
      st.post_recv_grad(mb);
      break;
  }
}

double PipelineExecutor::broadcast_mean_loss() {
  PipelineStage& any = *stages_.front();
  const int last = schedule_.num_stages - 1;
  // The double's bits travel as an i64, so every rank returns exactly the last stage's value.
  int64_t mine = 0;
  if (is_local(last)) {
    double loss_sum = 0;  // f64, in microbatch order
    for (const Tensor& loss : losses_) loss_sum += loss.item<double>();
    mine = std::bit_cast<int64_t>(loss_sum / static_cast<double>(schedule_.num_microbatches));
  }
  const Tensor bits = ops::from_vector_i64({mine}, {1}, any.group().device());
  any.group().broadcast(bits, any.group_rank_of_stage(last))->wait();
  return std::bit_cast<double>(ops::to(bits, Device::cpu()).data<int64_t>()[0]);
}

double PipelineExecutor::step(const Tensor& inputs, const Tensor& targets, StepOptions options) {
  LOOM_CHECK(options.loss_scale > 0, "PipelineExecutor::step: loss_scale must be positive, got {}",
             options.loss_scale);
  loss_scale_ = options.loss_scale;
  const auto start = std::chrono::steady_clock::now();
  stats_ = {};
  losses_.assign(schedule_.num_microbatches, Tensor());
  scaled_losses_.assign(schedule_.num_microbatches, Tensor());
  for (const auto& stage : stages_) {
    stage->begin_step(schedule_.num_microbatches, options.sync_gradients);
  }
  const std::vector<Tensor> input_mbs =
      is_local(0) ? split(inputs, "inputs") : std::vector<Tensor>{};
  const std::vector<Tensor> target_mbs =
      is_local(schedule_.num_stages - 1) ? split(targets, "targets") : std::vector<Tensor>{};
  const auto& actions = schedule_.actions[pp_rank_];
  for (size_t index = 0; index < actions.size(); ++index) {
    const Action& action = actions[index];
    const auto action_start = std::chrono::steady_clock::now();
    const double waited_before = recv_wait_seconds();
    try {
      run_action(action, input_mbs, target_mbs);
    } catch (const std::exception& e) {
      comm::throw_in_context(
          e,
          fmt::format("pipeline step ('{}'): pp rank {} action {} {}{} failed: {}", schedule_.name,
                      pp_rank_, index, describe(action), peer_note(action), e.what()));
    }
    if (is_compute(action.kind)) {
      stats_.compute_seconds += seconds_since(action_start) - (recv_wait_seconds() - waited_before);
    }
  }
  try {
    for (const auto& stage : stages_) stage->finish_step();
  } catch (const std::exception& e) {
    comm::throw_in_context(e, fmt::format("pipeline step ('{}'): pp rank {}: a send failed: {}",
                                          schedule_.name, pp_rank_, e.what()));
  }
  const double loss = broadcast_mean_loss();
  stats_.recv_wait_seconds = recv_wait_seconds();
  stats_.step_seconds = seconds_since(start);
  return loss;
}

}  // namespace loom::pipeline
