#include "tensor/op_device.h"

#include "base/error.h"
#include "tensor/ops_copy.h"

namespace loom {
namespace {

bool is_cpu_scalar(const Tensor& t) { return t.device().is_cpu() && t.dim() == 0; }

}  // namespace

namespace {

// The operands are any range; `at(i)` gives the i-th tensor.
template <typename At>
Device op_device_of(std::string_view op, size_t count, At at) {
  // The device of the first operand that is not a CPU scalar decides; CPU scalars follow it.
  int decider = -1;
  for (size_t i = 0; i < count; ++i) {
    if (!at(i).defined() || is_cpu_scalar(at(i))) continue;
    decider = static_cast<int>(i);
    break;
  }
  if (decider < 0) return Device::cpu();
  const Device device = at(decider).device();
  for (size_t i = 0; i < count; ++i) {
    const Tensor& t = at(i);
    if (!t.defined() || t.device() == device || is_cpu_scalar(t)) continue;
    LOOM_FAIL(
        "{}: expected all tensors on one device, got {} (operand {}: {}) and {} (operand {}: {})",
        op, device.str(), decider, at(decider).description(), t.device().str(), i, t.description());
  }
  return device;
}

}  // namespace

Device op_device(std::string_view op, std::span<const Tensor> operands) {
  return op_device_of(op, operands.size(), [&](size_t i) -> const Tensor& { return operands[i]; });
}

Device op_device(std::string_view op, std::span<const Tensor* const> operands) {
  return op_device_of(op, operands.size(), [&](size_t i) -> const Tensor& { return *operands[i]; });
}

Device op_device(std::string_view op, std::initializer_list<Tensor> operands) {
  return op_device(op, std::span<const Tensor>(operands.begin(), operands.size()));
}

Tensor on_device(const Tensor& t, Device device) {
  if (!t.defined() || t.device() == device) return t;
  return ops::to(t, device);
}

}  // namespace loom
