// The meta device (tensor/device.h): ops give the shapes and dtypes a real device gives without
// running a kernel; small storage keeps values; the memory tracker and the FLOP counter count.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tensor/device.h"
#include "tensor/flop_counter.h"
#include "tensor/memory_stats.h"
#include "tensor/ops.h"
#include "tests/tensor/tensor_test_util.h"

namespace loom {
namespace {

TEST(MetaDevice, OpsGiveTheShapesOfARealDevice) {
  const Tensor a = ops::empty({4, 8}, kFloat32, Device::meta());
  const Tensor w = ops::empty({8, 3}, kFloat32, Device::meta());
  const Tensor y = ops::matmul(a, w);
  EXPECT_EQ(y.shape(), (Shape{4, 3}));
  EXPECT_TRUE(y.device().is_meta());
  EXPECT_EQ(ops::add(a, ops::full({8}, 1.0, kFloat32, Device::meta())).shape(), (Shape{4, 8}));
  EXPECT_EQ(ops::sum(a, {1}, false).shape(), (Shape{4}));
  const auto ln = ops::layer_norm(a, {8}, Tensor(), Tensor(), 1e-5);
  EXPECT_EQ(ln.out.shape(), (Shape{4, 8}));
  EXPECT_EQ(ln.mean.shape(), (Shape{4}));
  const Tensor ids = ops::empty({2, 5}, kInt64, Device::meta());
  EXPECT_EQ(ops::embedding(w, ids).shape(), (Shape{2, 5, 3}));
  const Tensor logits = ops::empty({10, 8}, kBFloat16, Device::meta());
  const auto ce = ops::cross_entropy(logits, ops::empty({10}, kInt64, Device::meta()));
  EXPECT_EQ(ce.loss.shape(), (Shape{}));
  EXPECT_EQ(ce.loss.dtype(), kFloat32);  // computed in f32 and kept so
  EXPECT_EQ(ops::to(a, kBFloat16).dtype(), kBFloat16);
  EXPECT_EQ(ops::transpose(a, 0, 1).shape(), (Shape{8, 4}));
}

TEST(MetaDevice, SmallStorageKeepsValuesLargeStorageHasNone) {
  const Tensor small = ops::from_vector_i64({3, 1, 4}, {3}, Device::meta());
  EXPECT_EQ(ops::to_vector(small), (std::vector<double>{3, 1, 4}));
  EXPECT_EQ(ops::full({1}, 2.5, kFloat32, Device::meta()).item<double>(), 2.5);
  // Computed values are not: what a kernel would write stays zero.
  EXPECT_EQ(ops::add(small, small).storage()->data() != nullptr, true);
  const Tensor big = ops::empty({1024}, kFloat32, Device::meta());
  EXPECT_EQ(big.storage()->data(), nullptr);
  // Without values a meta tensor reads as zeros (what ops compute on meta).
  EXPECT_EQ(ops::to_vector(ops::sum(big, {0}, false)), (std::vector<double>{0}));
  EXPECT_EQ(ops::to_vector(ops::narrow(big, 0, 0, 3)), (std::vector<double>{0, 0, 0}));
  // Copies into big meta storage are shape-checked no-ops.
  ops::copy_(big, ops::zeros({1024}));
}

TEST(MetaDevice, DefaultDeviceGuardPlacesFactories) {
  EXPECT_TRUE(ops::zeros({2}).device().is_cpu());
  {
    DefaultDeviceGuard meta(Device::meta());
    EXPECT_TRUE(ops::zeros({2}).device().is_meta());
    EXPECT_TRUE(ops::normal({3, 3}, /*seed=*/1).device().is_meta());
  }
  EXPECT_TRUE(ops::ones({2}).device().is_cpu());
  EXPECT_EQ(Device::meta().str(), "meta");
}

TEST(MemoryTracker, CountsStorageFromAllocationToFree) {
  MemoryTracker tracker;
  {
    ScopedMemoryTracker scope(tracker);
    Tensor a = ops::empty({1000}, kFloat32, Device::meta());  // 4000 bytes
    {
      Tensor b = ops::empty({500}, kFloat32);  // 2000 bytes on the CPU
      EXPECT_EQ(tracker.stats().current_bytes, 6000);
    }
    EXPECT_EQ(tracker.stats().current_bytes, 4000);
    EXPECT_EQ(tracker.stats().peak_bytes, 6000);
    tracker.reset_peak();
    EXPECT_EQ(tracker.stats().peak_bytes, 4000);
    a.storage()->release();
    EXPECT_EQ(tracker.stats().current_bytes, 0);
    a.storage()->refill();
    EXPECT_EQ(tracker.stats().current_bytes, 4000);
  }
  EXPECT_EQ(tracker.stats().current_bytes, 0);
  EXPECT_EQ(tracker.stats().allocations, 3);  // a, b, a's refill
  EXPECT_EQ(tracker.stats().allocated_bytes, 4000 + 2000 + 4000);
}

// Norms on a GPU take bf16 directly (issue 31): traced for a GPU, a bf16 layer or RMS norm
// allocates its bf16 output and f32 statistics only; traced for a CPU, it also stages f32 copies
// of its input and output, as the CPU kernels do. Forward and backward both.
TEST(MetaDevice, NormsOnAGpuAllocateNoF32CopiesOfBf16Tensors) {
  const int64_t rows = 64, n = 256;
  const int64_t bf16_rows = rows * n * 2, f32_rows = rows * n * 4, stats = rows * 4;
  const auto allocated = [&](Device target, bool rms, bool backward) {
    MetaTargetGuard follow(target);
    const Tensor x = ops::empty({rows, n}, kBFloat16, Device::meta());
    const Tensor w = ops::empty({n}, kBFloat16, Device::meta());
    const Tensor b = ops::empty({n}, kBFloat16, Device::meta());
    const Tensor g = ops::empty({rows, n}, kBFloat16, Device::meta());
    const Tensor mean = ops::empty({rows}, kFloat32, Device::meta());
    const Tensor rstd = ops::empty({rows}, kFloat32, Device::meta());
    MemoryTracker tracker;
    ScopedMemoryTracker scope(tracker);
    if (!rms && !backward) {
      const auto out = ops::layer_norm(x, {n}, w, b, 1e-5);
      EXPECT_EQ(out.out.dtype(), kBFloat16);
    } else if (!rms) {
      const auto grads = ops::layer_norm_backward(g, x, mean, rstd, w, {n});
      EXPECT_EQ(grads.grad_x.dtype(), kBFloat16);
      EXPECT_EQ(grads.grad_weight.dtype(), kBFloat16);
    } else if (!backward) {
      const auto out = ops::rms_norm(x, w, 1e-5);
      EXPECT_EQ(out.out.dtype(), kBFloat16);
    } else {
      const auto grads = ops::rms_norm_backward(g, x, rstd, w);
      EXPECT_EQ(grads.grad_x.dtype(), kBFloat16);
    }
    return tracker.stats().allocated_bytes;
  };
  // The GPU's: the bf16 output (and for layer norm's forward its f32 mean and rstd; backward: the
  // weight's f32 gradient sums and their bf16 rounding).
  EXPECT_EQ(allocated(Device::cuda(), false, false), bf16_rows + 2 * stats);
  EXPECT_EQ(allocated(Device::cuda(), true, false), bf16_rows + stats);
  EXPECT_EQ(allocated(Device::cuda(), false, true), bf16_rows + 2 * (n * 4 + n * 2));
  EXPECT_EQ(allocated(Device::cuda(), true, true), bf16_rows + n * 4 + n * 2);
  // The CPU's stage f32 copies: more than the input's and the output's f32 rows on top.
  for (bool rms : {false, true}) {
    for (bool backward : {false, true}) {
      EXPECT_GT(allocated(Device::cpu(), rms, backward),
                allocated(Device::cuda(), rms, backward) + 2 * f32_rows)
          << (rms ? "rms_norm" : "layer_norm") << (backward ? " backward" : "");
    }
  }
}

// RoPE likewise: on a GPU a bf16 x is rotated in place of dtype (its f32 tables as they are).
TEST(MetaDevice, RopeOnAGpuAllocatesOnlyItsBf16Output) {
  const auto allocated = [](Device target) {
    MetaTargetGuard follow(target);
    const Tensor x = ops::empty({2, 16, 4, 8}, kBFloat16, Device::meta());
    const Tensor cos = ops::empty({16, 4}, kFloat32, Device::meta());
    const Tensor sin = ops::empty({16, 4}, kFloat32, Device::meta());
    MemoryTracker tracker;
    ScopedMemoryTracker scope(tracker);
    EXPECT_EQ(ops::rope(x, cos, sin, /*inverse=*/false).dtype(), kBFloat16);
    return tracker.stats().allocated_bytes;
  };
  EXPECT_EQ(allocated(Device::cuda()), 2 * 16 * 4 * 8 * 2);
  EXPECT_EQ(allocated(Device::cpu()), 2 * 16 * 4 * 8 * (2 + 4 + 4));  // + f32 x and out
}

// Attention beyond the fused kernels' head dims (DeepSeek's multi-head latent attention: 192)
// runs composed on a GPU, and a GPU's trace holds what it allocates: f32 copies of q, k and v
// (k and v repeated per query head under grouped-query attention), the (Tq, Tk) f32 scores, the
// f32 output and its bf16 cast, and the f32 logsumexp.
TEST(MetaDevice, AttentionBeyondTheFusedHeadDimsTracesItsScores) {
  const int64_t b = 2, hq = 4, hkv = 2, t = 64, d = 192;
  MetaTargetGuard follow(Device::cuda());
  const Tensor q = ops::empty({b, hq, t, d}, kBFloat16, Device::meta());
  const Tensor kv = ops::empty({b, hkv, t, d}, kBFloat16, Device::meta());
  MemoryTracker tracker;
  ScopedMemoryTracker scope(tracker);
  const auto r =
      ops::scaled_dot_product_attention(q, kv, kv, true, 0.0, 0, {}, /*enable_gqa=*/true);
  EXPECT_EQ(r.out.dtype(), kBFloat16);
  const int64_t qf = b * hq * t * d * 4, kvf = b * hkv * t * d * 4, repeated = b * hq * t * d * 4;
  const int64_t scores = b * hq * t * t * 4, out = b * hq * t * d * (4 + 2), lse = b * hq * t * 4;
  EXPECT_EQ(tracker.stats().allocated_bytes, qf + 2 * (kvf + repeated) + scores + out + lse);
}

// Softmax likewise (the MoE router's, the composed attention's): on a GPU a bf16 x gives a bf16
// output with no f32 copies, forward and backward.
TEST(MetaDevice, SoftmaxOnAGpuAllocatesOnlyItsBf16Output) {
  const int64_t numel = 4 * 64 * 8;
  const auto allocated = [](Device target, bool log, bool backward) {
    MetaTargetGuard follow(target);
    const Tensor x = ops::empty({4, 64, 8}, kBFloat16, Device::meta());
    const Tensor g = ops::empty({4, 64, 8}, kBFloat16, Device::meta());
    MemoryTracker tracker;
    ScopedMemoryTracker scope(tracker);
    const Tensor out =
        backward ? (log ? ops::log_softmax_backward(g, x, 1) : ops::softmax_backward(g, x, 1))
                 : (log ? ops::log_softmax(x, 1) : ops::softmax(x, 1));
    EXPECT_EQ(out.dtype(), kBFloat16);
    return tracker.stats().allocated_bytes;
  };
  for (bool log : {false, true}) {
    EXPECT_EQ(allocated(Device::cuda(), log, false), numel * 2);
    EXPECT_EQ(allocated(Device::cuda(), log, true), numel * 2);
    EXPECT_EQ(allocated(Device::cpu(), log, false), numel * (4 + 4 + 2));  // + f32 x and out
    EXPECT_EQ(allocated(Device::cpu(), log, true), numel * (4 + 4 + 4 + 2));
  }
}

// Cross entropy on a GPU reads bf16 logits as they are and writes their gradient in bf16 (the
// fused classifier of issue 31): traced for a GPU it allocates the f32 logsumexp and loss and
// the bf16 gradient only; traced for a CPU, also f32 copies of the logits and the gradient.
TEST(MetaDevice, CrossEntropyOnAGpuAllocatesNoF32Logits) {
  const int64_t rows = 64, vocab = 1000;
  const auto allocated = [&](Device target, bool backward) {
    MetaTargetGuard follow(target);
    const Tensor logits = ops::empty({rows, vocab}, kBFloat16, Device::meta());
    const Tensor targets = ops::empty({rows}, kInt64, Device::meta());
    const Tensor lse = ops::empty({rows}, kFloat32, Device::meta());
    const Tensor grad_loss = ops::empty({}, kFloat32, Device::meta());
    MemoryTracker tracker;
    ScopedMemoryTracker scope(tracker);
    if (backward) {
      const Tensor grad =
          ops::cross_entropy_backward(grad_loss, logits, targets, -100, Reduction::kMean, lse);
      EXPECT_EQ(grad.dtype(), kBFloat16);
    } else {
      EXPECT_EQ(ops::cross_entropy(logits, targets).loss.dtype(), kFloat32);
    }
    return tracker.stats().allocated_bytes;
  };
  EXPECT_EQ(allocated(Device::cuda(), false), rows * 4 + 4);  // logsumexp and the mean loss
  EXPECT_EQ(allocated(Device::cuda(), true), rows * vocab * 2);
  EXPECT_EQ(allocated(Device::cpu(), false), rows * vocab * 4 + rows * 4 + 4);
  EXPECT_EQ(allocated(Device::cpu(), true), rows * vocab * (4 + 4 + 2));
}

TEST(FlopCounter, CountsMatrixProductsOnEveryDevice) {
  FlopCounter outer;
  {
    FlopCounter inner;
    ops::matmul(ops::ones({2, 3, 4}), ops::ones({4, 5}));  // 2 * (2 * 3) * 5 * 4
    EXPECT_EQ(inner.total(), 240);
  }
  ops::linear(ops::empty({6, 4}, kFloat32, Device::meta()),
              ops::empty({5, 4}, kFloat32, Device::meta()),
              ops::empty({5}, kFloat32, Device::meta()));  // 2 * 6 * 5 * 4
  const Tensor q = ops::empty({1, 2, 8, 4}, kFloat32, Device::meta());
  ops::scaled_dot_product_attention(q, q, q, /*is_causal=*/true);  // 2 * 2 * 8 * 8 * (4 + 4)
  EXPECT_EQ(outer.total(), 240 + 240 + 2048);
}

// In-place writes count the bytes they move, on the CPU and on the meta device alike (a CPU
// job's trace runs there, allocating as the CPU kernels do); ops that fill an output they
// allocated (zeros, clone, cat) are not counted again.
TEST(FlopCounter, CountsTheBytesInPlaceOpsMove) {
  const MetaTargetGuard cpu_kernels(Device::cpu());
  for (const Device device : {Device::cpu(), Device::meta()}) {
    SCOPED_TRACE(device.str());
    const Tensor a = ops::zeros({10, 10}, kFloat32, device);  // 400 bytes
    const Tensor b = ops::ones({10, 10}, kFloat32, device);
    const Tensor m = ops::zeros({10, 10}, kFloat32, device);
    const Tensor v = ops::zeros({10, 10}, kFloat32, device);
    FlopCounter counter;
    ops::clone(a);
    ops::cat(std::vector<Tensor>{a, b}, 0);
    ops::zeros({10, 10}, kFloat32, device);
    EXPECT_EQ(counter.in_place_bytes(), 0);
    ops::copy_(a, b);  // read 400, write 400
    EXPECT_EQ(counter.in_place_bytes(), 800);
    ops::fill_(a, 2.0);  // write 400
    EXPECT_EQ(counter.in_place_bytes(), 1200);
    ops::add_(a, b);  // read 800, write 400
    EXPECT_EQ(counter.in_place_bytes(), 2400);
    ops::mul_(a, 0.5);  // read 400, write 400
    EXPECT_EQ(counter.in_place_bytes(), 3200);
    // AdamW's fused pass: param, grad and both moments read, param and moments written.
    const ops::AdamWParameter x{a, b, m, v, /*bias1=*/0.1, /*bias2=*/0.01};
    ASSERT_TRUE(ops::adamw_fusable(x));
    ops::adamw_update_fused_(
        std::span(&x, 1), {.lr = 0.1, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0});
    EXPECT_EQ(counter.in_place_bytes(), 3200 + 7 * 400);
    EXPECT_EQ(counter.total(), 0);  // no matrix products
  }
}

}  // namespace
}  // namespace loom
