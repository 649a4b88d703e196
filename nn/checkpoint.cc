#include "nn/checkpoint.h"

#include <fmt/format.h>

#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "nn/layers.h"
#include "tensor/ops.h"

namespace loom::nn {

namespace {

// What a module's forward reads besides its input: each module's parameter slots, and each
// dropout's RNG position.
struct ForwardState {
  struct Slot {
    Module* module;
    std::string name;
    Tensor value;
  };
  std::vector<Slot> slots;
  std::vector<std::pair<Dropout*, uint64_t>> rng;

  static ForwardState of(Module& root) {
    ForwardState state;
    for (auto& [path, module] : root.named_modules()) {
      for (auto& [name, value] : module->named_parameters(/*recurse=*/false)) {
        state.slots.push_back({module, name, value});
      }
      if (auto* dropout = dynamic_cast<Dropout*>(module)) {
        state.rng.emplace_back(dropout, dropout->calls());
      }
    }
    return state;
  }
  void apply() const {
    for (const Slot& slot : slots) slot.module->set_parameter(slot.name, slot.value);
    for (const auto& [dropout, calls] : rng) dropout->set_calls(calls);
  }
};

// Grad mode on for its scope, whatever the caller's (the engine runs backward under no-grad).
class GradOn {
 public:
  GradOn() : previous_(GradMode::is_enabled()) { GradMode::set_enabled(true); }
  ~GradOn() { GradMode::set_enabled(previous_); }
  GradOn(const GradOn&) = delete;
  GradOn& operator=(const GradOn&) = delete;

 private:
  bool previous_;
};

}  // namespace

Tensor checkpointed_forward(Module& module, const Tensor& input) {
  const ForwardState before = ForwardState::of(module);
  Tensor output;
  {
    NoGradGuard no_grad;  // no graph: no activation is kept
    output = module.forward(input);
  }
  // A graph node needs an input that requires grad; when the module's input does not (its
  // parameters still do), an anchor leaf stands in and receives no gradient.
  std::vector<Tensor> inputs{input};
  if (!input.requires_grad()) {
    Tensor anchor = ops::zeros({1});
    anchor.set_requires_grad(true);
    inputs.push_back(anchor);
  }
  Module* target = &module;
  const size_t count = inputs.size();
  return autograd::record(
      fmt::format("checkpoint({})", module.type_name()), inputs, std::vector<Tensor>{output},
      [target, before, input, count](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
        // The recompute sees the forward's slots and RNG positions; everything is put back after.
        const ForwardState after = ForwardState::of(*target);
        Tensor leaf = detach(input);
        if (input.requires_grad()) leaf.set_requires_grad(true);
        Tensor recomputed;
        {
          GradOn grad_on;
          before.apply();
          try {
            recomputed = target->forward(leaf);
          } catch (...) {
            after.apply();
            throw;
          }
          after.apply();
        }
        std::vector<Tensor> result(count);
        if (recomputed.requires_grad()) {
          backward(std::vector<Tensor>{recomputed}, std::vector<Tensor>{grads.at(0)});
        }
        if (input.requires_grad()) result[0] = leaf.grad();
        return result;
      })[0];
}

}  // namespace loom::nn
