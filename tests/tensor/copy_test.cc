// Copies, conversions and factories (tensor/ops_copy.h, tensor/ops_create.h).
// Values are small integers or dyadic fractions, exact in every dtype used, so comparisons are
// exact unless a comment says otherwise.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "tensor/half.h"
#include "tensor/ops.h"
#include "tensor/ops_copy.h"
#include "tests/tensor/tensor_test_util.h"

namespace loom::ops {
namespace {

using testing::error_of;
using testing::iota;
using testing::kAllDTypes;
using testing::Values;

TEST(ContiguousTest, ReturnsSelfWhenAlreadyContiguous) {
  Tensor x = iota({2, 3});
  EXPECT_TRUE(contiguous(x).is_same(x));
  // A narrowed-rows view is contiguous too (just offset).
  Tensor rows = narrow(x, 0, 1, 1);
  EXPECT_TRUE(contiguous(rows).is_same(rows));
}

TEST(ContiguousTest, CopiesNonContiguousViews) {
  Tensor x = iota({2, 3});
  Tensor t = transpose(x, 0, 1);
  Tensor c = contiguous(t);
  EXPECT_NE(c.storage(), x.storage());
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.shape(), (Shape{3, 2}));
  EXPECT_EQ(c.strides(), (Strides{2, 1}));
  EXPECT_EQ(to_vector(c), (Values{0, 3, 1, 4, 2, 5}));
  // Broadcast and stepped views, for every dtype.
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    Tensor e = contiguous(expand(iota({3, 1}, dtype), {3, 2}));
    EXPECT_EQ(e.dtype(), dtype);
    EXPECT_EQ(to_vector(e), (Values{0, 0, 1, 1, 2, 2}));
    Tensor s = contiguous(slice(iota({2, 6}, dtype), 1, 1, 6, 2));
    EXPECT_EQ(to_vector(s), (Values{1, 3, 5, 7, 9, 11}));
    Tensor p = contiguous(permute(iota({2, 2, 2}, dtype), {2, 0, 1}));
    EXPECT_EQ(to_vector(p), (Values{0, 2, 4, 6, 1, 3, 5, 7}));
  }
}

TEST(RepeatInterleaveTest, RepeatsEachIndexInARowAsTorchDoes) {
  const Tensor x = iota({2, 3});  // [[0 1 2] [3 4 5]]
  EXPECT_EQ(to_vector(repeat_interleave(x, 2, 0)), (Values{0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5}));
  const Tensor cols = repeat_interleave(x, 2, -1);
  EXPECT_EQ(cols.shape(), (Shape{2, 6}));
  EXPECT_EQ(to_vector(cols), (Values{0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5}));
  EXPECT_TRUE(repeat_interleave(x, 1, 0).is_same(x));
  EXPECT_EQ(error_of([&] { repeat_interleave(x, 0, 0); }),
            "repeat_interleave: repeats must be >= 1, got 0");
  EXPECT_EQ(error_of([&] { repeat_interleave(x, 2, 2); }),
            "repeat_interleave: dim 2 is out of range for a tensor of shape (2, 3)");
}

TEST(CloneTest, SharesNothing) {
  Tensor x = iota({2, 2});
  Tensor c = clone(x);
  EXPECT_FALSE(c.is_same(x));
  EXPECT_NE(c.storage(), x.storage());
  EXPECT_EQ(to_vector(c), to_vector(x));
  c.data<float>()[0] = 9.0f;
  EXPECT_EQ(to_vector(x)[0], 0.0);
  // Clone of a view is a compact contiguous copy of just the view.
  Tensor v = slice(iota({10}), 0, 2, 9, 3);  // 2, 5, 8
  Tensor cv = clone(v);
  EXPECT_TRUE(cv.is_contiguous());
  EXPECT_EQ(cv.offset(), 0);
  EXPECT_EQ(cv.storage()->bytes(), 3 * sizeof(float));
  EXPECT_EQ(to_vector(cv), (Values{2, 5, 8}));
  // i64 beyond 2^53 survives a clone bit for bit.
  Tensor big =
      from_vector_i64(std::vector<int64_t>{(int64_t{1} << 62) + 1, -(int64_t{1} << 53) - 1}, {2});
  Tensor bc = clone(transpose(unsqueeze(big, 0), 0, 1));
  EXPECT_EQ(bc.data<int64_t>()[0], (int64_t{1} << 62) + 1);
  EXPECT_EQ(bc.data<int64_t>()[1], -(int64_t{1} << 53) - 1);
}

TEST(ToDTypeTest, RoundTripsBetweenAllDTypes) {
  // -8..8: exact in every dtype.
  std::vector<float> values;
  for (int i = -8; i <= 8; ++i) values.push_back(static_cast<float>(i));
  for (DType from : kAllDTypes) {
    const Tensor x = from_vector(values, {17}, from);
    EXPECT_TRUE(to(x, from).is_same(x));
    for (DType dest : kAllDTypes) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + std::string(dtype_name(dest)));
      const Tensor y = to(x, dest);
      EXPECT_EQ(y.dtype(), dest);
      EXPECT_EQ(y.shape(), x.shape());
      EXPECT_EQ(to_vector(y), to_vector(x));
      const Tensor back = to(y, from);
      EXPECT_EQ(back.dtype(), from);
      EXPECT_EQ(to_vector(back), to_vector(x));
    }
  }
}

TEST(ToDTypeTest, RoundingAndTruncation) {
  const Tensor x = from_vector({1.0f / 3.0f, -2.75f, 2.75f, 65519.0f, 1e5f}, {5});
  // f32 -> bf16 / f16 round to nearest even (bit patterns from tests/tensor/half_test.cc).
  const Tensor b = to(x, kBFloat16);
  EXPECT_EQ(to_vector(b)[0], static_cast<double>(bits_float(0x3eab0000u)));
  EXPECT_EQ(to_vector(b)[1], -2.75);
  const Tensor h = to(x, kFloat16);
  EXPECT_EQ(to_vector(h)[0], 0.333251953125);
  EXPECT_EQ(to_vector(h)[3], 65504.0);
  EXPECT_EQ(to_vector(h)[4], std::numeric_limits<double>::infinity());
  // Floating -> integer truncates toward zero (as a C cast and torch's .to(int) do).
  EXPECT_EQ(to_vector(to(narrow(x, 0, 0, 3), kInt32)), (Values{0, -2, 2}));
  EXPECT_EQ(to_vector(to(narrow(x, 0, 0, 3), kInt64)), (Values{0, -2, 2}));
  // bf16 -> f16 goes through the float value: 1/3 in bf16 is 0.333984375, which f16 holds as
  // 0x3558 = 0.333984375 exactly.
  EXPECT_EQ(to_vector(to(narrow(b, 0, 0, 1), kFloat16))[0], 0.333984375);
  // Non-contiguous input: the result is contiguous with the source's logical order.
  const Tensor t = to(transpose(iota({2, 3}, kInt32), 0, 1), kFloat32);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(to_vector(t), (Values{0, 3, 1, 4, 2, 5}));
}

TEST(ToDeviceTest, SameDeviceIsANoOp) {
  Tensor x = iota({2});
  EXPECT_TRUE(to(x, Device::cpu()).is_same(x));
}

TEST(CopyTest, BroadcastsTheSource) {
  Tensor dst = zeros({2, 3});
  copy_(dst, from_vector({1.f, 2.f, 3.f}, {3}));
  EXPECT_EQ(to_vector(dst), (Values{1, 2, 3, 1, 2, 3}));
  copy_(dst, from_vector({7.f, 8.f}, {2, 1}));
  EXPECT_EQ(to_vector(dst), (Values{7, 7, 7, 8, 8, 8}));
  copy_(dst, scalar_tensor(-1.5));
  EXPECT_EQ(to_vector(dst), (Values{-1.5, -1.5, -1.5, -1.5, -1.5, -1.5}));
  copy_(dst, from_vector({4.f}, {1, 1}));
  EXPECT_EQ(to_vector(dst), (Values{4, 4, 4, 4, 4, 4}));
  EXPECT_EQ(error_of([&] { copy_(dst, zeros({4})); }),
            "expand: shape (4,) cannot be expanded to (2, 3) (size 4 at dim 0 is not 1)");
  EXPECT_EQ(error_of([&] {
              copy_(dst, zeros({3, 2, 3}));
            }),
            "expand: cannot expand shape (3, 2, 3) to fewer dims (2, 3)");
}

TEST(CopyTest, ConvertsDTypes) {
  Tensor dst = zeros({4}, kBFloat16);
  copy_(dst, from_vector_i64(std::vector<int64_t>{1, -2, 300, 257}, {4}));
  // 257 is not a bf16 value: 256 and 258 are its neighbours; the tie goes to even 256.
  EXPECT_EQ(to_vector(dst), (Values{1, -2, 300, 256}));
  Tensor idst = zeros({2, 2}, kInt64);
  copy_(idst, from_vector({1.5f, -1.5f}, {2}));
  EXPECT_EQ(to_vector(idst), (Values{1, -1, 1, -1}));
  Tensor hdst = zeros({3}, kFloat16);
  copy_(hdst, from_vector({0.1f, 1e-8f, 7e4f}, {3}));
  EXPECT_EQ(to_vector(hdst)[0], static_cast<double>(f16_to_float(0x2e66)));
  EXPECT_EQ(to_vector(hdst)[1], 0.0);
  EXPECT_EQ(to_vector(hdst)[2], std::numeric_limits<double>::infinity());
}

TEST(CopyTest, WritesThroughNonContiguousDestinations) {
  Tensor base = zeros({3, 4});
  // Column 1 and 3 of every row, seen transposed: (2, 3) with strides (2, 4).
  Tensor dst = transpose(slice(base, 1, 1, 4, 2), 0, 1);
  ASSERT_EQ(dst.shape(), (Shape{2, 3}));
  copy_(dst, iota({2, 3}, kInt32));
  EXPECT_EQ(to_vector(base), (Values{0, 0, 0, 3,  //
                                     0, 1, 0, 4,  //
                                     0, 2, 0, 5}));
  // Non-contiguous source into non-contiguous destination, with broadcasting.
  Tensor base2 = zeros({2, 4});
  copy_(slice(base2, 1, 0, 4, 2), transpose(from_vector({5.f, 6.f}, {1, 2}), 0, 1));
  EXPECT_EQ(to_vector(base2), (Values{5, 0, 5, 0, 6, 0, 6, 0}));
}

// f32 copies between row-major and transposed storage, batched and large enough to split over
// threads (the blocked kernels of tensor/cpu/transpose.h): every element where it belongs.
TEST(CopyTest, TransposedF32CopiesOfAnySize) {
  const int64_t batch = 2, rows = 131, cols = 257;
  const Tensor source = iota({batch, cols, rows});
  const std::vector<double> want = to_vector(source);
  const auto at = [&](int64_t i, int64_t r, int64_t c) { return want[(i * cols + c) * rows + r]; };
  // contiguous() of a transposed view.
  const std::vector<double> got = to_vector(contiguous(transpose(source, 1, 2)));
  for (int64_t i = 0; i < batch; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(got[(i * rows + r) * cols + c], at(i, r, c)) << i << "," << r << "," << c;
      }
    }
  }
  // copy_ into a transposed destination gives back the source's storage.
  const Tensor back = zeros({batch, cols, rows});
  copy_(transpose(back, 1, 2), contiguous(transpose(source, 1, 2)));
  EXPECT_EQ(to_vector(back), want);
}

TEST(CatTest, AlongEachDim) {
  Tensor a = iota({2, 3});
  Tensor b = add(iota({1, 3}), 10.0);
  Tensor c0 = cat(std::vector<Tensor>{a, b}, 0);
  EXPECT_EQ(c0.shape(), (Shape{3, 3}));
  EXPECT_EQ(to_vector(c0), (Values{0, 1, 2, 3, 4, 5, 10, 11, 12}));
  EXPECT_NE(c0.storage(), a.storage());

  Tensor d = add(iota({2, 2}), 20.0);
  Tensor c1 = cat(std::vector<Tensor>{a, d}, -1);
  EXPECT_EQ(c1.shape(), (Shape{2, 5}));
  EXPECT_EQ(to_vector(c1), (Values{0, 1, 2, 20, 21, 3, 4, 5, 22, 23}));

  // Three inputs, one of them empty along the cat dim.
  Tensor c2 = cat(std::vector<Tensor>{a, zeros({0, 3}), b}, 0);
  EXPECT_EQ(to_vector(c2), to_vector(c0));
  // One input: a copy.
  Tensor one = cat(std::vector<Tensor>{a}, 1);
  EXPECT_NE(one.storage(), a.storage());
  EXPECT_EQ(to_vector(one), to_vector(a));
}

TEST(CatTest, NonContiguousInputsAndOtherDTypes) {
  Tensor t = transpose(iota({3, 2}), 0, 1);               // (2, 3): 0 2 4 / 1 3 5
  Tensor s = slice(iota({2, 6}), 1, 0, 6, 2);             // (2, 3): 0 2 4 / 6 8 10
  Tensor e = expand(from_vector({9.f}, {1, 1}), {2, 2});  // stride 0
  Tensor c = cat(std::vector<Tensor>{t, s, e}, 1);
  EXPECT_EQ(c.shape(), (Shape{2, 8}));
  EXPECT_EQ(to_vector(c), (Values{0, 2, 4, 0, 2, 4, 9, 9,  //
                                  1, 3, 5, 6, 8, 10, 9, 9}));
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    Tensor x = transpose(iota({2, 2}, dtype), 0, 1);
    Tensor y = cat(std::vector<Tensor>{x, x}, 0);
    EXPECT_EQ(y.dtype(), dtype);
    EXPECT_EQ(to_vector(y), (Values{0, 2, 1, 3, 0, 2, 1, 3}));
  }
  // 3-D along the middle dim.
  Tensor m = cat(std::vector<Tensor>{iota({2, 1, 2}), add(iota({2, 2, 2}), 100.0)}, 1);
  EXPECT_EQ(to_vector(m), (Values{0, 1, 100, 101, 102, 103, 2, 3, 104, 105, 106, 107}));
}

TEST(CatTest, Errors) {
  Tensor a = zeros({2, 3});
  EXPECT_EQ(error_of([&] {
              cat(std::vector<Tensor>{a, zeros({2, 4})}, 0);
            }),
            "cat: tensor 1 has shape (2, 4) but tensor 0 has shape (2, 3) (they may differ only "
            "in dim 0)");
  EXPECT_EQ(error_of([&] {
              cat(std::vector<Tensor>{a, a, zeros({3, 3})}, 1);
            }),
            "cat: tensor 2 has shape (3, 3) but tensor 0 has shape (2, 3) (they may differ only "
            "in dim 1)");
  EXPECT_EQ(error_of([&] {
              cat(std::vector<Tensor>{a, zeros({2, 3}, kInt64)}, 0);
            }),
            "cat: tensor 1 is Tensor(shape=(2, 3), dtype=i64, device=cpu) but tensor 0 is "
            "Tensor(shape=(2, 3), dtype=f32, device=cpu)");
  EXPECT_EQ(error_of([&] {
              cat(std::vector<Tensor>{a, zeros({6})}, 0);
            }),
            "cat: tensor 1 is Tensor(shape=(6,), dtype=f32, device=cpu) but tensor 0 is "
            "Tensor(shape=(2, 3), dtype=f32, device=cpu)");
  EXPECT_EQ(error_of([&] { cat(std::vector<Tensor>{}, 0); }), "cat: expected at least one tensor");
  EXPECT_EQ(error_of([&] {
              cat(std::vector<Tensor>{a, a}, 2);
            }),
            "cat: dim 2 out of range for a tensor of rank 2 (expected -2..1)");
  // Scalars have no dim to concatenate along (torch: "zero-dimensional tensor ... cannot be
  // concatenated"); this must throw, not index an empty shape.
  EXPECT_EQ(error_of([&] {
              cat(std::vector<Tensor>{scalar_tensor(1), scalar_tensor(2)}, 0);
            }),
            "cat: tensor 0 is a scalar (shape ()) and cannot be concatenated; use stack");
}

TEST(StackTest, AlongANewDim) {
  Tensor a = iota({2, 3});
  Tensor b = add(iota({2, 3}), 10.0);
  Tensor s0 = stack(std::vector<Tensor>{a, b}, 0);
  EXPECT_EQ(s0.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(to_vector(s0), (Values{0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15}));
  Tensor s1 = stack(std::vector<Tensor>{a, b}, 1);
  EXPECT_EQ(s1.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(to_vector(s1), (Values{0, 1, 2, 10, 11, 12, 3, 4, 5, 13, 14, 15}));
  Tensor s2 = stack(std::vector<Tensor>{a, b}, -1);
  EXPECT_EQ(s2.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(to_vector(s2), (Values{0, 10, 1, 11, 2, 12, 3, 13, 4, 14, 5, 15}));
  // Non-contiguous inputs, and scalars.
  Tensor t = stack(std::vector<Tensor>{transpose(a, 0, 1), transpose(b, 0, 1)}, 0);
  EXPECT_EQ(to_vector(t), (Values{0, 3, 1, 4, 2, 5, 10, 13, 11, 14, 12, 15}));
  Tensor sc = stack(std::vector<Tensor>{scalar_tensor(1), scalar_tensor(2), scalar_tensor(3)}, 0);
  EXPECT_EQ(sc.shape(), Shape{3});
  EXPECT_EQ(to_vector(sc), (Values{1, 2, 3}));
  EXPECT_EQ(error_of([&] {
              stack(std::vector<Tensor>{zeros({2}), zeros({3})}, 0);
            }),
            "stack: tensor 1 has shape (3,) but tensor 0 has shape (2,)");
  EXPECT_EQ(error_of([&] { stack(std::vector<Tensor>{}, 0); }),
            "stack: expected at least one tensor");
  EXPECT_EQ(error_of([&] { stack(std::vector<Tensor>{a}, 3); }),
            "stack: dim 3 out of range for a tensor of rank 3 (expected -3..2)");
}

// Slices of one buffer that stack back into it (a fused QKV projection's q, k, v, transposed)
// stack as a view of that buffer, with stack's values; anything else is refused (undefined).
TEST(StackTest, StackedViewOfSlicesThatLieSideBySide) {
  const Tensor qkv = iota({2, 5, 3, 3, 4});  // (B, T, H, 3, D)
  std::vector<Tensor> parts;
  for (int64_t i = 0; i < 3; ++i) {
    parts.push_back(transpose(squeeze(narrow(qkv, 3, i, 1), 3), 1, 2));  // (B, H, T, D)
  }
  for (int64_t dim : {4, 0, 2}) {
    const Tensor view = stacked_view(parts, dim);
    ASSERT_TRUE(view.defined()) << dim;
    EXPECT_EQ(view.storage(), qkv.storage());
    EXPECT_EQ(to_vector(view), to_vector(stack(parts, dim))) << dim;
  }
  // Out of order, a gap, overlapping slices and a lone tensor are not a stacked block.
  EXPECT_FALSE(stacked_view(std::vector<Tensor>{parts[1], parts[0], parts[2]}, 0).defined());
  EXPECT_FALSE(stacked_view(std::vector<Tensor>{parts[0], parts[2]}, 0).defined());
  const Tensor row = iota({8});
  EXPECT_FALSE(
      stacked_view(std::vector<Tensor>{narrow(row, 0, 0, 4), narrow(row, 0, 1, 4)}, 0).defined());
  EXPECT_FALSE(stacked_view(std::vector<Tensor>{parts[0]}, 0).defined());
  // Two separate tensors never are.
  EXPECT_FALSE(stacked_view(std::vector<Tensor>{iota({2}), iota({2})}, 0).defined());
}

TEST(FactoryTest, FullZerosOnesArange) {
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    EXPECT_EQ(to_vector(zeros({2, 2}, dtype)), (Values{0, 0, 0, 0}));
    EXPECT_EQ(to_vector(ones({3}, dtype)), (Values{1, 1, 1}));
    EXPECT_EQ(to_vector(full({2}, -3, dtype)), (Values{-3, -3}));
    EXPECT_EQ(full({2}, -3, dtype).dtype(), dtype);
    EXPECT_EQ(to_vector(zeros_like(ones({2, 1}, dtype))), (Values{0, 0}));
    EXPECT_EQ(ones_like(zeros({2, 1}, dtype)).shape(), (Shape{2, 1}));
    EXPECT_EQ(ones_like(zeros({2, 1}, dtype)).dtype(), dtype);
  }
  EXPECT_EQ(to_vector(full({2}, 0.1, kBFloat16))[0], static_cast<double>(bits_float(0x3dcd0000u)));
  EXPECT_EQ(arange(4).dtype(), kInt64);
  EXPECT_EQ(to_vector(arange(4)), (Values{0, 1, 2, 3}));
  EXPECT_EQ(arange(0).shape(), Shape{0});
  EXPECT_EQ(to_vector(arange(5, 1, -1)), (Values{5, 4, 3, 2}));
  // ceil((1 - 0) / 0.25) = 4 elements; 0.25 steps are exact in f32.
  EXPECT_EQ(to_vector(arange(0, 1, 0.25, kFloat32)), (Values{0, 0.25, 0.5, 0.75}));
  EXPECT_EQ(arange(0, 1, 0.3, kFloat32).numel(), 4);
  EXPECT_EQ(error_of([] { arange(0, 5, -1); }),
            "arange: range [0, 5) with step -1 goes the wrong way");
  EXPECT_EQ(error_of([] { arange(0, 5, 0); }), "arange: step must be non-zero");
}

TEST(FactoryTest, FromVectorScalarAndFill) {
  Tensor f = from_vector({1.5f, -2.f, 3.f, 4.f}, {2, 2}, kFloat16);
  EXPECT_EQ(f.dtype(), kFloat16);
  EXPECT_EQ(to_vector(f), (Values{1.5, -2, 3, 4}));
  Tensor i = from_vector_i64(std::vector<int64_t>{(int64_t{1} << 53) + 1, 2}, {2, 1});
  EXPECT_EQ(i.dtype(), kInt64);
  EXPECT_EQ(i.data<int64_t>()[0], (int64_t{1} << 53) + 1);
  EXPECT_EQ(error_of([] {
              from_vector({1.f, 2.f, 3.f}, {2, 2});
            }),
            "from_vector: 3 values cannot fill shape (2, 2) (4 elements)");
  EXPECT_EQ(error_of([] { from_vector_i64(std::vector<int64_t>{1}, {2}); }),
            "from_vector_i64: 1 values cannot fill shape (2,) (2 elements)");
  Tensor s = scalar_tensor(2.5, kBFloat16);
  EXPECT_EQ(s.shape(), Shape{});
  EXPECT_EQ(s.item<float>(), 2.5f);
  // fill_ on a strided view fills only the viewed elements.
  Tensor base = zeros({3, 3}, kInt32);
  fill_(slice(transpose(base, 0, 1), 0, 0, 3, 2), 7);  // columns 0 and 2
  EXPECT_EQ(to_vector(base), (Values{7, 0, 7, 7, 0, 7, 7, 0, 7}));
  fill_(expand(narrow(narrow(base, 0, 1, 1), 1, 1, 1), {1, 1}), -4);
  EXPECT_EQ(to_vector(base), (Values{7, 0, 7, 7, -4, 7, 7, 0, 7}));
}

}  // namespace
}  // namespace loom::ops
