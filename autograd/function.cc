#include "autograd/function.h"

#include "autograd/grad_mode.h"
#include "base/error.h"

namespace loom::autograd {

bool any_requires_grad(std::span<const Tensor> inputs) {
  if (!recording_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (t.requires_grad()) return true;
  }
  return false;
}

bool any_requires_grad(std::initializer_list<Tensor> inputs) {
  return any_requires_grad(std::span<const Tensor>(inputs.begin(), inputs.size()));
}

namespace {
// A new handle onto `t`'s data (and extension), with no autograd state of its own yet.
Tensor fresh_handle(const Tensor& t) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage();
  impl->shape = t.shape();
  impl->strides = t.strides();
  impl->offset = t.offset();
  impl->dtype = t.dtype();
  impl->extension = t.extension();
  return Tensor(std::move(impl));
}
}  // namespace

std::vector<Tensor> record(std::string name, std::span<const Tensor> inputs,
                           std::vector<Tensor> outputs, FunctionNode::Backward backward) {
  if (!any_requires_grad(inputs)) return outputs;
  std::vector<FunctionNode::OutputInfo> infos;
  for (const Tensor& out : outputs) {
    LOOM_INTERNAL_ASSERT(out.defined(), "{} produced an undefined output", name);
    infos.push_back({out.shape(), out.dtype(), out.device(),
                     out.extension() ? out.extension()->zeros_maker() : nullptr});
  }
  auto node =
      std::make_shared<FunctionNode>(std::move(name), std::move(backward), std::move(infos));
  std::vector<Edge> edges;
  edges.reserve(inputs.size());
  for (const Tensor& in : inputs) edges.push_back(gradient_edge(in));
  node->set_next_edges(std::move(edges));
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor handle = fresh_handle(outputs[i]);
    TensorImpl* impl = handle.impl();
    impl->requires_grad = is_floating(handle.dtype());
    impl->grad_fn = node;
    impl->output_nr = static_cast<uint32_t>(i);
    outputs[i] = std::move(handle);
  }
  return outputs;
}

Tensor record(std::string name, std::initializer_list<Tensor> inputs, Tensor output,
              FunctionNode::Backward backward) {
  std::vector<Tensor> outputs{std::move(output)};
  return record(std::move(name), std::span<const Tensor>(inputs.begin(), inputs.size()),
                std::move(outputs), std::move(backward))[0];
}

std::vector<Tensor> Function::apply(std::shared_ptr<Function> function,
                                    const std::vector<Tensor>& inputs) {
  LOOM_CHECK(function != nullptr, "Function::apply: got a null function");
  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;
    outputs = function->forward(inputs);
  }
  const size_t input_count = inputs.size();
  const std::string name = function->name();
  return record(name, inputs, std::move(outputs),
                [function, input_count, name](const std::vector<Tensor>& grads) {
                  NoGradGuard no_grad;
                  std::vector<Tensor> result = function->backward(grads);
                  LOOM_CHECK(result.size() == input_count,
                             "{}::backward returned {} gradients for {} inputs", name,
                             result.size(), input_count);
                  return result;
                });
}

}  // namespace loom::autograd
