// Gradient hooks, as torch.Tensor.register_hook and register_post_accumulate_grad_hook.
#pragma once

#include "autograd/node.h"

namespace loom::autograd {

// `hook(grad)` runs when the gradient for `tensor` has been computed, before it is used; a
// defined return value replaces the gradient. Works on leaves and non-leaves that require grad.
void register_hook(const Tensor& tensor, GradHook hook);

// `hook(leaf)` runs right after `leaf.grad()` has been updated during backward — the moment the
// gradient is ready, in readiness order. Leaves that require grad only.
void register_post_accumulate_grad_hook(const Tensor& leaf, PostAccumulateGradHook hook);

}  // namespace loom::autograd
