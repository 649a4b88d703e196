// Local reductions for the Gloo backend's reduce_scatter / all_reduce (private to comm/gloo).
#pragma once

#include <cstdint>
#include <vector>

#include "comm/types.h"
#include "tensor/dtype.h"

namespace loom::comm::gloo_detail {

// out[i] = op over r = 0..W-1 of inputs[r][i] (W = inputs.size(), rank order, so every rank
// computes bit-identical results). f32, bf16 and f16 accumulate in f32 and round once when
// storing; i32/i64 accumulate natively (sum and product wrap). kAvg divides the sum by W
// (integers: truncating). `out` may alias any input.
void reduce_pieces(DType dtype, ReduceOp op, const std::vector<const void*>& inputs, void* out,
                   int64_t count);

}  // namespace loom::comm::gloo_detail
