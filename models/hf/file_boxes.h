// Reading one rank's box of a parameter straight from a checkpoint file: only the bytes of the
// rows (and columns) its shard holds, through the parameter's FileLayout (state_dict_adapter.h),
// so loading a model over N ranks reads about 1/N of the file on each.
#pragma once

#include <cstdint>
#include <string>

#include "models/hf/safetensors.h"
#include "models/hf/state_dict_adapter.h"
#include "tensor/tensor.h"

namespace loom::models::hf {

// Loom's box [offset, offset + shape) of a parameter of (global) shape `loom_shape` (1-D or
// 2-D), read from `source` through `layout`: a fresh CPU tensor of shape `shape` in the file's
// dtype. Adds the bytes read to *bytes_read. Throws naming the file when a read fails.
Tensor read_box(const TensorSource& source, const StateDictAdapter::FileLayout& layout,
                const Shape& loom_shape, const Shape& offset, const Shape& shape,
                int64_t* bytes_read);

}  // namespace loom::models::hf
