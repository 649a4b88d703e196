#include "autograd/engine.h"

#include <queue>
#include <unordered_map>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "base/error.h"
#include "base/profiler.h"
#include "tensor/ops_copy.h"
#include "tensor/ops_create.h"
#include "tensor/ops_elementwise.h"

namespace loom {

namespace {

using autograd::Edge;
using autograd::Node;

struct NodeTask {
  Node* node;
  // A max-heap: nodes that run first (AccumulateGrad), then the latest created.
  bool operator<(const NodeTask& other) const {
    const bool first = node->runs_first(), other_first = other.node->runs_first();
    if (first != other_first) return other_first;
    return node->sequence_nr() < other.node->sequence_nr();
  }
};

// Gradient inputs collected for one node, summed per output slot.
struct InputBuffer {
  std::vector<Tensor> grads;
  void add(size_t slot, const Tensor& grad) {
    if (grads.size() <= slot) grads.resize(slot + 1);
    grads[slot] = grads[slot].defined() ? ops::add(grads[slot], grad) : grad;
  }
};

Tensor apply_output_hooks(Node* node, uint32_t slot, Tensor grad) {
  for (const auto& hook : node->output_hooks(slot)) {
    Tensor replaced = hook(grad);
    if (replaced.defined()) grad = replaced;
  }
  return grad;
}

// Callbacks queued during the backward running on this thread (nullptr: none running).
thread_local std::vector<std::function<void()>>* pending_callbacks = nullptr;

}  // namespace

namespace autograd {
void queue_backward_callback(std::function<void()> callback) {
  LOOM_CHECK(pending_callbacks != nullptr,
             "queue_backward_callback: no backward pass is running on this thread");
  pending_callbacks->push_back(std::move(callback));
}

bool backward_running() { return pending_callbacks != nullptr; }
}  // namespace autograd

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
              bool retain_graph) {
  LOOM_CHECK(roots.size() == grads.size(), "backward: got {} roots but {} seed gradients",
             roots.size(), grads.size());
  // Backward formulas run plain ops; nothing inside records a graph.
  NoGradGuard no_grad;
  profiler::Scope scope("autograd::backward");  // the ops it runs are timed inside it

  std::vector<Edge> root_edges;
  std::vector<Tensor> seeds;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& root = roots[i];
    LOOM_CHECK(root.defined(), "backward: root {} is undefined", i);
    LOOM_CHECK(root.requires_grad(),
               "backward: root {} ({}) does not require grad and has no grad_fn; did you forget "
               "set_requires_grad(true) on an input, or run the forward under NoGradGuard?",
               i, root.description());
    Tensor seed = grads[i];
    if (!seed.defined()) {
      LOOM_CHECK(root.numel() == 1,
                 "backward: a seed gradient is required for a root with more than one element "
                 "(root shape {})",
                 shape_str(root.shape()));
      seed = ops::ones(root.shape(), root.dtype(), root.device());
      // A distributed root (a DTensor loss) gets a seed in its own layout, so the backward
      // formulas never mix it with plain tensors.
      if (root.extension()) seed = ops::match_layout(seed, root);
    }
    LOOM_CHECK(seed.shape() == root.shape(),
               "backward: seed gradient of shape {} does not match root of shape {}",
               shape_str(seed.shape()), shape_str(root.shape()));
    root_edges.push_back(autograd::gradient_edge(root));
    seeds.push_back(seed);
  }

  // Count, for every reachable node, how many edges point at it.
  std::unordered_map<Node*, int> dependencies;
  std::vector<std::shared_ptr<Node>> visited;  // keeps nodes alive, and lists them for release
  {
    std::vector<Node*> stack;
    for (const Edge& edge : root_edges) {
      if (edge.valid() && !dependencies.count(edge.node.get())) {
        dependencies[edge.node.get()] = 0;
        visited.push_back(edge.node);
        stack.push_back(edge.node.get());
      }
    }
    while (!stack.empty()) {
      Node* node = stack.back();
      stack.pop_back();
      for (const Edge& next : node->next_edges()) {
        if (!next.valid()) continue;
        auto [it, inserted] = dependencies.try_emplace(next.node.get(), 0);
        ++it->second;
        if (inserted) {
          visited.push_back(next.node);
          stack.push_back(next.node.get());
        }
      }
    }
  }

  // A backward run inside another's node (an activation checkpoint's recompute) queues its
  // callbacks to the outer one: they run once, when the whole backward is done.
  std::vector<std::function<void()>> callbacks;
  auto* outer_callbacks = pending_callbacks;
  const bool nested = outer_callbacks != nullptr;
  if (!nested) pending_callbacks = &callbacks;
  struct RestoreCallbacks {
    std::vector<std::function<void()>>* outer;
    ~RestoreCallbacks() { pending_callbacks = outer; }
  } restore{outer_callbacks};

  std::unordered_map<Node*, InputBuffer> buffers;
  std::priority_queue<NodeTask> ready;
  for (size_t i = 0; i < root_edges.size(); ++i) {
    if (!root_edges[i].valid()) continue;
    buffers[root_edges[i].node.get()].add(root_edges[i].input_nr, seeds[i]);
  }
  for (const auto& [node, count] : dependencies) {
    if (count == 0) ready.push({node});
  }

  while (!ready.empty()) {
    Node* node = ready.top().node;
    ready.pop();
    InputBuffer buffer = std::move(buffers[node]);
    buffers.erase(node);
    buffer.grads.resize(node->num_outputs());
    for (uint32_t slot = 0; slot < buffer.grads.size(); ++slot) {
      if (buffer.grads[slot].defined()) {
        buffer.grads[slot] = apply_output_hooks(node, slot, std::move(buffer.grads[slot]));
      }
    }
    std::vector<Tensor> input_grads = node->apply(std::move(buffer.grads));
    // Its saved tensors are not needed again (each node runs once per backward): freed now, as
    // PyTorch does, so a backward's memory falls as it goes instead of holding every
    // activation until it ends.
    if (!retain_graph && !node->reusable()) node->release();
    const auto& edges = node->next_edges();
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& edge = edges[i];
      if (!edge.valid()) continue;
      if (i < input_grads.size() && input_grads[i].defined()) {
        buffers[edge.node.get()].add(edge.input_nr, input_grads[i]);
      }
      if (--dependencies[edge.node.get()] == 0) ready.push({edge.node.get()});
    }
  }

  if (!retain_graph) {
    for (const auto& node : visited) {
      if (!node->reusable()) node->release();
    }
  }
  // Callbacks may queue more callbacks; run until none are left.
  for (size_t i = 0; i < callbacks.size(); ++i) {
    auto callback = std::move(callbacks[i]);  // the vector may grow while it runs
    callback();
  }
}

void backward(const Tensor& root, const Tensor& grad, bool retain_graph) {
  backward(std::vector<Tensor>{root}, std::vector<Tensor>{grad}, retain_graph);
}

}  // namespace loom
