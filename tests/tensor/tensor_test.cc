// Tensor handles: construction, metadata, item<T>(), data<T>(), description(), and the small
// value types under them (dtype names and sizes, shape_str, normalize_dim, contiguous strides).
#include "tensor/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "base/error.h"
#include "tensor/dtype.h"
#include "tensor/half.h"
#include "tensor/ops.h"
#include "tensor/shape.h"
#include "tests/tensor/tensor_test_util.h"

namespace loom {
namespace {

using testing::error_of;

TEST(DTypeTest, NamesSizesAndKinds) {
  EXPECT_EQ(dtype_name(kFloat32), "f32");
  EXPECT_EQ(dtype_name(kBFloat16), "bf16");
  EXPECT_EQ(dtype_name(kFloat16), "f16");
  EXPECT_EQ(dtype_name(kInt32), "i32");
  EXPECT_EQ(dtype_name(kInt64), "i64");
  EXPECT_EQ(element_size(kFloat32), 4u);
  EXPECT_EQ(element_size(kBFloat16), 2u);
  EXPECT_EQ(element_size(kFloat16), 2u);
  EXPECT_EQ(element_size(kInt32), 4u);
  EXPECT_EQ(element_size(kInt64), 8u);
  EXPECT_TRUE(is_floating(kFloat32));
  EXPECT_TRUE(is_floating(kBFloat16));
  EXPECT_TRUE(is_floating(kFloat16));
  EXPECT_FALSE(is_floating(kInt32));
  EXPECT_FALSE(is_floating(kInt64));
}

TEST(ShapeTest, ShapeStrNumelAndStrides) {
  EXPECT_EQ(shape_str({}), "()");
  EXPECT_EQ(shape_str({4}), "(4,)");
  EXPECT_EQ(shape_str({4, 3}), "(4, 3)");
  EXPECT_EQ(shape_str({2, 0, 5}), "(2, 0, 5)");
  EXPECT_EQ(shape_numel({}), 1);
  EXPECT_EQ(shape_numel({2, 3, 4}), 24);
  EXPECT_EQ(shape_numel({2, 0, 4}), 0);
  EXPECT_EQ(contiguous_strides({2, 3, 4}), (Strides{12, 4, 1}));
  EXPECT_EQ(contiguous_strides({}), Strides{});
  // Zero-size dims count as 1 in the strides (as in PyTorch), so strides stay positive.
  EXPECT_EQ(contiguous_strides({2, 0, 4}), (Strides{4, 4, 1}));
}

TEST(ShapeTest, NormalizeDim) {
  EXPECT_EQ(normalize_dim(0, 3, "op"), 0);
  EXPECT_EQ(normalize_dim(2, 3, "op"), 2);
  EXPECT_EQ(normalize_dim(-1, 3, "op"), 2);
  EXPECT_EQ(normalize_dim(-3, 3, "op"), 0);
  // A scalar accepts dim 0 and -1 (PyTorch's wrap_scalar).
  EXPECT_EQ(normalize_dim(-1, 0, "op"), 0);
  EXPECT_EQ(normalize_dim(0, 0, "op"), 0);
  EXPECT_EQ(error_of([] { normalize_dim(-4, 3, "sum"); }),
            "sum: dim -4 out of range for a tensor of rank 3 (expected -3..2)");
  EXPECT_EQ(error_of([] { normalize_dim(3, 3, "sum"); }),
            "sum: dim 3 out of range for a tensor of rank 3 (expected -3..2)");
}

TEST(TensorTest, DefaultIsUndefined) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_EQ(t.description(), "Tensor(undefined)");
  EXPECT_FALSE(t.requires_grad());
  EXPECT_EQ(error_of([&] { t.data<float>(); }), "data: tensor is undefined");
  EXPECT_EQ(error_of([&] { t.item<float>(); }),
            "item: expected a tensor with one element, got shape undefined");
  EXPECT_EQ(error_of([&] { ops::to_vector(t); }),
            "to_vector: the tensor is undefined (a gradient not computed yet?)");
}

TEST(TensorTest, EmptyMetadataForEveryDType) {
  for (DType dtype : {kFloat32, kBFloat16, kFloat16, kInt32, kInt64}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    Tensor t = Tensor::empty({2, 3, 4}, dtype);
    ASSERT_TRUE(t.defined());
    EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
    EXPECT_EQ(t.strides(), (Strides{12, 4, 1}));
    EXPECT_EQ(t.dim(), 3);
    EXPECT_EQ(t.numel(), 24);
    EXPECT_EQ(t.offset(), 0);
    EXPECT_EQ(t.dtype(), dtype);
    EXPECT_TRUE(t.device().is_cpu());
    EXPECT_EQ(t.device(), Device::cpu());
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_TRUE(t.is_leaf());
    EXPECT_FALSE(t.requires_grad());
    EXPECT_EQ(t.extension(), nullptr);
    EXPECT_EQ(t.storage()->bytes(), 24 * element_size(dtype));
    EXPECT_EQ(t.raw_data(), t.storage()->data());
    // CPU storage is 64-byte aligned (storage.h).
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u);
  }
}

TEST(TensorTest, SizeAndStrideAcceptNegativeDims) {
  Tensor t = Tensor::empty({2, 3, 4});
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.size(-3), 2);
  EXPECT_EQ(t.stride(-1), 1);
  EXPECT_EQ(t.stride(-2), 4);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_EQ(error_of([&] { t.size(3); }),
            "size: dim 3 out of range for a tensor of rank 3 (expected -3..2)");
  EXPECT_EQ(error_of([&] { t.stride(-4); }),
            "stride: dim -4 out of range for a tensor of rank 3 (expected -3..2)");
}

TEST(TensorTest, ScalarAndZeroSizeTensors) {
  Tensor s = Tensor::empty({}, kFloat32);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.shape(), Shape{});
  EXPECT_TRUE(s.is_contiguous());
  // A scalar has no dims to index: size()/stride() must throw rather than read shape()[0].
  EXPECT_EQ(error_of([&] { s.size(0); }),
            "size: dim 0 out of range for a tensor of rank 0 (a scalar has no dims)");
  EXPECT_EQ(error_of([&] { s.stride(-1); }),
            "stride: dim -1 out of range for a tensor of rank 0 (a scalar has no dims)");

  Tensor z = Tensor::empty({0, 3}, kInt64);
  EXPECT_EQ(z.numel(), 0);
  EXPECT_EQ(z.strides(), (Strides{3, 1}));
  EXPECT_TRUE(z.is_contiguous());
  EXPECT_EQ(z.storage()->bytes(), 0u);
  EXPECT_NE(z.raw_data(), nullptr);  // CPU allocates at least one aligned block
}

TEST(TensorTest, EmptyRejectsNegativeSizes) {
  EXPECT_EQ(error_of([] { Tensor::empty({2, -1}); }), "empty: negative size in shape (2, -1)");
}

TEST(TensorTest, FromStorageSharesTheBuffer) {
  Tensor base = ops::arange(12, kFloat32);
  Tensor v = Tensor::from_storage(base.storage(), {2, 3}, {4, 1}, /*offset=*/1, kFloat32);
  EXPECT_EQ(v.storage(), base.storage());
  EXPECT_EQ(v.storage().use_count(), 2);  // held by base and v, nothing copied
  EXPECT_EQ(v.offset(), 1);
  EXPECT_EQ(v.raw_data(), static_cast<char*>(base.storage()->data()) + 4);
  EXPECT_FALSE(v.is_contiguous());
  EXPECT_EQ(ops::to_vector(v), (std::vector<double>{1, 2, 3, 5, 6, 7}));
  // Writes through one handle are seen by the other.
  v.data<float>()[0] = 100.0f;
  EXPECT_EQ(base.data<float>()[1], 100.0f);
}

TEST(TensorTest, CopyingAHandleSharesTheTensor) {
  Tensor a = ops::zeros({3});
  Tensor b = a;
  EXPECT_TRUE(a.is_same(b));
  EXPECT_EQ(a.impl(), b.impl());
  b.data<float>()[2] = 7.0f;
  EXPECT_EQ(ops::to_vector(a), (std::vector<double>{0, 0, 7}));
  Tensor c = ops::zeros({3});
  EXPECT_FALSE(a.is_same(c));
}

TEST(TensorTest, IsContiguous) {
  EXPECT_TRUE(Tensor::empty({2, 3}).is_contiguous());
  EXPECT_FALSE(ops::transpose(Tensor::empty({2, 3}), 0, 1).is_contiguous());
  // Size-1 dims may carry any stride.
  Tensor odd = Tensor::from_storage(Storage::allocate(24, Device::cpu()), {1, 3, 1, 2},
                                    {99, 2, 7, 1}, 0, kFloat32);
  EXPECT_TRUE(odd.is_contiguous());
  EXPECT_FALSE(ops::slice(Tensor::empty({6}), 0, 0, 6, 2).is_contiguous());
  EXPECT_FALSE(ops::expand(Tensor::empty({1, 3}), {4, 3}).is_contiguous());
}

TEST(TensorTest, ItemConvertsEveryDType) {
  EXPECT_EQ(ops::scalar_tensor(2.5, kFloat32).item<float>(), 2.5f);
  EXPECT_EQ(ops::scalar_tensor(2.5, kFloat32).item<double>(), 2.5);
  EXPECT_EQ(ops::scalar_tensor(-7, kInt32).item<int32_t>(), -7);
  EXPECT_EQ(ops::scalar_tensor(-7, kInt32).item<double>(), -7.0);
  EXPECT_EQ(ops::scalar_tensor(3.9, kFloat32).item<int64_t>(), 3);  // truncation, like a C cast
  // bf16/f16 store the rounded value; item returns exactly that value.
  EXPECT_EQ(ops::scalar_tensor(1.0 / 3.0, kBFloat16).item<float>(), bits_float(0x3eab0000u));
  EXPECT_EQ(ops::scalar_tensor(1.0 / 3.0, kFloat16).item<double>(), 0.333251953125);
  EXPECT_EQ(ops::scalar_tensor(65504, kFloat16).item<float>(), 65504.0f);
  // Any one-element shape, and views with an offset, work.
  Tensor one = ops::narrow(ops::arange(10, kFloat32), 0, 7, 1);
  EXPECT_EQ(one.shape(), Shape{1});
  EXPECT_EQ(one.item<float>(), 7.0f);
  EXPECT_EQ(ops::full({1, 1, 1}, 4.0, kInt64).item<int64_t>(), 4);
}

TEST(TensorTest, ItemOfLargeInt64IsExact) {
  // 2^53 + 1 is not representable in a double; item<int64_t> must not go through one.
  const int64_t big = (int64_t{1} << 53) + 1;
  Tensor t = Tensor::empty({}, kInt64);
  *t.data<int64_t>() = big;
  EXPECT_EQ(t.item<int64_t>(), big);
  EXPECT_EQ(t.item<double>(), 9007199254740992.0);  // the nearest double, as documented
  *t.data<int64_t>() = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(t.item<int64_t>(), std::numeric_limits<int64_t>::max());
  *t.data<int64_t>() = std::numeric_limits<int64_t>::min();
  EXPECT_EQ(t.item<int64_t>(), std::numeric_limits<int64_t>::min());
  *t.data<int64_t>() = -big;
  EXPECT_EQ(t.item<int64_t>(), -big);
}

TEST(TensorTest, ItemErrors) {
  EXPECT_EQ(error_of([] { ops::zeros({2}).item<float>(); }),
            "item: expected a tensor with one element, got shape (2,)");
  EXPECT_EQ(error_of([] {
              ops::zeros({0, 1}).item<float>();
            }),
            "item: expected a tensor with one element, got shape (0, 1)");
}

TEST(TensorTest, DataChecksTheDType) {
  Tensor f = ops::zeros({2, 2}, kFloat32);
  EXPECT_NE(f.data<float>(), nullptr);
  EXPECT_EQ(f.data<const float>(), f.data<float>());
  EXPECT_EQ(error_of([&] { f.data<int64_t>(); }),
            "data: tensor has dtype f32 but i64 was requested");
  EXPECT_EQ(error_of([&] { f.data<int32_t>(); }),
            "data: tensor has dtype f32 but i32 was requested");
  EXPECT_EQ(error_of([] { ops::zeros({2}, kBFloat16).data<float>(); }),
            "data: tensor has dtype bf16 but f32 was requested");
  EXPECT_EQ(error_of([] { ops::zeros({2}, kFloat16).data<float>(); }),
            "data: tensor has dtype f16 but f32 was requested");
  EXPECT_EQ(error_of([] { ops::zeros({2}, kInt64).data<int32_t>(); }),
            "data: tensor has dtype i64 but i32 was requested");
  // data<T>() points at element [0, ...] of a view, past its offset.
  Tensor base = ops::arange(6, kInt64);
  Tensor view = ops::narrow(base, 0, 2, 3);
  EXPECT_EQ(view.data<int64_t>(), base.data<int64_t>() + 2);
  EXPECT_EQ(*view.data<int64_t>(), 2);
}

TEST(TensorTest, Description) {
  EXPECT_EQ(Tensor::empty({2, 3}).description(), "Tensor(shape=(2, 3), dtype=f32, device=cpu)");
  EXPECT_EQ(Tensor::empty({}, kInt64).description(), "Tensor(shape=(), dtype=i64, device=cpu)");
  EXPECT_EQ(Tensor::empty({4}, kBFloat16).description(),
            "Tensor(shape=(4,), dtype=bf16, device=cpu)");
  EXPECT_EQ(Tensor::empty({0, 5, 1}, kFloat16).description(),
            "Tensor(shape=(0, 5, 1), dtype=f16, device=cpu)");
  EXPECT_EQ(Device::cuda(1).str(), "cuda:1");
}

TEST(TensorTest, RequiresGradOnlyOnFloatingLeaves) {
  Tensor f = ops::zeros({2});
  f.set_requires_grad(true);
  EXPECT_TRUE(f.requires_grad());
  f.set_requires_grad(false);
  EXPECT_FALSE(f.requires_grad());
  EXPECT_TRUE(ops::zeros({2}, kBFloat16).set_requires_grad(true).requires_grad());
  EXPECT_EQ(error_of([] { ops::zeros({2}, kInt64).set_requires_grad(true); }),
            "set_requires_grad: only floating tensors can require grad, got dtype i64");
  // Turning it off is allowed for any dtype.
  EXPECT_FALSE(ops::zeros({2}, kInt32).set_requires_grad(false).requires_grad());
  EXPECT_EQ(error_of([] { Tensor().set_requires_grad(true); }),
            "set_requires_grad: tensor is undefined");
}

TEST(TensorTest, GradSlot) {
  Tensor w = ops::zeros({2});
  EXPECT_FALSE(w.grad().defined());
  Tensor g = ops::ones({2});
  w.set_grad(g);
  EXPECT_TRUE(w.grad().is_same(g));
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// FSDP frees a whole parameter's memory between forward and backward while autograd keeps the
// tensors: the storage releases its buffer and refills it, and every view sees the new memory.
TEST(StorageTest, ReleaseFreesTheBufferAndRefillBringsItBack) {
  Tensor t = ops::arange(6, kFloat32);
  const Tensor view = ops::narrow(t, 0, 2, 3);
  const std::shared_ptr<Storage>& storage = t.storage();
  EXPECT_FALSE(storage->released());
  storage->release();
  EXPECT_TRUE(storage->released());
  EXPECT_EQ(storage->data(), nullptr);
  EXPECT_EQ(storage->bytes(), 6 * sizeof(float));
  storage->release();  // twice is fine
  storage->refill();
  EXPECT_FALSE(storage->released());
  ASSERT_NE(storage->data(), nullptr);
  ops::copy_(t, ops::arange(6, kFloat32));
  EXPECT_EQ(ops::to_vector(view), (std::vector<double>{2, 3, 4}));
}

}  // namespace
}  // namespace loom
