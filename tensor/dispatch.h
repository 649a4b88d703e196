// Op dispatch: where autograd and tensor extensions (DTensor) take over an op.
//
// Every op declared in tensor/op_list.h begins with `dispatch_op(OpId::name, inputs, attrs)`.
// When that returns outputs, the op returns them; when it returns nullopt, the op runs its own
// CPU/CUDA kernel. The order is torch's dispatcher's, in miniature:
//
//   1. Autograd. If grad mode is on, no BelowAutogradGuard is active and an input requires grad,
//      a kDifferentiable op goes to the autograd handler (installed by autograd/, which computes
//      the op below autograd and records it once with the op's formula); a kNoGrad op is run
//      below autograd, so nothing it calls records either.
//   2. Extensions. If an input carries a TensorExtension (tensor.h) and the op is kExtended, the
//      op becomes an OpCall and goes to the handler registered for that extension's kind: this
//      is how dtensor/ takes over ops on DTensors (sharding propagation, then the local op on
//      each shard through call_op) while tensor/ never includes dtensor/.
//   3. Otherwise nullopt: the op's kernel runs.
//
// So one spelling of each op, loom::ops::add or loom::add, records when it should: there is no
// plain variant that silently drops a gradient. Cost when nothing applies: a thread-local read
// and one pointer test per input.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "tensor/op_list.h"
#include "tensor/tensor.h"

namespace loom {

// One attribute of an op call, in declaration order of the op's non-tensor parameters.
using OpAttr = std::variant<int64_t, double, bool, std::vector<int64_t>, DType>;

struct OpCall {
  OpId id;
  std::string_view op;  // op_name(id), for messages
  std::vector<Tensor> inputs;
  std::vector<OpAttr> attrs;

  OpCall(OpId id, std::vector<Tensor> inputs, std::vector<OpAttr> attrs = {})
      : id(id), op(op_name(id)), inputs(std::move(inputs)), attrs(std::move(attrs)) {}

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

// The autograd handler: records a kDifferentiable op (see 1. above). A plain function pointer,
// so that setting it from autograd's static registration (autograd/autograd_dispatch.cc) does
// not depend on the order in which static objects are constructed.
using AutogradHandler = std::vector<Tensor> (*)(const OpCall&);
void register_autograd_handler(AutogradHandler handler);
bool autograd_handler_registered();

// Routes the op (see above). Returns the outputs when autograd or an extension handled the op,
// nullopt when its kernel should run. Throws naming the op when an input's extension kind has no
// handler, or when an input requires grad and autograd is not linked into the program.
std::optional<std::vector<Tensor>> dispatch_op(OpId op, std::initializer_list<Tensor> inputs,
                                               std::vector<OpAttr> attrs = {});
// Same, for ops with a variable number of inputs (cat).
std::optional<std::vector<Tensor>> dispatch_op(OpId op, std::span<const Tensor> inputs,
                                               std::vector<OpAttr> attrs = {});

// A thread's dispatch mode (torch's TorchDispatchMode, in miniature): sees every op call on its
// way to an extension handler or a kernel — below autograd, so an op recorded by autograd shows
// up once, when autograd runs its forward — outermost only: what it runs through call_op, and
// what a handler runs inside the call, is not shown to it again. Selective activation
// checkpointing (nn/checkpoint.h) keeps some ops' outputs in forward and hands them back in the
// recompute through one.
class DispatchMode {
 public:
  virtual ~DispatchMode() = default;
  // The op's outputs: run it with call_op(call), or answer without running it.
  virtual std::vector<Tensor> dispatch(const OpCall& call) = 0;
};

// Installs `mode` on this thread for its scope (the previous one comes back on exit).
class ScopedDispatchMode {
 public:
  explicit ScopedDispatchMode(DispatchMode& mode);
  ~ScopedDispatchMode();
  ScopedDispatchMode(const ScopedDispatchMode&) = delete;
  ScopedDispatchMode& operator=(const ScopedDispatchMode&) = delete;

 private:
  DispatchMode* previous_;
  bool previous_inside_;
};

// Runs the plain op `call.id` (as if called directly; it dispatches again from the top).
// Handlers use it to run the local computation on unwrapped shards.
std::vector<Tensor> call_op(const OpCall& call);

}  // namespace loom
