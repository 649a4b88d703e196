// View ops (tensor/ops_views.h): values, shapes, strides, storage sharing, and error messages.
// All values are small integers held exactly in f32, so comparisons are exact.
#include <gtest/gtest.h>

#include <vector>

#include "base/error.h"
#include "tensor/ops.h"
#include "tensor/ops_views.h"
#include "tests/tensor/tensor_test_util.h"

namespace loom::ops {
namespace {

using testing::error_of;
using testing::iota;
using testing::Values;

// True when `v` views `base`'s buffer (no copy).
bool shares(const Tensor& v, const Tensor& base) { return v.storage() == base.storage(); }

TEST(ViewTest, ViewSharesStorageAndKeepsValues) {
  Tensor x = iota({2, 3, 4});
  Tensor v = view(x, {6, 4});
  EXPECT_EQ(v.shape(), (Shape{6, 4}));
  EXPECT_EQ(v.strides(), (Strides{4, 1}));
  EXPECT_TRUE(shares(v, x));
  EXPECT_EQ(v.raw_data(), x.raw_data());
  EXPECT_EQ(to_vector(v), to_vector(x));
  // A write through the view is visible in the base.
  v.data<float>()[5] = -1.0f;
  EXPECT_EQ(to_vector(x)[5], -1.0);
}

TEST(ViewTest, InfersMinusOne) {
  Tensor x = iota({2, 3, 4});
  EXPECT_EQ(view(x, {-1}).shape(), Shape{24});
  EXPECT_EQ(view(x, {4, -1}).shape(), (Shape{4, 6}));
  EXPECT_EQ(view(x, {2, -1, 2}).shape(), (Shape{2, 6, 2}));
  EXPECT_EQ(view(iota({}), {}).shape(), Shape{});
  EXPECT_EQ(view(iota({}), {1, 1}).strides(), (Strides{1, 1}));
  EXPECT_EQ(view(Tensor::empty({0, 3}), {-1, 3}).shape(), (Shape{0, 3}));
  EXPECT_EQ(error_of([&] { view(x, {-1, -1}); }), "view: only one dim can be -1, got (-1, -1)");
  EXPECT_EQ(error_of([&] {
              view(x, {5, -1});
            }),
            "view: shape (5, -1) is invalid for a tensor of shape (2, 3, 4) (24 elements)");
  EXPECT_EQ(error_of([&] {
              view(x, {5, 5});
            }),
            "view: shape (5, 5) is invalid for a tensor of shape (2, 3, 4) (24 elements)");
  EXPECT_EQ(error_of([&] { view(x, {-2, 12}); }), "view: invalid size -2 in shape (-2, 12)");
}

TEST(ViewTest, ViewOfANonContiguousTensorWhereTheLayoutAllows) {
  // Narrowing the first dim keeps rows contiguous: merging the rest is still a view.
  Tensor x = iota({4, 3, 2});
  Tensor n = narrow(x, 0, 1, 2);  // (2, 3, 2), offset 6
  Tensor v = view(n, {2, 6});
  EXPECT_TRUE(shares(v, x));
  EXPECT_EQ(v.offset(), 6);
  EXPECT_EQ(to_vector(v), (Values{6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}));
  // Splitting a transposed dim is fine too (only merging across it is not).
  Tensor t = transpose(iota({4, 6}), 0, 1);  // (6, 4) strides (1, 6)
  Tensor s = view(t, {2, 3, 4});
  EXPECT_EQ(s.strides(), (Strides{3, 1, 6}));
  EXPECT_EQ(to_vector(s), to_vector(contiguous(t)));
}

TEST(ViewTest, ViewOfATransposedTensorSaysUseReshape) {
  Tensor t = transpose(iota({2, 3}), 0, 1);
  EXPECT_EQ(error_of([&] { view(t, {6}); }),
            "view: a tensor of shape (3, 2) and strides (1, 3) cannot be viewed as (6,) without a "
            "copy; use reshape");
}

TEST(ReshapeTest, ViewableReshapeSharesStorage) {
  Tensor x = iota({2, 3, 4});
  Tensor r = reshape(x, {4, 3, 2});
  EXPECT_TRUE(shares(r, x));
  EXPECT_EQ(r.shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(to_vector(r), to_vector(x));
}

TEST(ReshapeTest, NonViewableReshapeCopies) {
  Tensor x = iota({2, 3});
  Tensor t = transpose(x, 0, 1);  // (3, 2): 0 3 / 1 4 / 2 5
  Tensor r = reshape(t, {6});
  EXPECT_FALSE(shares(r, x));
  EXPECT_TRUE(r.is_contiguous());
  EXPECT_EQ(to_vector(r), (Values{0, 3, 1, 4, 2, 5}));
  // The copy is independent of the source.
  r.data<float>()[0] = 42.0f;
  EXPECT_EQ(to_vector(x)[0], 0.0);
  EXPECT_EQ(reshape(t, {2, -1}).shape(), (Shape{2, 3}));
  EXPECT_EQ(error_of([&] {
              reshape(t, {4, 2});
            }),
            "reshape: shape (4, 2) is invalid for a tensor of shape (3, 2) (6 elements)");
}

TEST(TransposeTest, SwapsShapeAndStrides) {
  Tensor x = iota({2, 3, 4});
  Tensor t = transpose(x, 0, 2);
  EXPECT_TRUE(shares(t, x));
  EXPECT_EQ(t.shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(t.strides(), (Strides{1, 4, 12}));
  EXPECT_FALSE(t.is_contiguous());
  // t[i][j][k] == x[k][j][i].
  const Values tv = to_vector(t);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 2; ++k) EXPECT_EQ(tv[(i * 3 + j) * 2 + k], k * 12 + j * 4 + i);
  EXPECT_EQ(transpose(x, -1, -3).strides(), t.strides());
  EXPECT_EQ(transpose(x, 1, 1).strides(), x.strides());
  EXPECT_EQ(error_of([&] { transpose(x, 0, 3); }),
            "transpose: dim 3 out of range for a tensor of rank 3 (expected -3..2)");
}

TEST(PermuteTest, ReordersDims) {
  Tensor x = iota({2, 3, 4});
  Tensor p = permute(x, {2, 0, 1});
  EXPECT_TRUE(shares(p, x));
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Strides{1, 12, 4}));
  const Values pv = to_vector(p);
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < 3; ++c) EXPECT_EQ(pv[(a * 2 + b) * 3 + c], b * 12 + c * 4 + a);
  EXPECT_EQ(permute(x, {-1, 0, -2}).shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(error_of([&] { permute(x, {0, 1, 0}); }), "permute: dim 0 repeated in (0, 1, 0)");
  EXPECT_EQ(error_of([&] { permute(x, {0, -3, 1}); }), "permute: dim 0 repeated in (0, -3, 1)");
  EXPECT_EQ(error_of([&] {
              permute(x, {0, 1});
            }),
            "permute: got 2 dims (0, 1) for a tensor of rank 3");
}

TEST(NarrowTest, ValuesOffsetAndErrors) {
  Tensor x = iota({3, 5});
  Tensor n = narrow(x, 1, 1, 3);
  EXPECT_TRUE(shares(n, x));
  EXPECT_EQ(n.shape(), (Shape{3, 3}));
  EXPECT_EQ(n.strides(), (Strides{5, 1}));
  EXPECT_EQ(n.offset(), 1);
  EXPECT_EQ(to_vector(n), (Values{1, 2, 3, 6, 7, 8, 11, 12, 13}));
  // Negative start counts from the end; length 0 is allowed.
  EXPECT_EQ(to_vector(narrow(x, 0, -1, 1)), (Values{10, 11, 12, 13, 14}));
  EXPECT_EQ(narrow(x, 1, 5, 0).shape(), (Shape{3, 0}));
  // Narrowing a narrow accumulates offsets.
  EXPECT_EQ(to_vector(narrow(narrow(x, 0, 1, 2), 1, 2, 2)), (Values{7, 8, 12, 13}));
  EXPECT_EQ(error_of([&] { narrow(x, 1, 3, 3); }),
            "narrow: range [3, 6) is outside dim 1 of size 5 (tensor shape (3, 5))");
  EXPECT_EQ(error_of([&] { narrow(x, 0, -5, 1); }),
            "narrow: range [-2, -1) is outside dim 0 of size 3 (tensor shape (3, 5))");
  EXPECT_EQ(error_of([&] { narrow(x, 2, 0, 1); }),
            "narrow: dim 2 out of range for a tensor of rank 2 (expected -2..1)");
}

TEST(SliceTest, StepsClampingAndNegativeBounds) {
  Tensor x = iota({10});
  Tensor s = slice(x, 0, 1, 8, 3);  // 1, 4, 7
  EXPECT_TRUE(shares(s, x));
  EXPECT_EQ(s.shape(), Shape{3});
  EXPECT_EQ(s.strides(), Strides{3});
  EXPECT_EQ(s.offset(), 1);
  EXPECT_EQ(to_vector(s), (Values{1, 4, 7}));
  EXPECT_EQ(to_vector(slice(x, 0, 0, 10, 4)), (Values{0, 4, 8}));
  EXPECT_EQ(to_vector(slice(x, 0, -3, 100)), (Values{7, 8, 9}));  // end clamped
  EXPECT_EQ(to_vector(slice(x, 0, -100, 2)), (Values{0, 1}));     // start clamped
  EXPECT_EQ(to_vector(slice(x, 0, 2, -5, 2)), (Values{2, 4}));    // [2:5:2]
  EXPECT_EQ(slice(x, 0, 6, 3).shape(), Shape{0});                 // empty, not negative
  EXPECT_EQ(slice(x, 0, 20, 30).shape(), Shape{0});
  Tensor m = iota({4, 6});
  Tensor ms = slice(slice(m, 1, 1, 6, 2), 0, 1, 4, 2);  // rows 1,3; cols 1,3,5
  EXPECT_EQ(ms.strides(), (Strides{12, 2}));
  EXPECT_EQ(to_vector(ms), (Values{7, 9, 11, 19, 21, 23}));
  EXPECT_EQ(error_of([&] { slice(x, 0, 0, 5, 0); }), "slice: step must be positive, got 0");
  EXPECT_EQ(error_of([&] { slice(x, 0, 0, 5, -1); }), "slice: step must be positive, got -1");
}

std::vector<Shape> shapes_of(const std::vector<Tensor>& pieces) {
  std::vector<Shape> shapes;
  for (const Tensor& p : pieces) shapes.push_back(p.shape());
  return shapes;
}

TEST(ChunkTest, UnevenChunks) {
  Tensor x = iota({10});
  const auto c = chunk(x, 4);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(shapes_of(c), (std::vector<Shape>{{3}, {3}, {3}, {1}}));
  EXPECT_EQ(to_vector(c[0]), (Values{0, 1, 2}));
  EXPECT_EQ(to_vector(c[2]), (Values{6, 7, 8}));
  EXPECT_EQ(to_vector(c[3]), (Values{9}));
  for (const Tensor& p : c) EXPECT_TRUE(shares(p, x));
  // Fewer pieces than asked when the dim is small (torch.chunk).
  const auto small = chunk(iota({2}), 4);
  ASSERT_EQ(small.size(), 2u);
  EXPECT_EQ(to_vector(small[0]), Values{0});
  EXPECT_EQ(to_vector(small[1]), Values{1});
  // 9 into 4: ceil = 3, so only 3 pieces.
  EXPECT_EQ(shapes_of(chunk(iota({9}), 4)), (std::vector<Shape>{{3}, {3}, {3}}));
  EXPECT_EQ(shapes_of(chunk(iota({8}), 4)), (std::vector<Shape>{{2}, {2}, {2}, {2}}));
  // Along another dim.
  const auto cols = chunk(iota({2, 5}), 2, -1);
  EXPECT_EQ(shapes_of(cols), (std::vector<Shape>{{2, 3}, {2, 2}}));
  EXPECT_EQ(to_vector(cols[1]), (Values{3, 4, 8, 9}));
  // An empty dim gives `chunks` empty pieces, as torch.chunk does.
  EXPECT_EQ(shapes_of(chunk(Tensor::empty({0, 2}), 3)),
            (std::vector<Shape>{{0, 2}, {0, 2}, {0, 2}}));
  EXPECT_EQ(shapes_of(chunk(Tensor::empty({2, 0}), 2, 1)), (std::vector<Shape>{{2, 0}, {2, 0}}));
  EXPECT_EQ(error_of([&] { chunk(x, 0); }), "chunk: chunks must be positive, got 0");
}

TEST(SplitTest, SplitAndSplitWithSizes) {
  Tensor x = iota({7, 2});
  const auto s = split(x, 3);
  EXPECT_EQ(shapes_of(s), (std::vector<Shape>{{3, 2}, {3, 2}, {1, 2}}));
  EXPECT_EQ(to_vector(s[2]), (Values{12, 13}));
  for (const Tensor& p : s) EXPECT_TRUE(shares(p, x));
  EXPECT_EQ(shapes_of(split(x, 7)), (std::vector<Shape>{{7, 2}}));
  EXPECT_EQ(shapes_of(split(x, 100)), (std::vector<Shape>{{7, 2}}));
  EXPECT_EQ(shapes_of(split(x, 1, 1)), (std::vector<Shape>{{7, 1}, {7, 1}}));
  EXPECT_EQ(error_of([&] { split(x, 0); }), "split: split_size must be positive, got 0");

  const auto w = split_with_sizes(x, {1, 0, 4, 2});
  EXPECT_EQ(shapes_of(w), (std::vector<Shape>{{1, 2}, {0, 2}, {4, 2}, {2, 2}}));
  EXPECT_EQ(to_vector(w[2]), (Values{2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(w[3].offset(), 10);
  EXPECT_EQ(error_of([&] {
              split_with_sizes(x, {3, 3});
            }),
            "split_with_sizes: sizes (3, 3) add up to 6 but dim 0 has size 7");
}

TEST(ExpandTest, BroadcastsWithStrideZero) {
  Tensor x = iota({3, 1});
  Tensor e = expand(x, {2, 3, 4});
  EXPECT_TRUE(shares(e, x));
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.strides(), (Strides{0, 1, 0}));
  EXPECT_EQ(to_vector(e), (Values{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2,  //
                                  0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}));
  EXPECT_EQ(expand(x, {-1, 5}).shape(), (Shape{3, 5}));
  EXPECT_EQ(expand(iota({}), {2, 2}).strides(), (Strides{0, 0}));
  EXPECT_EQ(to_vector(expand(iota({}), {2})), (Values{0, 0}));
  EXPECT_EQ(expand(x, {3, 1}).strides(), x.strides());
}

TEST(ExpandTest, Errors) {
  Tensor x = iota({3, 1});
  EXPECT_EQ(error_of([&] {
              expand(x, {4, 4});
            }),
            "expand: shape (3, 1) cannot be expanded to (4, 4) (size 3 at dim 0 is not 1)");
  EXPECT_EQ(error_of([&] { expand(x, {3}); }),
            "expand: cannot expand shape (3, 1) to fewer dims (3,)");
  EXPECT_EQ(error_of([&] {
              expand(x, {-1, 3, 1});
            }),
            "expand: size -1 not allowed for a new leading dim in (-1, 3, 1)");
}

TEST(UnsqueezeSqueezeTest, InsertAndRemoveSizeOneDims) {
  Tensor x = iota({2, 3});
  Tensor u0 = unsqueeze(x, 0);
  EXPECT_TRUE(shares(u0, x));
  EXPECT_EQ(u0.shape(), (Shape{1, 2, 3}));
  EXPECT_EQ(u0.strides(), (Strides{6, 3, 1}));
  EXPECT_EQ(unsqueeze(x, 1).shape(), (Shape{2, 1, 3}));
  EXPECT_EQ(unsqueeze(x, 1).strides(), (Strides{3, 3, 1}));
  EXPECT_EQ(unsqueeze(x, 2).shape(), (Shape{2, 3, 1}));
  EXPECT_EQ(unsqueeze(x, 2).strides(), (Strides{3, 1, 1}));
  EXPECT_EQ(unsqueeze(x, -1).shape(), (Shape{2, 3, 1}));
  EXPECT_EQ(unsqueeze(x, -3).shape(), (Shape{1, 2, 3}));
  EXPECT_EQ(unsqueeze(iota({}), 0).shape(), Shape{1});
  EXPECT_TRUE(unsqueeze(x, 1).is_contiguous());
  EXPECT_EQ(to_vector(unsqueeze(x, 1)), to_vector(x));
  EXPECT_EQ(error_of([&] { unsqueeze(x, 3); }),
            "unsqueeze: dim 3 out of range for a tensor of rank 3 (expected -3..2)");

  Tensor y = iota({2, 1, 3, 1});
  Tensor s1 = squeeze(y, 1);
  EXPECT_TRUE(shares(s1, y));
  EXPECT_EQ(s1.shape(), (Shape{2, 3, 1}));
  EXPECT_EQ(squeeze(y, -1).shape(), (Shape{2, 1, 3}));
  EXPECT_EQ(squeeze(y, 0).shape(), y.shape());  // size != 1: unchanged
  EXPECT_TRUE(shares(squeeze(y, 0), y));
  EXPECT_EQ(squeeze(iota({1}), 0).shape(), Shape{});
  EXPECT_EQ(squeeze(iota({}), 0).shape(), Shape{});
  EXPECT_EQ(to_vector(squeeze(y, 1)), to_vector(y));
  // Unsqueeze of a transposed view keeps the strides consistent.
  Tensor t = transpose(x, 0, 1);  // (3, 2) strides (1, 3)
  Tensor tu = unsqueeze(t, 1);
  EXPECT_EQ(tu.shape(), (Shape{3, 1, 2}));
  EXPECT_EQ(to_vector(tu), to_vector(t));
}

TEST(AliasTest, SameStorageNoExtensionNoAutograd) {
  Tensor x = iota({2, 2});
  x.set_requires_grad(true);
  Tensor a = alias(x);
  EXPECT_FALSE(a.is_same(x));
  EXPECT_TRUE(shares(a, x));
  EXPECT_EQ(a.shape(), x.shape());
  EXPECT_EQ(a.strides(), x.strides());
  EXPECT_FALSE(a.requires_grad());
}

TEST(ViewStridesTest, MatchesTorchComputeStride) {
  Tensor t = transpose(iota({4, 6}), 0, 1);  // (6, 4) strides (1, 6)
  EXPECT_FALSE(view_strides(t, {24}).has_value());
  EXPECT_EQ(*view_strides(t, {6, 2, 2}), (Strides{1, 12, 6}));
  EXPECT_EQ(*view_strides(t, {6, 1, 4}), (Strides{1, 24, 6}));  // size-1 dim: as torch
  Tensor e = expand(iota({1, 3}), {4, 3});
  EXPECT_EQ(*view_strides(e, {2, 2, 3}), (Strides{0, 0, 1}));
  EXPECT_FALSE(view_strides(e, {12}).has_value());
}

TEST(ScalarTest, ViewsThatIndexADimRejectScalars) {
  // A scalar accepts dim 0 in normalize_dim (PyTorch's wrap_scalar), but it has no dim to
  // narrow, slice or split: these must throw rather than read shape()[0] of an empty shape.
  Tensor s = iota({});
  EXPECT_EQ(error_of([&] { narrow(s, 0, 0, 1); }),
            "narrow: cannot be applied to a scalar (shape ())");
  EXPECT_EQ(error_of([&] { slice(s, 0, 0, 1); }),
            "slice: cannot be applied to a scalar (shape ())");
  EXPECT_EQ(error_of([&] { split(s, 1); }), "split: cannot be applied to a scalar (shape ())");
  EXPECT_EQ(error_of([&] { chunk(s, 2); }), "chunk: cannot be applied to a scalar (shape ())");
  EXPECT_EQ(error_of([&] { split_with_sizes(s, {1}); }),
            "split_with_sizes: cannot be applied to a scalar (shape ())");
}

}  // namespace
}  // namespace loom::ops
