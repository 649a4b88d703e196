// Shapes, strides and dim arithmetic shared by every op (one place for the index math).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
Strides contiguous_strides(const Shape& shape);
// Whether a view of `shape` and `strides` covers a block of shape_numel(shape) elements exactly
// once: contiguous up to a permutation of its dims (torch's is_non_overlapping_and_dense).
// Size-1 dims' strides do not matter.
bool non_overlapping_and_dense(const Shape& shape, const Strides& strides);
// "(4, 3)"; "()" for a scalar. Every shape in an error message goes through this.
std::string shape_str(const Shape& shape);

// Maps a possibly negative dim into [0, ndim); throws "<op>: dim -4 out of range for a
// tensor of rank 3 (expected -3..2)".
int64_t normalize_dim(int64_t dim, int64_t ndim, std::string_view op);

// NumPy broadcasting of two shapes; throws naming the op and both shapes when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op);

}  // namespace loom
