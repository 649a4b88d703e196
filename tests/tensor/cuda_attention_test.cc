// The fused CUDA attention (tensor/cuda/kernels/flash_attention.cu) against the CPU op on seeded
// random inputs, forward (out, logsumexp) and backward (dq, dk, dv), in f32 and bf16, causal and
// not, Tq == Tk and Tq != Tk, odd sizes across tile edges (tiles are 64 rows), several (batch,
// head) rows, Tk == 0, non-contiguous inputs, head dims above the fused kernel's 128 (the
// composed fallback), and causal offsets (query i sees key j <= i + offset: tile-aligned and not,
// negative ones leaving whole query tiles without a key, the chunk shapes of context
// parallelism), attention dropout and grouped-query attention on every path. Every case skips
// without a GPU.
//
// bf16 cases run on both GPU paths: the tensor-core kernels (flash_attention_mma.h: head dims 16,
// 32, 64 and 128, D == Dv) and the plain CUDA kernels, each against the CPU.
//
// Tolerances (cuda_test_util.h): f32 1e-5 relative and absolute, bf16 1e-2, times a slack of 4
// for out and logsumexp (the online softmax rescales partial sums, so terms add in another
// order than the CPU's row softmax) and 10 for the gradients (sums over up to 1000 keys or
// queries of products of recomputed P and dP).
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "tensor/cuda/caching_allocator.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/cuda/kernels/flash_attention_mma.h"
#include "tensor/ops.h"
#include "tests/tensor/cuda_test_util.h"
#include "tests/testing/errors.h"

namespace loom {
namespace {

using namespace ::loom::testing;  // NOLINT(build/namespaces): the comparison helpers

// Sets the tensor-core switch for a scope, restoring it after.
class TensorCoreAttention {
 public:
  explicit TensorCoreAttention(bool enabled)
      : previous_(cuda::kernels::tensor_core_attention_enabled()) {
    cuda::kernels::set_tensor_core_attention(enabled);
  }
  ~TensorCoreAttention() { cuda::kernels::set_tensor_core_attention(previous_); }
  TensorCoreAttention(const TensorCoreAttention&) = delete;
  TensorCoreAttention& operator=(const TensorCoreAttention&) = delete;

 private:
  bool previous_;
};

// Caps the shared memory per block the tensor-core kernels plan for, for a scope.
class SharedMemoryCap {
 public:
  explicit SharedMemoryCap(size_t bytes) {
    cuda::kernels::set_attention_shared_memory_limit(bytes);
  }
  ~SharedMemoryCap() { cuda::kernels::set_attention_shared_memory_limit(0); }
  SharedMemoryCap(const SharedMemoryCap&) = delete;
  SharedMemoryCap& operator=(const SharedMemoryCap&) = delete;
};

struct Case {
  Shape batch;
  int64_t tq, tk, d, dv;
};

Shape with(Shape batch, int64_t t, int64_t n) {
  batch.insert(batch.end(), {t, n});
  return batch;
}

class CudaAttentionTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { LOOM_SKIP_WITHOUT_CUDA(); }

  // Forward and backward of q, k, v (CPU tensors, any layout) on both devices, compared. bf16
  // runs both GPU paths: the tensor-core kernels (where they take the shape: head dims 16, 32,
  // 64 and 128 with D == Dv) and the plain ones; f32 has the plain ones only.
  void compare(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
               const std::string& what, int64_t offset = 0, const AttentionDropout& dropout = {},
               bool gqa = false) {
    const DType dtype = GetParam();
    const auto cpu = ops::scaled_dot_product_attention(q, k, v, causal, 0.0, offset, dropout, gqa);
    const Tensor g = random_tensor(cpu.out.shape(), 99, dtype);
    const auto cg = ops::scaled_dot_product_attention_backward(
        g, q, k, v, cpu.out, cpu.logsumexp, causal, 0.0, offset, false, dropout, gqa);
    for (bool tensor_cores : {true, false}) {
      if (!tensor_cores && dtype == kFloat32) break;
      const TensorCoreAttention path(tensor_cores);
      const std::string tag =
          fmt::format("{} causal {} offset {} dropout {} {} {}", what, causal, offset, dropout.p,
                      dtype_name(dtype), tensor_cores ? "(tensor cores)" : "");
      const auto dev = ops::scaled_dot_product_attention(gpu(q), gpu(k), gpu(v), causal, 0.0,
                                                         offset, dropout, gqa);
      expect_close({.actual = dev.out,
                    .expected = cpu.out,
                    .tol = kernel_tolerance(cpu.out.dtype(), 4.0),
                    .what = tag + " out"});
      expect_close({.actual = dev.logsumexp,
                    .expected = cpu.logsumexp,
                    .tol = kernel_tolerance(cpu.logsumexp.dtype(), 4.0),
                    .what = tag + " logsumexp"});
      const auto dg = ops::scaled_dot_product_attention_backward(gpu(g), gpu(q), gpu(k), gpu(v),
                                                                 dev.out, dev.logsumexp, causal,
                                                                 0.0, offset, false, dropout, gqa);
      expect_close({.actual = dg.dq,
                    .expected = cg.dq,
                    .tol = kernel_tolerance(cg.dq.dtype(), 10.0),
                    .what = tag + " dq"});
      expect_close({.actual = dg.dk,
                    .expected = cg.dk,
                    .tol = kernel_tolerance(cg.dk.dtype(), 10.0),
                    .what = tag + " dk"});
      expect_close({.actual = dg.dv,
                    .expected = cg.dv,
                    .tol = kernel_tolerance(cg.dv.dtype(), 10.0),
                    .what = tag + " dv"});
    }
  }

  // Both masks, or (a non-zero offset) causal with that offset only.
  void compare_case(const Case& c, uint32_t seed, int64_t offset = 0,
                    const AttentionDropout& dropout = {}) {
    const DType dtype = GetParam();
    const Tensor q = random_tensor(with(c.batch, c.tq, c.d), seed, dtype);
    const Tensor k = random_tensor(with(c.batch, c.tk, c.d), seed + 1, dtype);
    const Tensor v = random_tensor(with(c.batch, c.tk, c.dv), seed + 2, dtype);
    const std::string what =
        fmt::format("batch {} tq {} tk {} d {} dv {}", shape_str(c.batch), c.tq, c.tk, c.d, c.dv);
    if (offset != 0) {
      compare(q, k, v, /*causal=*/true, what, offset, dropout);
      return;
    }
    for (bool causal : {false, true}) compare(q, k, v, causal, what, 0, dropout);
  }
};

TEST_P(CudaAttentionTest, MatchesTheCpuAcrossTileEdgesAndSequenceLengths) {
  const std::vector<Case> cases = {
      {{2, 3}, 1, 1, 8, 8},         // one query, one key
      {{2, 3}, 37, 37, 64, 64},     // one partial tile
      {{1, 2}, 130, 130, 80, 80},   // three tiles, the last of 2 rows
      {{2, 2}, 37, 130, 8, 64},     // Tq < Tk: causal rows see keys 0..i only (top-left)
      {{2, 1}, 130, 37, 64, 8},     // Tq > Tk: causal rows past Tk see every key
      {{3}, 1, 130, 80, 80},        // one batch dim, a single query over three key tiles
      {{1, 1}, 64, 128, 128, 128},  // the largest head dims of the fused kernel, whole tiles
  };
  uint32_t seed = 10;
  for (const Case& c : cases) compare_case(c, seed += 3);
}

// Issue 31's odd sizes: one sequence of 1000 (16 tiles, the last of 40 rows) at the head dims
// GPT-2 (64) and Llama (128) use, both masks, both GPU paths.
TEST_P(CudaAttentionTest, OneSequenceOf1000AtHeadDims64And128) {
  compare_case({{1, 1}, 1000, 1000, 64, 64}, 400);
  compare_case({{1, 1}, 1000, 1000, 128, 128}, 403);
}

TEST_P(CudaAttentionTest, CausalOffsetsMatchTheCpu) {
  // Query i sees key j <= i + offset. The fused kernels' tile bounds move with the offset: the
  // last key tile a query tile sees (forward, dq) and the first query tile a key tile is seen by
  // (dk/dv), so offsets sit on, just before and just after 64-row tile edges.
  struct OffsetCase {
    Case c;
    int64_t offset;
  };
  const std::vector<OffsetCase> cases = {
      {{{2, 2}, 70, 200, 32, 32}, 130},   // bottom-right (tk - tq): context parallelism's chunk
      {{{1, 2}, 130, 260, 64, 64}, 64},   // one whole tile
      {{{1, 2}, 130, 260, 64, 64}, 65},   // a tile and one key
      {{{1, 2}, 130, 200, 16, 24}, 63},   // a key short of a tile
      {{{2, 1}, 130, 130, 16, 16}, 3},    // square, a few keys ahead
      {{{2, 1}, 200, 130, 32, 32}, -70},  // query tile 0 and 6 rows of tile 1 see no key
      {{{1, 1}, 130, 130, 8, 8}, -64},    // exactly query tile 0 sees no key
      {{{1, 1}, 100, 80, 8, 8}, -150},    // no query sees a key: zeros, -inf logsumexp
      {{{1, 1}, 37, 80, 8, 8}, 500},      // past the keys: every key visible
      {{{1, 2}, 9, 30, 160, 16}, 21},     // composed path (D > 128), bottom-right
      {{{1, 2}, 20, 11, 16, 136}, -5},    // composed path (Dv > 128), negative
  };
  uint32_t seed = 80;
  for (const OffsetCase& oc : cases) compare_case(oc.c, seed += 3, oc.offset);
}

TEST_P(CudaAttentionTest, BlockBackwardWithTheWholeRowsSumsMatchesTheCpu) {
  // Ring attention's per-block backward (delta_from_out): keys [0, s) and [s, s + c) of one
  // causal row block, each block's backward with the whole attention's out and logsumexp, on the
  // fused path (D 32) and the composed one (D 136), against the CPU's.
  const DType dtype = GetParam();
  for (int64_t d : {int64_t{32}, int64_t{136}}) {
    const int64_t s = 70, c = 66;
    const Tensor q = random_tensor({2, 2, c, d}, 301, dtype);
    const Tensor k = random_tensor({2, 2, s + c, d}, 302, dtype);
    const Tensor v = random_tensor({2, 2, s + c, d}, 303, dtype);
    const auto whole = ops::scaled_dot_product_attention(q, k, v, true, 0.0, s);
    const Tensor g = random_tensor(whole.out.shape(), 304, dtype);
    for (const auto& [begin, length, causal, tensor_cores] :
         {std::tuple<int64_t, int64_t, bool, bool>{0, s, false, true},
          {s, c, true, true},
          {0, s, false, false},
          {s, c, true, false}}) {
      if (!tensor_cores && dtype == kFloat32) continue;
      const TensorCoreAttention path(tensor_cores);
      const Tensor kb = ops::contiguous(ops::narrow(k, 2, begin, length)),
                   vb = ops::contiguous(ops::narrow(v, 2, begin, length));
      const auto cpu = ops::scaled_dot_product_attention_backward(
          g, q, kb, vb, whole.out, whole.logsumexp, causal, 0.0, 0, /*delta_from_out=*/true);
      const auto dev = ops::scaled_dot_product_attention_backward(
          gpu(g), gpu(q), gpu(kb), gpu(vb), gpu(whole.out), gpu(whole.logsumexp), causal, 0.0, 0,
          /*delta_from_out=*/true);
      const std::string tag = fmt::format("d {} keys [{}, {}) {}{}", d, begin, begin + length,
                                          dtype_name(dtype), tensor_cores ? " (tensor cores)" : "");
      expect_close({.actual = dev.dq,
                    .expected = cpu.dq,
                    .tol = kernel_tolerance(cpu.dq.dtype(), 10.0),
                    .what = tag + " dq"});
      expect_close({.actual = dev.dk,
                    .expected = cpu.dk,
                    .tol = kernel_tolerance(cpu.dk.dtype(), 10.0),
                    .what = tag + " dk"});
      expect_close({.actual = dev.dv,
                    .expected = cpu.dv,
                    .tol = kernel_tolerance(cpu.dv.dtype(), 10.0),
                    .what = tag + " dv"});
    }
  }
}

TEST_P(CudaAttentionTest, QueryChunkWithOffsetIsRowsOfFullCausalAttention) {
  // Context parallelism on the device: queries [s, s + c) against keys [0, s + c) with offset s
  // give rows s.. of the full causal attention (within the fused kernels' reordering: 4x).
  const DType dtype = GetParam();
  const int64_t s = 100, c = 70, t = s + c;
  const Tensor q = gpu(random_tensor({1, 2, t, 32}, 90, dtype));
  const Tensor k = gpu(random_tensor({1, 2, t, 32}, 91, dtype));
  const Tensor v = gpu(random_tensor({1, 2, t, 32}, 92, dtype));
  const auto full = ops::scaled_dot_product_attention(q, k, v, true);
  const auto chunk = ops::scaled_dot_product_attention(ops::narrow(q, 2, s, c), k, v, true, 0.0, s);
  expect_close({.actual = chunk.out,
                .expected = ops::contiguous(ops::narrow(full.out, 2, s, c)),
                .tol = kernel_tolerance(dtype, 4.0),
                .what = "chunk out"});
  expect_close({.actual = chunk.logsumexp,
                .expected = ops::contiguous(ops::narrow(full.logsumexp, 2, s, c)),
                .tol = kernel_tolerance(kFloat32, 4.0),
                .what = "chunk logsumexp"});
}

TEST_P(CudaAttentionTest, NoKeysGivesZerosAndMinusInfinityLogsumexp) {
  compare_case({{2, 3}, 5, 0, 8, 8}, 40);
  const DType dtype = GetParam();
  const auto dev = ops::scaled_dot_product_attention(gpu(random_tensor({2, 5, 8}, 41, dtype)),
                                                     gpu(ops::zeros({2, 0, 8}, dtype)),
                                                     gpu(ops::zeros({2, 0, 4}, dtype)));
  for (double x : ops::to_vector(dev.out)) EXPECT_EQ(x, 0.0);
  for (double x : ops::to_vector(dev.logsumexp))
    EXPECT_EQ(x, -std::numeric_limits<double>::infinity());
}

TEST_P(CudaAttentionTest, NonContiguousInputsAreMadeContiguous) {
  // (batch, T, heads, D) laid out, seen as (batch, heads, T, D), as a fused QKV projection gives.
  const DType dtype = GetParam();
  const Tensor q = ops::transpose(random_tensor({2, 45, 3, 16}, 50, dtype), 1, 2);
  const Tensor k = ops::transpose(random_tensor({2, 70, 3, 16}, 51, dtype), 1, 2);
  const Tensor v = ops::transpose(random_tensor({2, 70, 3, 24}, 52, dtype), 1, 2);
  for (bool causal : {false, true}) compare(q, k, v, causal, "transposed (b, t, h, d) inputs");
}

TEST_P(CudaAttentionTest, ReadsTheHeadsOfAFusedProjectionWithoutCopies) {
  // q, k and v as a GPT takes them: slices of one (B, T, H, 3, D) projection, heads transposed to
  // (B, H, T, D). Both paths match the CPU; on tensor cores (bf16) the kernels read the views as
  // they are, the forward allocating only out and logsumexp, laid out (B, T, H, D) so the
  // caller's transpose back is a view, and the backward one buffer holding dq, dk and dv as the
  // projection holds q, k and v (so unbind's backward stacks them as a view) and delta.
  const DType dtype = GetParam();
  const int64_t b = 2, t = 70, h = 3, d = 64;
  const Tensor qkv = random_tensor({b, t, h, 3, d}, 120, dtype);
  const auto head = [&](const Tensor& x, int64_t which) {
    return ops::transpose(ops::squeeze(ops::narrow(x, 3, which, 1), 3), 1, 2);
  };
  for (bool causal : {false, true}) {
    compare(head(qkv, 0), head(qkv, 1), head(qkv, 2), causal, "heads of a fused projection");
  }
  if (dtype == kFloat32) return;  // no tensor cores for f32
  const Tensor dev = gpu(qkv);
  const Tensor q = head(dev, 0), k = head(dev, 1), v = head(dev, 2);
  const Tensor g = ops::transpose(gpu(random_tensor({b, t, h, d}, 121, dtype)), 1, 2);
  const int64_t before = cuda::allocator_stats(0).allocations;
  const auto fwd = ops::scaled_dot_product_attention(q, k, v, /*is_causal=*/true);
  EXPECT_EQ(cuda::allocator_stats(0).allocations - before, 2) << "out and logsumexp only";
  const auto grads =
      ops::scaled_dot_product_attention_backward(g, q, k, v, fwd.out, fwd.logsumexp, true);
  EXPECT_EQ(cuda::allocator_stats(0).allocations - before, 2 + 2)
      << "one buffer for dq, dk and dv, and delta";
  EXPECT_TRUE(ops::transpose(fwd.out, 1, 2).is_contiguous()) << "out laid out (B, T, H, D)";
  // The gradients lie as q, k and v do, side by side: unbind's backward (over dim 3 of the
  // (B, T, H, 3, D) projection, its gradients transposed back to (B, T, H, D)) stacks them as a
  // view. (Stacking the (B, H, T, D) gradients at dim 4, as this test first did, puts the new dim
  // after D: never the projection's layout. The emulated device found it: tools/cuda_emulator.)
  const auto back = [](const Tensor& x) { return ops::transpose(x, 1, 2); };
  const Tensor stacked = ops::stacked_view(
      std::vector<Tensor>{back(grads.dq), back(grads.dk), back(grads.dv)}, /*dim=*/3);
  ASSERT_TRUE(stacked.defined());
  EXPECT_TRUE(stacked.is_contiguous()) << "(B, T, H, 3, D)";
}

// Attention dropout: every GPU path (tensor cores, plain kernels, the composed products beyond
// head dim 128) draws each element's keep factor where it holds P, forward and backward, and
// drops exactly what the CPU drops (the mask is Philox's, bit for bit), so results differ by
// the kernels' usual rounding only. Sizes cross tile edges; a region places heads 2.. of a
// larger attention.
TEST_P(CudaAttentionTest, DropoutDropsWhatTheCpuDrops) {
  const AttentionDropout dropout{.p = 0.3, .seed = 9001};
  compare_case({{2, 3}, 37, 37, 64, 64}, 500, 0, dropout);
  compare_case({{1, 2}, 130, 130, 64, 64}, 503, 0, dropout);
  compare_case({{2, 2}, 37, 130, 8, 64}, 506, 0, dropout);
  compare_case({{1, 1}, 70, 70, 128, 128}, 509, 0, dropout);
  compare_case({{1, 2}, 9, 11, 160, 16}, 512, 0, dropout);     // composed
  compare_case({{1, 2}, 64, 200, 32, 32}, 515, 136, dropout);  // a chunk of queries at the end
  compare_case({{2, 2}, 40, 40, 16, 16}, 518, 0,
               {.p = 0.5, .seed = 77, .region = {{2, 5, 40, 40}, {0, 2, 0, 0}}});
}

// Grouped-query attention read in place: every GPU path takes key/value head h / g for query
// head h, and the backward sums each group's query heads into dk and dv (one block per key/value
// head and key tile looping over its group), as the CPU does.
TEST_P(CudaAttentionTest, GroupedQueryAttentionMatchesTheCpu) {
  const DType dtype = GetParam();
  struct GqaCase {
    int64_t hq, hkv, tq, tk, d;
  };
  uint32_t seed = 700;
  for (const GqaCase& c : {GqaCase{4, 2, 70, 70, 64}, GqaCase{6, 2, 37, 130, 32},
                           GqaCase{3, 1, 65, 65, 128}, GqaCase{4, 2, 9, 9, 160}}) {
    const Tensor q = random_tensor({2, c.hq, c.tq, c.d}, seed, dtype);
    const Tensor k = random_tensor({2, c.hkv, c.tk, c.d}, seed + 1, dtype);
    const Tensor v = random_tensor({2, c.hkv, c.tk, c.d}, seed + 2, dtype);
    seed += 3;
    const std::string what =
        fmt::format("Hq {} Hkv {} tq {} tk {} d {}", c.hq, c.hkv, c.tq, c.tk, c.d);
    for (bool causal : {false, true}) compare(q, k, v, causal, what, 0, {}, /*gqa=*/true);
    compare(q, k, v, true, what, 0, {.p = 0.2, .seed = 31}, /*gqa=*/true);
  }
}

TEST_P(CudaAttentionTest, HeadDimsAbove128UseTheComposedPath) {
  compare_case({{1, 2}, 9, 11, 160, 16}, 60);
  compare_case({{1, 2}, 9, 11, 16, 136}, 63);
}

TEST_P(CudaAttentionTest, NeverAllocatesTheScoreMatrix) {
  // T = 2048, D = 64, one head: the (T, T) f32 scores alone would be 16 MiB; q, k, v, out and
  // the gradients are 0.5 MiB each in f32.
  const DType dtype = GetParam();
  const int64_t t = 2048;
  const Tensor q = gpu(random_tensor({1, 1, t, 64}, 70, dtype));
  const Tensor k = gpu(random_tensor({1, 1, t, 64}, 71, dtype));
  const Tensor v = gpu(random_tensor({1, 1, t, 64}, 72, dtype));
  const Tensor g = gpu(random_tensor({1, 1, t, 64}, 73, dtype));
  const size_t before = cuda::allocator_stats(0).allocated_bytes;
  cuda::reset_peak_stats(0);
  const auto fwd = ops::scaled_dot_product_attention(q, k, v, true);
  const auto grads =
      ops::scaled_dot_product_attention_backward(g, q, k, v, fwd.out, fwd.logsumexp, true);
  const size_t peak = cuda::allocator_stats(0).peak_allocated_bytes - before;
  EXPECT_EQ(shape_str(grads.dq.shape()), shape_str(q.shape()));
  EXPECT_LT(peak, size_t{8} << 20) << "peak " << peak << " bytes above the inputs";
}

// The tensor-core kernels' tile buffering, for the dtypes they take.
class CudaAttentionTilesTest : public CudaAttentionTest {};

TEST_P(CudaAttentionTilesTest, SingleBufferedWhereABlockHasLessSharedMemory) {
  const DType dtype = GetParam();
  using cuda::kernels::tensor_core_attention_plan;
  // A tile is 64 rows of D + 8 (padding) elements of 2 bytes; the dk/dv kernel adds 64 lse and 64
  // delta floats.
  const auto tiles = [](int n, int64_t d) { return static_cast<size_t>(n * 64 * (d + 8) * 2); };
  {
    // sm_86 and sm_89 let a block use 99 KiB: at D = 128 the forward's double-buffered tiles
    // (5 tiles, 85 KiB) fit, the backward's (6 tiles, 102 KiB) do not, its single-buffered ones
    // (4 tiles) do.
    const SharedMemoryCap cap(99 << 10);
    const auto plan = tensor_core_attention_plan(dtype, 128, 0);
    EXPECT_EQ(plan.shared_memory_per_block, size_t{99} << 10);
    EXPECT_EQ(plan.forward.tile_buffers, 2);
    EXPECT_EQ(plan.forward.shared_bytes, tiles(5, 128));
    EXPECT_EQ(plan.dq.tile_buffers, 1);
    EXPECT_EQ(plan.dq.shared_bytes, tiles(4, 128));
    EXPECT_EQ(plan.dkdv.tile_buffers, 1);
    EXPECT_EQ(plan.dkdv.shared_bytes, tiles(4, 128) + 2 * 64 * sizeof(float));
    compare_case({{2, 1}, 130, 130, 128, 128}, 300);
  }
  {
    // 40 KiB: every kernel single-buffered at D = 64, the forward too (3 tiles).
    const SharedMemoryCap cap(40 << 10);
    const auto plan = tensor_core_attention_plan(dtype, 64, 0);
    EXPECT_EQ(plan.forward.tile_buffers, 1);
    EXPECT_EQ(plan.forward.shared_bytes, tiles(3, 64));
    EXPECT_EQ(plan.dq.tile_buffers, 1);
    EXPECT_EQ(plan.dkdv.tile_buffers, 1);
    compare_case({{2, 1}, 37, 130, 64, 64}, 310);
    compare_case({{1, 2}, 70, 200, 64, 64}, 320, /*offset=*/130);  // key tiles begin mid-way
  }
  {
    // 16 KiB holds not even one buffer at D = 64: the call fails, naming the sizes and the way
    // out.
    const SharedMemoryCap cap(16 << 10);
    EXPECT_EQ(tensor_core_attention_plan(dtype, 64, 0).forward.tile_buffers, 0);
    const Tensor q = gpu(random_tensor({1, 1, 70, 64}, 330, dtype));
    const std::string message =
        error_of([&] { (void)ops::scaled_dot_product_attention(q, q, q, true); });
    EXPECT_THAT(message, ::testing::HasSubstr(fmt::format(
                             "the forward kernel at head dim 64 needs {} bytes of shared memory "
                             "per block with single-buffered tiles ({} double-buffered), but a "
                             "block of device 0 may use 16384",
                             tiles(3, 64), tiles(5, 64))));
    EXPECT_THAT(message, ::testing::HasSubstr("set_tensor_core_attention(false)"));
  }
  // Uncapped (an sm_90 allows 227 KiB): double-buffered at every head dim.
  EXPECT_EQ(tensor_core_attention_plan(dtype, 128, 0).dkdv.tile_buffers, 2);
}

// Which calls the tensor-core kernels take (host logic: runs without a GPU, in a CUDA build).
TEST(TensorCoreAttention, TakesBf16AndF16AtHeadDims16To128WithAlignedTensors) {
  if (!cuda::kernels_built()) GTEST_SKIP() << "a CPU-only build has no CUDA kernels";
  alignas(16) static char buffer[64];
  const void* aligned = buffer;
  const void* misaligned = buffer + 2;
  const auto shape = [](int64_t d, int64_t dv) {
    return cuda::kernels::FlashAttentionShape{.rows = 2, .tq = 100, .tk = 100, .d = d, .dv = dv};
  };
  using cuda::kernels::tensor_core_attention_takes;
  for (int64_t d : {16, 32, 64, 128}) {
    EXPECT_TRUE(tensor_core_attention_takes(kBFloat16, shape(d, d), {aligned, aligned})) << d;
    EXPECT_TRUE(tensor_core_attention_takes(kFloat16, shape(d, d), {aligned, nullptr})) << d;
  }
  EXPECT_FALSE(tensor_core_attention_takes(kFloat32, shape(64, 64), {aligned}));
  EXPECT_FALSE(tensor_core_attention_takes(kBFloat16, shape(80, 80), {aligned}));
  EXPECT_FALSE(tensor_core_attention_takes(kBFloat16, shape(64, 32), {aligned}));
  EXPECT_FALSE(tensor_core_attention_takes(kBFloat16, shape(64, 64), {aligned, misaligned}));
  {
    const TensorCoreAttention off(false);
    EXPECT_FALSE(tensor_core_attention_takes(kBFloat16, shape(64, 64), {aligned}));
  }
  EXPECT_TRUE(tensor_core_attention_takes(kBFloat16, shape(64, 64), {aligned}));
}

INSTANTIATE_TEST_SUITE_P(DTypes, CudaAttentionTest, ::testing::ValuesIn(kKernelDTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });
INSTANTIATE_TEST_SUITE_P(TensorCoreDTypes, CudaAttentionTilesTest, ::testing::Values(kBFloat16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace loom
