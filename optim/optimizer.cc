#include "optim/optimizer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <span>

#include "autograd/grad_mode.h"
#include "base/error.h"
#include "base/profiler.h"
#include "dtensor/dtensor.h"
#include "tensor/ops.h"

namespace loom::optim {

namespace {

// The local shards of a DTensor parameter, its gradient and its moments when all four lie the
// same way (one mesh, equal placements, none Partial): AdamW is element-wise, so its fused
// kernel on the shards is the update of the whole. Plain tensors come back as they are; a
// gradient laid out otherwise (a Partial one, or one not yet redistributed) returns false and
// takes the composed ops, whose DTensor rules move it.
bool same_layout_locals(std::array<Tensor, 4>& tensors) {
  const bool any = std::any_of(tensors.begin(), tensors.end(), is_dtensor);
  if (!any) return true;
  for (const Tensor& t : tensors) {
    if (!is_dtensor(t)) return false;
  }
  const DTensorSpec& first = dtensor_spec(tensors[0]);
  for (const Placement& p : first.placements) {
    if (p.is_partial()) return false;
  }
  for (size_t i = 1; i < tensors.size(); ++i) {
    if (!(dtensor_spec(tensors[i]) == first)) return false;
  }
  for (Tensor& t : tensors) t = local_shard(t);
  return true;
}

}  // namespace

Optimizer::Optimizer(std::vector<Tensor> params) : params_(std::move(params)) {
  for (size_t i = 0; i < params_.size(); ++i) {
    LOOM_CHECK(params_[i].defined() && params_[i].requires_grad(),
               "optimizer: parameter {} ({}) does not require grad", i, params_[i].description());
  }
}

void Optimizer::zero_grad() {
  for (Tensor& p : params_) p.set_grad(Tensor());
}

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : Optimizer(std::move(params)), options_(options), momentum_buffers_(params_.size()) {
  lr_ = options.lr;
  LOOM_CHECK(options.lr >= 0 && options.momentum >= 0 && options.weight_decay >= 0,
             "SGD: lr, momentum and weight_decay must be >= 0, got {}, {}, {}", options.lr,
             options.momentum, options.weight_decay);
}

void SGD::step() {
  profiler::Scope scope("optim::SGD.step");
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor grad = p.grad();
    if (!grad.defined()) continue;
    if (options_.weight_decay != 0) grad = ops::add(grad, ops::mul(p, options_.weight_decay));
    if (options_.momentum != 0) {
      Tensor& buffer = momentum_buffers_[i];
      buffer =
          buffer.defined() ? ops::add(ops::mul(buffer, options_.momentum), grad) : ops::clone(grad);
      grad = buffer;
    }
    ops::copy_(p, ops::sub(p, ops::mul(grad, lr_)));
  }
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : Optimizer(std::move(params)),
      options_(options),
      exp_avg_(params_.size()),
      exp_avg_sq_(params_.size()),
      steps_(params_.size(), 0) {
  lr_ = options.lr;
  LOOM_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1,
             "AdamW: betas must be in [0, 1), got ({}, {})", options.beta1, options.beta2);
}

void AdamW::step() {
  NoGradGuard no_grad;
  profiler::Scope scope("optim::AdamW.step");
  // The parameters the fused pass takes (plain contiguous f32, or such local shards of DTensors
  // that lie alike), updated together at the end: on a GPU, many per kernel launch.
  std::vector<ops::AdamWParameter> fused;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    const Tensor grad = p.grad();
    if (!grad.defined()) continue;
    // Per-parameter step count (as torch.optim.AdamW): a parameter that first gets a gradient
    // late starts its own bias correction.
    const double step = static_cast<double>(++steps_[i]);
    const double bias1 = 1.0 - std::pow(options_.beta1, step);
    const double bias2 = 1.0 - std::pow(options_.beta2, step);
    if (!exp_avg_[i].defined()) {
      exp_avg_[i] = ops::zeros_like(p);
      exp_avg_sq_[i] = ops::zeros_like(p);
    }
    std::array<Tensor, 4> locals{p, grad, exp_avg_[i], exp_avg_sq_[i]};
    if (same_layout_locals(locals)) {
      ops::AdamWParameter x{locals[0], locals[1], locals[2], locals[3], bias1, bias2};
      if (ops::adamw_fusable(x)) {
        fused.push_back(std::move(x));
        continue;
      }
    }
    // m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
    exp_avg_[i] =
        ops::add(ops::mul(exp_avg_[i], options_.beta1), ops::mul(grad, 1.0 - options_.beta1));
    exp_avg_sq_[i] = ops::add(ops::mul(exp_avg_sq_[i], options_.beta2),
                              ops::mul(ops::mul(grad, grad), 1.0 - options_.beta2));
    // p = p (1 - lr wd) - lr * m_hat / (sqrt(v_hat) + eps)
    const Tensor denom = ops::add(ops::sqrt(ops::div(exp_avg_sq_[i], bias2)), options_.eps);
    const Tensor update = ops::div(ops::div(exp_avg_[i], bias1), denom);
    Tensor decayed =
        options_.weight_decay != 0 ? ops::mul(p, 1.0 - lr_ * options_.weight_decay) : p;
    ops::copy_(p, ops::sub(decayed, ops::mul(update, lr_)));
  }
  // One call per device (a pipeline stage's parameters share one; the call takes one GPU's).
  while (!fused.empty()) {
    const Device device = fused.front().param.device();
    const auto other = std::stable_partition(
        fused.begin(), fused.end(), [&](const auto& x) { return x.param.device() == device; });
    ops::adamw_update_fused_(std::span(fused.begin(), other),
                             {.lr = lr_,
                              .beta1 = options_.beta1,
                              .beta2 = options_.beta2,
                              .eps = options_.eps,
                              .weight_decay = options_.weight_decay});
    fused.erase(fused.begin(), other);
  }
}

void AdamW::init_state() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (exp_avg_[i].defined()) continue;
    exp_avg_[i] = ops::zeros_like(params_[i]);
    exp_avg_sq_[i] = ops::zeros_like(params_[i]);
  }
}

std::vector<Tensor> AdamW::state_tensors() const {
  std::vector<Tensor> state;
  for (const auto* moments : {&exp_avg_, &exp_avg_sq_}) {
    for (const Tensor& m : *moments) {
      if (m.defined()) state.push_back(m);
    }
  }
  return state;
}

}  // namespace loom::optim
