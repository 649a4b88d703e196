#include "nn/mixed_precision.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/functions.h"
#include "base/error.h"

namespace loom::nn {

namespace {

// The parameters of a tree by owning module and local name, with their f32 masters while a
// forward runs (the slots then hold the casts).
struct Swap {
  struct Entry {
    Module* owner;
    std::string name;
    Tensor master;
  };
  std::vector<Entry> entries;
  bool swapped = false;

  void restore() {
    if (!swapped) return;
    for (Entry& e : entries) e.owner->set_parameter(e.name, std::exchange(e.master, Tensor()));
    swapped = false;
  }
};

Tensor cast_floating(const Tensor& t, DType dtype) {
  return t.defined() && is_floating(t.dtype()) && t.dtype() != dtype ? to(t, dtype) : t;
}

}  // namespace

void apply_mixed_precision(Module& root, MixedPrecisionPolicy policy) {
  LOOM_CHECK(
      is_floating(policy.param_dtype) && is_floating(policy.output_dtype),
      "apply_mixed_precision: param_dtype {} and output_dtype {} must be floating-point dtypes",
      dtype_name(policy.param_dtype), dtype_name(policy.output_dtype));
  auto swap = std::make_shared<Swap>();
  for (const auto& [path, module] : root.named_modules()) {
    for (const auto& [name, p] : module->named_parameters(/*recurse=*/false)) {
      const std::string full = path.empty() ? name : path + "." + name;
      LOOM_CHECK(p.dtype() == DType::kFloat32,
                 "apply_mixed_precision: parameter '{}' is {}; the master weights must be f32",
                 full, dtype_name(p.dtype()));
      swap->entries.push_back({module, name, Tensor()});
    }
  }
  root.register_forward_pre_hook([swap, policy](Module&, const Tensor& input) {
    // A forward that threw left the casts in place: put the masters back first.
    swap->restore();
    for (Swap::Entry& e : swap->entries) {
      e.master = e.owner->parameter(e.name);
      e.owner->set_parameter(e.name, to(e.master, policy.param_dtype));
    }
    swap->swapped = true;
    return policy.cast_forward_inputs ? cast_floating(input, policy.param_dtype) : input;
  });
  root.register_forward_hook([swap, policy](Module&, const Tensor&, const Tensor& output) {
    swap->restore();
    return cast_floating(output, policy.output_dtype);
  });
}

}  // namespace loom::nn
