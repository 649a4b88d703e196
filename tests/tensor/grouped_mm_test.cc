// The grouped GEMM (tensor/ops_grouped_mm.h, autograd/grouped_mm.h) against one matmul per group
// on the same rows: products, the weights' gradient, empty groups, bf16, gradcheck, the offsets'
// errors; on CUDA (skipped without a GPU) against the CPU.
#include "autograd/grouped_mm.h"

#include <gtest/gtest.h>

#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "base/error.h"
#include "tensor/ops.h"
#include "tensor/rng.h"
#include "tests/tensor/cuda_skip.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

// Uneven groups, two of them empty (the first and one in the middle).
const std::vector<int64_t> kOffsets = {0, 0, 5, 6, 6, 13};
constexpr int64_t kGroups = 5, kRows = 13, kIn = 7, kOut = 9;

// One matmul per group, concatenated: what the grouped call must equal.
Tensor per_group(const Tensor& x, const Tensor& w, bool transpose_b) {
  std::vector<Tensor> parts;
  for (int64_t g = 0; g < kGroups; ++g) {
    const int64_t n = kOffsets[g + 1] - kOffsets[g];
    if (n == 0) continue;
    const Tensor wg = ops::squeeze(ops::narrow(w, 0, g, 1), 0);
    parts.push_back(ops::matmul(ops::narrow(x, 0, kOffsets[g], n),
                                transpose_b ? ops::transpose(wg, 0, 1) : wg));
  }
  return ops::cat(parts, 0);
}

TEST(GroupedMmTest, EachGroupTimesItsOwnMatrix) {
  const Tensor x = ops::normal({kRows, kIn}, 1), w = ops::normal({kGroups, kOut, kIn}, 2);
  const testing::Tolerance tol{.rtol = 1e-6, .atol = 1e-6};
  testing::expect_close({.actual = ops::grouped_mm(x, w, kOffsets, true),
                         .expected = per_group(x, w, true),
                         .tol = tol,
                         .what = "x @ w[g]^T"});
  const Tensor dy = ops::normal({kRows, kOut}, 3);
  testing::expect_close({.actual = ops::grouped_mm(dy, w, kOffsets, false),
                         .expected = per_group(dy, w, false),
                         .tol = tol,
                         .what = "dy @ w[g]"});
  // dw[g] = dy[g]^T @ x[g]; the empty groups' are zeros.
  const Tensor dw = ops::grouped_mm_weight_grad(dy, x, kOffsets);
  for (int64_t g = 0; g < kGroups; ++g) {
    const int64_t n = kOffsets[g + 1] - kOffsets[g];
    const Tensor want = n == 0
                            ? ops::zeros({kOut, kIn})
                            : ops::matmul(ops::transpose(ops::narrow(dy, 0, kOffsets[g], n), 0, 1),
                                          ops::narrow(x, 0, kOffsets[g], n));
    testing::expect_close({.actual = ops::squeeze(ops::narrow(dw, 0, g, 1), 0),
                           .expected = want,
                           .tol = tol,
                           .what = "dw of group " + std::to_string(g)});
  }
}

TEST(GroupedMmTest, Bf16ComputesInF32AndReturnsBf16) {
  const Tensor x = ops::to(ops::normal({kRows, kIn}, 1), kBFloat16);
  const Tensor w = ops::to(ops::normal({kGroups, kOut, kIn}, 2), kBFloat16);
  const Tensor y = ops::grouped_mm(x, w, kOffsets, true);
  EXPECT_EQ(y.dtype(), kBFloat16);
  testing::expect_close(
      {.actual = y,
       .expected = ops::to(per_group(ops::to(x, kFloat32), ops::to(w, kFloat32), true), kBFloat16),
       .tol = {.rtol = 1e-2, .atol = 1e-2},
       .what = "bf16 (one bf16 rounding of the f32 product)"});
}

TEST(GroupedMmTest, GradientsMatchCentralDifferences) {
  Tensor x = ops::normal({kRows, kIn}, 4), w = ops::normal({kGroups, kOut, kIn}, 5);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  const auto result = autograd::gradcheck(
      [](const std::vector<Tensor>& in) { return grouped_mm(in[0], in[1], kOffsets); }, {x, w});
  EXPECT_TRUE(result.ok) << result.message;
}

TEST(GroupedMmTest, BadOffsetsAreNamed) {
  const Tensor x = ops::normal({kRows, kIn}, 1), w = ops::normal({kGroups, kOut, kIn}, 2);
  const auto message = [&](std::vector<int64_t> offsets) {
    try {
      ops::grouped_mm(x, w, offsets, true);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({0, 5, 13}).find("3 group offsets for 5 groups; expected groups + 1 = 6"),
            std::string::npos);
  EXPECT_NE(message({0, 1, 2, 3, 4, 12}).find("run from 0 to 12; expected 0 to the 13 rows"),
            std::string::npos);
  EXPECT_NE(message({0, 6, 5, 7, 8, 13}).find("decrease at group 1 (6 then 5)"), std::string::npos);
  try {
    ops::grouped_mm(x, ops::normal({kGroups, kOut, kIn + 1}, 2), kOffsets, true);
    ADD_FAILURE() << "a mismatched inner size was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a's rows have 7 elements"), std::string::npos)
        << e.what();
  }
}

class GroupedMmCudaTest : public ::testing::Test {
  void SetUp() override { LOOM_SKIP_WITHOUT_CUDA(); }
};

TEST_F(GroupedMmCudaTest, EqualsTheCpu) {
  const Tensor x = ops::normal({kRows, kIn}, 1), w = ops::normal({kGroups, kOut, kIn}, 2);
  const Tensor dy = ops::normal({kRows, kOut}, 3);
  const Device gpu = Device::cuda(0);
  const testing::Tolerance tol{.rtol = 1e-5, .atol = 1e-5};  // cuBLASLt's f32 (TF32 off)
  for (DType dtype : {kFloat32, kBFloat16}) {
    const auto on_gpu = [&](const Tensor& t) { return ops::to(ops::to(t, dtype), gpu); };
    const auto back = [](const Tensor& t) { return ops::to(ops::to(t, Device::cpu()), kFloat32); };
    const testing::Tolerance t =
        dtype == kFloat32 ? tol : testing::Tolerance{.rtol = 2e-2, .atol = 2e-2};
    testing::expect_close({.actual = back(ops::grouped_mm(on_gpu(x), on_gpu(w), kOffsets, true)),
                           .expected = per_group(x, w, true),
                           .tol = t,
                           .what = "x @ w[g]^T on CUDA"});
    testing::expect_close(
        {.actual = back(ops::grouped_mm_weight_grad(on_gpu(dy), on_gpu(x), kOffsets)),
         .expected = ops::grouped_mm_weight_grad(dy, x, kOffsets),
         .tol = t,
         .what = "dw on CUDA"});
  }
}

}  // namespace
}  // namespace loom
