// Autograd in the op dispatch: every kDifferentiable op of tensor/op_list.h records itself when
// grad mode is on and an input requires grad, through its formula (autograd/formulas_*.cc).
//
// The handler is installed when //autograd is loaded (static registration; the library is
// alwayslink). install_autograd_dispatch() installs it again, e.g. for a program that links
// autograd's objects selectively.
#pragma once

#include "tensor/op_list.h"

namespace loom::autograd {

void install_autograd_dispatch();
// Whether `op` has an autograd formula (exactly the kDifferentiable ops do).
bool has_formula(OpId op);

}  // namespace loom::autograd
