#include "tensor/op_table.h"

#include "base/error.h"
#include "tensor/ops_copy.h"
#include "tensor/ops_create.h"
#include "tensor/ops_elementwise.h"
#include "tensor/ops_matmul.h"
#include "tensor/ops_reduce.h"
#include "tensor/ops_views.h"

namespace loom {

namespace {

const OpTable& table() {
  static const OpTable instance = [] {
    OpTable t;
    register_core_ops(t);
    register_nn_ops(t);
    const auto missing = t.missing([](const OpInfo&) { return true; });
    LOOM_INTERNAL_ASSERT(!missing, "op '{}' (tensor/op_list.h) has no call_op entry",
                         op_name(*missing));
    return t;
  }();
  return instance;
}

// Moves `t` in (a braced list would copy it: one reference-count round trip per op).
std::vector<Tensor> one(Tensor t) {
  std::vector<Tensor> out;
  out.reserve(1);
  out.push_back(std::move(t));
  return out;
}

}  // namespace

void register_core_ops(OpTable& t) {
  using C = const OpCall&;
  // Views.
  t[OpId::view] = [](C c) { return one(ops::view(c.inputs[0], c.ints_attr(0))); };
  t[OpId::reshape] = [](C c) { return one(ops::reshape(c.inputs[0], c.ints_attr(0))); };
  t[OpId::transpose] = [](C c) {
    return one(ops::transpose(c.inputs[0], c.int_attr(0), c.int_attr(1)));
  };
  t[OpId::permute] = [](C c) { return one(ops::permute(c.inputs[0], c.ints_attr(0))); };
  t[OpId::narrow] = [](C c) {
    return one(ops::narrow(c.inputs[0], c.int_attr(0), c.int_attr(1), c.int_attr(2)));
  };
  t[OpId::slice] = [](C c) {
    return one(ops::slice(c.inputs[0], c.int_attr(0), c.int_attr(1), c.int_attr(2), c.int_attr(3)));
  };
  t[OpId::expand] = [](C c) { return one(ops::expand(c.inputs[0], c.ints_attr(0))); };
  t[OpId::unsqueeze] = [](C c) { return one(ops::unsqueeze(c.inputs[0], c.int_attr(0))); };
  t[OpId::squeeze] = [](C c) { return one(ops::squeeze(c.inputs[0], c.int_attr(0))); };
  // Copies.
  t[OpId::copy_] = [](C c) {
    ops::copy_(c.inputs[0], c.inputs[1]);
    return std::vector<Tensor>{};
  };
  t[OpId::clone] = [](C c) { return one(ops::clone(c.inputs[0])); };
  t[OpId::to_dtype] = [](C c) { return one(ops::to(c.inputs[0], c.dtype_attr(0))); };
  // Attrs (device type, device index).
  t[OpId::to_device] = [](C c) {
    return one(ops::to(c.inputs[0], Device{static_cast<DeviceType>(c.int_attr(0)),
                                           static_cast<int>(c.int_attr(1))}));
  };
  t[OpId::cat] = [](C c) { return one(ops::cat(c.inputs, c.int_attr(0))); };
  t[OpId::match_layout] = [](C c) { return one(ops::match_layout(c.inputs[0], c.inputs[1])); };
  t[OpId::zeros_like] = [](C c) { return one(ops::zeros_like(c.inputs[0])); };
  t[OpId::ones_like] = [](C c) { return one(ops::ones_like(c.inputs[0])); };
  t[OpId::fill_] = [](C c) {
    ops::fill_(c.inputs[0], c.double_attr(0));
    return std::vector<Tensor>{};
  };
  // Elementwise.
  t[OpId::add] = [](C c) { return one(ops::add(c.inputs[0], c.inputs[1])); };
  t[OpId::sub] = [](C c) { return one(ops::sub(c.inputs[0], c.inputs[1])); };
  t[OpId::mul] = [](C c) { return one(ops::mul(c.inputs[0], c.inputs[1])); };
  t[OpId::div] = [](C c) { return one(ops::div(c.inputs[0], c.inputs[1])); };
  t[OpId::maximum] = [](C c) { return one(ops::maximum(c.inputs[0], c.inputs[1])); };
  t[OpId::eq] = [](C c) { return one(ops::eq(c.inputs[0], c.inputs[1])); };
  t[OpId::gt] = [](C c) { return one(ops::gt(c.inputs[0], c.inputs[1])); };
  t[OpId::add_scalar] = [](C c) { return one(ops::add(c.inputs[0], c.double_attr(0))); };
  t[OpId::sub_scalar] = [](C c) { return one(ops::sub(c.inputs[0], c.double_attr(0))); };
  t[OpId::rsub_scalar] = [](C c) { return one(ops::rsub(c.inputs[0], c.double_attr(0))); };
  t[OpId::mul_scalar] = [](C c) { return one(ops::mul(c.inputs[0], c.double_attr(0))); };
  t[OpId::div_scalar] = [](C c) { return one(ops::div(c.inputs[0], c.double_attr(0))); };
  t[OpId::neg] = [](C c) { return one(ops::neg(c.inputs[0])); };
  t[OpId::abs] = [](C c) { return one(ops::abs(c.inputs[0])); };
  t[OpId::exp] = [](C c) { return one(ops::exp(c.inputs[0])); };
  t[OpId::log] = [](C c) { return one(ops::log(c.inputs[0])); };
  t[OpId::tanh] = [](C c) { return one(ops::tanh(c.inputs[0])); };
  t[OpId::sqrt] = [](C c) { return one(ops::sqrt(c.inputs[0])); };
  t[OpId::rsqrt] = [](C c) { return one(ops::rsqrt(c.inputs[0])); };
  t[OpId::pow] = [](C c) { return one(ops::pow(c.inputs[0], c.double_attr(0))); };
  t[OpId::relu] = [](C c) { return one(ops::relu(c.inputs[0])); };
  t[OpId::gelu] = [](C c) { return one(ops::gelu(c.inputs[0])); };
  t[OpId::sigmoid] = [](C c) { return one(ops::sigmoid(c.inputs[0])); };
  t[OpId::silu] = [](C c) { return one(ops::silu(c.inputs[0])); };
  t[OpId::gelu_backward] = [](C c) { return one(ops::gelu_backward(c.inputs[0], c.inputs[1])); };
  t[OpId::silu_backward] = [](C c) { return one(ops::silu_backward(c.inputs[0], c.inputs[1])); };
  t[OpId::silu_mul] = [](C c) { return one(ops::silu_mul(c.inputs[0], c.inputs[1])); };
  t[OpId::silu_mul_backward] = [](C c) {
    const auto r = ops::silu_mul_backward(c.inputs[0], c.inputs[1], c.inputs[2]);
    return std::vector<Tensor>{r.grad_gate, r.grad_up};
  };
  t[OpId::where] = [](C c) { return one(ops::where(c.inputs[0], c.inputs[1], c.inputs[2])); };
  t[OpId::masked_fill] = [](C c) {
    return one(ops::masked_fill(c.inputs[0], c.inputs[1], c.double_attr(0)));
  };
  t[OpId::add_] = [](C c) {
    ops::add_(c.inputs[0], c.inputs[1]);
    return std::vector<Tensor>{};
  };
  t[OpId::mul_scalar_] = [](C c) {
    ops::mul_(c.inputs[0], c.double_attr(0));
    return std::vector<Tensor>{};
  };
  // Reductions and products.
  t[OpId::sum] = [](C c) { return one(ops::sum(c.inputs[0], c.ints_attr(0), c.bool_attr(1))); };
  t[OpId::mean] = [](C c) { return one(ops::mean(c.inputs[0], c.ints_attr(0), c.bool_attr(1))); };
  t[OpId::max_dim] = [](C c) {
    auto [values, indices] = ops::max(c.inputs[0], c.int_attr(0), c.bool_attr(1));
    return std::vector<Tensor>{values, indices};
  };
  t[OpId::matmul] = [](C c) { return one(ops::matmul(c.inputs[0], c.inputs[1])); };
  // Inputs (input, weight, bias — may be undefined).
  t[OpId::linear] = [](C c) { return one(ops::linear(c.inputs[0], c.inputs[1], c.inputs[2])); };
  // Backward kernels with an op of their own (so DTensors dispatch them).
  t[OpId::max_dim_backward] = [](C c) {
    return one(ops::max_dim_backward(c.inputs[0], c.inputs[1], c.ints_attr(0), c.int_attr(1),
                                     c.bool_attr(2)));
  };
  t[OpId::slice_backward] = [](C c) {
    return one(ops::slice_backward(c.inputs[0], c.ints_attr(0), c.int_attr(1), c.int_attr(2),
                                   c.int_attr(3), c.int_attr(4)));
  };
}

std::vector<Tensor> call_op(const OpCall& call) { return table()[call.id](call); }

}  // namespace loom
