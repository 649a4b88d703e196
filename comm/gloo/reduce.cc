#include "comm/gloo/reduce.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "base/error.h"
#include "tensor/half.h"

namespace loom::comm::gloo_detail {

namespace {

template <ReduceOp kOp, typename Acc>
inline Acc combine(Acc a, Acc b) {
  if constexpr (std::is_floating_point_v<Acc>) {
    if constexpr (kOp == ReduceOp::kSum || kOp == ReduceOp::kAvg) return a + b;
    if constexpr (kOp == ReduceOp::kProduct) return a * b;
    if constexpr (kOp == ReduceOp::kMax) return (std::isnan(a) || a > b) ? a : b;  // NaN propagates
    if constexpr (kOp == ReduceOp::kMin) return (std::isnan(a) || a < b) ? a : b;
  } else {
    using U = std::make_unsigned_t<Acc>;  // wrap instead of signed-overflow UB
    if constexpr (kOp == ReduceOp::kSum || kOp == ReduceOp::kAvg) {
      return static_cast<Acc>(static_cast<U>(a) + static_cast<U>(b));
    }
    if constexpr (kOp == ReduceOp::kProduct)
      return static_cast<Acc>(static_cast<U>(a) * static_cast<U>(b));
    if constexpr (kOp == ReduceOp::kMax) return a > b ? a : b;
    if constexpr (kOp == ReduceOp::kMin) return a < b ? a : b;
  }
}

// Storage type S, accumulation type Acc, with load/store converting between them. Works in
// blocks so the accumulator stays in L1 and no buffer is allocated; `out` may alias any input
// because each block is read completely before it is written.
template <ReduceOp kOp, typename S, typename Acc, typename Load, typename Store>
void reduce_loop(const std::vector<const void*>& inputs, void* out, int64_t count, Load load,
                 Store store) {
  constexpr int64_t kBlock = 2048;
  Acc acc[kBlock];
  const Acc world = static_cast<Acc>(inputs.size());
  S* dst = static_cast<S*>(out);
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t n = std::min(kBlock, count - begin);
    const S* first = static_cast<const S*>(inputs[0]) + begin;
    for (int64_t i = 0; i < n; ++i) acc[i] = load(first[i]);
    for (size_t r = 1; r < inputs.size(); ++r) {
      const S* in = static_cast<const S*>(inputs[r]) + begin;
      for (int64_t i = 0; i < n; ++i) acc[i] = combine<kOp, Acc>(acc[i], load(in[i]));
    }
    if constexpr (kOp == ReduceOp::kAvg) {
      for (int64_t i = 0; i < n; ++i) acc[i] = acc[i] / world;
    }
    for (int64_t i = 0; i < n; ++i) dst[begin + i] = store(acc[i]);
  }
}

template <typename S, typename Acc, typename Load, typename Store>
void reduce_typed(ReduceOp op, const std::vector<const void*>& inputs, void* out, int64_t count,
                  Load load, Store store) {
  switch (op) {
    case ReduceOp::kSum:
      return reduce_loop<ReduceOp::kSum, S, Acc>(inputs, out, count, load, store);
    case ReduceOp::kAvg:
      return reduce_loop<ReduceOp::kAvg, S, Acc>(inputs, out, count, load, store);
    case ReduceOp::kMax:
      return reduce_loop<ReduceOp::kMax, S, Acc>(inputs, out, count, load, store);
    case ReduceOp::kMin:
      return reduce_loop<ReduceOp::kMin, S, Acc>(inputs, out, count, load, store);
    case ReduceOp::kProduct:
      return reduce_loop<ReduceOp::kProduct, S, Acc>(inputs, out, count, load, store);
  }
  LOOM_INTERNAL_ASSERT(false, "reduce_pieces: unknown reduce op {}", static_cast<int>(op));
}

}  // namespace

void reduce_pieces(DType dtype, ReduceOp op, const std::vector<const void*>& inputs, void* out,
                   int64_t count) {
  LOOM_INTERNAL_ASSERT(!inputs.empty());
  auto same_f = [](float v) { return v; };
  switch (dtype) {
    case kFloat32:
      return reduce_typed<float, float>(op, inputs, out, count, same_f, same_f);
    case kBFloat16:
      return reduce_typed<uint16_t, float>(op, inputs, out, count, bf16_to_float, float_to_bf16);
    case kFloat16:
      return reduce_typed<uint16_t, float>(op, inputs, out, count, f16_to_float, float_to_f16);
    case kInt32: {
      auto same = [](int32_t v) { return v; };
      return reduce_typed<int32_t, int32_t>(op, inputs, out, count, same, same);
    }
    case kInt64: {
      auto same = [](int64_t v) { return v; };
      return reduce_typed<int64_t, int64_t>(op, inputs, out, count, same, same);
    }
  }
  LOOM_INTERNAL_ASSERT(false, "reduce_pieces: unknown dtype {}", static_cast<int>(dtype));
}

}  // namespace loom::comm::gloo_detail
