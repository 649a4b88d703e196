// Recording ops into the graph, and user-defined differentiable functions.
//
// Loom's own ops record through the op dispatch (tensor/dispatch.h, autograd/formulas_*.cc).
// record() is how a new differentiable computation is added: compute the outputs, then record()
// them with a backward closure. Compute them under BelowAutogradGuard (or NoGradGuard) when they
// are built from ops that would record on their own, so the graph gets one node, not two. The
// closure may capture inputs and the raw outputs freely: record() hands back *new* handles for the
// outputs, so the graph never owns a tensor that owns the graph.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "autograd/node.h"

namespace loom::autograd {

// True when an op would record now (grad mode on, no BelowAutogradGuard) and some input
// requires grad.
bool any_requires_grad(std::span<const Tensor> inputs);
bool any_requires_grad(std::initializer_list<Tensor> inputs);

// Connects `outputs` to `inputs` through a node running `backward` (grad_outputs -> one
// gradient per input; undefined for inputs that need none). Returns the outputs to hand to
// the caller (new handles onto the same data, carrying grad_fn). Records nothing — and returns
// `outputs` unchanged — when no input requires grad or grad mode is off.
std::vector<Tensor> record(std::string name, std::span<const Tensor> inputs,
                           std::vector<Tensor> outputs, FunctionNode::Backward backward);
Tensor record(std::string name, std::initializer_list<Tensor> inputs, Tensor output,
              FunctionNode::Backward backward);

// A user-defined differentiable function, like torch.autograd.Function:
//
//   class ScaleByTwo : public autograd::Function {
//     std::vector<Tensor> forward(const std::vector<Tensor>& in) override { return
//     {ops::mul(in[0], 2.0)}; } std::vector<Tensor> backward(const std::vector<Tensor>& g) override
//     { return {ops::mul(g[0], 2.0)}; }
//   };
//   Tensor y = autograd::Function::apply(std::make_shared<ScaleByTwo>(), {x})[0];
//
// forward runs with grad mode off; it may keep whatever backward needs in members (the graph
// keeps the object alive until backward has run). backward returns one gradient per input.
class Function {
 public:
  virtual ~Function() = default;
  virtual std::vector<Tensor> forward(const std::vector<Tensor>& inputs) = 0;
  virtual std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs) = 0;
  virtual std::string name() const { return "CustomFunction"; }

  static std::vector<Tensor> apply(std::shared_ptr<Function> function,
                                   const std::vector<Tensor>& inputs);
};

}  // namespace loom::autograd
