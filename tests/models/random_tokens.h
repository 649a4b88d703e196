// Token ids for GPT tests: uniform in [0, vocab), a pure function of (shape, seed) like every
// Loom RNG draw, so each rank of a multi-rank test builds the same batch.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/ops.h"
#include "tensor/rng.h"

namespace loom::models::testing {

inline Tensor random_tokens(const Shape& shape, uint64_t seed, int64_t vocab) {
  std::vector<int64_t> ids;
  for (double v : ops::to_vector(ops::uniform(shape, seed, 0.0, static_cast<double>(vocab)))) {
    ids.push_back(static_cast<int64_t>(v));
  }
  return ops::from_vector_i64(ids, shape);
}

}  // namespace loom::models::testing
