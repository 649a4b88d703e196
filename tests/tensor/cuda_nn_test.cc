// CUDA kernels of the nn ops against the CPU kernels on random inputs, forward and backward, in
// f32 and bf16 (tolerances in cuda_test_util.h); dropout and the RNG fills must match the CPU's
// bits. Attention has its own file (cuda_attention_test.cc). Every case skips without a GPU.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tensor/ops.h"
#include "tests/tensor/cuda_test_util.h"

namespace loom {
namespace {

using namespace ::loom::testing;  // NOLINT(build/namespaces): the comparison helpers

class CudaNnTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { LOOM_SKIP_WITHOUT_CUDA(); }
  std::string tag(const std::string& what) const {
    return what + " " + std::string(dtype_name(GetParam()));
  }
};

TEST_P(CudaNnTest, SoftmaxAndLogSoftmaxWithBackwardOverAnyDim) {
  const DType dtype = GetParam();
  const Tensor x = random_tensor({3, 67, 5}, 1, dtype, -4.0f, 4.0f);
  const Tensor g = random_tensor({3, 67, 5}, 2, dtype);
  for (int64_t dim : {-1, 1, 0}) {
    const Tensor y = ops::softmax(x, dim), ly = ops::log_softmax(x, dim);
    expect_close({.actual = ops::softmax(gpu(x), dim),
                  .expected = y,
                  .tol = kernel_tolerance(y.dtype()),
                  .what = tag("softmax")});
    expect_close({.actual = ops::log_softmax(gpu(x), dim),
                  .expected = ly,
                  .tol = kernel_tolerance(ly.dtype()),
                  .what = tag("log_softmax")});
    const Tensor dy = ops::softmax_backward(g, y, dim);
    const Tensor dly = ops::log_softmax_backward(g, ly, dim);
    expect_close({.actual = ops::softmax_backward(gpu(g), gpu(y), dim),
                  .expected = dy,
                  .tol = kernel_tolerance(dy.dtype(), 4.0),
                  .what = tag("softmax_backward")});
    expect_close({.actual = ops::log_softmax_backward(gpu(g), gpu(ly), dim),
                  .expected = dly,
                  .tol = kernel_tolerance(dly.dtype(), 4.0),
                  .what = tag("log_softmax_backward")});
  }
}

TEST_P(CudaNnTest, LayerNormWithAndWithoutAffine) {
  const DType dtype = GetParam();
  const Tensor x = ops::transpose(random_tensor({97, 4, 3}, 3, dtype), 0, 2);  // (3, 4, 97) view
  const Tensor w = random_tensor({97}, 4, dtype), b = random_tensor({97}, 5, dtype);
  const Tensor g = random_tensor({3, 4, 97}, 6, dtype);
  for (bool affine : {true, false}) {
    const Tensor wt = affine ? w : Tensor(), bt = affine ? b : Tensor();
    const auto cpu = ops::layer_norm(x, {97}, wt, bt, 1e-5);
    const auto dev =
        ops::layer_norm(gpu(x), {97}, affine ? gpu(w) : Tensor(), affine ? gpu(b) : Tensor(), 1e-5);
    expect_close({.actual = dev.out,
                  .expected = cpu.out,
                  .tol = kernel_tolerance(cpu.out.dtype(), 4.0),
                  .what = tag("layer_norm out")});
    expect_close({.actual = dev.mean,
                  .expected = cpu.mean,
                  .tol = kernel_tolerance(cpu.mean.dtype(), 4.0),
                  .what = tag("layer_norm mean")});
    expect_close({.actual = dev.rstd,
                  .expected = cpu.rstd,
                  .tol = kernel_tolerance(cpu.rstd.dtype(), 4.0),
                  .what = tag("layer_norm rstd")});
    const auto cg = ops::layer_norm_backward(g, x, cpu.mean, cpu.rstd, wt, {97});
    const auto dg = ops::layer_norm_backward(gpu(g), gpu(x), gpu(cpu.mean), gpu(cpu.rstd),
                                             affine ? gpu(w) : Tensor(), {97});
    expect_close({.actual = dg.grad_x,
                  .expected = cg.grad_x,
                  .tol = kernel_tolerance(cg.grad_x.dtype(), 10.0),
                  .what = tag("layer_norm grad_x")});
    ASSERT_EQ(cg.grad_weight.defined(), dg.grad_weight.defined());
    if (affine) {
      expect_close({.actual = dg.grad_weight,
                    .expected = cg.grad_weight,
                    .tol = kernel_tolerance(cg.grad_weight.dtype(), 10.0),
                    .what = tag("layer_norm grad_weight")});
      expect_close({.actual = dg.grad_bias,
                    .expected = cg.grad_bias,
                    .tol = kernel_tolerance(cg.grad_bias.dtype(), 10.0),
                    .what = tag("layer_norm grad_bias")});
    }
  }
}

TEST_P(CudaNnTest, RmsNormWithAndWithoutWeight) {
  const DType dtype = GetParam();
  const Tensor x = ops::transpose(random_tensor({97, 4, 3}, 13, dtype), 0, 2);  // (3, 4, 97) view
  const Tensor w = random_tensor({97}, 14, dtype);
  const Tensor g = random_tensor({3, 4, 97}, 15, dtype);
  for (bool weighted : {true, false}) {
    const Tensor wt = weighted ? w : Tensor();
    const auto cpu = ops::rms_norm(x, wt, 1e-5);
    const auto dev = ops::rms_norm(gpu(x), weighted ? gpu(w) : Tensor(), 1e-5);
    expect_close({.actual = dev.out,
                  .expected = cpu.out,
                  .tol = kernel_tolerance(cpu.out.dtype(), 4.0),
                  .what = tag("rms_norm out")});
    expect_close({.actual = dev.rstd,
                  .expected = cpu.rstd,
                  .tol = kernel_tolerance(cpu.rstd.dtype(), 4.0),
                  .what = tag("rms_norm rstd")});
    const auto cg = ops::rms_norm_backward(g, x, cpu.rstd, wt);
    const auto dg =
        ops::rms_norm_backward(gpu(g), gpu(x), gpu(cpu.rstd), weighted ? gpu(w) : Tensor());
    expect_close({.actual = dg.grad_x,
                  .expected = cg.grad_x,
                  .tol = kernel_tolerance(cg.grad_x.dtype(), 10.0),
                  .what = tag("rms_norm grad_x")});
    ASSERT_EQ(cg.grad_weight.defined(), dg.grad_weight.defined());
    if (weighted) {
      expect_close({.actual = dg.grad_weight,
                    .expected = cg.grad_weight,
                    .tol = kernel_tolerance(cg.grad_weight.dtype(), 10.0),
                    .what = tag("rms_norm grad_weight")});
    }
  }
}

TEST_P(CudaNnTest, RopeAndItsInverse) {
  const DType dtype = GetParam();
  const Tensor x = ops::transpose(random_tensor({2, 6, 5, 3}, 16, dtype), 1, 3);  // (2, 3, 5, 6)
  const Tensor cos = random_tensor({3, 3}, 17, kFloat32), sin = random_tensor({3, 3}, 18, kFloat32);
  for (bool inverse : {false, true}) {
    const Tensor cpu = ops::rope(x, cos, sin, inverse);
    expect_close({.actual = ops::rope(gpu(x), gpu(cos), gpu(sin), inverse),
                  .expected = cpu,
                  .tol = kernel_tolerance(cpu.dtype()),
                  .what = tag(inverse ? "rope inverse" : "rope")});
  }
}

TEST_P(CudaNnTest, EmbeddingAndItsScatterAddBackward) {
  const DType dtype = GetParam();
  const Tensor weight =
      ops::transpose(random_tensor({16, 11}, 7, dtype), 0, 1);  // (11, 16) strided
  const Tensor idx = ops::from_vector_i64({3, 0, 10, 3, 3, 7, 0, 1, 9, 10, 3, 2}, {3, 4});
  const Tensor rows = ops::embedding(weight, idx);
  expect_close({.actual = ops::embedding(gpu(weight), gpu(idx)),
                .expected = rows,
                .tol = kernel_tolerance(rows.dtype()),
                .what = tag("embedding")});
  const Tensor g = random_tensor({3, 4, 16}, 8, dtype);
  const Tensor grad = ops::embedding_backward(g, idx, 11);
  // The GPU adds each row's positions in increasing order in f32 and rounds once, as the CPU:
  // bit for bit the CPU's (no atomics).
  expect_bitwise_equal({.actual = ops::embedding_backward(gpu(g), gpu(idx), 11),
                        .expected = grad,
                        .what = tag("embedding_backward (repeated indices add up)")});
}

// Many positions on few rows (one row named 1500 times), rows no index names, a count that is not
// a power of two (the sort pads it): the CPU's sums bit for bit, the same on every run, and the
// gradient in grad_out's dtype.
TEST_P(CudaNnTest, EmbeddingBackwardIsTheCpusSumsBitForBit) {
  const DType dtype = GetParam();
  std::vector<int64_t> rows(3001);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = i % 2 == 0 ? 5 : static_cast<int64_t>(i % 37);
  const Tensor idx = ops::from_vector_i64(rows, {3001});
  const Tensor g = random_tensor({3001, 24}, 9, dtype);
  const Tensor want = ops::embedding_backward(g, idx, 40);
  const Tensor first = ops::embedding_backward(gpu(g), gpu(idx), 40);
  EXPECT_EQ(first.dtype(), dtype);
  expect_bitwise_equal({.actual = first, .expected = want, .what = tag("3001 positions")});
  expect_bitwise_equal({.actual = ops::embedding_backward(gpu(g), gpu(idx), 40),
                        .expected = first,
                        .what = tag("a second run")});
}

TEST_P(CudaNnTest, CrossEntropyEveryReductionWithIgnoredRows) {
  const DType dtype = GetParam();
  const Tensor logits = random_tensor({9, 257}, 10, dtype, -5.0f, 5.0f);
  const Tensor targets = ops::from_vector_i64({0, 256, -100, 17, 3, -100, 128, 255, 1}, {9});
  for (Reduction r : {Reduction::kNone, Reduction::kMean, Reduction::kSum}) {
    const auto cpu = ops::cross_entropy(logits, targets, -100, r);
    const auto dev = ops::cross_entropy(gpu(logits), gpu(targets), -100, r);
    const std::string what = tag("cross_entropy reduction " + std::to_string(static_cast<int>(r)));
    expect_close({.actual = dev.loss,
                  .expected = cpu.loss,
                  .tol = kernel_tolerance(cpu.loss.dtype(), 4.0),
                  .what = what});
    expect_close({.actual = dev.logsumexp,
                  .expected = cpu.logsumexp,
                  .tol = kernel_tolerance(cpu.logsumexp.dtype(), 4.0),
                  .what = what + " logsumexp"});
    const Tensor grad_loss =
        r == Reduction::kNone ? random_tensor({9}, 11, dtype) : ops::scalar_tensor(0.7, dtype);
    const Tensor grad =
        ops::cross_entropy_backward(grad_loss, logits, targets, -100, r, cpu.logsumexp);
    expect_close({.actual = ops::cross_entropy_backward(gpu(grad_loss), gpu(logits), gpu(targets),
                                                        -100, r, dev.logsumexp),
                  .expected = grad,
                  .tol = kernel_tolerance(grad.dtype(), 4.0),
                  .what = what + " backward"});
    // Over the logits (the caller lets them go): the same gradient, in the logits' memory.
    const Tensor spent = gpu(logits);
    const Tensor over = ops::cross_entropy_backward(gpu(grad_loss), spent, gpu(targets), -100, r,
                                                    dev.logsumexp, {}, /*over_logits=*/true);
    EXPECT_EQ(over.raw_data(), spent.raw_data()) << what << " backward over the logits";
    expect_close({.actual = over,
                  .expected = grad,
                  .tol = kernel_tolerance(grad.dtype(), 4.0),
                  .what = what + " backward over the logits"});
    const Tensor recomputed = ops::cross_entropy_backward(grad_loss, logits, targets, -100, r);
    expect_close(
        {.actual = ops::cross_entropy_backward(gpu(grad_loss), gpu(logits), gpu(targets), -100, r),
         .expected = recomputed,
         .tol = kernel_tolerance(recomputed.dtype(), 4.0),
         .what = what + " backward, logsumexp recomputed"});
  }
  // A slice of the classes (loss parallel) against the CPU's slice: forward and backward.
  const Tensor lse = ops::cross_entropy(logits, targets).logsumexp;
  const Tensor slice = ops::contiguous(ops::narrow(logits, 1, 100, 57));
  const auto part =
      ops::cross_entropy(slice, targets, -100, Reduction::kNone, {.offset = 100, .classes = 257});
  const auto part_dev = ops::cross_entropy(gpu(slice), gpu(targets), -100, Reduction::kNone,
                                           {.offset = 100, .classes = 257});
  expect_close({.actual = part_dev.loss,
                .expected = part.loss,
                .tol = kernel_tolerance(kFloat32, 4.0),
                .what = tag("cross_entropy's part of classes [100, 157) of 257")});
  expect_close({.actual = part_dev.logsumexp,
                .expected = part.logsumexp,
                .tol = kernel_tolerance(kFloat32, 4.0),
                .what = tag("cross_entropy's logsumexp of classes [100, 157)")});
  // A slice whose classes are all masked: logsumexp -inf (not NaN), as on the CPU.
  const Tensor masked = ops::full({9, 3}, -std::numeric_limits<double>::infinity(), dtype);
  for (double l : ops::to_vector(ops::cross_entropy(gpu(masked), gpu(targets), -100,
                                                    Reduction::kNone, {.offset = 0, .classes = 257})
                                     .logsumexp)) {
    EXPECT_EQ(l, -std::numeric_limits<double>::infinity()) << tag("a masked slice");
  }
  const Tensor want =
      ops::cross_entropy_backward(ops::scalar_tensor(0.7), slice, targets, -100, Reduction::kMean,
                                  lse, {.offset = 100, .classes = 257});
  expect_close({.actual = ops::cross_entropy_backward(ops::scalar_tensor(0.7), gpu(slice),
                                                      gpu(targets), -100, Reduction::kMean,
                                                      gpu(lse), {.offset = 100, .classes = 257}),
                .expected = want,
                .tol = kernel_tolerance(want.dtype(), 4.0),
                .what = tag("cross_entropy_backward of classes [100, 157) of 257")});
  const Tensor all_ignored = ops::full({9}, -100.0, kInt64);
  EXPECT_TRUE(std::isnan(ops::to_vector(ops::cross_entropy(gpu(logits), gpu(all_ignored)).loss)[0]))
      << "a mean over no rows is NaN, as on the CPU";
}

// Issue 31's odd sizes: GPT-2's vocabulary (50257: a bf16 row of logits is not 16-byte aligned)
// and the padded one (50304), one sequence of 5 tokens; targets and indices at both ends of the
// table, repeated, and (cross entropy) ignored.
TEST_P(CudaNnTest, CrossEntropyAndEmbeddingAtGpt2Vocabularies) {
  const DType dtype = GetParam();
  for (const int64_t vocab : {int64_t{50257}, int64_t{50304}}) {
    const std::string what = tag(fmt::format("vocab {}", vocab));
    const Tensor logits = random_tensor({5, vocab}, 61, dtype, -5.0f, 5.0f);
    const Tensor targets = ops::from_vector_i64({0, vocab - 1, -100, 12345, vocab - 1}, {5});
    const auto cpu = ops::cross_entropy(logits, targets, -100, Reduction::kMean);
    const auto dev = ops::cross_entropy(gpu(logits), gpu(targets), -100, Reduction::kMean);
    expect_close({.actual = dev.loss,
                  .expected = cpu.loss,
                  .tol = kernel_tolerance(cpu.loss.dtype(), 4.0),
                  .what = what + " cross_entropy"});
    const Tensor grad_loss = ops::scalar_tensor(0.7, dtype);
    const Tensor grad =
        ops::cross_entropy_backward(grad_loss, logits, targets, -100, Reduction::kMean);
    expect_close({.actual = ops::cross_entropy_backward(gpu(grad_loss), gpu(logits), gpu(targets),
                                                        -100, Reduction::kMean, dev.logsumexp),
                  .expected = grad,
                  .tol = kernel_tolerance(grad.dtype(), 4.0),
                  .what = what + " cross_entropy backward"});

    const Tensor weight = random_tensor({vocab, 24}, 62, dtype);
    const Tensor idx = ops::from_vector_i64({vocab - 1, 0, 50256, vocab - 1, 7}, {1, 5});
    expect_close({.actual = ops::embedding(gpu(weight), gpu(idx)),
                  .expected = ops::embedding(weight, idx),
                  .tol = kernel_tolerance(dtype),
                  .what = what + " embedding"});
    const Tensor g = random_tensor({1, 5, 24}, 63, dtype);
    const Tensor table_grad = ops::embedding_backward(g, idx, vocab);
    expect_close({.actual = ops::embedding_backward(gpu(g), gpu(idx), vocab),
                  .expected = table_grad,
                  .tol = kernel_tolerance(table_grad.dtype(), 4.0),
                  .what = what + " embedding_backward"});
  }
}

TEST_P(CudaNnTest, DropoutMaskIsBitIdenticalToTheCpuMask) {
  const DType dtype = GetParam();
  const Tensor x = random_tensor({7, 33, 5}, 12, dtype);
  const auto cpu = ops::dropout(x, 0.3, 1234);
  const auto dev = ops::dropout(gpu(x), 0.3, 1234);
  EXPECT_EQ(ops::to_vector(cpu.mask), ops::to_vector(dev.mask));
  expect_close({.actual = dev.out,
                .expected = cpu.out,
                .tol = kernel_tolerance(cpu.out.dtype()),
                .what = tag("dropout out")});
  const Tensor g = random_tensor({7, 33, 5}, 13, dtype);
  const Tensor grad = ops::dropout_backward(g, cpu.mask, 0.3);
  expect_close({.actual = ops::dropout_backward(gpu(g), dev.mask, 0.3),
                .expected = grad,
                .tol = kernel_tolerance(grad.dtype()),
                .what = tag("dropout_backward")});
  // A shard draws its slice of the whole tensor's mask (sequence-parallel dropout).
  const RngRegion region{{7, 66, 5}, {0, 33, 0}};
  EXPECT_EQ(ops::to_vector(ops::bernoulli_keep_mask({7, 33, 5}, 99, 0.5, region)),
            ops::to_vector(ops::bernoulli_keep_mask({7, 33, 5}, 99, 0.5, region, Device::cuda(0))));
}

TEST_P(CudaNnTest, RandomFillsMatchTheCpu) {
  const DType dtype = GetParam();
  Tensor cpu_u = ops::empty({1001}, dtype), dev_u = ops::empty({1001}, dtype, Device::cuda(0));
  ops::uniform_(cpu_u, 5, -0.5, 0.5);
  ops::uniform_(dev_u, 5, -0.5, 0.5);
  EXPECT_EQ(ops::to_vector(cpu_u), ops::to_vector(dev_u)) << "uniform_ is bit-identical";
  Tensor cpu_n = ops::empty({1001}, dtype), dev_n = ops::empty({1001}, dtype, Device::cuda(0));
  ops::normal_(cpu_n, 6, 0.0, 0.02);
  ops::normal_(dev_n, 6, 0.0, 0.02);
  expect_close({.actual = dev_n,
                .expected = cpu_n,
                .tol = kernel_tolerance(cpu_n.dtype()),
                .what = tag("normal_ (libm vs libdevice: an ulp)")});
}

// A bf16 input with f32 weights (dtypes the own-dtype kernels do not take together) computes on
// f32 copies, as before; GPT-2's width and a thousand rows, so several blocks share the rows.
TEST(CudaNnMixedDtypes, NormsOfBf16InputsWithF32Weights) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Tensor x = random_tensor({1000, 768}, 21, kBFloat16);
  const Tensor w = random_tensor({768}, 22, kFloat32), b = random_tensor({768}, 23, kFloat32);
  const auto cpu = ops::layer_norm(x, {768}, w, b, 1e-5);
  const auto dev = ops::layer_norm(gpu(x), {768}, gpu(w), gpu(b), 1e-5);
  expect_close({.actual = dev.out,
                .expected = cpu.out,
                .tol = kernel_tolerance(kBFloat16, 4.0),
                .what = "layer_norm bf16 x, f32 weights"});
  const auto rms_cpu = ops::rms_norm(x, w, 1e-5);
  const auto rms_dev = ops::rms_norm(gpu(x), gpu(w), 1e-5);
  expect_close({.actual = rms_dev.out,
                .expected = rms_cpu.out,
                .tol = kernel_tolerance(kBFloat16, 4.0),
                .what = "rms_norm bf16 x, f32 weight"});
}

INSTANTIATE_TEST_SUITE_P(DTypes, CudaNnTest, ::testing::ValuesIn(kKernelDTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace loom
