#include "tensor/cuda/kernels/device_common.cuh"
#include "tensor/cuda/kernels/nn.h"
#include "tensor/philox.h"

namespace loom::cuda::kernels {
namespace {

template <typename T>
__global__ void philox_kernel(T* out, Collapsed<1> global, int64_t base, uint64_t seed,
                              RandomKind kind, double a, double b) {
  // For kBernoulliKeep, a is p (another kind's a, a mean or a bound, may be negative).
  const uint32_t keep_threshold =
      kind == RandomKind::kBernoulliKeep ? philox::keep_threshold(a) : 0u;
  LOOM_GRID_STRIDE(i, global.numel) {
    int64_t off[1];
    offsets_of(global, i, off);
    const uint64_t index = static_cast<uint64_t>(base + off[0]);
    const philox::Words words = philox::element_words(seed, index, static_cast<uint32_t>(kind));
    const uint32_t wx = words.w[0], wy = words.w[1];
    const double u0 = (wx >> 8) * 0x1.0p-24;  // [0, 1)
    float value;
    if (kind == RandomKind::kBernoulliKeep) {
      value = (wx >> 8) >= keep_threshold ? 1.0f : 0.0f;
    } else if (kind == RandomKind::kUniform) {
      value = static_cast<float>(a + (b - a) * u0);
    } else {
      const double u_left = ((wx >> 8) + 1) * 0x1.0p-24;  // (0, 1]
      const double radius = sqrt(-2.0 * log(u_left));
      const double angle = 2.0 * 3.141592653589793 * ((wy >> 8) * 0x1.0p-24);
      value = static_cast<float>(a + b * radius * cos(angle));
    }
    out[i] = convert<T>(value);
  }
}

}  // namespace

void philox_fill(DType dtype, void* out, const StridedArg& global, int64_t base, uint64_t seed,
                 RandomKind kind, double a, double b, int device) {
  const Collapsed<1> c = collapse<1>({&global});
  if (c.numel == 0) return;
  visit_floating(dtype, "philox_fill", [&](auto tag) {
    using T = decltype(tag);
    philox_kernel<T><<<grid_for(c.numel), kThreads, 0, compute_stream(device)>>>(
        static_cast<T*>(out), c, base, seed, kind, a, b);
  });
  check_launch("philox_kernel", device);
}

}  // namespace loom::cuda::kernels
