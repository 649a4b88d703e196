// Which parameters share a gradient bucket (PyTorch's compute_bucket_assignment_by_size).
// Pure: no tensors, no communication.
//
// Parameters go in reverse registration order — roughly the order their gradients become
// ready in backward — and a bucket closes once its bytes reach the cap: the first bucket is
// small (1 MiB) so the first all-reduce starts early, later ones larger (25 MiB) to amortize
// per-call cost. A bucket holds one dtype only.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/dtype.h"

namespace loom::ddp {

struct BucketCaps {
  int64_t first_bucket_bytes = 1 << 20;
  int64_t bucket_bytes = 25 << 20;
};

struct ParameterInfo {
  int64_t numel;
  DType dtype;
};

// Bucket i lists indices into `parameters`, in the order they were placed.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<ParameterInfo>& parameters,
                                                BucketCaps caps = {});

}  // namespace loom::ddp
