#include "tensor/cuda/kernels/device_common.cuh"
#include "tensor/cuda/kernels/nn.h"

namespace loom::cuda::kernels {
namespace {

// Philox4x32-10, word for word as loom::philox4x32 (tensor/rng.cc).
__device__ __forceinline__ uint4 philox(uint4 c, uint2 k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(kM0, c.x), lo0 = kM0 * c.x;
    const uint32_t hi1 = __umulhi(kM1, c.z), lo1 = kM1 * c.z;
    c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    k.x += kW0;
    k.y += kW1;
  }
  return c;
}

template <typename T>
__global__ void philox_kernel(T* out, Collapsed<1> global, int64_t base, uint64_t seed,
                              RandomKind kind, double a, double b) {
  const uint2 key = make_uint2(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  LOOM_GRID_STRIDE(i, global.numel) {
    int64_t off[1];
    offsets_of(global, i, off);
    const uint64_t index = static_cast<uint64_t>(base + off[0]);
    const uint4 w =
        philox(make_uint4(static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                          static_cast<uint32_t>(kind), 0u),
               key);
    const double u0 = (w.x >> 8) * 0x1.0p-24;  // [0, 1)
    float value;
    if (kind == RandomKind::kBernoulliKeep) {
      value = u0 >= a ? 1.0f : 0.0f;
    } else if (kind == RandomKind::kUniform) {
      value = static_cast<float>(a + (b - a) * u0);
    } else {
      const double u_left = ((w.x >> 8) + 1) * 0x1.0p-24;  // (0, 1]
      const double radius = sqrt(-2.0 * log(u_left));
      const double angle = 2.0 * 3.141592653589793 * ((w.y >> 8) * 0x1.0p-24);
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
