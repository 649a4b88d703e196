// Finite-difference gradient checking, like torch.autograd.gradcheck, for built-in ops and for
// users' custom Functions.
//
// The function's output is reduced to a scalar with fixed random weights (so every output
// element matters and errors cannot cancel), autograd's gradient of that scalar is compared
// with central differences (f(x + eps) - f(x - eps)) / 2eps per input element. Inputs are
// f32, so the comparison tolerates truncation error O(eps^2) and rounding error
// O(ulp(f) / eps): pass tolerances that say which you expect.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace loom::autograd {

struct GradcheckOptions {
  double eps = 1e-2;
  double atol = 1e-3;
  double rtol = 1e-2;
  uint64_t seed = 1234;  // for the output weights
};

struct GradcheckResult {
  bool ok = true;
  double max_abs_error = 0;
  // The first mismatch: "input 1 element 5: analytic 0.25 vs numeric 0.31".
  std::string message;
};

// `inputs` that require grad are checked; others are held constant. The inputs' own .grad is
// left untouched (the check runs on detached copies).
GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& function,
                          const std::vector<Tensor>& inputs, const GradcheckOptions& options = {});

}  // namespace loom::autograd
