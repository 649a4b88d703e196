// Autograd's handler in the op dispatch (tensor/dispatch.h): run the op below autograd, then
// record it once with its formula. Installed by static registration (below) so that every
// program linking //autograd records, whichever spelling of an op it calls; //autograd is an
// alwayslink library so the registration survives static linking.
#include "autograd/autograd_dispatch.h"

#include "autograd/formulas.h"
#include "base/error.h"
#include "tensor/grad_mode.h"

namespace loom::autograd {

namespace {

const FormulaTable& formulas() {
  static const FormulaTable table = [] {
    FormulaTable t;
    register_elementwise_formulas(t);
    register_view_formulas(t);
    register_reduction_formulas(t);
    register_nn_formulas(t);
    const auto missing =
        t.missing([](const OpInfo& info) { return info.grad == OpGrad::kDifferentiable; });
    LOOM_INTERNAL_ASSERT(!missing,
                         "op '{}' is kDifferentiable (tensor/op_list.h) but has no "
                         "autograd formula",
                         op_name(*missing));
    for (const OpInfo& info : all_ops()) {
      LOOM_INTERNAL_ASSERT(info.grad == OpGrad::kDifferentiable || !t[info.id],
                           "op '{}' is kNoGrad (tensor/op_list.h) but has an autograd formula",
                           info.name);
    }
    return t;
  }();
  return table;
}

std::vector<Tensor> record_op(const OpCall& call) {
  const Formula formula = formulas()[call.id];
  std::vector<Tensor> outputs;
  {
    BelowAutogradGuard below;
    outputs = call_op(call);
  }
  return formula(call, std::move(outputs));
}

// Static registration: a constant-initialized function pointer in tensor/ is all it sets.
[[maybe_unused]] const bool registered = (install_autograd_dispatch(), true);

}  // namespace

void install_autograd_dispatch() { register_autograd_handler(&record_op); }

bool has_formula(OpId op) { return formulas()[op] != nullptr; }

}  // namespace loom::autograd
