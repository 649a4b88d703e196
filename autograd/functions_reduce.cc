// Differentiable reductions and matrix products.
#include "autograd/function.h"
#include "autograd/functions.h"

namespace loom {

using autograd::any_requires_grad;
using autograd::record;
using Grads = std::vector<Tensor>;

namespace {

// Re-inserts reduced dims (as size 1) so a reduction's gradient broadcasts to the input.
Tensor unsqueeze_reduced(Tensor grad, const std::vector<int64_t>& dims, int64_t ndim, bool keepdim) {
  if (keepdim) return grad;
  if (dims.empty()) {
    Shape ones(ndim, 1);
    return ops::reshape(grad, ones);
  }
  std::vector<int64_t> sorted;
  for (int64_t d : dims) sorted.push_back(normalize_dim(d, ndim, "sum"));
  std::sort(sorted.begin(), sorted.end());
  for (int64_t d : sorted) grad = ops::unsqueeze(grad, d);
  return grad;
}

int64_t reduced_count(const Tensor& self, const std::vector<int64_t>& dims) {
  if (dims.empty()) return self.numel();
  int64_t count = 1;
  for (int64_t d : dims) count *= self.size(d);
  return count;
}

}  // namespace

Tensor sum(const Tensor& self, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor out = ops::sum(self, dims, keepdim);
  if (!any_requires_grad({self})) return out;
  return record("SumBackward", {self}, out,
                [dims, keepdim, shape = self.shape()](const Grads& g) {
                  const Tensor grad = unsqueeze_reduced(g[0], dims, shape.size(), keepdim);
                  return Grads{ops::contiguous(ops::expand(grad, shape))};
                });
}

Tensor mean(const Tensor& self, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor out = ops::mean(self, dims, keepdim);
  if (!any_requires_grad({self})) return out;
  const double count = static_cast<double>(reduced_count(self, dims));
  return record("MeanBackward", {self}, out,
                [dims, keepdim, count, shape = self.shape()](const Grads& g) {
                  const Tensor grad = unsqueeze_reduced(g[0], dims, shape.size(), keepdim);
                  return Grads{ops::div(ops::expand(grad, shape), count)};
                });
}

std::pair<Tensor, Tensor> max(const Tensor& self, int64_t dim, bool keepdim) {
  auto [values, indices] = ops::max(self, dim, keepdim);
  if (!any_requires_grad({self})) return {values, indices};
  const int64_t d = normalize_dim(dim, self.dim(), "max");
  Tensor recorded = record("MaxBackward", {self}, values,
                           [d, keepdim, indices, shape = self.shape()](const Grads& g) {
                             return Grads{ops::max_dim_backward(g[0], indices, shape, d, keepdim)};
                           });
  return {recorded, indices};
}

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  if (!any_requires_grad({a_in, b_in})) return ops::matmul(a_in, b_in);
  // 1-D operands go through differentiable unsqueeze/squeeze so the core is always >= 2-D.
  // (1, K) @ b is (..., 1, N), or (1,) when b is a vector too (a dot product).
  if (a_in.dim() == 1) return squeeze(matmul(unsqueeze(a_in, 0), b_in), b_in.dim() == 1 ? -1 : -2);
  if (b_in.dim() == 1) return squeeze(matmul(a_in, unsqueeze(b_in, -1)), -1);
  Tensor out = ops::matmul(a_in, b_in);
  return record("MatmulBackward", {a_in, b_in}, out, [a = a_in, b = b_in](const Grads& g) {
    // dA = dC @ B^T, dB = A^T @ dC; transposes are views the GEMM takes as flags.
    Tensor grad_a, grad_b;
    if (a.requires_grad()) grad_a = ops::sum_to(ops::matmul(g[0], ops::transpose(b, -1, -2)), a.shape());
    if (b.requires_grad()) grad_b = ops::sum_to(ops::matmul(ops::transpose(a, -1, -2), g[0]), b.shape());
    return Grads{grad_a, grad_b};
  });
}

Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias) {
  if (input.extension() || weight.extension() || (bias.defined() && bias.extension())) {
    // DTensors: the composed ops, whose sharding rules exist (ops::linear would compose too, but
    // under one backward node that sharding propagation could not see into).
    const Tensor out = matmul(input, transpose(weight, 0, 1));
    return bias.defined() ? add(out, bias) : out;
  }
  std::vector<Tensor> inputs{input, weight};
  if (bias.defined()) inputs.push_back(bias);
  Tensor out = ops::linear(input, weight, bias);
  if (!any_requires_grad(inputs)) return out;
  return record("LinearBackward", inputs, {out}, [input, weight, has_bias = bias.defined(),
                                                        bias_grad = bias.defined() && bias.requires_grad()](
                                                           const Grads& g) {
    // Over the rows of the flattened (M, N) output: dX = dY W, dW = dY^T X, db = column sums of
    // dY. The transposes are views the GEMM takes as flags.
    const int64_t n = weight.size(0), k = weight.size(1);
    const Tensor rows = ops::reshape(g[0], {g[0].numel() / std::max<int64_t>(n, 1), n});
    Grads grads(has_bias ? 3 : 2);
    if (input.requires_grad()) grads[0] = ops::matmul(g[0], weight);
    if (weight.requires_grad()) {
      grads[1] = ops::matmul(ops::transpose(rows, 0, 1), ops::reshape(input, {rows.size(0), k}));
    }
    if (bias_grad) grads[2] = ops::sum(rows, {0});
    return grads;
  })[0];
}

}  // namespace loom
