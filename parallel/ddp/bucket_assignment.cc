#include "parallel/ddp/bucket_assignment.h"

#include <map>

#include "base/error.h"

namespace loom::ddp {

std::vector<std::vector<size_t>> assign_buckets(const std::vector<ParameterInfo>& parameters,
                                                BucketCaps caps) {
  LOOM_CHECK(caps.first_bucket_bytes > 0 && caps.bucket_bytes > 0,
             "assign_buckets: bucket caps must be positive, got first {} and {} bytes",
             caps.first_bucket_bytes, caps.bucket_bytes);
  std::vector<std::vector<size_t>> buckets;
  // One open bucket per dtype.
  std::map<DType, std::pair<size_t, int64_t>> open;  // dtype -> (bucket index, bytes so far)
  for (size_t k = parameters.size(); k-- > 0;) {
    const ParameterInfo& p = parameters[k];
    auto it = open.find(p.dtype);
    if (it == open.end()) {
      buckets.emplace_back();
      it = open.emplace(p.dtype, std::make_pair(buckets.size() - 1, int64_t{0})).first;
    }
    buckets[it->second.first].push_back(k);
    it->second.second += p.numel * static_cast<int64_t>(element_size(p.dtype));
    const int64_t cap = it->second.first == 0 ? caps.first_bucket_bytes : caps.bucket_bytes;
    if (it->second.second >= cap) open.erase(it);
  }
  return buckets;
}

}  // namespace loom::ddp
