// bf16 GEMM throughput through Loom's cuBLASLt path (tensor/cuda/gemm_cublaslt.h) beside the
// GPU's dense bf16 peak: the GPU twin of gemm_bench. Times `--iterations` back-to-back GEMMs on
// the compute stream with CUDA events, after `--warmup` untimed ones (which also build and cache
// the plan). Prints one line per shape:
//   bf16 4096x4096x4096: 1.23 ms, 112.0 TFLOP/s = 0.11 of 989 TFLOP/s peak
// Exits 1 with the reason when there is no GPU.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "base/error.h"
#include "tensor/cuda/caching_allocator.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/cuda/gemm_cublaslt.h"
#include "tensor/cuda/stream.h"
#include "tensor/ops_create.h"
#include "tensor/rng.h"

namespace {

struct Shape3 {
  int64_t m, n, k;
};

// Milliseconds per GEMM of (m, k) @ (k, n) in `dtype`, row-major, no transposes.
double time_gemm(const Shape3& s, loom::DType dtype, int warmup, int iterations) {
  using namespace loom;
  Tensor a = Tensor::empty({s.m, s.k}, dtype, Device::cuda(0));
  Tensor b = Tensor::empty({s.k, s.n}, dtype, Device::cuda(0));
  Tensor c = Tensor::empty({s.m, s.n}, dtype, Device::cuda(0));
  ops::uniform_(a, 1, -1.0, 1.0);  // random values: zeros would let the tensor cores idle
  ops::uniform_(b, 2, -1.0, 1.0);
  const cuda::GemmProblem p{.dtype = dtype,
                            .m = s.m,
                            .n = s.n,
                            .k = s.k,
                            .lda = s.k,
                            .ldb = s.n,
                            .ldc = s.n,
                            .stride_c = s.m * s.n,
                            .batch = 1};
  for (int i = 0; i < warmup; ++i) cuda::gemm(p, a.raw_data(), b.raw_data(), c.raw_data(), 0);
  cuda::Event start(0, /*timing=*/true), stop(0, /*timing=*/true);
  start.record();
  for (int i = 0; i < iterations; ++i) cuda::gemm(p, a.raw_data(), b.raw_data(), c.raw_data(), 0);
  stop.record();
  stop.synchronize();
  return stop.elapsed_ms_since(start) / iterations;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bf16 GEMM TFLOP/s through cuBLASLt beside the dense bf16 peak"};
  int warmup = 5, iterations = 50;
  double peak_tflops = 989.0;  // H100/H200 SXM dense bf16 (no sparsity)
  app.add_option("--warmup", warmup, "untimed GEMMs per shape");
  app.add_option("--iterations", iterations, "timed GEMMs per shape");
  app.add_option("--peak", peak_tflops, "the GPU's dense bf16 peak in TFLOP/s");
  CLI11_PARSE(app, argc, argv);
  if (!loom::cuda::available()) {
    std::fprintf(stderr, "cuda_gemm_bench: %s\n", loom::cuda::unavailable_reason().c_str());
    return 1;
  }
  try {
    cudaDeviceProp prop{};
    LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    fmt::print("device: {} ({} SMs), cuBLASLt, f32 accumulation\n", prop.name,
               prop.multiProcessorCount);
    const std::vector<Shape3> shapes = {{4096, 4096, 4096}, {8192, 8192, 2048}};
    for (const Shape3& s : shapes) {
      const double ms = time_gemm(s, loom::kBFloat16, warmup, iterations);
      const double tflops = 2.0 * s.m * s.n * s.k / (ms * 1e-3) / 1e12;
      fmt::print("bf16 {}x{}x{}: {:.3f} ms, {:.1f} TFLOP/s = {:.2f} of {:.0f} TFLOP/s peak\n", s.m,
                 s.n, s.k, ms, tflops, tflops / peak_tflops, peak_tflops);
    }
    fmt::print("allocator: {}\n", loom::cuda::stats_str(loom::cuda::allocator_stats(0)));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_gemm_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
