// Fused attention throughput on one GPU (issue 31's figure): forward and backward TFLOP/s of
// ops::scaled_dot_product_attention in bf16, causal, at sequence 1024 and 4096 and head dims 64
// and 128, on the tensor-core kernels (tensor/cuda/kernels/flash_attention_mma.h) and on the
// plain CUDA kernels they replaced, side by side in the same process, and the tensor-core kernels
// single-buffered (what their double-buffered tiles buy). FLOPs by FlashAttention's
// convention: forward 4 B H T^2 D, halved when causal; backward 2.5 times the forward. Times
// `--iterations` calls with CUDA events after `--warmup` untimed ones. One line per case:
//   causal T 1024 D 64 (B 16 H 12): tensor cores fwd 0.41 ms 251.3 TFLOP/s, bwd ... |
//   single-buffered ... | plain ...
// Exits 1 with the reason when there is no GPU.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "base/error.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/cuda/kernels/flash_attention_mma.h"
#include "tensor/cuda/stream.h"
#include "tensor/ops.h"

namespace {

using namespace loom;

// Milliseconds per call of f.
double time_ms(const std::function<void()>& f, int warmup, int iterations) {
  for (int i = 0; i < warmup; ++i) f();
  cuda::Event start(0, /*timing=*/true), stop(0, /*timing=*/true);
  start.record();
  for (int i = 0; i < iterations; ++i) f();
  stop.record();
  stop.synchronize();
  return stop.elapsed_ms_since(start) / iterations;
}

struct Case {
  int64_t batch, heads, t, d;
};

struct Variant {
  const char* name;
  bool tensor_cores;
  size_t shared_memory_cap;  // 0: none
};

// The most shared memory the tensor-core kernels take at head dim d single-buffered: a cap there
// makes every kernel single-buffered.
size_t single_buffered_bytes(int64_t d) {
  const auto plan = cuda::kernels::tensor_core_attention_plan(kBFloat16, d, 0);
  return std::max({plan.forward.single_buffered_bytes, plan.dq.single_buffered_bytes,
                   plan.dkdv.single_buffered_bytes});
}

// "forward 2 tile buffers (85 KiB), dq ..., dk/dv ...": how the GPU runs head dim d.
std::string plan_line(int64_t d) {
  const auto plan = cuda::kernels::tensor_core_attention_plan(kBFloat16, d, 0);
  const auto kernel = [](const char* name, const cuda::kernels::AttentionKernelPlan& k) {
    return fmt::format("{} {} tile buffers ({:.1f} KiB)", name, k.tile_buffers,
                       k.shared_bytes / 1024.0);
  };
  return fmt::format("D {}: {}, {}, {}; {:.0f} KiB per block allowed", d,
                     kernel("forward", plan.forward), kernel("dq", plan.dq),
                     kernel("dk/dv", plan.dkdv), plan.shared_memory_per_block / 1024.0);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fused attention TFLOP/s on one GPU: tensor-core kernels beside the plain ones"};
  int warmup = 3, iterations = 10;
  app.add_option("--warmup", warmup, "untimed calls per case");
  app.add_option("--iterations", iterations, "timed calls per case");
  CLI11_PARSE(app, argc, argv);
  if (!cuda::available()) {
    std::fprintf(stderr, "cuda_attention_bench: %s\n", cuda::unavailable_reason().c_str());
    return 1;
  }
  try {
    // About 2^24 query rows x head dim in each case: GPT-2 small's (16, 12) heads at 1024.
    const std::vector<Case> cases = {
        {16, 12, 1024, 64}, {8, 8, 1024, 128}, {4, 12, 4096, 64}, {2, 8, 4096, 128}};
    for (int64_t d : {64, 128}) fmt::print("tensor-core attention at {}\n", plan_line(d));
    for (const Case& c : cases) {
      const Device gpu = Device::cuda(0);
      const Shape shape{c.batch, c.heads, c.t, c.d};
      Tensor q = ops::empty(shape, kBFloat16, gpu), k = ops::empty(shape, kBFloat16, gpu);
      Tensor v = ops::empty(shape, kBFloat16, gpu), g = ops::empty(shape, kBFloat16, gpu);
      for (auto [t, seed] : {std::pair{&q, 1}, {&k, 2}, {&v, 3}, {&g, 4}}) {
        ops::uniform_(*t, seed, -1.0, 1.0);
      }
      const double fwd_flops = 4.0 * c.batch * c.heads * c.t * c.t * c.d / 2;  // causal
      std::string line = fmt::format("causal T {} D {} (B {} H {}):", c.t, c.d, c.batch, c.heads);
      // The tensor-core kernels as the GPU takes them (double-buffered tiles where they fit),
      // then single-buffered (as on a GPU with less shared memory per block, forced by a cap at
      // their own sizes: what the double buffering buys), then the plain kernels.
      const size_t single = single_buffered_bytes(c.d);
      for (const Variant& variant :
           {Variant{"tensor cores", true, 0}, Variant{"| single-buffered", true, single},
            Variant{"| plain", false, 0}}) {
        cuda::kernels::set_tensor_core_attention(variant.tensor_cores);
        cuda::kernels::set_attention_shared_memory_limit(variant.shared_memory_cap);
        ops::AttentionResult fwd;
        const double f_ms =
            time_ms([&] { fwd = ops::scaled_dot_product_attention(q, k, v, /*is_causal=*/true); },
                    warmup, iterations);
        const double b_ms = time_ms(
            [&] {
              ops::scaled_dot_product_attention_backward(g, q, k, v, fwd.out, fwd.logsumexp,
                                                         /*is_causal=*/true);
            },
            warmup, iterations);
        line += fmt::format(" {} fwd {:.3f} ms {:.1f} TFLOP/s, bwd {:.3f} ms {:.1f} TFLOP/s",
                            variant.name, f_ms, fwd_flops / (f_ms * 1e-3) / 1e12, b_ms,
                            2.5 * fwd_flops / (b_ms * 1e-3) / 1e12);
      }
      cuda::kernels::set_attention_shared_memory_limit(0);
      cuda::kernels::set_tensor_core_attention(true);
      fmt::print("{}\n", line);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_attention_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
