#include "parallel/pipeline/p2p.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <limits>

#include "base/error.h"
#include "tensor/ops.h"

namespace loom::pipeline::detail {

int p2p_tag(Channel channel, int boundary, int microbatch, int num_stages) {
  constexpr int64_t kChannels = 3;
  const int64_t tag = (static_cast<int64_t>(microbatch) * num_stages + boundary) * kChannels +
                      static_cast<int>(channel);
  LOOM_CHECK(tag <= std::numeric_limits<int>::max(),
             "pipeline: microbatch {} of {} stages needs message tag {}, beyond int", microbatch,
             num_stages, tag);
  return static_cast<int>(tag);
}

Tensor encode_metadata(const Tensor& tensor) {
  LOOM_CHECK(tensor.dim() <= kMaxMetaDims,
             "pipeline: a stage boundary tensor has {} dims; at most {} are supported",
             tensor.dim(), kMaxMetaDims);
  std::vector<int64_t> values(kMetaElements, 0);
  values[0] = static_cast<int64_t>(tensor.dtype());
  values[1] = tensor.dim();
  for (int64_t d = 0; d < tensor.dim(); ++d) values[2 + d] = tensor.size(d);
  return ops::from_vector_i64(values, {kMetaElements});
}

Tensor allocate_from_metadata(const Tensor& metadata) {
  const int64_t* values = metadata.data<int64_t>();
  const int64_t dtype = values[0], ndim = values[1];
  LOOM_CHECK(dtype >= 0 && dtype <= static_cast<int64_t>(DType::kInt64) && ndim >= 0 &&
                 ndim <= kMaxMetaDims,
             "pipeline: received malformed shape metadata [{}]",
             fmt::join(values, values + kMetaElements, ", "));
  return ops::empty(Shape(values + 2, values + 2 + ndim), static_cast<DType>(dtype));
}

}  // namespace loom::pipeline::detail
