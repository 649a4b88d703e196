#include "nn/checkpoint.h"

#include <fmt/format.h>

#include <map>

#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "base/error.h"
#include "nn/auxiliary_loss.h"
#include "nn/batch_part.h"
#include "nn/layers.h"
#include "tensor/dispatch.h"
#include "tensor/flop_counter.h"
#include "tensor/ops.h"

namespace loom::nn {

namespace {

thread_local bool recomputing_now = false;

// Marks this thread as recomputing for a scope (nested recomputes keep the mark), for
// in_checkpoint_recompute() and the FLOP counter (a recompute's products are not model FLOPs).
class Recomputing {
 public:
  Recomputing() : previous_(recomputing_now) { recomputing_now = true; }
  ~Recomputing() { recomputing_now = previous_; }
  Recomputing(const Recomputing&) = delete;
  Recomputing& operator=(const Recomputing&) = delete;

 private:
  bool previous_;
  FlopCounter::RecomputeScope flops_;
};

// What a module's forward reads besides its input: each module's parameter slots, and each
// dropout's RNG position.
struct ForwardState {
  struct Slot {
    Module* module;
    std::string name;
    Tensor value;
  };
  std::vector<Slot> slots;
  DropoutCalls rng;

  static ForwardState of(Module& root) {
    ForwardState state;
    for (auto& [path, module] : root.named_modules()) {
      for (auto& [name, value] : module->named_parameters(/*recurse=*/false)) {
        state.slots.push_back({module, name, value});
      }
    }
    state.rng = DropoutCalls::of(root);
    return state;
  }
  void apply() const {
    for (const Slot& slot : slots) slot.module->set_parameter(slot.name, slot.value);
    rng.restore();
  }
};

// The outputs a policy keeps from a checkpointed forward, in call order.
struct KeptOutputs {
  struct Entry {
    OpId op;
    std::vector<Shape> input_shapes;
    std::vector<Tensor> outputs;
  };
  std::vector<Entry> entries;
  size_t next = 0;  // the recompute's position
};

std::vector<Shape> shapes_of(const OpCall& call) {
  std::vector<Shape> shapes;
  for (const Tensor& t : call.inputs) shapes.push_back(t.defined() ? t.shape() : Shape{});
  return shapes;
}

// The policy's decision for each call of a forward (or its recompute), numbering the calls of
// each op: both see the same calls in the same order, so they decide alike.
class PolicyCalls {
 public:
  explicit PolicyCalls(const CheckpointPolicy& policy) : policy_(policy) {}
  bool keep(OpId op) { return policy_.keep(op, calls_[op]++); }

 private:
  const CheckpointPolicy& policy_;
  std::map<OpId, int64_t> calls_;
};

// Forward: runs every op, keeping the outputs of those the policy keeps.
class KeepMode : public DispatchMode {
 public:
  KeepMode(const CheckpointPolicy& policy, KeptOutputs& kept) : policy_(policy), kept_(kept) {}
  std::vector<Tensor> dispatch(const OpCall& call) override {
    std::vector<Tensor> outputs = call_op(call);
    if (policy_.keep(call.id)) kept_.entries.push_back({call.id, shapes_of(call), outputs});
    return outputs;
  }

 private:
  PolicyCalls policy_;
  KeptOutputs& kept_;
};

// Recompute: hands back the kept outputs in order instead of running those ops again.
class ReplayMode : public DispatchMode {
 public:
  ReplayMode(const CheckpointPolicy& policy, KeptOutputs& kept, const std::string& module)
      : policy_(policy), kept_(kept), module_(module) {}
  std::vector<Tensor> dispatch(const OpCall& call) override {
    if (!policy_.keep(call.id)) return call_op(call);
    LOOM_INTERNAL_ASSERT(kept_.next < kept_.entries.size(),
                         "checkpoint({}): the recompute ran {} more times than the forward",
                         module_, op_name(call.id));
    KeptOutputs::Entry& entry = kept_.entries[kept_.next++];
    LOOM_INTERNAL_ASSERT(entry.op == call.id && entry.input_shapes == shapes_of(call),
                         "checkpoint({}): the recompute's kept op {} is {} on other inputs than "
                         "the forward's {}: the forward is not deterministic",
                         module_, kept_.next - 1, op_name(call.id), op_name(entry.op));
    return std::move(entry.outputs);  // handed back once: the entry lets go of them
  }

 private:
  PolicyCalls policy_;
  KeptOutputs& kept_;
  const std::string& module_;
};

}  // namespace

CheckpointPolicy CheckpointPolicy::full() { return {.name = "full", .keep = nullptr}; }

CheckpointPolicy CheckpointPolicy::selective_op() {
  return {.name = "selective-op", .keep = [](OpId op, int64_t nth) {
            if (op == OpId::scaled_dot_product_attention) return true;
            return (op == OpId::matmul || op == OpId::linear) && nth % 2 == 0;
          }};
}

CheckpointPolicy CheckpointPolicy::matmuls_and_attention() {
  return {.name = "matmuls-and-attention", .keep = [](OpId op, int64_t) {
            return op == OpId::matmul || op == OpId::linear ||
                   op == OpId::scaled_dot_product_attention;
          }};
}

Tensor checkpointed_forward(Module& module, const Tensor& input) {
  // What the backward needs, given up as soon as it has run: the input (the one activation
  // kept), the forward's slots (FSDP's gathered parameters among them: held past the unit's
  // backward, every unit's would stay until the whole backward ends) and the kept outputs.
  struct Saved {
    Module* target;
    ForwardState before;
    Tensor input;
    std::shared_ptr<const CheckpointPolicy> policy;
    KeptOutputs kept;
    double auxiliary_loss_scale;
    BatchPart::Place batch_part;  // the forward's rows in the batch: its dropout masks' place
    bool used = false;
  };
  auto saved = std::make_shared<Saved>(Saved{&module,
                                             ForwardState::of(module),
                                             input,
                                             module.checkpoint_policy(),
                                             {},
                                             AuxiliaryLossScale::current(),
                                             BatchPart::current()});
  const bool selective = saved->policy != nullptr && saved->policy->keep != nullptr;
  Tensor output;
  {
    NoGradGuard no_grad;  // no graph: no activation is kept (but the policy's outputs)
    if (selective) {
      KeepMode keep(*saved->policy, saved->kept);
      ScopedDispatchMode mode(keep);
      output = module.forward(input);
    } else {
      output = module.forward(input);
    }
  }
  // A graph node needs an input that requires grad; when the module's input does not (its
  // parameters still do), an anchor leaf stands in and receives no gradient.
  std::vector<Tensor> inputs{input};
  if (!input.requires_grad()) {
    Tensor anchor = ops::zeros({1});
    anchor.set_requires_grad(true);
    inputs.push_back(anchor);
  }
  const size_t count = inputs.size();
  return autograd::record(
      fmt::format("checkpoint({})", module.type_name()), inputs, std::vector<Tensor>{output},
      [saved, count, selective](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
        Module& target = *saved->target;
        LOOM_CHECK(!saved->used,
                   "checkpoint({}): a second backward through a checkpointed module (retain_graph) "
                   "is not supported: its forward state went with the first",
                   target.type_name());
        saved->used = true;
        // The recompute sees the forward's slots and RNG positions; everything is put back after.
        const ForwardState after = ForwardState::of(target);
        const Tensor input = std::move(saved->input);
        Tensor leaf = detach(input);
        if (input.requires_grad()) leaf.set_requires_grad(true);
        Tensor recomputed;
        {
          EnableGradGuard grad_on;
          AuxiliaryLossScale scale(saved->auxiliary_loss_scale);
          const BatchPart::Reopen part(saved->batch_part);
          const Recomputing recomputing;
          saved->before.apply();
          try {
            if (selective) {
              ReplayMode replay(*saved->policy, saved->kept, target.type_name());
              ScopedDispatchMode mode(replay);
              recomputed = target.forward(leaf);
            } else {
              recomputed = target.forward(leaf);
            }
          } catch (...) {
            after.apply();
            throw;
          }
          after.apply();
        }
        saved->before = {};  // the forward's slots are let go before this backward
        saved->kept = {};
        std::vector<Tensor> result(count);
        if (recomputed.requires_grad()) {
          if (autograd::split_input_running()) {
            // Inside a split backward's B: the block's input gradient now, its weights' with W.
            std::vector<Tensor> inputs;
            if (leaf.requires_grad()) inputs.push_back(leaf);
            autograd::defer_to_weight_backward(autograd::backward_input(
                std::vector<Tensor>{recomputed}, std::vector<Tensor>{grads.at(0)}, inputs));
          } else {
            backward(std::vector<Tensor>{recomputed}, std::vector<Tensor>{grads.at(0)});
          }
        }
        if (input.requires_grad()) result[0] = leaf.grad();
        return result;
      })[0];
}

bool in_checkpoint_recompute() { return recomputing_now; }

}  // namespace loom::nn
