#include "autograd/engine.h"

#include <functional>
#include <queue>
#include <unordered_map>
#include <unordered_set>

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
    Tensor& sum = grads[slot];
    if (!sum.defined()) {
      sum = grad;
    } else if (accumulates_in_place(sum, grad)) {
      ops::add_(sum, grad);  // the same values as add's, without a new tensor (PyTorch's too)
    } else {
      sum = ops::add(sum, grad);
    }
  }
  // A tensor's gradients summed where it feeds several ops (a residual stream): into the first
  // when nothing else holds it and it is a plain contiguous tensor of the sum's shape and dtype
  // (a distributed one keeps add's choice of placement).
  static bool accumulates_in_place(const Tensor& sum, const Tensor& grad) {
    return sum.extension() == nullptr && grad.extension() == nullptr && sum.sole_owner() &&
           sum.is_contiguous() && sum.shape() == grad.shape() && sum.dtype() == grad.dtype() &&
           sum.device() == grad.device();
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
// The edges the node now running must produce (nullptr: all).
thread_local const std::vector<bool>* wanted_edges = nullptr;
// Whether the node now running is released right after its apply.
thread_local bool last_apply = false;
// The split backward whose B is running on this thread (nullptr: none): a backward started
// inside it (an activation checkpoint's recompute) must split too, its W deferred to this one's.
thread_local autograd::WeightBackward::State* split_input_state = nullptr;

}  // namespace

namespace autograd {
bool needs_input_grad(size_t i) {
  return wanted_edges == nullptr || (i < wanted_edges->size() && (*wanted_edges)[i]);
}

bool releases_after_apply() { return last_apply; }

void queue_backward_callback(std::function<void()> callback) {
  LOOM_CHECK(pending_callbacks != nullptr,
             "queue_backward_callback: no backward pass is running on this thread");
  pending_callbacks->push_back(std::move(callback));
}

bool backward_running() { return pending_callbacks != nullptr; }
}  // namespace autograd

namespace {

// One backward's graph: every node reachable from the roots, how many edges still point at each,
// and the gradients collected for each so far.
struct Graph {
  std::unordered_map<Node*, int> dependencies;
  std::vector<std::shared_ptr<Node>> visited;  // keeps nodes alive, and lists them for release
  std::unordered_map<Node*, InputBuffer> buffers;
};

std::shared_ptr<Graph> discover(const std::vector<Tensor>& roots,
                                const std::vector<Tensor>& grads) {
  LOOM_CHECK(roots.size() == grads.size(), "backward: got {} roots but {} seed gradients",
             roots.size(), grads.size());
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
  auto graph = std::make_shared<Graph>();
  std::vector<Node*> stack;
  for (const Edge& edge : root_edges) {
    if (edge.valid() && !graph->dependencies.count(edge.node.get())) {
      graph->dependencies[edge.node.get()] = 0;
      graph->visited.push_back(edge.node);
      stack.push_back(edge.node.get());
    }
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& next : node->next_edges()) {
      if (!next.valid()) continue;
      auto [it, inserted] = graph->dependencies.try_emplace(next.node.get(), 0);
      ++it->second;
      if (inserted) {
        graph->visited.push_back(next.node);
        stack.push_back(next.node.get());
      }
    }
  }
  for (size_t i = 0; i < root_edges.size(); ++i) {
    if (!root_edges[i].valid()) continue;
    graph->buffers[root_edges[i].node.get()].add(root_edges[i].input_nr, seeds[i]);
  }
  return graph;
}

// A split backward's nodes that lead both to the chosen inputs and to weights: run in B for
// their input edges and again in W for their weight edges, with the gradients they got once.
struct TwoSided {
  std::vector<bool> b_edges, w_edges;  // which next edges each run produces
  std::vector<Tensor> grads;           // their incoming gradients, hooks applied (B keeps them)
};

// Runs, as their inputs complete, the nodes of `graph` that `admitted` accepts (every node when it
// is empty); a node it does not accept keeps its gradients and remaining count in `graph` for a
// later run. `two_sided` nodes run for the edges of `side` (true: B's, false: W's) only, and in B
// are kept for W. Callbacks queued meanwhile run at the end (or go to the backward this one runs
// inside: an activation checkpoint's recompute).
void execute(Graph& graph, const std::function<bool(Node*)>& admitted, bool retain_graph,
             std::unordered_map<Node*, TwoSided>* two_sided = nullptr, bool b_side = true,
             const std::function<void()>& before_callbacks = nullptr) {
  NoGradGuard no_grad;  // backward formulas run plain ops; nothing inside records a graph
  profiler::Scope scope("autograd::backward");  // the ops it runs are timed inside it
  std::vector<std::function<void()>> callbacks;
  auto* outer_callbacks = pending_callbacks;
  if (outer_callbacks == nullptr) pending_callbacks = &callbacks;
  struct RestoreCallbacks {
    std::vector<std::function<void()>>* outer;
    ~RestoreCallbacks() { pending_callbacks = outer; }
  } restore{outer_callbacks};

  const auto runs = [&](Node* node) { return !admitted || admitted(node); };
  std::priority_queue<NodeTask> ready;
  for (const auto& [node, count] : graph.dependencies) {
    if (count == 0 && runs(node)) ready.push({node});
  }
  if (two_sided != nullptr && !b_side) {  // W: the two-sided nodes again, their gradients kept
    for (const auto& [node, sides] : *two_sided) ready.push({node});
  }
  while (!ready.empty()) {
    Node* node = ready.top().node;
    ready.pop();
    TwoSided* sides = nullptr;
    if (two_sided != nullptr) {
      if (auto it = two_sided->find(node); it != two_sided->end()) sides = &it->second;
    }
    std::vector<Tensor> grads;
    if (sides != nullptr && !b_side) {
      grads = std::move(sides->grads);
    } else {
      InputBuffer buffer = std::move(graph.buffers[node]);
      graph.buffers.erase(node);
      graph.dependencies.erase(node);
      buffer.grads.resize(node->num_outputs());
      for (uint32_t slot = 0; slot < buffer.grads.size(); ++slot) {
        if (buffer.grads[slot].defined()) {
          buffer.grads[slot] = apply_output_hooks(node, slot, std::move(buffer.grads[slot]));
        }
      }
      grads = std::move(buffer.grads);
      if (sides != nullptr) sides->grads = grads;  // W runs it again with these
    }
    const std::vector<bool>* edges_wanted =
        sides == nullptr ? nullptr : (b_side ? &sides->b_edges : &sides->w_edges);
    // Its saved tensors are not needed after this apply (each node runs once per backward; a
    // two-sided one once per side): freed right after, as PyTorch does, so a backward's memory
    // falls as it goes instead of holding every activation until it ends.
    const bool kept_for_w = sides != nullptr && b_side;
    const bool released = !retain_graph && !node->reusable() && !kept_for_w;
    std::vector<Tensor> input_grads;
    {
      const std::vector<bool>* outer = wanted_edges;
      const bool outer_last = last_apply;
      wanted_edges = edges_wanted;
      last_apply = released;
      struct Restore {
        const std::vector<bool>* outer;
        bool outer_last;
        ~Restore() {
          wanted_edges = outer;
          last_apply = outer_last;
        }
      } restore_wanted{outer, outer_last};
      input_grads = node->apply(std::move(grads));
    }
    if (released) node->release();
    const auto& edges = node->next_edges();
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& edge = edges[i];
      if (!edge.valid()) continue;
      if (edges_wanted != nullptr && !(*edges_wanted)[i]) continue;  // the other side's
      if (i < input_grads.size() && input_grads[i].defined()) {
        graph.buffers[edge.node.get()].add(edge.input_nr, input_grads[i]);
      }
      if (--graph.dependencies[edge.node.get()] == 0 && runs(edge.node.get())) {
        ready.push({edge.node.get()});
      }
    }
  }
  // What belongs to this backward though it runs apart (the W's of checkpointed blocks split
  // inside B) runs before the callbacks, which must see every gradient (DDP's last wait).
  if (before_callbacks) before_callbacks();
  // Callbacks may queue more callbacks; run until none are left.
  for (size_t i = 0; i < callbacks.size(); ++i) {
    auto callback = std::move(callbacks[i]);  // the vector may grow while it runs
    callback();
  }
}

}  // namespace

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
              bool retain_graph) {
  LOOM_CHECK(split_input_state == nullptr,
             "backward: a full backward started inside a split backward's B "
             "(autograd::backward_input) would compute weight gradients in B; a nested backward "
             "there must split too (autograd::backward_input and defer_to_weight_backward, as an "
             "activation checkpoint's recompute does)");
  std::shared_ptr<Graph> graph = discover(roots, grads);
  execute(*graph, {}, retain_graph);
  if (!retain_graph) {
    for (const auto& node : graph->visited) {
      if (!node->reusable()) node->release();
    }
  }
}

namespace autograd {

struct WeightBackward::State {
  std::shared_ptr<Graph> graph;
  std::unordered_set<Node*> deferred;             // the nodes only W runs
  std::unordered_map<Node*, TwoSided> two_sided;  // run by both, each for its own edges
  std::vector<WeightBackward> nested;             // W's of backwards split inside B (recomputes)
  bool done = false;
};

bool split_input_running() { return split_input_state != nullptr; }

void defer_to_weight_backward(WeightBackward weights) {
  LOOM_CHECK(split_input_state != nullptr,
             "defer_to_weight_backward: no split backward's B is running on this thread");
  split_input_state->nested.push_back(std::move(weights));
}

WeightBackward::WeightBackward(std::shared_ptr<State> state) : state_(std::move(state)) {}
WeightBackward::WeightBackward() = default;
WeightBackward::~WeightBackward() = default;
WeightBackward::WeightBackward(WeightBackward&&) noexcept = default;
WeightBackward& WeightBackward::operator=(WeightBackward&&) noexcept = default;

bool WeightBackward::done() const { return state_ == nullptr || state_->done; }

void WeightBackward::run() {
  LOOM_CHECK(state_ != nullptr, "WeightBackward::run: no deferred backward (default-constructed)");
  LOOM_CHECK(!state_->done, "WeightBackward::run: the weights' backward already ran; it runs once");
  state_->done = true;
  State& s = *state_;
  std::vector<Node*> needed(s.deferred.begin(), s.deferred.end());
  for (const auto& [node, sides] : s.two_sided) needed.push_back(node);
  for (Node* node : needed) {
    LOOM_CHECK(!node->released(),
               "WeightBackward::run: the graph's saved tensors were freed before W ran (a "
               "backward through the same graph since backward_input?); W needs them");
  }
  // The checkpointed blocks' weights (their W's, split inside B) run inside this W, before its
  // callbacks: a DDP reducer's end-of-backward wait must find their gradients too.
  execute(
      *s.graph, [&s](Node* node) { return s.deferred.count(node) > 0; }, false, &s.two_sided,
      /*b_side=*/false,
      [&s] {
        for (WeightBackward& nested : s.nested) nested.run();
        s.nested.clear();
      });
  for (const auto& node : s.graph->visited) {
    const bool w_ran = s.deferred.count(node.get()) || s.two_sided.count(node.get());
    if (w_ran && !node->reusable()) node->release();
  }
  s.graph.reset();  // W's nodes and their inputs go now
  s.two_sided.clear();
}

WeightBackward backward_input(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                              const std::vector<Tensor>& inputs) {
  std::shared_ptr<Graph> graph = discover(roots, grads);
  // B: the nodes from which some input's gradient node is reachable (every path to an input runs
  // now); W: the rest (only weights behind them).
  std::unordered_set<Node*> targets;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& input = inputs[i];
    LOOM_CHECK(input.defined() && input.requires_grad(),
               "backward_input: input {} ({}) does not require grad; B computes the gradients "
               "of inputs that do",
               i, input.defined() ? input.description() : "undefined");
    LOOM_CHECK(input.grad_fn() == nullptr,
               "backward_input: input {} ({}) is not a leaf (it has a grad_fn); B accumulates "
               "into leaves' .grad: pass a detached copy that requires grad, as a pipeline stage's "
               "received input is",
               i, input.description());
    const Edge edge = gradient_edge(input);
    if (edge.valid()) targets.insert(edge.node.get());
  }
  std::unordered_map<Node*, bool> leads;  // memo: does a path from this node reach a target?
  std::function<bool(Node*)> reaches = [&](Node* node) {
    if (auto it = leads.find(node); it != leads.end()) return it->second;
    leads[node] = targets.count(node) > 0;  // (a graph is acyclic; this also stops revisits)
    bool any = targets.count(node) > 0;
    for (const Edge& next : node->next_edges()) {
      if (next.valid() && reaches(next.node.get())) any = true;
    }
    return leads[node] = any;
  };
  auto state = std::make_shared<WeightBackward::State>();
  for (const auto& node : graph->visited) {
    if (!reaches(node.get())) state->deferred.insert(node.get());
  }
  // A B node with edges into W's nodes (a matmul's weight side): B runs its input edges, W its
  // weight edges.
  for (const auto& node : graph->visited) {
    if (state->deferred.count(node.get())) continue;
    const auto& edges = node->next_edges();
    TwoSided sides{
        std::vector<bool>(edges.size(), false), std::vector<bool>(edges.size(), false), {}};
    bool any_w = false;
    for (size_t i = 0; i < edges.size(); ++i) {
      if (!edges[i].valid()) continue;
      const bool w = state->deferred.count(edges[i].node.get()) > 0;
      (w ? sides.w_edges : sides.b_edges)[i] = true;
      any_w = any_w || w;
    }
    if (any_w) state->two_sided.emplace(node.get(), std::move(sides));
  }
  {
    WeightBackward::State* outer = split_input_state;
    split_input_state = state.get();
    struct Reset {
      WeightBackward::State* outer;
      ~Reset() { split_input_state = outer; }
    } reset{outer};
    execute(
        *graph, [&state](Node* node) { return state->deferred.count(node) == 0; }, false,
        &state->two_sided, /*b_side=*/true);
  }
  for (const auto& node : graph->visited) {
    const bool b_only = !state->deferred.count(node.get()) && !state->two_sided.count(node.get());
    if (b_only && !node->reusable()) node->release();
  }
  state->graph = std::move(graph);
  return WeightBackward(std::move(state));
}

}  // namespace autograd

void backward(const Tensor& root, const Tensor& grad, bool retain_graph) {
  backward(std::vector<Tensor>{root}, std::vector<Tensor>{grad}, retain_graph);
}

}  // namespace loom
