// Autograd's formulas: how each kDifferentiable op of tensor/op_list.h records its backward.
// Internal to autograd/ (listed in srcs, not hdrs).
//
// autograd_dispatch.cc runs an op below autograd (BelowAutogradGuard) to get its outputs, then
// hands the call and the outputs to the op's formula, which records them with autograd::record
// and returns the handles the caller gets. Backward closures use plain ops; they run under
// NoGradGuard (the engine's), so nothing inside them records.
#pragma once

#include <vector>

#include "autograd/function.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"

namespace loom::autograd {

using Grads = std::vector<Tensor>;
using Formula = std::vector<Tensor> (*)(const OpCall& call, std::vector<Tensor> outputs);
using FormulaTable = PerOp<Formula>;

// One per formulas_*.cc; autograd_dispatch.cc calls them all once.
void register_elementwise_formulas(FormulaTable& table);
void register_view_formulas(FormulaTable& table);
void register_reduction_formulas(FormulaTable& table);
void register_nn_formulas(FormulaTable& table);

// Records outputs[0] with `backward` (one gradient per call input); further outputs (saved
// statistics, indices, masks) are returned as they are, not recorded.
inline std::vector<Tensor> record_first(const char* name, const OpCall& call,
                                        std::vector<Tensor> outputs,
                                        FunctionNode::Backward backward) {
  outputs[0] =
      record(name, std::span<const Tensor>(call.inputs), {outputs[0]}, std::move(backward))[0];
  return outputs;
}

}  // namespace loom::autograd
