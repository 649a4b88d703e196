// Reverse-mode execution of the recorded graph.
#pragma once

#include <functional>
#include <memory>
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

// Split backward (zero-bubble pipelines' B and W, Qi et al. 2023): backward_input runs now only
// the part of the roots' backward that leads to `inputs` (leaves that require grad; their
// gradients accumulate into .grad as backward's do) — B — and returns the rest — W: the nodes
// that lead to nothing but other leaves (the weights), with the gradients B sent them. W keeps
// alive what those nodes saved (the activations their weight gradients need; B's own nodes are
// freed as they run) and the gradients waiting for them; run() computes the weights' gradients
// once, firing their hooks (DDP's buckets, FSDP's reduce-scatters) and the callbacks queued
// meanwhile, then frees all of it. Together B then W give the gradients one backward gives.
class WeightBackward {
 public:
  struct State;
  WeightBackward();
  explicit WeightBackward(std::shared_ptr<State> state);
  ~WeightBackward();
  WeightBackward(WeightBackward&&) noexcept;
  WeightBackward& operator=(WeightBackward&&) noexcept;
  // Runs W. Throws naming the cause when it ran already, or when the graph's saved tensors were
  // freed since B (another backward through it).
  void run();
  bool done() const;

 private:
  std::shared_ptr<State> state_;
};
WeightBackward backward_input(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                              const std::vector<Tensor>& inputs);
// Whether a split backward's B is running on this thread. A backward started inside it (an
// activation checkpoint's recompute) splits too: its B now, its W handed to
// defer_to_weight_backward, which the running split's W runs (a plain backward there throws).
bool split_input_running();
void defer_to_weight_backward(WeightBackward weights);
}  // namespace autograd

}  // namespace loom
