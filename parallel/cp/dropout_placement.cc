#include "parallel/cp/dropout_placement.h"

#include "base/error.h"

namespace loom::parallel::cp {

DropoutPlacement::DropoutPlacement(const AttentionDropout& dropout, const Tensor& q,
                                   int64_t seq_len)
    : dropout_(dropout) {
  if (dropout.p == 0.0) return;
  const RngRegion& given = dropout.region;
  LOOM_CHECK(given.global_shape.empty() ||
                 (given.global_shape.size() == 4 && given.global_offset.size() == 4),
             "context-parallel attention: a dropout region must place (B, H, T, T) probabilities, "
             "got global shape {} and offset {}",
             shape_str(given.global_shape), shape_str(given.global_offset));
  Shape global{q.size(0), q.size(1), seq_len, seq_len};
  Shape offset{0, 0, 0, 0};
  if (!given.global_shape.empty()) {
    for (int d = 0; d < 2; ++d) {
      global[d] = given.global_shape[d];
      offset[d] = given.global_offset[d];
    }
  }
  dropout_.region = {std::move(global), std::move(offset)};
}

AttentionDropout DropoutPlacement::at(int64_t head_offset, int64_t first_query,
                                      int64_t first_key) const {
  if (dropout_.p == 0.0) return {};
  AttentionDropout piece = dropout_;
  piece.region.global_offset[1] += head_offset;
  piece.region.global_offset[2] = first_query;
  piece.region.global_offset[3] = first_key;
  return piece;
}

}  // namespace loom::parallel::cp
