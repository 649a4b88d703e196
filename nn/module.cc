#include "nn/module.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>

#include "autograd/grad_mode.h"
#include "base/error.h"
#include "nn/checkpoint.h"
#include "tensor/ops_copy.h"
#include "tensor/ops_views.h"

namespace loom::nn {

Tensor Module::forward(const Tensor&) {
  LOOM_FAIL("{}: this module has no single-tensor forward(); call its own forward method",
            type_name_);
}

Tensor Module::operator()(const Tensor& input) {
  Tensor x = input;
  for (const auto& hook : pre_hooks_) {
    Tensor replaced = hook(*this, x);
    if (replaced.defined()) x = replaced;
  }
  Tensor out = checkpoint_ && recording_enabled() ? checkpointed_forward(*this, x) : forward(x);
  for (const auto& hook : post_hooks_) {
    Tensor replaced = hook(*this, x, out);
    if (replaced.defined()) out = replaced;
  }
  return out;
}

void Module::reset_parameters() {
  std::vector<std::string> own;
  for (const Slot& slot : parameters_) {
    if (slot.value.defined()) own.push_back(slot.name);
  }
  LOOM_CHECK(own.empty(),
             "{}: holds parameters ({}) but does not override reset_parameters(), so they cannot "
             "be initialized in place (a model built on the meta device gets its values from "
             "it); override it to draw them as the constructor does",
             type_name_, fmt::join(own, ", "));
}

void Module::init_weights() {
  for (const auto& [name, child] : children_) child->init_weights();
  NoGradGuard no_grad;
  reset_parameters();
}

void Module::set_checkpointed(bool checkpointed) {
  checkpoint_ =
      checkpointed ? std::make_shared<const CheckpointPolicy>(CheckpointPolicy::full()) : nullptr;
}

const Tensor& Module::absent_parameter() {
  static const Tensor none;
  return none;
}

void Module::check_new_name(const std::string& name) const {
  LOOM_CHECK(!name.empty() && name.find('.') == std::string::npos,
             "{}: invalid name '{}' (non-empty, no dots)", type_name_, name);
  auto taken = [&](const auto& slots) {
    return std::any_of(slots.begin(), slots.end(), [&](const auto& s) { return s.name == name; });
  };
  const bool child_taken = std::any_of(children_.begin(), children_.end(),
                                       [&](const auto& c) { return c.first == name; });
  LOOM_CHECK(!taken(parameters_) && !taken(buffers_) && !child_taken,
             "{}: name '{}' is already registered", type_name_, name);
}

Tensor& Module::register_parameter(const std::string& name, Tensor value, bool requires_grad) {
  check_new_name(name);
  LOOM_CHECK(value.defined(), "{}: parameter '{}' is undefined", type_name_, name);
  if (requires_grad && !value.requires_grad()) value.set_requires_grad(true);
  parameters_.push_back({name, std::move(value)});
  return parameters_.back().value;
}

Tensor& Module::register_buffer(const std::string& name, Tensor value) {
  check_new_name(name);
  buffers_.push_back({name, std::move(value)});
  return buffers_.back().value;
}

void Module::register_module_impl(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name);
  LOOM_CHECK(module != nullptr, "{}: submodule '{}' is null", type_name_, name);
  children_.emplace_back(name, std::move(module));
}

void Module::collect_parameters(const std::string& prefix, bool recurse,
                                std::vector<std::pair<std::string, Tensor>>& out,
                                std::vector<const TensorImpl*>& seen) const {
  for (const Slot& slot : parameters_) {
    if (std::find(seen.begin(), seen.end(), slot.value.impl()) != seen.end()) continue;
    seen.push_back(slot.value.impl());
    out.emplace_back(prefix + slot.name, slot.value);
  }
  if (!recurse) return;
  for (const auto& [name, child] : children_) {
    child->collect_parameters(prefix + name + ".", true, out, seen);
  }
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::vector<const TensorImpl*> seen;
  collect_parameters("", recurse, out, seen);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, value] : named_parameters(recurse)) out.push_back(value);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out{{"", this}};
  for (const auto& [name, child] : children_) {
    for (const auto& [sub_name, sub] : child->named_modules()) {
      out.emplace_back(sub_name.empty() ? name : name + "." + sub_name, sub);
    }
  }
  return out;
}

std::vector<Module*> Module::modules() {
  std::vector<Module*> out;
  // Depth first without recursion's vector per level: the children go on a stack in reverse,
  // so the first child is visited next.
  std::vector<Module*> stack{this};
  while (!stack.empty()) {
    Module* m = stack.back();
    stack.pop_back();
    out.push_back(m);
    for (auto it = m->children_.rbegin(); it != m->children_.rend(); ++it) {
      stack.push_back(it->second.get());
    }
  }
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
  return children_;
}

Module& Module::submodule(const std::string& path) {
  Module* current = this;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = path.find('.', start);
    const std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    auto it = std::find_if(current->children_.begin(), current->children_.end(),
                           [&](const auto& c) { return c.first == part; });
    LOOM_CHECK(it != current->children_.end(),
               "submodule: '{}' has no submodule '{}' (in path '{}')", current->type_name_, part,
               path);
    current = it->second.get();
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return *current;
}

void Module::set_parameter(const std::string& name, Tensor value) {
  auto it = std::find_if(parameters_.begin(), parameters_.end(),
                         [&](const Slot& s) { return s.name == name; });
  LOOM_CHECK(it != parameters_.end(), "set_parameter: {} has no parameter '{}'", type_name_, name);
  it->value = std::move(value);
}

void Module::to(Device device) {
  NoGradGuard no_grad;  // parameters stay leaves: the copy is not part of any graph
  for (std::deque<Slot>* slots : {&parameters_, &buffers_}) {
    for (Slot& slot : *slots) {
      if (slot.value.device() == device) continue;
      const bool requires_grad = slot.value.requires_grad();
      slot.value = ops::to(slot.value, device);
      if (requires_grad) slot.value.set_requires_grad(true);
    }
  }
  for (auto& [name, child] : children_) child->to(device);
}

const Tensor& Module::parameter(const std::string& name) const {
  auto it = std::find_if(parameters_.begin(), parameters_.end(),
                         [&](const Slot& s) { return s.name == name; });
  LOOM_CHECK(it != parameters_.end(), "parameter: {} has no parameter '{}'", type_name_, name);
  return it->value;
}

bool Module::has_parameter(const std::string& name) const {
  return std::any_of(parameters_.begin(), parameters_.end(),
                     [&](const Slot& s) { return s.name == name && s.value.defined(); });
}

void Module::zero_grad() {
  for (auto& [name, p] : named_parameters()) p.set_grad(Tensor());
}

void Module::train(bool training) {
  training_ = training;
  for (auto& [name, child] : children_) child->train(training);
}

void Module::collect_state(const std::string& prefix, StateDict& out) const {
  for (const Slot& slot : parameters_) out.emplace(prefix + slot.name, slot.value);
  for (const Slot& slot : buffers_) out.emplace(prefix + slot.name, slot.value);
  for (const auto& [name, child] : children_) child->collect_state(prefix + name + ".", out);
}

StateDict Module::state_dict() const {
  StateDict out;
  collect_state("", out);
  return out;
}

void Module::load_state_dict(const StateDict& state, bool strict) {
  const StateDict own = state_dict();
  std::vector<std::string> missing, unexpected;
  for (const auto& [name, tensor] : own) {
    if (!state.count(name)) missing.push_back(name);
  }
  for (const auto& [name, tensor] : state) {
    if (!own.count(name)) unexpected.push_back(name);
  }
  LOOM_CHECK(!strict || (missing.empty() && unexpected.empty()),
             "load_state_dict: {} state does not match: missing keys [{}], unexpected keys [{}]",
             type_name_, fmt::join(missing, ", "), fmt::join(unexpected, ", "));
  NoGradGuard no_grad;
  for (const auto& [name, target] : own) {
    auto it = state.find(name);
    if (it == state.end()) continue;
    const Tensor& value = it->second;
    LOOM_CHECK(value.shape() == target.shape(),
               "load_state_dict: '{}' has shape {} in the checkpoint but {} in the module", name,
               shape_str(value.shape()), shape_str(target.shape()));
    if (target.extension() && !value.extension()) {
      // A full (unsharded) value for a sharded parameter (a DTensor): this rank's piece of it,
      // as torch's set_model_state_dict(full_state_dict=True) or distribute_tensor takes it.
      const std::optional<LocalPiece> piece = target.extension()->local_piece();
      LOOM_CHECK(piece.has_value(),
                 "load_state_dict: '{}' is a Partial DTensor in the module ({}), whose addends "
                 "a full value does not give; load its value as a DTensor",
                 name, target.description());
      Tensor part = value;
      for (size_t d = 0; d < piece->global_offset.size(); ++d) {
        part = ops::narrow(part, static_cast<int64_t>(d), piece->global_offset[d],
                           piece->local.size(static_cast<int64_t>(d)));
      }
      ops::copy_(piece->local, part);
      continue;
    }
    try {
      ops::copy_(target, value);
    } catch (const Error& e) {
      LOOM_FAIL("load_state_dict: '{}': {}", name, e.what());
    }
  }
}

}  // namespace loom::nn
