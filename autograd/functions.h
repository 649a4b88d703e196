// The differentiable ops: same names and meaning as loom::ops (tensor/ops.h), but each records
// its backward when an input requires grad. This is the API models and users call.
//
// Backward formulas are written with plain ops (no double backward). Gradients of broadcast
// inputs are summed back to the input's shape (ops::sum_to).
#pragma once

#include <span>
#include <vector>

#include "tensor/ops.h"

namespace loom {

// ---- elementwise ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor rsub(const Tensor& a, double b);  // b - a
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor pow(const Tensor& a, double exponent);
Tensor relu(const Tensor& a);
Tensor gelu(const Tensor& a);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& self, const Tensor& mask, double value);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, double b) { return div(a, b); }
inline Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
inline Tensor operator-(const Tensor& a) { return neg(a); }

// ---- views and copies ----
Tensor view(const Tensor& self, Shape shape);
Tensor reshape(const Tensor& self, Shape shape);
Tensor transpose(const Tensor& self, int64_t dim0, int64_t dim1);
Tensor permute(const Tensor& self, const std::vector<int64_t>& dims);
Tensor narrow(const Tensor& self, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& self, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
std::vector<Tensor> chunk(const Tensor& self, int64_t chunks, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& self, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split_with_sizes(const Tensor& self, const std::vector<int64_t>& sizes, int64_t dim = 0);
Tensor expand(const Tensor& self, Shape shape);
Tensor unsqueeze(const Tensor& self, int64_t dim);
Tensor squeeze(const Tensor& self, int64_t dim);
Tensor contiguous(const Tensor& self);
Tensor clone(const Tensor& self);
Tensor to(const Tensor& self, DType dtype);
Tensor to(const Tensor& self, Device device);
Tensor cat(std::span<const Tensor> tensors, int64_t dim);
Tensor stack(std::span<const Tensor> tensors, int64_t dim);
// A new leaf sharing `self`'s data, cut from the graph (requires_grad false).
Tensor detach(const Tensor& self);

// ---- reductions and products ----
Tensor sum(const Tensor& self, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& self, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Values are differentiable (the gradient goes to the first maximum); indices are not.
std::pair<Tensor, Tensor> max(const Tensor& self, int64_t dim, bool keepdim = false);
Tensor matmul(const Tensor& a, const Tensor& b);
// torch.nn.functional.linear: input (..., K) @ weight (N, K)^T + bias (N,) (bias optional) as one
// op with the bias fused into the GEMM (ops::linear); DTensors go through matmul and add.
Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace loom
