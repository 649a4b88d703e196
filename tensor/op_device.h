// Which device a plain op runs on, decided once per op family (tensor/ops_*.cc) before any
// kernel: all defined tensor operands must be on one device, and the op's outputs go there.
//
// As in PyTorch, a 0-dim CPU tensor (a scalar such as scalar_tensor(2.0)) may join operands on
// a GPU: it is copied there (4-8 bytes). Any other mix is an error naming the op and both
// devices, e.g.
//   add: expected all tensors on one device, got cpu (operand 0: Tensor(shape=(4,), dtype=f32,
//   device=cpu)) and cuda:0 (operand 1: Tensor(shape=(4,), dtype=f32, device=cuda:0))
#pragma once

#include <span>
#include <string_view>

#include "tensor/tensor.h"

namespace loom {

Device op_device(std::string_view op, std::span<const Tensor> operands);
Device op_device(std::string_view op, std::initializer_list<Tensor> operands);
// Same, for operands by pointer (hot ops: no tensor handle is copied).
Device op_device(std::string_view op, std::span<const Tensor* const> operands);

// `t` on `device`: itself when already there (or undefined), else a copy (only 0-dim CPU
// tensors reach this after op_device has checked the operands).
Tensor on_device(const Tensor& t, Device device);

}  // namespace loom
