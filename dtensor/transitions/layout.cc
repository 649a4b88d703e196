#include "dtensor/transitions/layout.h"

#include "tensor/ops.h"

namespace loom::transitions {

namespace {
std::vector<int64_t> front_permutation(int64_t ndim, int64_t tensor_dim) {
  std::vector<int64_t> dims{tensor_dim};
  for (int64_t d = 0; d < ndim; ++d) {
    if (d != tensor_dim) dims.push_back(d);
  }
  return dims;
}
}  // namespace

Tensor dim_to_front(const Tensor& t, int64_t tensor_dim) {
  if (tensor_dim == 0) return ops::contiguous(t);
  return ops::contiguous(ops::permute(t, front_permutation(t.dim(), tensor_dim)));
}

Tensor dim_from_front(const Tensor& t, int64_t tensor_dim) {
  if (tensor_dim == 0) return t;
  const auto forward = front_permutation(t.dim(), tensor_dim);
  std::vector<int64_t> inverse(forward.size());
  for (size_t i = 0; i < forward.size(); ++i) inverse[forward[i]] = static_cast<int64_t>(i);
  return ops::contiguous(ops::permute(t, inverse));
}

Tensor chunks_to_front(const Tensor& full, int64_t tensor_dim, int64_t count) {
  Shape split;  // (A..., count, chunk, R...)
  std::vector<int64_t> to_front{tensor_dim};
  for (int64_t d = 0; d < full.dim(); ++d) {
    if (d == tensor_dim) {
      split.push_back(count);
      split.push_back(full.size(d) / count);
    } else {
      split.push_back(full.size(d));
    }
  }
  for (int64_t d = 0; d <= full.dim(); ++d) {
    if (d != tensor_dim) to_front.push_back(d);
  }
  return ops::contiguous(ops::permute(ops::reshape(ops::contiguous(full), split), to_front));
}

Tensor chunks_from_front(const Tensor& stacked, int64_t tensor_dim) {
  // (count, A..., chunk, R...) -> (A..., count, chunk, R...) -> merge count and chunk.
  std::vector<int64_t> order;
  for (int64_t d = 1; d <= tensor_dim; ++d) order.push_back(d);
  order.push_back(0);
  for (int64_t d = tensor_dim + 1; d < stacked.dim(); ++d) order.push_back(d);
  Shape merged;
  for (int64_t d = 1; d < stacked.dim(); ++d) {
    merged.push_back(d == tensor_dim + 1 ? stacked.size(0) * stacked.size(d) : stacked.size(d));
  }
  return ops::reshape(ops::contiguous(ops::permute(stacked, order)), merged);
}

Shape front_shape(const Shape& shape, int64_t tensor_dim, int64_t size) {
  Shape out{size};
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (d != tensor_dim) out.push_back(shape[d]);
  }
  return out;
}

}  // namespace loom::transitions
