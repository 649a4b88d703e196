// The recorded graph: a Node per op that produced a tensor requiring grad, with Edges to the
// nodes that produced its inputs. Leaves end in an AccumulateGrad node.
//
// Ownership runs backwards only: a tensor owns its grad_fn, a node owns the nodes behind it.
// Nothing in the graph owns the tensors an op produced (recorded outputs are fresh handles, see
// record() in function.h), so graphs are freed with their last output — no cycles.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace loom::autograd {

class Node;

// Where one input's gradient goes: input `input_nr` of `node`. An invalid edge (no node)
// means the input needs no gradient.
struct Edge {
  std::shared_ptr<Node> node;
  uint32_t input_nr = 0;
  bool valid() const { return node != nullptr; }
};

// Rewrites the gradient flowing into a tensor (returns an undefined Tensor to keep it as is).
using GradHook = std::function<Tensor(const Tensor&)>;
// Runs after a leaf's .grad has been updated, during backward.
using PostAccumulateGradHook = std::function<void(const Tensor& leaf)>;

// Inside a node's apply: whether the engine wants the gradient of the node's input `i` (its next
// edge i) from this run. Always true in a plain backward; a split backward (engine.h:
// backward_input) runs a node whose inputs lead both to the chosen inputs and to weights twice,
// once for each side. A formula may skip what is not wanted (the engine drops it anyway).
bool needs_input_grad(size_t i);
// Inside a node's apply: whether the engine releases the node right after it (no retain_graph,
// not kept for a split backward's W). A formula may then write a gradient over a saved input
// that nothing else holds (Tensor::sole_owner): cross entropy's over its logits.
bool releases_after_apply();

class Node {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Gradients of this node's inputs from the gradients of its outputs (one per output; an
  // output that received none gets zeros). Returns one tensor per next edge (undefined = none).
  virtual std::vector<Tensor> apply(std::vector<Tensor> grad_outputs) = 0;
  virtual std::string name() const = 0;
  // Frees saved tensors once backward no longer needs them (retain_graph = false).
  virtual void release() {}
  // Whether release() freed what apply needs (a second apply then throws).
  virtual bool released() const { return false; }
  // A node that saves nothing may run in several backward passes: mixed precision's weight
  // casts (nn/mixed_precision.h), shared by the microbatches of a step. The engine never
  // releases it; it goes with the last tensor that holds it.
  void set_reusable() { reusable_ = true; }
  bool reusable() const { return reusable_; }

  const std::vector<Edge>& next_edges() const { return next_edges_; }
  void set_next_edges(std::vector<Edge> edges) { next_edges_ = std::move(edges); }
  // Creation order: the engine runs later nodes first, as PyTorch does, so gradients of the
  // last layers become ready first (what DDP's bucket order assumes).
  uint64_t sequence_nr() const { return sequence_nr_; }
  // Whether the engine runs this node as soon as it is ready, before any other ready node
  // (AccumulateGrad, as PyTorch's: a gradient goes into .grad at once instead of living, with
  // every other parameter's, until the end of the backward; and mixed precision's weight casts,
  // created before the whole forward and so otherwise run last).
  bool runs_first() const { return runs_first_; }
  void set_runs_first() { runs_first_ = true; }
  size_t num_outputs() const { return output_hooks_.size(); }
  void set_num_outputs(size_t n) { output_hooks_.resize(n); }
  // Hooks on output `output_nr` (a non-leaf tensor's register_hook).
  void add_output_hook(uint32_t output_nr, GradHook hook);
  const std::vector<GradHook>& output_hooks(uint32_t output_nr) const {
    return output_hooks_[output_nr];
  }

 private:
  std::vector<Edge> next_edges_;
  std::vector<std::vector<GradHook>> output_hooks_;
  uint64_t sequence_nr_;
  bool reusable_ = false;
  bool runs_first_ = false;
};

// A node whose backward is a function object — what every built-in op and custom Function
// records. Output metadata is kept to materialize zero gradients for unused outputs.
class FunctionNode final : public Node {
 public:
  using Backward = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;
  struct OutputInfo {
    Shape shape;
    DType dtype;
    Device device;
    // A wrapper output's zeros (TensorExtension::zeros_maker: a DTensor's, sharded as it was);
    // none: plain zeros of shape.
    std::function<Tensor()> zeros;
  };

  FunctionNode(std::string name, Backward backward, std::vector<OutputInfo> outputs);
  std::vector<Tensor> apply(std::vector<Tensor> grad_outputs) override;
  std::string name() const override { return name_; }
  void release() override;
  bool released() const override { return released_; }

 private:
  std::string name_;
  Backward backward_;
  std::vector<OutputInfo> outputs_;
  bool released_ = false;
};

// The sink for a leaf's gradient: runs the leaf's grad hooks, adds the gradient into
// leaf.grad(), then runs its post-accumulate hooks — immediately, in the order gradients
// become ready.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Tensor leaf);
  std::vector<Tensor> apply(std::vector<Tensor> grad_outputs) override;
  std::string name() const override { return "AccumulateGrad"; }
  const Tensor& leaf() const { return leaf_; }

 private:
  Tensor leaf_;
};

// Per-tensor autograd state beyond TensorImpl's plain fields: the leaf's accumulator and hooks.
struct AutogradMeta {
  std::weak_ptr<AccumulateGrad> accumulator;
  // When set and the leaf already has a gradient, new gradients are added into that tensor in
  // place (its storage is kept): what DDP uses to keep .grad a view into its bucket.
  bool accumulate_in_place = false;
  std::vector<GradHook> grad_hooks;  // leaves only; non-leaf hooks live on their grad_fn
  std::vector<PostAccumulateGradHook> post_accumulate_hooks;
};

AutogradMeta& autograd_meta(const Tensor& tensor);
// The edge a gradient for `tensor` flows into (invalid when it needs none).
Edge gradient_edge(const Tensor& tensor);

}  // namespace loom::autograd
