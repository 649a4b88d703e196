#include "nn/auxiliary_loss.h"

#include "autograd/function.h"
#include "base/error.h"
#include "tensor/ops.h"

namespace loom::nn {

namespace {
thread_local double current_scale = 1.0;
}  // namespace

Tensor attach_auxiliary_loss(const Tensor& out, const Tensor& loss) {
  LOOM_CHECK(loss.defined() && loss.numel() == 1,
             "attach_auxiliary_loss: the loss must be a scalar, got {}",
             loss.defined() ? loss.description() : "an undefined tensor");
  const double scale = current_scale;
  return autograd::record(
      "AuxiliaryLoss", {out, loss}, out, [loss, scale](const std::vector<Tensor>& grads) {
        return std::vector<Tensor>{grads[0],
                                   ops::full(loss.shape(), scale, loss.dtype(), loss.device())};
      });
}

AuxiliaryLossScale::AuxiliaryLossScale(double scale) : previous_(current_scale) {
  LOOM_CHECK(scale > 0, "AuxiliaryLossScale: the scale must be positive, got {}", scale);
  current_scale = scale;
}

AuxiliaryLossScale::~AuxiliaryLossScale() { current_scale = previous_; }

double AuxiliaryLossScale::current() { return current_scale; }

}  // namespace loom::nn
