#include "autograd/gradcheck.h"

#include <fmt/format.h>

#include <cmath>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "base/error.h"
#include "tensor/element.h"

namespace loom::autograd {

namespace {

double weighted_output(const std::function<Tensor(const std::vector<Tensor>&)>& function,
                       const std::vector<Tensor>& inputs, const Tensor& weights) {
  NoGradGuard no_grad;
  const Tensor out = function(inputs);
  const std::vector<double> values = ops::to_vector(out);
  const std::vector<double> w = ops::to_vector(weights);
  double total = 0;
  for (size_t i = 0; i < values.size(); ++i) total += values[i] * w[i];
  return total;
}

}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& function,
                          const std::vector<Tensor>& inputs, const GradcheckOptions& options) {
  // Work on private leaves so the caller's tensors keep their grads and data.
  std::vector<Tensor> leaves;
  for (const Tensor& input : inputs) {
    Tensor copy = ops::clone(detach(input));
    if (input.requires_grad()) copy.set_requires_grad(true);
    leaves.push_back(copy);
  }
  const Tensor out = function(leaves);
  const Tensor weights = ops::uniform(out.shape(), options.seed, 0.5, 1.5, kFloat32);
  backward(sum(mul(to(out, kFloat32), weights)));

  GradcheckResult result;
  for (size_t k = 0; k < leaves.size(); ++k) {
    if (!inputs[k].requires_grad()) continue;
    Tensor leaf = leaves[k];
    LOOM_CHECK(leaf.dtype() == kFloat32, "gradcheck: input {} must be f32, got {}", k,
               dtype_name(leaf.dtype()));
    const Tensor analytic = leaf.grad();
    const std::vector<double> analytic_values =
        analytic.defined() ? ops::to_vector(analytic) : std::vector<double>(leaf.numel(), 0.0);
    float* data = leaf.data<float>();  // contiguous: made by clone
    for (int64_t i = 0; i < leaf.numel(); ++i) {
      const float original = data[i];
      data[i] = original + static_cast<float>(options.eps);
      const double plus = weighted_output(function, leaves, weights);
      data[i] = original - static_cast<float>(options.eps);
      const double minus = weighted_output(function, leaves, weights);
      data[i] = original;
      const double numeric = (plus - minus) / (2 * options.eps);
      const double error = std::abs(numeric - analytic_values[i]);
      result.max_abs_error = std::max(result.max_abs_error, error);
      if (error > options.atol + options.rtol * std::abs(numeric) && result.ok) {
        result.ok = false;
        result.message = fmt::format("input {} element {}: analytic {} vs numeric {}", k, i,
                                     analytic_values[i], numeric);
      }
    }
  }
  return result;
}

}  // namespace loom::autograd
