#include "tensor/op_device.h"

#include "base/error.h"
#include "tensor/ops_copy.h"

namespace loom {
namespace {

bool is_cpu_scalar(const Tensor& t) { return t.device().is_cpu() && t.dim() == 0; }

}  // namespace

Device op_device(std::string_view op, std::span<const Tensor> operands) {
  // The device of the first operand that is not a CPU scalar decides; CPU scalars follow it.
  int decider = -1;
  for (size_t i = 0; i < operands.size(); ++i) {
    if (!operands[i].defined() || is_cpu_scalar(operands[i])) continue;
    decider = static_cast<int>(i);
    break;
  }
  if (decider < 0) return Device::cpu();
  const Device device = operands[decider].device();
  for (size_t i = 0; i < operands.size(); ++i) {
    const Tensor& t = operands[i];
    if (!t.defined() || t.device() == device || is_cpu_scalar(t)) continue;
    LOOM_FAIL(
        "{}: expected all tensors on one device, got {} (operand {}: {}) and {} (operand {}: {})",
        op, device.str(), decider, operands[decider].description(), t.device().str(), i,
        t.description());
  }
  return device;
}

Device op_device(std::string_view op, std::initializer_list<Tensor> operands) {
  return op_device(op, std::span<const Tensor>(operands.begin(), operands.size()));
}

Tensor on_device(const Tensor& t, Device device) {
  if (!t.defined() || t.device() == device) return t;
  return ops::to(t, device);
}

}  // namespace loom
