#include "tensor/ops_top_k.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "base/error.h"
#include "tensor/cpu/element_types.h"
#include "tensor/ops_copy.h"
#include "tensor/ops_cuda.h"

namespace loom::ops {

Tensor top_k_indices(const Tensor& x, int64_t k) {
  LOOM_CHECK(x.defined(), "top_k_indices: the input is undefined");
  LOOM_CHECK(!x.extension(),
             "top_k_indices: got a distributed tensor of shape {}; it takes plain tensors (pass "
             "the local tensor)",
             shape_str(x.shape()));
  LOOM_CHECK(is_floating(x.dtype()), "top_k_indices: expected a floating input, got {} of shape {}",
             dtype_name(x.dtype()), shape_str(x.shape()));
  LOOM_CHECK(x.dim() >= 1 && k >= 1 && k <= x.size(-1),
             "top_k_indices: k must be in [1, n] for an input (..., n), got k={} and shape {}", k,
             shape_str(x.shape()));
  const int64_t n = x.size(-1);
  const int64_t rows = x.numel() / n;
  Shape out_shape = x.shape();
  out_shape.back() = k;
  Tensor out = Tensor::empty(out_shape, kInt64, x.device());
  if (x.device().is_meta() || rows == 0) return out;
  const Tensor in = contiguous(x);
  if (x.device().is_cuda()) {
    cuda_backend::top_k_rows(out, in, rows, n, k);
    return out;
  }
  int64_t* o = out.data<int64_t>();
  cpu::visit_dtype(in.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* data = static_cast<const T*>(in.raw_data());
    std::vector<int64_t> order(n);
    std::vector<double> key(n);
    for (int64_t r = 0; r < rows; ++r) {
      bool nan = false;
      for (int64_t j = 0; j < n; ++j) {
        key[j] = static_cast<double>(cpu::to_compute(data[r * n + j]));
        nan = nan || key[j] != key[j];
      }
      if (nan) {
        std::fill(o + r * k, o + (r + 1) * k, int64_t{-1});
        continue;
      }
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
        return key[a] > key[b] || (key[a] == key[b] && a < b);
      });
      std::copy(order.begin(), order.begin() + k, o + r * k);
    }
  });
  return out;
}

}  // namespace loom::ops
