// CUDA kernels of the core ops against the CPU kernels on random inputs: elementwise (with
// broadcasting and non-contiguous views), copies and casts, reductions and matmul, in f32 and
// bf16 with the tolerances of cuda_test_util.h. Every case skips without a GPU.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tensor/cuda/gemm_cublaslt.h"
#include "tensor/memory_stats.h"
#include "tensor/ops.h"
#include "tests/tensor/cuda_test_util.h"

namespace loom {
namespace {

using namespace ::loom::testing;  // NOLINT(build/namespaces): the comparison helpers

using Binary = std::function<Tensor(const Tensor&, const Tensor&)>;
using Unary = std::function<Tensor(const Tensor&)>;

class CudaElementwiseTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { LOOM_SKIP_WITHOUT_CUDA(); }
};

TEST_P(CudaElementwiseTest, BinaryOpsBroadcastAndTakeViews) {
  const DType dtype = GetParam();
  const std::vector<std::pair<std::string, Binary>> ops_list = {
      {"add", [](auto& a, auto& b) { return ops::add(a, b); }},
      {"sub", [](auto& a, auto& b) { return ops::sub(a, b); }},
      {"mul", [](auto& a, auto& b) { return ops::mul(a, b); }},
      {"div", [](auto& a, auto& b) { return ops::div(a, b); }},
      {"maximum", [](auto& a, auto& b) { return ops::maximum(a, b); }},
      {"eq", [](auto& a, auto& b) { return ops::eq(a, ops::maximum(a, b)); }},
      {"gt", [](auto& a, auto& b) { return ops::gt(a, b); }},
      {"gelu_backward", [](auto& a, auto& b) { return ops::gelu_backward(a, b); }},
      {"silu_backward", [](auto& a, auto& b) { return ops::silu_backward(a, b); }},
      {"silu_mul", [](auto& a, auto& b) { return ops::silu_mul(a, b); }},
      {"silu_mul_backward gate",
       [](auto& a, auto& b) { return ops::silu_mul_backward(a, b, ops::neg(b)).grad_gate; }},
      {"silu_mul_backward up",
       [](auto& a, auto& b) { return ops::silu_mul_backward(b, a, b).grad_up; }},
  };
  // (5, 1, 7) with (3, 7) broadcasts; the transposed (7, 3) view of b is non-contiguous.
  const Tensor a = random_tensor({5, 1, 7}, 1, dtype);
  const Tensor b = ops::transpose(random_tensor({7, 3}, 2, dtype), 0, 1);
  for (const auto& [name, f] : ops_list) {
    const Tensor want = f(a, b);
    expect_close({.actual = f(gpu(a), gpu(b)),
                  .expected = want,
                  .tol = kernel_tolerance(want.dtype()),
                  .what = name + " " + std::string(dtype_name(dtype))});
  }
}

// add_ and mul_ write self directly on a GPU (no temporary copied back): the same values as the
// CPU's, also with a broadcast operand, with self as its own operand, and (through the
// temporary) with a shifted view of self, which one kernel reading and writing would corrupt.
TEST_P(CudaElementwiseTest, InPlaceAddAndScaleMatchTheCpu) {
  const DType dtype = GetParam();
  const auto check = [&](const std::string& what, const std::function<void(const Tensor&)>& f) {
    const Tensor want = ops::clone(random_tensor({6, 33}, 3, dtype));
    const Tensor got = gpu(want);
    f(want);
    f(got);
    expect_close({.actual = got,
                  .expected = want,
                  .tol = kernel_tolerance(dtype),
                  .what = what + " " + std::string(dtype_name(dtype))});
  };
  const Tensor row = random_tensor({33}, 4, dtype);
  check("add_ same shape", [&](const Tensor& x) {
    ops::add_(x, x.device().is_cuda() ? gpu(random_tensor({6, 33}, 5, dtype))
                                      : random_tensor({6, 33}, 5, dtype));
  });
  check("add_ broadcast row",
        [&](const Tensor& x) { ops::add_(x, x.device().is_cuda() ? gpu(row) : row); });
  check("add_ self", [](const Tensor& x) { ops::add_(x, x); });
  check("add_ shifted view of self",
        [](const Tensor& x) { ops::add_(ops::narrow(x, 0, 1, 5), ops::narrow(x, 0, 0, 5)); });
  check("mul_", [](const Tensor& x) { ops::mul_(x, -0.75); });
  // A bf16 gradient accumulated into an f32 .grad: one kernel converting as it adds, the values
  // of converting first bit for bit.
  if (dtype == kFloat32) {
    const Tensor low = ops::to(random_tensor({6, 33}, 6), kBFloat16);
    const Tensor want = ops::add(random_tensor({6, 33}, 7), ops::to(low, kFloat32));
    const Tensor got = gpu(random_tensor({6, 33}, 7));
    ops::add_(got, gpu(low));
    expect_bitwise_equal(
        {.actual = ops::to(got, Device::cpu()), .expected = want, .what = "add_ of bf16 into f32"});
  }
}

TEST(InPlaceOnAGpuTrace, AddAndScaleAllocateNothing) {
  MetaTargetGuard gpu_like(Device::cuda(0));
  const Tensor x = ops::empty({64, 32}, kFloat32, Device::meta());
  const Tensor g = ops::empty({64, 32}, kFloat32, Device::meta());
  MemoryTracker tracker;
  ScopedMemoryTracker scope(tracker);
  ops::add_(x, g);
  ops::mul_(x, 0.5);
  EXPECT_EQ(tracker.stats().allocations, 0);
  // A transposed view of self takes the temporary.
  ops::add_(x, ops::transpose(ops::reshape(x, {32, 64}), 0, 1));
  EXPECT_GT(tracker.stats().allocations, 0);
}

TEST_P(CudaElementwiseTest, UnaryAndScalarOps) {
  const DType dtype = GetParam();
  const std::vector<std::pair<std::string, Unary>> ops_list = {
      {"neg", [](auto& x) { return ops::neg(x); }},
      {"abs", [](auto& x) { return ops::abs(x); }},
      {"exp", [](auto& x) { return ops::exp(x); }},
      {"log", [](auto& x) { return ops::log(ops::abs(x)); }},
      {"tanh", [](auto& x) { return ops::tanh(x); }},
      {"sigmoid", [](auto& x) { return ops::sigmoid(x); }},
      {"silu", [](auto& x) { return ops::silu(x); }},
      {"sqrt", [](auto& x) { return ops::sqrt(ops::abs(x)); }},
      {"rsqrt", [](auto& x) { return ops::rsqrt(ops::add(ops::abs(x), 0.5)); }},
      {"pow3", [](auto& x) { return ops::pow(x, 3.0); }},
      {"pow2", [](auto& x) { return ops::pow(x, 2.0); }},
      {"relu", [](auto& x) { return ops::relu(x); }},
      {"gelu", [](auto& x) { return ops::gelu(x); }},
      {"add_scalar", [](auto& x) { return ops::add(x, 0.25); }},
      {"sub_scalar", [](auto& x) { return ops::sub(x, 1.5); }},
      {"rsub_scalar", [](auto& x) { return ops::rsub(x, 1.5); }},
      {"mul_scalar", [](auto& x) { return ops::mul(x, -3.0); }},
      {"div_scalar", [](auto& x) { return ops::div(x, 7.0); }},
  };
  // Odd sizes and a sliced, transposed view.
  const Tensor base = random_tensor({37, 53}, 3, dtype);
  const Tensor x = ops::transpose(ops::slice(base, 1, 1, 50, 2), 0, 1);
  for (const auto& [name, f] : ops_list) {
    const Tensor want = f(x);
    expect_close({.actual = f(gpu(x)),
                  .expected = want,
                  .tol = kernel_tolerance(want.dtype()),
                  .what = name + " " + std::string(dtype_name(dtype))});
  }
}

TEST_P(CudaElementwiseTest, WhereMaskedFillCopyCastAndCat) {
  const DType dtype = GetParam();
  const Tensor cond = ops::gt(random_tensor({4, 1, 6}, 4), random_tensor({6}, 5));
  const Tensor a = random_tensor({3, 6}, 6, dtype), b = random_tensor({4, 3, 1}, 7, dtype);
  const Tolerance tol = kernel_tolerance(dtype);
  expect_close({.actual = ops::where(gpu(cond), gpu(a), gpu(b)),
                .expected = ops::where(cond, a, b),
                .tol = tol,
                .what = "where"});
  const Tensor mask = ops::gt(random_tensor({3, 1}, 8), ops::zeros({1}));
  expect_close({.actual = ops::masked_fill(gpu(a), gpu(mask), -9.0),
                .expected = ops::masked_fill(a, mask, -9.0),
                .tol = tol,
                .what = "masked_fill"});
  for (DType to : {kFloat32, kBFloat16, kFloat16, kInt32, kInt64}) {
    expect_close({.actual = ops::to(gpu(a), to),
                  .expected = ops::to(a, to),
                  .tol = kernel_tolerance(to),
                  .what = "cast to " + std::string(dtype_name(to))});
  }
  // copy_ into a strided destination, from a broadcast source of another dtype.
  const Tensor dst_cpu = ops::zeros({6, 3}, dtype), dst_gpu = gpu(dst_cpu);
  const Tensor src = random_tensor({6, 1}, 9, kFloat32);
  ops::copy_(ops::transpose(dst_cpu, 0, 1), ops::transpose(src, 0, 1));
  ops::copy_(ops::transpose(dst_gpu, 0, 1), gpu(ops::transpose(src, 0, 1)));
  expect_close({.actual = dst_gpu,
                .expected = dst_cpu,
                .tol = kernel_tolerance(dst_cpu.dtype()),
                .what = "strided copy_"});
  // Across devices into a strided destination: staged through a contiguous copy.
  const Tensor dst2 = gpu(ops::zeros({3, 6}, dtype));
  ops::copy_(ops::transpose(dst2, 0, 1), ops::transpose(a, 0, 1));
  expect_close({.actual = dst2,
                .expected = a,
                .tol = kernel_tolerance(a.dtype()),
                .what = "host-to-device copy_ into a view"});
  const Tensor c1 = random_tensor({2, 6}, 10, dtype);
  expect_close({.actual = ops::cat(std::vector<Tensor>{gpu(a), gpu(c1)}, 0),
                .expected = ops::cat(std::vector<Tensor>{a, c1}, 0),
                .tol = tol,
                .what = "cat"});
  Tensor filled = gpu(ops::zeros({5, 7}, dtype));
  ops::fill_(ops::slice(filled, 1, 0, 7, 3), 2.5);
  Tensor filled_cpu = ops::zeros({5, 7}, dtype);
  ops::fill_(ops::slice(filled_cpu, 1, 0, 7, 3), 2.5);
  expect_close({.actual = filled,
                .expected = filled_cpu,
                .tol = kernel_tolerance(filled_cpu.dtype()),
                .what = "fill_ of a view"});
  expect_close({.actual = ops::full({3, 2}, -1.25, dtype, Device::cuda(0)),
                .expected = ops::full({3, 2}, -1.25, dtype),
                .tol = tol,
                .what = "full"});
}

TEST_P(CudaElementwiseTest, Reductions) {
  const DType dtype = GetParam();
  const Tensor x = random_tensor({7, 129, 5}, 11, dtype);
  const std::vector<std::vector<int64_t>> dim_sets = {{}, {0}, {1}, {2}, {0, 2}, {0, 1}, {-1, 1}};
  for (const auto& dims : dim_sets) {
    for (bool keepdim : {false, true}) {
      const std::string what = fmt::format("dims ({}) keepdim {}", fmt::join(dims, ","), keepdim);
      // Sums of up to ~4500 terms: a few ulp per term of summation-order difference.
      const Tensor sum = ops::sum(x, dims, keepdim), mean = ops::mean(x, dims, keepdim);
      expect_close({.actual = ops::sum(gpu(x), dims, keepdim),
                    .expected = sum,
                    .tol = kernel_tolerance(sum.dtype(), 10.0),
                    .what = "sum " + what});
      expect_close({.actual = ops::mean(gpu(x), dims, keepdim),
                    .expected = mean,
                    .tol = kernel_tolerance(mean.dtype(), 10.0),
                    .what = "mean " + what});
    }
  }
  const Tensor view = ops::transpose(x, 0, 2);
  const Tensor view_sum = ops::sum(view, {1});
  expect_close({.actual = ops::sum(gpu(view), {1}),
                .expected = view_sum,
                .tol = kernel_tolerance(view_sum.dtype(), 10.0),
                .what = "sum of a view"});
  for (int64_t dim : {0, 1, 2}) {
    auto [values, indices] = ops::max(x, dim, dim == 1);
    auto [gv, gi] = ops::max(gpu(x), dim, dim == 1);
    expect_close({.actual = gv,
                  .expected = values,
                  .tol = kernel_tolerance(values.dtype()),
                  .what = "max values"});
    EXPECT_EQ(ops::to_vector(indices), ops::to_vector(gi)) << "max indices over dim " << dim;
  }
  const Tensor ints = ops::to(ops::mul(random_tensor({9, 31}, 12), 100.0), kInt64);
  EXPECT_EQ(ops::to_vector(ops::sum(ints, {1})), ops::to_vector(ops::sum(gpu(ints), {1})));
}

// The k largest per row (a router's choice): the CPU's indices exactly, ties (bf16 values of a
// few levels: many) to the lower index, k from 1 to n, n above a warp's 32 lanes, and a row
// holding a NaN all -1.
TEST_P(CudaElementwiseTest, TopKIndicesAreTheCpus) {
  const DType dtype = GetParam();
  // Values on 16 levels, so most rows hold equal values among their largest.
  const Tensor levels =
      ops::to(ops::to(ops::mul(random_tensor({301, 70}, 17), 16.0), kInt64), dtype);
  for (int64_t k : {int64_t{1}, int64_t{2}, int64_t{8}, int64_t{33}, int64_t{70}}) {
    EXPECT_EQ(ops::to_vector(ops::top_k_indices(gpu(levels), k)),
              ops::to_vector(ops::top_k_indices(levels, k)))
        << "k " << k;
  }
  // Rows of 70: a NaN in lane 8's second share (column 40) empties its row; infinities order as
  // numbers, the last column's +inf first.
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> values(3 * 70, 0.5f);
  values[70 + 40] = std::nanf("");
  values[2 * 70 + 3] = -inf;
  values[2 * 70 + 69] = inf;
  const Tensor odd = ops::from_vector(values, {3, 70}, dtype);
  const std::vector<double> got = ops::to_vector(ops::top_k_indices(gpu(odd), 3));
  EXPECT_EQ(got, ops::to_vector(ops::top_k_indices(odd, 3)));
  EXPECT_EQ(got, (std::vector<double>{0, 1, 2, -1, -1, -1, 69, 0, 1}));
}

// Column sums at a bias gradient's shape (many rows, a column count no tile divides): every row
// group and a partial last tile of columns, against the CPU; integers exactly; twice the same
// bits (no atomics).
TEST_P(CudaElementwiseTest, ColumnSumsOfManyRows) {
  const DType dtype = GetParam();
  const Tensor x = random_tensor({4099, 771}, 13, dtype);
  const Tensor expected = ops::sum(x, {0});
  const Tensor got = ops::sum(gpu(x), {0});
  expect_close({.actual = got,
                .expected = expected,
                .tol = kernel_tolerance(expected.dtype(), 10.0),
                .what = "column sums of 4099 rows"});
  EXPECT_EQ(ops::to_vector(got), ops::to_vector(ops::sum(gpu(x), {0}))) << "deterministic";
  const Tensor ints = ops::to(ops::mul(random_tensor({1025, 67}, 14), 100.0), kInt64);
  EXPECT_EQ(ops::to_vector(ops::sum(ints, {0})), ops::to_vector(ops::sum(gpu(ints), {0})));
}

// Full reductions and a few long rows, which split each row over many blocks: against the CPU,
// the same bits twice, integers exactly.
TEST_P(CudaElementwiseTest, SumsOfFewLongRows) {
  const DType dtype = GetParam();
  const Tensor x = random_tensor({3, 200003}, 15, dtype);
  for (const std::vector<int64_t>& dims : {std::vector<int64_t>{}, std::vector<int64_t>{1}}) {
    const Tensor expected = ops::sum(x, dims);
    const Tensor got = ops::sum(gpu(x), dims);
    expect_close({.actual = got,
                  .expected = expected,
                  .tol = kernel_tolerance(expected.dtype(), 10.0),
                  .what = fmt::format("sum over {} dims of (3, 200003)", dims.size())});
    EXPECT_EQ(ops::to_vector(got), ops::to_vector(ops::sum(gpu(x), dims))) << "deterministic";
  }
  const Tensor ints = ops::to(ops::mul(random_tensor({2, 70001}, 16), 100.0), kInt64);
  EXPECT_EQ(ops::to_vector(ops::sum(ints, {1})), ops::to_vector(ops::sum(gpu(ints), {1})));
  EXPECT_EQ(ops::to_vector(ops::sum(ints)), ops::to_vector(ops::sum(gpu(ints))));
}

TEST_P(CudaElementwiseTest, MatmulShapesTransposesAndBatches) {
  const DType dtype = GetParam();
  const auto check = [&](const Tensor& a, const Tensor& b, const std::string& what) {
    // bf16 products round the output once on both devices (the CPU converts its f32 result).
    const Tensor want = ops::matmul(a, b);
    expect_close({.actual = ops::matmul(gpu(a), gpu(b)),
                  .expected = want,
                  .tol = kernel_tolerance(want.dtype(), 4.0),
                  .what = what});
  };
  check(random_tensor({33, 17}, 20, dtype), random_tensor({17, 29}, 21, dtype), "2-D odd sizes");
  check(random_tensor({33, 17}, 22, dtype),
        ops::transpose(random_tensor({29, 17}, 23, dtype), 0, 1), "B transposed (Linear's weight)");
  check(ops::transpose(random_tensor({17, 33}, 24, dtype), 0, 1),
        random_tensor({17, 29}, 25, dtype), "A transposed");
  check(random_tensor({4, 1, 9, 13}, 26, dtype), random_tensor({3, 13, 7}, 27, dtype),
        "batched with broadcast");
  check(random_tensor({2, 3, 5, 8}, 28, dtype),
        ops::transpose(random_tensor({2, 3, 6, 8}, 29, dtype), -1, -2), "batched, B^T (attention)");
  check(random_tensor({13}, 30, dtype), random_tensor({13, 5}, 31, dtype), "vector @ matrix");
  check(random_tensor({5, 13}, 32, dtype), random_tensor({13}, 33, dtype), "matrix @ vector");
  check(random_tensor({4, 0}, 34, dtype), random_tensor({0, 3}, 35, dtype), "K = 0 gives zeros");
  const size_t plans = cuda::gemm_plan_cache_size(0);
  ops::matmul(gpu(random_tensor({33, 17}, 20, dtype)), gpu(random_tensor({17, 29}, 21, dtype)));
  EXPECT_EQ(cuda::gemm_plan_cache_size(0), plans) << "a repeated shape reuses its cached plan";
}

// Issue 31's odd sizes: GPT-2's classifier at its vocabulary (50257: the logits' rows, and the
// weight's gradient's, are not 16-byte aligned in bf16) and the padded one (50304), one sequence
// of 7 tokens: the logits, the input's gradient (a product over the vocabulary) and the weight's.
// Products over 50257 terms: each element's rounding is relative to the largest ones' sums.
TEST_P(CudaElementwiseTest, ClassifierProductsAtGpt2Vocabularies) {
  const DType dtype = GetParam();
  Tolerance tol = kernel_tolerance(dtype, 4.0);
  tol.relative_to = RelativeTo::kLargest;
  for (const int64_t vocab : {int64_t{50257}, int64_t{50304}}) {
    const std::string what = fmt::format("vocab {} {}", vocab, dtype_name(dtype));
    const Tensor x = random_tensor({1, 7, 64}, 70, dtype);
    const Tensor w = random_tensor({vocab, 64}, 71, dtype);
    expect_close({.actual = ops::linear(gpu(x), gpu(w), Tensor()),
                  .expected = ops::linear(x, w, Tensor()),
                  .tol = tol,
                  .what = what + " logits"});
    const Tensor dlogits = random_tensor({7, vocab}, 72, dtype);
    expect_close({.actual = ops::matmul(gpu(dlogits), gpu(w)),
                  .expected = ops::matmul(dlogits, w),
                  .tol = tol,
                  .what = what + " input gradient"});
    const Tensor rows = ops::reshape(x, {7, 64});
    expect_close({.actual = ops::matmul(ops::transpose(gpu(dlogits), 0, 1), gpu(rows)),
                  .expected = ops::matmul(ops::transpose(dlogits, 0, 1), rows),
                  .tol = tol,
                  .what = what + " weight gradient"});
  }
}

TEST_P(CudaElementwiseTest, LinearWithTheBiasEpilogue) {
  const DType dtype = GetParam();
  const auto check = [&](const Tensor& x, const Tensor& w, const Tensor& b,
                         const std::string& what) {
    const Tensor want = ops::linear(x, w, b);
    expect_close({.actual = ops::linear(gpu(x), gpu(w), b.defined() ? gpu(b) : Tensor()),
                  .expected = want,
                  .tol = kernel_tolerance(want.dtype(), 4.0),
                  .what = what});
  };
  check(random_tensor({33, 17}, 40, dtype), random_tensor({29, 17}, 41, dtype),
        random_tensor({29}, 42, dtype), "2-D, cuBLASLt bias epilogue");
  check(random_tensor({2, 16, 64}, 43, dtype), random_tensor({96, 64}, 44, dtype),
        random_tensor({96}, 45, dtype), "batch dims flattened into rows");
  check(random_tensor({5, 8}, 46, dtype), random_tensor({3, 8}, 47, dtype), Tensor(), "no bias");
  // One output or one input feature: composed (cuBLASLt's heuristic rejects these with a bias).
  check(random_tensor({9, 8}, 51, dtype), random_tensor({1, 8}, 52, dtype),
        random_tensor({1}, 53, dtype), "N = 1");
  check(random_tensor({9, 1}, 54, dtype), random_tensor({6, 1}, 55, dtype),
        random_tensor({6}, 56, dtype), "K = 1");
  // A bias 16-byte aligned but not 256-byte aligned gets its own plan (the heuristic reads the
  // bias pointer's alignment), after the same shape ran with a 256-byte aligned bias.
  const int64_t sixteen_bytes = 16 / static_cast<int64_t>(element_size(dtype));
  const Tensor bias_storage = gpu(random_tensor({29 + sixteen_bytes}, 57, dtype));
  const Tensor shifted_bias = ops::narrow(bias_storage, 0, sixteen_bytes, 29);
  const Tensor x16 = random_tensor({33, 17}, 40, dtype), w16 = random_tensor({29, 17}, 41, dtype);
  const Tensor want16 = ops::linear(x16, w16, ops::to(shifted_bias, Device::cpu()));
  expect_close({.actual = ops::linear(gpu(x16), gpu(w16), shifted_bias),
                .expected = want16,
                .tol = kernel_tolerance(want16.dtype(), 4.0),
                .what = "bias at a 16-byte offset"});
  // A bias at an odd element offset is not 16-byte aligned: the composed path (matmul, add).
  const Tensor storage = gpu(random_tensor({30}, 48, dtype));
  const Tensor odd_bias = ops::narrow(storage, 0, 1, 29);
  const Tensor x = random_tensor({7, 17}, 49, dtype), w = random_tensor({29, 17}, 50, dtype);
  const Tensor want = ops::linear(x, w, ops::to(odd_bias, Device::cpu()));
  expect_close({.actual = ops::linear(gpu(x), gpu(w), odd_bias),
                .expected = want,
                .tol = kernel_tolerance(want.dtype(), 4.0),
                .what = "misaligned bias (composed)"});
}

// The fused AdamW (ops::adamw_update_fused_) on many parameters at once against the CPU's pass:
// 40 parameters take two launches (kAdamWTensorsPerLaunch 32), of sizes from 1 element to
// several blocks' chunks (an empty one too), each with its own step count's bias corrections,
// over three steps with weight decay. f32 throughout: the kernels differ only by contraction
// into FMAs and CUDA's sqrt/div rounding, a few ulp per step.
TEST(CudaAdamWTest, ManyParametersPerLaunchMatchTheCpuPass) {
  LOOM_SKIP_WITHOUT_CUDA();
  const std::vector<int64_t> sizes = {1, 0, 7, 4095, 4096, 4097, 70001, 3 * 4096 + 5};
  struct Slot {
    Tensor p, g, m, v;
  };
  std::vector<Slot> cpu_slots, gpu_slots;
  for (int i = 0; i < 40; ++i) {
    const int64_t n = sizes[i % sizes.size()];
    Slot cpu{random_tensor({n}, 10 + i), random_tensor({n}, 100 + i),
             random_tensor({n}, 200 + i, kFloat32, -0.1f, 0.1f),
             random_tensor({n}, 300 + i, kFloat32, 0.0f, 0.5f)};
    gpu_slots.push_back({gpu(cpu.p), gpu(cpu.g), gpu(cpu.m), gpu(cpu.v)});
    cpu_slots.push_back(std::move(cpu));
  }
  const ops::AdamWHyperparameters h{
      .lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  for (int step = 1; step <= 3; ++step) {
    for (auto* slots : {&cpu_slots, &gpu_slots}) {
      std::vector<ops::AdamWParameter> params;
      for (size_t i = 0; i < slots->size(); ++i) {
        const double t = static_cast<double>(step + static_cast<int>(i % 3));  // own step counts
        const Slot& s = (*slots)[i];
        params.push_back({s.p, s.g, s.m, s.v, 1.0 - std::pow(0.9, t), 1.0 - std::pow(0.95, t)});
      }
      ops::adamw_update_fused_(params, h);
    }
  }
  for (size_t i = 0; i < cpu_slots.size(); ++i) {
    const std::string what = fmt::format("parameter {} of {} elements", i, cpu_slots[i].p.numel());
    expect_close({.actual = gpu_slots[i].p,
                  .expected = cpu_slots[i].p,
                  .tol = kernel_tolerance(kFloat32),
                  .what = what + ": param"});
    expect_close({.actual = gpu_slots[i].m,
                  .expected = cpu_slots[i].m,
                  .tol = kernel_tolerance(kFloat32),
                  .what = what + ": exp_avg"});
    expect_close({.actual = gpu_slots[i].v,
                  .expected = cpu_slots[i].v,
                  .tol = kernel_tolerance(kFloat32),
                  .what = what + ": exp_avg_sq"});
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, CudaElementwiseTest, ::testing::ValuesIn(kKernelDTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace loom
