// The ops as models and users call them: loom::add, loom::matmul, ... Each is the one op of
// tensor/ops.h (a using-declaration: loom::add and loom::ops::add are the same function), and it
// records autograd when grad mode is on and an input requires grad (tensor/dispatch.h, with the
// formulas in autograd/formulas_*.cc). There is no non-recording twin to call by mistake.
//
// Backward formulas are written with the same ops and run under NoGradGuard (no double
// backward). Gradients of broadcast inputs are summed back to the input's shape (ops::sum_to).
// The neural-network ops (softmax, log_softmax, layer_norm, cross_entropy, dropout, attention)
// as torch.nn.functional spells them are in autograd/functions_nn.h, included here: one include
// gives a user every op.
#pragma once

#include <span>
#include <vector>

#include "autograd/functions_nn.h"
#include "autograd/grouped_mm.h"  // loom::grouped_mm, the experts' differentiable product
#include "tensor/ops.h"

namespace loom {

// ---- elementwise ----
using ops::abs;
using ops::add;
using ops::div;
using ops::exp;
using ops::gelu;
using ops::log;
using ops::masked_fill;
using ops::maximum;
using ops::mul;
using ops::neg;
using ops::pow;
using ops::relu;
using ops::rsqrt;
using ops::rsub;  // rsub(a, b) = b - a
using ops::sigmoid;
using ops::silu;
using ops::silu_mul;
using ops::sqrt;
using ops::sub;
using ops::tanh;
using ops::where;
// Comparisons (1.0 where true; no gradient).
using ops::eq;
using ops::gt;

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
using ops::cat;
using ops::chunk;
using ops::clone;
using ops::contiguous;
using ops::expand;
using ops::narrow;
using ops::permute;
using ops::repeat_interleave;
using ops::reshape;
using ops::slice;
using ops::split;
using ops::split_with_sizes;
using ops::squeeze;
using ops::stack;
using ops::to;
using ops::transpose;
using ops::unsqueeze;
using ops::view;
// ---- factories like a tensor, selection (no gradient) ----
using ops::ones_like;
using ops::top_k_indices;
using ops::zeros_like;
// A new leaf sharing `self`'s data, cut from the graph (requires_grad false); a DTensor's is a
// DTensor with its placements.
Tensor detach(const Tensor& self);
// torch.unbind: the slices of `self` along `dim`, that dim removed (views). One graph node for
// all of them, whose backward stacks their gradients in one write (zeros for slices that got
// none), where separate narrows would each start from a zero tensor of `self`'s size and then
// be added up (the q/k/v split of attention: 3 fills, 3 copies and 2 adds of the qkv tensor).
std::vector<Tensor> unbind(const Tensor& self, int64_t dim);

// ---- reductions and products ----
using ops::linear;  // input (..., K) @ weight (N, K)^T + bias (N,), bias fused into the GEMM
using ops::matmul;
using ops::max;  // max(self, dim, keepdim): (values, indices); the gradient goes to the first max
using ops::mean;
using ops::sum;

}  // namespace loom
