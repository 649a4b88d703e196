#include "nn/linear.h"

#include <cmath>

#include "autograd/functions.h"
#include "base/error.h"
#include "tensor/rng.h"

namespace loom::nn {

Linear::Linear(int64_t in_features, int64_t out_features, LinearOptions options)
    : Module("Linear"),
      in_features_(in_features),
      out_features_(out_features),
      seed_(options.seed),
      weight_(register_parameter("weight", ops::empty({std::max<int64_t>(out_features, 0),
                                                       std::max<int64_t>(in_features, 0)}))),
      bias_(options.bias
                ? register_parameter("bias", ops::empty({std::max<int64_t>(out_features, 0)}))
                : absent_parameter()) {
  LOOM_CHECK(in_features > 0 && out_features > 0,
             "Linear: features must be positive, got in_features={} out_features={}", in_features,
             out_features);
  reset_parameters();
}

void Linear::reset_parameters() {
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features_));
  ops::uniform_(weight_, seed_, -bound, bound);
  if (bias_.defined()) ops::uniform_(bias_, seed_ + 1, -bound, bound);
}

Tensor Linear::forward(const Tensor& input) {
  LOOM_CHECK(input.dim() >= 1 && input.size(-1) == weight_.size(-1),
             "Linear: input of shape {} does not end in in_features={} (weight shape {})",
             shape_str(input.shape()), weight_.size(-1), shape_str(weight_.shape()));
  // One GEMM with the bias fused into it (loom::linear); the transposed weight is a flag.
  return linear(input, weight_, bias_);
}

}  // namespace loom::nn
