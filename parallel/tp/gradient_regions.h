// Megatron's "f" operator for code that computes on plain tensors under tensor parallelism: a
// value every tp rank holds whole (replicated) that each rank then uses for its own heads only,
// so each rank's gradient of it is a partial sum. copy_to_tensor_parallel_region passes the value
// through and, in backward, sums its gradient over the tp group (one all-reduce), giving every
// rank the whole gradient (latent attention's rotary key, shared by every head; a tp-split
// expert's input).
#pragma once

#include <memory>

#include "mesh/device_mesh.h"
#include "tensor/tensor.h"

namespace loom::tp {

// Identity forward; backward all-reduces the gradient (sum) over the 1-D `tp_mesh`.
Tensor copy_to_tensor_parallel_region(const Tensor& x, std::shared_ptr<const DeviceMesh> tp_mesh);
// Megatron's "g": forward all-reduces (sum) the tp ranks' partial results, backward passes the
// gradient through (every rank's partial result took part whole).
Tensor reduce_from_tensor_parallel_region(const Tensor& x,
                                          std::shared_ptr<const DeviceMesh> tp_mesh);

}  // namespace loom::tp
