// Formulas of the reductions and matrix products.
#include <algorithm>
#include <optional>

#include "autograd/formulas.h"

namespace loom::autograd {

namespace {

using C = const OpCall&;
using Outs = std::vector<Tensor>;

// Re-inserts reduced dims (as size 1) so a reduction's gradient broadcasts to the input.
Tensor unsqueeze_reduced(Tensor grad, const std::vector<int64_t>& dims, int64_t ndim,
                         bool keepdim) {
  if (keepdim) return grad;
  if (dims.empty()) return ops::reshape(grad, Shape(ndim, 1));
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

// `t` with a size-1 dim inserted where matmul promotes a 1-D operand (at 0 for the left one, at
// the end for the right one); other tensors unchanged.
Tensor as_matrix(const Tensor& t, bool left) {
  if (t.dim() != 1) return t;
  return ops::unsqueeze(t, left ? 0 : -1);
}

// `t` as (rows, its last dim), when that reshape moves no data between ranks: always for plain
// tensors; a DTensor says (a shard on a merged dim other than the first would need a gather).
std::optional<Shape> rows_shape(const Tensor& t) {
  const int64_t last = t.size(-1);
  const Shape rows{last == 0 ? 0 : t.numel() / last, last};
  if (t.extension() && !t.extension()->reshapes_locally(rows)) return std::nullopt;
  return rows;
}

}  // namespace

void register_reduction_formulas(FormulaTable& f) {
  // Attrs (dims, keepdim).
  f[OpId::sum] = [](C c, Outs out) {
    return record_first("SumBackward", c, std::move(out),
                        [dims = c.ints_attr(0), keepdim = c.bool_attr(1),
                         shape = c.inputs[0].shape()](const Grads& g) {
                          const Tensor grad = unsqueeze_reduced(g[0], dims, shape.size(), keepdim);
                          return Grads{ops::contiguous(ops::expand(grad, shape))};
                        });
  };
  f[OpId::mean] = [](C c, Outs out) {
    const double count = static_cast<double>(reduced_count(c.inputs[0], c.ints_attr(0)));
    return record_first("MeanBackward", c, std::move(out),
                        [dims = c.ints_attr(0), keepdim = c.bool_attr(1), count,
                         shape = c.inputs[0].shape()](const Grads& g) {
                          const Tensor grad = unsqueeze_reduced(g[0], dims, shape.size(), keepdim);
                          return Grads{ops::div(ops::expand(grad, shape), count)};
                        });
  };
  // Attrs (dim, keepdim); outputs (values, indices). The gradient goes to the first maximum;
  // the indices are not differentiable.
  f[OpId::max_dim] = [](C c, Outs out) {
    const int64_t dim = normalize_dim(c.int_attr(0), c.inputs[0].dim(), "max");
    return record_first("MaxBackward", c, out,
                        [dim, keepdim = c.bool_attr(1), indices = out[1],
                         shape = c.inputs[0].shape()](const Grads& g) {
                          return Grads{ops::max_dim_backward(g[0], indices, shape, dim, keepdim)};
                        });
  };
  // dA = dC @ B^T, dB = A^T @ dC (the transposes are views the GEMM takes as flags), summed
  // over broadcast batch dims. A 1-D operand is treated as the matrix matmul promotes it to, and
  // its gradient reshaped back.
  f[OpId::matmul] = [](C c, Outs out) {
    return record_first(
        "MatmulBackward", c, std::move(out), [a = c.inputs[0], b = c.inputs[1]](const Grads& g) {
          const bool promoted = a.dim() == 1 || b.dim() == 1;
          const Tensor a2 = as_matrix(a, true), b2 = as_matrix(b, false);
          Tensor g2 = g[0];
          if (promoted) {
            // The promoted product's shape: broadcast batch dims, then (M, N).
            Shape product =
                broadcast_shapes(Shape(a2.shape().begin(), a2.shape().end() - 2),
                                 Shape(b2.shape().begin(), b2.shape().end() - 2), "matmul");
            product.push_back(a2.size(-2));
            product.push_back(b2.size(-1));
            g2 = ops::reshape(g2, product);
          }
          Tensor grad_a, grad_b;
          if (a.requires_grad() && needs_input_grad(0)) {
            grad_a = ops::sum_to(ops::matmul(g2, ops::transpose(b2, -1, -2)), a2.shape());
            if (promoted) grad_a = ops::reshape(grad_a, a.shape());
          }
          if (b.requires_grad() && needs_input_grad(1)) {
            const auto a_rows = !promoted && b2.dim() == 2 && a2.dim() > 2 && g2.dim() == a2.dim()
                                    ? rows_shape(a2)
                                    : std::nullopt;
            const auto g_rows = a_rows ? rows_shape(g2) : std::nullopt;
            if (a_rows && g_rows) {
              // A weight shared by every batch entry: one GEMM over all rows, (K, rows) @
              // (rows, N), as linear's backward does, instead of one per batch entry and a sum.
              grad_b = ops::matmul(ops::transpose(ops::reshape(a2, *a_rows), 0, 1),
                                   ops::reshape(g2, *g_rows));
            } else {
              grad_b = ops::sum_to(ops::matmul(ops::transpose(a2, -1, -2), g2), b2.shape());
            }
            if (promoted) grad_b = ops::reshape(grad_b, b.shape());
          }
          return Grads{grad_a, grad_b};
        });
  };
  // Inputs (input, weight, bias — may be undefined). Over the rows of the flattened (M, N)
  // output: dX = dY W, dW = dY^T X, db = column sums of dY.
  f[OpId::linear] = [](C c, Outs out) {
    const Tensor& bias = c.inputs[2];
    return record_first(
        "LinearBackward", c, std::move(out),
        [input = c.inputs[0], weight = c.inputs[1],
         bias_grad = bias.defined() && bias.requires_grad()](const Grads& g) {
          const int64_t n = weight.size(0), k = weight.size(1);
          const Tensor rows = ops::reshape(g[0], {g[0].numel() / std::max<int64_t>(n, 1), n});
          Grads grads(3);
          if (input.requires_grad() && needs_input_grad(0)) grads[0] = ops::matmul(g[0], weight);
          if (weight.requires_grad() && needs_input_grad(1)) {
            grads[1] =
                ops::matmul(ops::transpose(rows, 0, 1), ops::reshape(input, {rows.size(0), k}));
          }
          if (bias_grad && needs_input_grad(2)) grads[2] = ops::sum(rows, {0});
          return grads;
        });
  };
}

}  // namespace loom::autograd
