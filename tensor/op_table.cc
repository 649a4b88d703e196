#include "tensor/op_table.h"

#include <algorithm>

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
    return t;
  }();
  return instance;
}

std::vector<Tensor> one(Tensor t) { return {std::move(t)}; }

}  // namespace

void register_core_ops(OpTable& t) {
  using C = const OpCall&;
  // Views.
  t["view"] = [](C c) { return one(ops::view(c.inputs[0], c.ints_attr(0))); };
  t["reshape"] = [](C c) { return one(ops::reshape(c.inputs[0], c.ints_attr(0))); };
  t["transpose"] = [](C c) { return one(ops::transpose(c.inputs[0], c.int_attr(0), c.int_attr(1))); };
  t["permute"] = [](C c) { return one(ops::permute(c.inputs[0], c.ints_attr(0))); };
  t["narrow"] = [](C c) {
    return one(ops::narrow(c.inputs[0], c.int_attr(0), c.int_attr(1), c.int_attr(2)));
  };
  t["slice"] = [](C c) {
    return one(ops::slice(c.inputs[0], c.int_attr(0), c.int_attr(1), c.int_attr(2), c.int_attr(3)));
  };
  t["expand"] = [](C c) { return one(ops::expand(c.inputs[0], c.ints_attr(0))); };
  t["unsqueeze"] = [](C c) { return one(ops::unsqueeze(c.inputs[0], c.int_attr(0))); };
  t["squeeze"] = [](C c) { return one(ops::squeeze(c.inputs[0], c.int_attr(0))); };
  // Copies.
  t["copy_"] = [](C c) {
    ops::copy_(c.inputs[0], c.inputs[1]);
    return std::vector<Tensor>{};
  };
  t["clone"] = [](C c) { return one(ops::clone(c.inputs[0])); };
  t["to_dtype"] = [](C c) { return one(ops::to(c.inputs[0], c.dtype_attr(0))); };
  t["cat"] = [](C c) { return one(ops::cat(c.inputs, c.int_attr(0))); };
  t["match_layout"] = [](C c) { return one(ops::match_layout(c.inputs[0], c.inputs[1])); };
  t["zeros_like"] = [](C c) { return one(ops::zeros_like(c.inputs[0])); };
  t["ones_like"] = [](C c) { return one(ops::ones_like(c.inputs[0])); };
  t["fill_"] = [](C c) {
    ops::fill_(c.inputs[0], c.double_attr(0));
    return std::vector<Tensor>{};
  };
  // Elementwise.
  t["add"] = [](C c) { return one(ops::add(c.inputs[0], c.inputs[1])); };
  t["sub"] = [](C c) { return one(ops::sub(c.inputs[0], c.inputs[1])); };
  t["mul"] = [](C c) { return one(ops::mul(c.inputs[0], c.inputs[1])); };
  t["div"] = [](C c) { return one(ops::div(c.inputs[0], c.inputs[1])); };
  t["maximum"] = [](C c) { return one(ops::maximum(c.inputs[0], c.inputs[1])); };
  t["eq"] = [](C c) { return one(ops::eq(c.inputs[0], c.inputs[1])); };
  t["gt"] = [](C c) { return one(ops::gt(c.inputs[0], c.inputs[1])); };
  t["add_scalar"] = [](C c) { return one(ops::add(c.inputs[0], c.double_attr(0))); };
  t["sub_scalar"] = [](C c) { return one(ops::sub(c.inputs[0], c.double_attr(0))); };
  t["rsub_scalar"] = [](C c) { return one(ops::rsub(c.inputs[0], c.double_attr(0))); };
  t["mul_scalar"] = [](C c) { return one(ops::mul(c.inputs[0], c.double_attr(0))); };
  t["div_scalar"] = [](C c) { return one(ops::div(c.inputs[0], c.double_attr(0))); };
  t["neg"] = [](C c) { return one(ops::neg(c.inputs[0])); };
  t["abs"] = [](C c) { return one(ops::abs(c.inputs[0])); };
  t["exp"] = [](C c) { return one(ops::exp(c.inputs[0])); };
  t["log"] = [](C c) { return one(ops::log(c.inputs[0])); };
  t["tanh"] = [](C c) { return one(ops::tanh(c.inputs[0])); };
  t["sqrt"] = [](C c) { return one(ops::sqrt(c.inputs[0])); };
  t["rsqrt"] = [](C c) { return one(ops::rsqrt(c.inputs[0])); };
  t["pow"] = [](C c) { return one(ops::pow(c.inputs[0], c.double_attr(0))); };
  t["relu"] = [](C c) { return one(ops::relu(c.inputs[0])); };
  t["gelu"] = [](C c) { return one(ops::gelu(c.inputs[0])); };
  t["gelu_backward"] = [](C c) { return one(ops::gelu_backward(c.inputs[0], c.inputs[1])); };
  t["where"] = [](C c) { return one(ops::where(c.inputs[0], c.inputs[1], c.inputs[2])); };
  t["masked_fill"] = [](C c) {
    return one(ops::masked_fill(c.inputs[0], c.inputs[1], c.double_attr(0)));
  };
  t["add_"] = [](C c) {
    ops::add_(c.inputs[0], c.inputs[1]);
    return std::vector<Tensor>{};
  };
  // Reductions and products.
  t["sum"] = [](C c) { return one(ops::sum(c.inputs[0], c.ints_attr(0), c.bool_attr(1))); };
  t["mean"] = [](C c) { return one(ops::mean(c.inputs[0], c.ints_attr(0), c.bool_attr(1))); };
  t["max_dim"] = [](C c) {
    auto [values, indices] = ops::max(c.inputs[0], c.int_attr(0), c.bool_attr(1));
    return std::vector<Tensor>{values, indices};
  };
  t["matmul"] = [](C c) { return one(ops::matmul(c.inputs[0], c.inputs[1])); };
  // Backward kernels with an op of their own (so DTensors dispatch them).
  t["max_dim_backward"] = [](C c) {
    return one(ops::max_dim_backward(c.inputs[0], c.inputs[1], c.ints_attr(0), c.int_attr(1), c.bool_attr(2)));
  };
  t["slice_backward"] = [](C c) {
    return one(ops::slice_backward(c.inputs[0], c.ints_attr(0), c.int_attr(1), c.int_attr(2), c.int_attr(3),
                                   c.int_attr(4)));
  };

}

std::vector<Tensor> call_op(const OpCall& call) {
  const auto& t = table();
  auto it = t.find(std::string(call.op));
  LOOM_CHECK(it != t.end(), "call_op: unknown op '{}'", call.op);
  return it->second(call);
}

std::vector<std::string> op_names() {
  std::vector<std::string> names;
  for (const auto& [name, fn] : table()) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace loom
