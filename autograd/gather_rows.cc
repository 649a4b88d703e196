#include "autograd/gather_rows.h"

#include <algorithm>
#include <vector>

#include "autograd/function.h"
#include "base/error.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom {

namespace {

// y = x[index] with -1 giving zeros (index in [-1, rows)), no autograd: ops::embedding over x,
// or over x with a zero row after its own when some index is -1.
Tensor gather(const Tensor& x, std::span<const int64_t> index, const Shape& index_shape) {
  const int64_t rows = x.size(0);
  const bool reads_zeros = std::find(index.begin(), index.end(), -1) != index.end();
  std::vector<int64_t> rows_read(index.begin(), index.end());
  if (reads_zeros) std::replace(rows_read.begin(), rows_read.end(), int64_t{-1}, rows);
  const Tensor table =
      reads_zeros
          ? ops::cat(std::vector<Tensor>{x, ops::zeros({1, x.size(1)}, x.dtype(), x.device())}, 0)
          : x;
  return ops::embedding(table, ops::to(ops::from_vector_i64(rows_read, index_shape), x.device()));
}

}  // namespace

Tensor gather_rows(const Tensor& x, std::span<const int64_t> index, const Shape& index_shape) {
  LOOM_CHECK(x.defined() && x.dim() == 2, "gather_rows: expected x of shape (rows, D); got {}",
             x.defined() ? shape_str(x.shape()) : "an undefined tensor");
  LOOM_CHECK(x.extension() == nullptr,
             "gather_rows: x is a wrapper tensor (a DTensor: {}); its rows are indexed on this "
             "process: pass its local tensor (to_local)",
             x.description());
  LOOM_CHECK(static_cast<int64_t>(index.size()) == shape_numel(index_shape),
             "gather_rows: {} indices for index shape {} ({} elements)", index.size(),
             shape_str(index_shape), shape_numel(index_shape));
  const int64_t rows = x.size(0);
  std::vector<int64_t> count(rows, 0);  // each row's positions
  for (size_t i = 0; i < index.size(); ++i) {
    LOOM_CHECK(index[i] >= -1 && index[i] < rows,
               "gather_rows: index {} at position {} is outside [-1, {}) (x has {} rows; -1 reads "
               "zeros)",
               index[i], i, rows, rows);
    if (index[i] >= 0) ++count[index[i]];
  }
  Tensor y;
  {
    BelowAutogradGuard below;
    y = gather(x, index, index_shape);
  }
  // The inverse: each row's positions in increasing order, padded with -1 to the most any row has.
  const int64_t m = rows == 0 ? 0 : *std::max_element(count.begin(), count.end());
  std::vector<int64_t> inverse(rows * m, -1), filled(rows, 0);
  for (size_t i = 0; i < index.size(); ++i) {
    const int64_t r = index[i];
    if (r >= 0) inverse[r * m + filled[r]++] = static_cast<int64_t>(i);
  }
  return autograd::record("GatherRows", {x}, std::move(y),
                          [rows, m, width = x.size(1), dtype = x.dtype(), device = x.device(),
                           inverse = std::move(inverse)](const std::vector<Tensor>& grads) {
                            if (m == 0)
                              return std::vector<Tensor>{ops::zeros({rows, width}, dtype, device)};
                            const Tensor dy = ops::reshape(grads[0], {-1, width});
                            const Tensor picked = gather(dy, inverse, {rows, m});  // (rows, m, D)
                            return std::vector<Tensor>{m == 1 ? ops::reshape(picked, {rows, width})
                                                              : ops::sum(picked, {1})};
                          });
}

}  // namespace loom
