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
      weight_(register_parameter(
          "weight",
          ops::uniform({out_features, in_features}, options.seed,
                       -1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(in_features, 1))),
                       1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(in_features, 1)))))),
      bias_(options.bias
                ? register_parameter(
                      "bias",
                      ops::uniform(
                          {out_features}, options.seed + 1,
                          -1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(in_features, 1))),
                          1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(in_features, 1)))))
                : absent_parameter()) {
  LOOM_CHECK(in_features > 0 && out_features > 0,
             "Linear: features must be positive, got in_features={} out_features={}", in_features,
             out_features);
}

Tensor Linear::forward(const Tensor& input) {
  LOOM_CHECK(input.dim() >= 1 && input.size(-1) == weight_.size(-1),
             "Linear: input of shape {} does not end in in_features={} (weight shape {})",
             shape_str(input.shape()), weight_.size(-1), shape_str(weight_.shape()));
  // One GEMM with the bias fused into it (loom::linear); the transposed weight is a flag.
  return linear(input, weight_, bias_);
}

}  // namespace loom::nn
