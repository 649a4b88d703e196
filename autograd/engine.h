// Reverse-mode execution of the recorded graph.
#pragma once

#include <functional>
#include <vector>

#include "tensor/tensor.h"

namespace loom {

// Computes gradients of `root` with respect to every leaf that requires grad and adds them
// into leaf.grad(). `grad` seeds the backward: required for a root with more than one element
// (it must have the root's shape), defaulting to 1 for a scalar. With retain_graph = false the
// graph's saved tensors are freed, and a second backward through it throws a loom::Error that
// says so.
//
// Nodes run in reverse creation order as their inputs become complete, and each leaf's
// post-accumulate hooks fire the moment its gradient is accumulated — during backward, not
// after — so a DDP reducer can start all-reducing early buckets while later ones compute.
void backward(const Tensor& root, const Tensor& grad = Tensor(), bool retain_graph = false);
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
              bool retain_graph = false);

namespace autograd {
// Runs `callback` once the backward pass now running has finished all its nodes (on the same
// thread, before backward() returns) — like torch's Variable._execution_engine.queue_callback.
// DDP uses it to wait for its last all-reduces. Throws when no backward is running.
void queue_backward_callback(std::function<void()> callback);
// Whether a backward pass is running on this thread (a checkpoint's recompute runs inside one).
bool backward_running();
}  // namespace autograd

}  // namespace loom
