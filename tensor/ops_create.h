// Factories (loom::ops). Results are contiguous, on default_device() (the CPU unless a
// DefaultDeviceGuard says otherwise, tensor/device.h) when no device is given.
#pragma once

#include <vector>

#include "tensor/tensor.h"

namespace loom::ops {

Tensor empty(const Shape& shape, DType dtype = kFloat32, Device device = default_device());
Tensor zeros(const Shape& shape, DType dtype = kFloat32, Device device = default_device());
Tensor ones(const Shape& shape, DType dtype = kFloat32, Device device = default_device());
Tensor full(const Shape& shape, double value, DType dtype = kFloat32,
            Device device = default_device());
Tensor zeros_like(const Tensor& like);
Tensor ones_like(const Tensor& like);
// [start, end) by step, like torch.arange; i64 by default.
Tensor arange(double start, double end, double step = 1.0, DType dtype = kInt64);
Tensor arange(int64_t end, DType dtype = kInt64);
// A tensor holding `values` (row-major) with `shape`; the count must match.
Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype = kFloat32);
// i64 values (indices, targets, small messages); a separate name so brace lists of numbers are
// not ambiguous. Filled on the host, then copied to `device`.
Tensor from_vector_i64(const std::vector<int64_t>& values, const Shape& shape,
                       Device device = Device::cpu());
Tensor scalar_tensor(double value, DType dtype = kFloat32);
// Fills every element of `self` (in place, any layout).
void fill_(const Tensor& self, double value);
// fill_ whose bytes a trace counts elsewhere (see copy_uncounted_): a new output's, or the zeros
// a meta tensor with values reads from one without.
void fill_uncounted_(const Tensor& self, double value);
// Row-major values as f64 (CPU): for tests, printing and small host-side logic.
std::vector<double> to_vector(const Tensor& self);

}  // namespace loom::ops
