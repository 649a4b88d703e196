#include "parallel/pipeline/p2p.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/error.h"
#include "tensor/ops.h"

namespace loom::pipeline::detail {

Tensor encode_metadata(const Tensor& tensor, Device device) {
  LOOM_CHECK(tensor.dim() <= kMaxMetaDims,
             "pipeline: a stage boundary tensor has {} dims; at most {} are supported",
             tensor.dim(), kMaxMetaDims);
  std::vector<int64_t> values(kMetaElements, 0);
  values[0] = static_cast<int64_t>(tensor.dtype());
  values[1] = tensor.dim();
  for (int64_t d = 0; d < tensor.dim(); ++d) values[2 + d] = tensor.size(d);
  return ops::from_vector_i64(values, {kMetaElements}, device);
}

BoundaryShape decode_metadata(const Tensor& metadata) {
  const Tensor host = ops::to(metadata, Device::cpu());
  const int64_t* values = host.data<int64_t>();
  const int64_t dtype = values[0], ndim = values[1];
  LOOM_CHECK(dtype >= 0 && dtype <= static_cast<int64_t>(DType::kInt64) && ndim >= 0 &&
                 ndim <= kMaxMetaDims,
             "pipeline: received malformed shape metadata [{}]",
             fmt::join(values, values + kMetaElements, ", "));
  return {Shape(values + 2, values + 2 + ndim), static_cast<DType>(dtype)};
}

}  // namespace loom::pipeline::detail
