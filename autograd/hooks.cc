#include "autograd/hooks.h"

#include "base/error.h"

namespace loom::autograd {

void register_hook(const Tensor& tensor, GradHook hook) {
  LOOM_CHECK(tensor.defined() && tensor.requires_grad(),
             "register_hook: the tensor does not require grad ({}); a hook on it would never run",
             tensor.description());
  if (tensor.grad_fn()) {
    tensor.grad_fn()->add_output_hook(tensor.impl()->output_nr, std::move(hook));
  } else {
    autograd_meta(tensor).grad_hooks.push_back(std::move(hook));
  }
}

void register_post_accumulate_grad_hook(const Tensor& leaf, PostAccumulateGradHook hook) {
  LOOM_CHECK(leaf.defined() && leaf.requires_grad() && leaf.is_leaf(),
             "register_post_accumulate_grad_hook: expected a leaf that requires grad, got {} "
             "(requires_grad={}, leaf={})",
             leaf.description(), leaf.requires_grad(), leaf.defined() && leaf.is_leaf());
  autograd_meta(leaf).post_accumulate_hooks.push_back(std::move(hook));
}

}  // namespace loom::autograd
