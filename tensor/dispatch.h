// The op-dispatch extension point.
//
// Every op in tensor/ops*.h first asks `dispatch_extension()` whether any input carries a
// TensorExtension (tensor.h). If one does, the op is described as an OpCall (name, inputs,
// attributes) and handed to the handler registered for that extension's kind; the handler
// returns the outputs and the CPU/CUDA kernel is never reached. This is how dtensor/ takes over
// ops on DTensors (sharding propagation, then the local op on each shard) while tensor/ never
// includes dtensor/. A handler re-enters the plain op on local tensors with `call_op`.
//
// Cost when no input is extended: one pointer test per input.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "tensor/tensor.h"

namespace loom {

// One attribute of an op call, in declaration order of the op's non-tensor parameters.
using OpAttr = std::variant<int64_t, double, bool, std::vector<int64_t>, DType>;

struct OpCall {
  std::string_view op;  // the op's name as in tensor/op_table.cc ("add", "matmul", ...)
  std::vector<Tensor> inputs;
  std::vector<OpAttr> attrs;

  int64_t int_attr(size_t i) const { return std::get<int64_t>(attrs.at(i)); }
  double double_attr(size_t i) const { return std::get<double>(attrs.at(i)); }
  bool bool_attr(size_t i) const { return std::get<bool>(attrs.at(i)); }
  const std::vector<int64_t>& ints_attr(size_t i) const {
    return std::get<std::vector<int64_t>>(attrs.at(i));
  }
  DType dtype_attr(size_t i) const { return std::get<DType>(attrs.at(i)); }
};

using DispatchHandler = std::function<std::vector<Tensor>(const OpCall&)>;

// Installs (or with an empty handler, removes) the handler for extension kind `kind`.
// Called explicitly by the layer that defines the extension, never from a static initializer.
void register_dispatch_handler(int kind, DispatchHandler handler);

// If any defined input carries an extension, runs the registered handler on the call and
// returns its outputs; otherwise returns nullopt and the caller runs its kernel. Throws if an
// input's extension kind has no handler (naming the op and the kind).
std::optional<std::vector<Tensor>> dispatch_extension(std::string_view op,
                                                      std::initializer_list<Tensor> inputs,
                                                      std::vector<OpAttr> attrs = {});
// Same, for ops with a variable number of inputs (cat, stack).
std::optional<std::vector<Tensor>> dispatch_extension(std::string_view op,
                                                      std::span<const Tensor> inputs,
                                                      std::vector<OpAttr> attrs = {});

// Runs the plain op named by `call.op` (as if called directly). Throws naming the op if it is
// unknown. Handlers use it to run the local computation on unwrapped shards.
std::vector<Tensor> call_op(const OpCall& call);
// The names call_op knows, sorted.
std::vector<std::string> op_names();

}  // namespace loom
