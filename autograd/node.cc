#include "autograd/node.h"

#include "base/error.h"
#include "tensor/ops_copy.h"
#include "tensor/ops_create.h"
#include "tensor/ops_elementwise.h"

namespace loom::autograd {

namespace {
std::atomic<uint64_t> next_sequence_nr{0};
}

Node::Node() : sequence_nr_(next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

void Node::add_output_hook(uint32_t output_nr, GradHook hook) {
  LOOM_INTERNAL_ASSERT(output_nr < output_hooks_.size());
  output_hooks_[output_nr].push_back(std::move(hook));
}

FunctionNode::FunctionNode(std::string name, Backward backward, std::vector<OutputInfo> outputs)
    : name_(std::move(name)), backward_(std::move(backward)), outputs_(std::move(outputs)) {
  set_num_outputs(outputs_.size());
}

std::vector<Tensor> FunctionNode::apply(std::vector<Tensor> grad_outputs) {
  LOOM_CHECK(!released_,
             "backward: {} was already run by a previous backward() that freed the graph; pass "
             "retain_graph=true to the first backward() to run it again",
             name_);
  for (size_t i = 0; i < grad_outputs.size(); ++i) {
    if (!grad_outputs[i].defined()) {
      grad_outputs[i] = outputs_[i].zeros
                            ? outputs_[i].zeros()
                            : ops::zeros(outputs_[i].shape, outputs_[i].dtype, outputs_[i].device);
    }
  }
  std::vector<Tensor> grads = backward_(grad_outputs);
  LOOM_INTERNAL_ASSERT(grads.size() == next_edges().size(),
                       "{} returned {} gradients for {} inputs", name_, grads.size(),
                       next_edges().size());
  return grads;
}

void FunctionNode::release() {
  backward_ = nullptr;  // drops every tensor the backward closure saved
  released_ = true;
}

AccumulateGrad::AccumulateGrad(Tensor leaf) : leaf_(std::move(leaf)) {
  set_num_outputs(1);
  set_runs_first();
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor> grad_outputs) {
  Tensor grad = std::move(grad_outputs.at(0));
  // No gradient reached this leaf (every path to it returned an undefined one, e.g. where's
  // condition): nothing to accumulate.
  if (!grad.defined()) return {};
  AutogradMeta& meta = autograd_meta(leaf_);
  // A gradient of another floating dtype (a cast's backward that hands a bf16 gradient on for its
  // f32 leaf to take, nn/mixed_precision.cc) becomes the leaf's dtype here: converted as it is
  // added where .grad is a buffer the leaf owns (one kernel on a GPU, ops::add_), converted first
  // otherwise and wherever a hook or a DTensor is to see it. The values are the same either way
  // (the conversion is exact; the add is in the leaf's dtype).
  const bool converts_as_it_adds = leaf_.grad().defined() && meta.accumulate_in_place &&
                                   meta.grad_hooks.empty() && !grad.extension() &&
                                   !leaf_.extension();
  if (grad.dtype() != leaf_.dtype() && !converts_as_it_adds) grad = ops::to(grad, leaf_.dtype());
  for (const GradHook& hook : meta.grad_hooks) {
    Tensor replaced = hook(grad);
    if (replaced.defined()) grad = replaced;
  }
  LOOM_CHECK(grad.shape() == leaf_.shape(),
             "backward: gradient of shape {} does not match its leaf of shape {}",
             shape_str(grad.shape()), shape_str(leaf_.shape()));
  // A distributed leaf's gradient takes the leaf's own layout (e.g. a Partial gradient of a
  // replicated parameter is all-reduced), so .grad always matches the parameter.
  if (grad.extension() || leaf_.extension()) grad = ops::match_layout(grad, leaf_);
  // Out of place by default: `grad` may be shared with other consumers of the same gradient.
  // In place only into a gradient buffer the leaf owns (meta.accumulate_in_place).
  const Tensor current = leaf_.grad();
  if (!current.defined()) {
    // A copy when `grad` may be the very tensor another leaf (add's backward) or the caller
    // holds; adopted when nothing else can see it (as PyTorch's AccumulateGrad steals it): a
    // fresh gradient the size of a weight costs a page-faulting copy otherwise.
    // A distributed gradient is adopted likewise when its extension holds its data alone and
    // contiguously (a tensor-parallel weight's fresh gradient, copied once per step otherwise).
    const bool adopt = grad.sole_owner() && grad.is_contiguous() && grad.dtype() == leaf_.dtype() &&
                       grad.device() == leaf_.device();
    leaf_.set_grad(adopt ? grad : ops::clone(grad));
  } else if (meta.accumulate_in_place) {
    ops::add_(current, grad);
  } else {
    leaf_.set_grad(ops::add(current, grad));
  }
  for (const PostAccumulateGradHook& hook : meta.post_accumulate_hooks) hook(leaf_);
  return {};
}

AutogradMeta& autograd_meta(const Tensor& tensor) {
  TensorImpl* impl = tensor.impl();
  LOOM_INTERNAL_ASSERT(impl != nullptr);
  if (!impl->autograd_meta) impl->autograd_meta = std::make_shared<AutogradMeta>();
  return *impl->autograd_meta;
}

Edge gradient_edge(const Tensor& tensor) {
  if (!tensor.defined()) return {};
  if (tensor.grad_fn()) return {tensor.grad_fn(), tensor.impl()->output_nr};
  if (!tensor.requires_grad()) return {};
  AutogradMeta& meta = autograd_meta(tensor);
  std::shared_ptr<AccumulateGrad> accumulator = meta.accumulator.lock();
  if (!accumulator) {
    accumulator = std::make_shared<AccumulateGrad>(tensor);
    meta.accumulator = accumulator;
  }
  return {accumulator, 0};
}

}  // namespace loom::autograd
