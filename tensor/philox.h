// Philox 4x32-10 (Salmon et al. 2011), one definition for the host and the CUDA kernels: the
// CPU's random tensors (tensor/rng.cc), the GPU's (kernels/random.cu) and the masks the attention
// kernels draw inside themselves (tensor/attention_dropout_mask.h) all come from this function,
// so a GPU and a CPU draw the same bits.
#pragma once

#include <cstdint>

#if defined(__CUDACC__) || defined(LOOM_CUDA_EMULATED)
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif

namespace loom::philox {

struct Words {
  uint32_t w[4];
};

// The Philox4x32-10 block for counter (c0, c1, c2, c3) and key (k0, k1).
LOOM_HOST_DEVICE inline Words block(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                    uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  // Unrolled, so that a loop over elements (the CPU attention kernel's row of keys) vectorizes.
#if defined(__CUDA_ARCH__)
#pragma unroll
#elif defined(__GNUC__) && !defined(__clang__)
#pragma GCC unroll 10
#endif
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += kW0;
    k1 += kW1;
  }
  return {{c0, c1, c2, c3}};
}

// The random words of element `index` of a tensor drawn under `seed`; `stream` separates the
// distributions (cuda::kernels::RandomKind: 1 normal, 2 uniform, 3 dropout's keep-mask).
LOOM_HOST_DEVICE inline Words element_words(uint64_t seed, uint64_t index, uint32_t stream) {
  return block(static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), stream, 0,
               static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Dropout's keep-mask stream, and the rule every keep-mask follows: element `index` is kept when
// its first word's top 24 bits, as a fraction of 2^24, are at least p. keep_threshold(p) is that
// rule as an integer compare (p * 2^24 is exact in double, so the ceiling is too).
inline constexpr uint32_t kKeepStream = 3;
LOOM_HOST_DEVICE inline uint32_t keep_threshold(double p) {
  const double scaled = p * 16777216.0;  // 2^24
  const auto whole = static_cast<uint32_t>(scaled);
  return static_cast<double>(whole) == scaled ? whole : whole + 1;
}
LOOM_HOST_DEVICE inline bool keep(uint64_t seed, uint64_t index, uint32_t threshold) {
  return (element_words(seed, index, kKeepStream).w[0] >> 8) >= threshold;
}

}  // namespace loom::philox
