// Dropout on attention's probabilities as the fused kernels draw it (CPU:
// tensor/cpu/attention_kernels.h; CUDA: kernels/flash_attention*.cu): never stored, each element
// of the keep-mask drawn where it is used, in the forward and again in the backward.
//
// Element (entry e, query i, key j) of a call's probabilities is element
//   index = base + (e / heads) * batch_stride + (e % heads) * head_stride + i * row_stride + j
// of the whole attention's (batch..., Tq, Tk) mask, and is kept as bernoulli_keep_mask
// (tensor/rng.h) keeps that element: so the fused kernels drop exactly what
// ops::dropout(softmax(...), p, seed, region) would, on every device and every shard.
#pragma once

#include <cstdint>

#include "tensor/philox.h"

namespace loom {

struct AttentionDropoutMask {
  uint64_t seed = 0;
  uint32_t threshold = 0;  // philox::keep_threshold(p); 0 keeps everything (dropout off)
  float rescale = 1.0f;    // 1 / (1 - p) for a kept element; 0 when p == 1
  int64_t base = 0, batch_stride = 0, head_stride = 0, heads = 1, row_stride = 0;

  LOOM_HOST_DEVICE bool active() const { return threshold > 0; }
  // The mask index of element (e, i, 0); element (e, i, j) is j on.
  LOOM_HOST_DEVICE int64_t row_index(int64_t e, int64_t i) const {
    return base + (e / heads) * batch_stride + (e % heads) * head_stride + i * row_stride;
  }
  // What element (e, i, j) of P is multiplied by: rescale where kept, 0 where dropped.
  LOOM_HOST_DEVICE float factor(int64_t e, int64_t i, int64_t j) const {
    return factor_at(static_cast<uint64_t>(row_index(e, i) + j));
  }
  LOOM_HOST_DEVICE float factor_at(uint64_t index) const {
    return philox::keep(seed, index, threshold) ? rescale : 0.0f;
  }
};

}  // namespace loom
