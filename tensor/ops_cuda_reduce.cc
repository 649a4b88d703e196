// CUDA backend of the reductions (ops_cuda.h).
#include "base/error.h"
#include "tensor/cuda/kernels/reduce.h"
#include "tensor/ops_copy.h"
#include "tensor/ops_cuda.h"
#include "tensor/ops_views.h"

namespace loom::ops::cuda_backend {

Tensor sum(const Tensor& self, const std::vector<bool>& reduced, bool keepdim, double scale) {
  std::vector<int64_t> kept_dims, reduced_dims;
  Shape out_shape;
  int64_t kept = 1, count = 1;
  for (int64_t d = 0; d < self.dim(); ++d) {
    if (reduced[d]) {
      reduced_dims.push_back(d);
      count *= self.shape()[d];
      if (keepdim) out_shape.push_back(1);
    } else {
      kept_dims.push_back(d);
      kept *= self.shape()[d];
      out_shape.push_back(self.shape()[d]);
    }
  }
  Tensor out = Tensor::empty(out_shape, self.dtype(), self.device());
  const int device = self.device().index;
  std::vector<int64_t> kept_last = kept_dims, reduced_first = reduced_dims;
  kept_last.insert(kept_last.end(), reduced_dims.begin(), reduced_dims.end());
  reduced_first.insert(reduced_first.end(), kept_dims.begin(), kept_dims.end());
  // Reduced dims innermost and contiguous: one block per output. Outermost: tiles of 32 outputs
  // x 32 row groups per block (reduce.cu). Neither: copy to (kept, reduced) first.
  const Tensor rows_view = self.dim() == 0 ? self : permute(self, kept_last);
  // Chunked sums' 8-byte accumulators (double, or int64 for integers), on the device.
  const auto workspace = [&](int64_t chunks) {
    return chunks > 1 ? Tensor::empty({chunks, kept}, kInt64, self.device()) : Tensor();
  };
  const auto data = [](const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; };
  if (count == 0) {
    fill(out, 0.0);
  } else if (rows_view.is_contiguous()) {
    const Tensor partial = workspace(kernels::sum_rows_chunks(kept, count));
    kernels::sum_rows(self.dtype(), out.raw_data(), rows_view.raw_data(), kept, count, scale,
                      data(partial), device);
  } else if (const Tensor cols_view = permute(self, reduced_first); cols_view.is_contiguous()) {
    const Tensor partial = workspace(kernels::sum_cols_chunks(count));
    kernels::sum_cols(self.dtype(), out.raw_data(), cols_view.raw_data(), count, kept, scale,
                      data(partial), device);
  } else {
    const Tensor packed = contiguous(rows_view);
    const Tensor partial = workspace(kernels::sum_rows_chunks(kept, count));
    kernels::sum_rows(self.dtype(), out.raw_data(), packed.raw_data(), kept, count, scale,
                      data(partial), device);
  }
  return out;
}

void max_rows(const Tensor& values, const Tensor& indices, const Tensor& in, int64_t rows,
              int64_t n) {
  kernels::max_rows(in.dtype(), values.raw_data(), indices.data<int64_t>(), in.raw_data(), rows, n,
                    in.device().index);
}

void top_k_rows(const Tensor& indices, const Tensor& in, int64_t rows, int64_t n, int64_t k) {
  kernels::top_k_rows(in.dtype(), indices.data<int64_t>(), in.raw_data(), rows, n, k,
                      in.device().index);
}

}  // namespace loom::ops::cuda_backend
