// Losses a module adds to training beyond the model's own (a mixture of experts' load-balancing
// loss), carried by the gradient of the module's output (Megatron's MoEAuxLossAutoScaler): the
// output passes through unchanged, and in backward the auxiliary loss gets the gradient the
// training loss gets at that point — 1, or 1/m when a step's loss is the mean of m micro-batches
// (gradient accumulation, a pipeline's microbatches). So a layer deep in the model, or on a
// pipeline stage that never sees the loss, adds its term without returning it.
//
//   out = nn::attach_auxiliary_loss(out, aux);          // in the module's forward
//   { nn::AuxiliaryLossScale scale(1.0 / m); loss = model(x) ... }   // where micro-batches run
#pragma once

#include "tensor/tensor.h"

namespace loom::nn {

// `out`, carrying `loss` (a scalar, part of out's graph or not): backward gives `loss` the
// gradient AuxiliaryLossScale::current() had at this call.
Tensor attach_auxiliary_loss(const Tensor& out, const Tensor& loss);

// The factor the training loss has in the forward running on this thread (default 1); set for a
// scope by whoever splits a step into micro-batches.
class AuxiliaryLossScale {
 public:
  explicit AuxiliaryLossScale(double scale);
  ~AuxiliaryLossScale();
  AuxiliaryLossScale(const AuxiliaryLossScale&) = delete;
  AuxiliaryLossScale& operator=(const AuxiliaryLossScale&) = delete;
  static double current();

 private:
  double previous_;
};

}  // namespace loom::nn
