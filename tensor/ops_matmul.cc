#include "tensor/ops_matmul.h"

#include "base/error.h"
#include "tensor/cpu/gemm.h"
#include "tensor/cpu/gemm_bf16.h"
#include "tensor/cpu/strided_loop.h"
#include "tensor/cuda/gemm_cublaslt.h"
#include "tensor/dispatch.h"
#include "tensor/flop_counter.h"
#include "tensor/grad_mode.h"
#include "tensor/op_device.h"
#include "tensor/ops_copy.h"
#include "tensor/ops_elementwise.h"
#include "tensor/ops_nn_internal.h"
#include "tensor/ops_views.h"

namespace loom::ops {

namespace {

// How a 2-D (last two dims) operand reaches the GEMM: the pointer-free part of a BLAS call.
struct GemmOperand {
  Tensor tensor;    // possibly a contiguous copy, when the layout fit neither form
  bool transposed;  // true: column-major, passed with the transpose flag
  int64_t leading;  // leading dimension in elements
};

GemmOperand as_gemm_operand(const Tensor& t) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  const int64_t row_stride = t.stride(-2), col_stride = t.stride(-1);
  if (col_stride == 1 && (row_stride >= std::max<int64_t>(cols, 1) || rows == 1)) {
    return {t, false, std::max<int64_t>(row_stride, std::max<int64_t>(cols, 1))};
  }
  if (row_stride == 1 && (col_stride >= std::max<int64_t>(rows, 1) || cols == 1)) {
    return {t, true, std::max<int64_t>(col_stride, std::max<int64_t>(rows, 1))};
  }
  Tensor copy = contiguous(t);
  return {copy, false, std::max<int64_t>(cols, 1)};
}

// A bf16 tensor's data as the raw bits the bf16 GEMM takes.
const uint16_t* bf16_bits(const Tensor& t) { return static_cast<const uint16_t*>(t.raw_data()); }

// Batch dims of `t` as (count, stride) when they collapse to one evenly strided run.
bool uniform_batch_stride(const Tensor& t, int64_t* stride) {
  const int64_t batch_dims = t.dim() - 2;
  int64_t expected = -1;
  int64_t run = 1;
  for (int64_t d = batch_dims - 1; d >= 0; --d) {
    if (t.shape()[d] == 1) continue;
    if (expected < 0) {
      expected = t.stride(d);
      *stride = expected;
    } else if (t.stride(d) != expected * run) {
      return false;
    }
    run *= t.shape()[d];
  }
  if (expected < 0) *stride = 0;
  return true;
}

// One batched cuBLASLt GEMM in the operands' dtype (f32 accumulation).
void cuda_batched_gemm(int64_t batch, bool transpose_a, bool transpose_b, int64_t m, int64_t n,
                       int64_t k, const Tensor& a, int64_t lda, int64_t stride_a, const Tensor& b,
                       int64_t ldb, int64_t stride_b, const Tensor& out) {
  cuda::GemmProblem p{.dtype = out.dtype(),
                      .transpose_a = transpose_a,
                      .transpose_b = transpose_b,
                      .m = m,
                      .n = n,
                      .k = k,
                      .lda = lda,
                      .ldb = ldb,
                      .ldc = std::max<int64_t>(n, 1),
                      .stride_a = stride_a,
                      .stride_b = stride_b,
                      .stride_c = m * n,
                      .batch = batch};
  cuda::gemm(p, a.raw_data(), b.raw_data(), out.raw_data(), out.device().index);
}

// The products on CPU, into `out` (contiguous, bf16 or f32 like the operands: bf16 only where
// the bf16 GEMM is native). One GEMM when there is one matrix pair, or when every entry shares
// one B and A's rows are evenly spaced across the batch (linear's dX = dY @ W over (B, T, N)):
// rows of a product do not depend on each other, and one GEMM of batch x m rows runs much faster
// than `batch` small ones (GPT-2's MLP projection over 16 x 64 rows: 79 instead of 100 ms).
// Otherwise one GEMM per entry, at the offsets the operands lie at (attention's heads are
// strided views of (B, T, H, D)).
void cpu_products(const GemmOperand& ga, const GemmOperand& gb, bool shared_b, int64_t batch,
                  int64_t m, int64_t n, int64_t k, const Tensor& out) {
  const bool bf16 = out.dtype() == kBFloat16;
  const int64_t ldc = std::max<int64_t>(n, 1);
  int64_t stride_a = 0;
  const bool one_gemm =
      batch == 1 || (shared_b && !ga.transposed && uniform_batch_stride(ga.tensor, &stride_a) &&
                     stride_a == m * ga.leading);
  if (one_gemm) {
    if (bf16) {
      cpu::gemm_bf16(ga.transposed, gb.transposed, batch * m, n, k, bf16_bits(ga.tensor),
                     ga.leading, bf16_bits(gb.tensor), gb.leading, out.raw_data(),
                     /*c_bf16=*/true, ldc);
    } else {
      cpu::sgemm(ga.transposed, gb.transposed, batch * m, n, k, 1.0f,
                 static_cast<const float*>(ga.tensor.raw_data()), ga.leading,
                 static_cast<const float*>(gb.tensor.raw_data()), gb.leading, 0.0f,
                 static_cast<float*>(out.raw_data()), ldc);
    }
    return;
  }
  std::vector<int64_t> c_offsets(static_cast<size_t>(batch));
  for (int64_t i = 0; i < batch; ++i) c_offsets[i] = i * m * n;
  const std::vector<int64_t> a_offsets = nn_internal::batch_offsets(ga.tensor, batch);
  const std::vector<int64_t> b_offsets = nn_internal::batch_offsets(gb.tensor, batch);
  if (bf16) {
    cpu::gemm_bf16_batched_at(batch, ga.transposed, gb.transposed, m, n, k, bf16_bits(ga.tensor),
                              ga.leading, a_offsets, bf16_bits(gb.tensor), gb.leading, b_offsets,
                              out.raw_data(), /*c_bf16=*/true, ldc, c_offsets);
  } else {
    cpu::sgemm_batched_at(batch, ga.transposed, gb.transposed, m, n, k, 1.0f,
                          static_cast<const float*>(ga.tensor.raw_data()), ga.leading, a_offsets,
                          static_cast<const float*>(gb.tensor.raw_data()), gb.leading, b_offsets,
                          0.0f, static_cast<float*>(out.raw_data()), ldc, c_offsets);
  }
}

}  // namespace

namespace nn_internal {
std::vector<int64_t> batch_offsets(const Tensor& t, int64_t count) {
  const Shape batch(t.shape().begin(), t.shape().end() - 2);
  const Strides strides(t.strides().begin(), t.strides().end() - 2);
  std::vector<int64_t> offsets;
  offsets.reserve(static_cast<size_t>(count));
  cpu::for_each_run<1>(batch, {strides}, [&](const auto& off, int64_t run, const auto& step) {
    for (int64_t j = 0; j < run; ++j) offsets.push_back(off[0] + j * step[0]);
  });
  return offsets;
}
}  // namespace nn_internal

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  if (auto out = dispatch_op(OpId::matmul, {a_in, b_in})) return std::move((*out)[0]);
  LOOM_CHECK(a_in.dim() >= 1 && b_in.dim() >= 1,
             "matmul: both operands need at least 1 dim, got shapes {} and {}",
             shape_str(a_in.shape()), shape_str(b_in.shape()));
  const Device device = op_device("matmul", {a_in, b_in});
  LOOM_CHECK(is_floating(a_in.dtype()) && a_in.dtype() == b_in.dtype(),
             "matmul: expected two floating tensors of one dtype, got {} and {}",
             dtype_name(a_in.dtype()), dtype_name(b_in.dtype()));
  const bool a_vector = a_in.dim() == 1, b_vector = b_in.dim() == 1;
  Tensor a = a_vector ? unsqueeze(a_in, 0) : a_in;
  Tensor b = b_vector ? unsqueeze(b_in, -1) : b_in;
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  LOOM_CHECK(k == b.size(-2), "matmul: shapes {} and {} cannot be multiplied ({} != {})",
             shape_str(a_in.shape()), shape_str(b_in.shape()), k, b.size(-2));
  // Broadcast batch dims.
  const Shape a_batch(a.shape().begin(), a.shape().end() - 2);
  const Shape b_batch(b.shape().begin(), b.shape().end() - 2);
  const Shape batch = broadcast_shapes(a_batch, b_batch, "matmul");
  Shape a_full = batch, b_full = batch;
  a_full.insert(a_full.end(), {m, k});
  b_full.insert(b_full.end(), {k, n});
  // cuBLASLt takes bf16/f16 as they are; on CPU bf16 runs natively where the CPU has bf16 dot
  // products (gemm_bf16.h), everything else in f32.
  const bool like_cpu = allocates_like_cpu(device);
  const bool native_bf16 = like_cpu && a.dtype() == kBFloat16 && cpu::bf16_gemm_native();
  const DType gemm_dtype = !like_cpu || native_bf16 ? a.dtype() : kFloat32;
  if (a.dtype() != gemm_dtype) {
    a = to(a, kFloat32);
    b = to(b, kFloat32);
  }
  a = a.shape() == a_full ? a : expand(a, a_full);
  b = b.shape() == b_full ? b : expand(b, b_full);
  Shape out_shape = batch;
  out_shape.insert(out_shape.end(), {m, n});
  Tensor out = Tensor::empty(out_shape, gemm_dtype, device);
  const int64_t batch_count = shape_numel(batch);
  FlopCounter::record(2 * batch_count * m * n * k);

  GemmOperand ga = as_gemm_operand(a), gb = as_gemm_operand(b);
  int64_t stride_a = 0, stride_b = 0;
  if (batch_count == 0 || device.is_meta()) {
    // Nothing to multiply (meta: shapes only).
  } else if (device.is_cpu()) {
    cpu_products(ga, gb, /*shared_b=*/shape_numel(b_batch) == 1, batch_count, m, n, k, out);
  } else if (uniform_batch_stride(ga.tensor, &stride_a) &&
             uniform_batch_stride(gb.tensor, &stride_b)) {
    cuda_batched_gemm(batch_count, ga.transposed, gb.transposed, m, n, k, ga.tensor, ga.leading,
                      stride_a, gb.tensor, gb.leading, stride_b, out);
  } else {
    // Irregular batch layout for cuBLASLt's strided batch: contiguous copies.
    const Tensor a3 = reshape(contiguous(ga.tensor), {batch_count, m, k});
    const Tensor b3 = reshape(contiguous(gb.tensor), {batch_count, k, n});
    cuda_batched_gemm(batch_count, false, false, m, n, k, a3, std::max<int64_t>(k, 1), m * k, b3,
                      std::max<int64_t>(n, 1), k * n, out);
  }
  if (out.dtype() != a_in.dtype()) out = to(out, a_in.dtype());
  if (a_vector) out = squeeze(out, -2);
  if (b_vector) out = squeeze(out, -1);
  return out;
}

Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias) {
  LOOM_CHECK(input.defined() && weight.defined(),
             "linear: the input and the weight must be defined");
  LOOM_CHECK(input.dim() >= 1 && weight.dim() == 2 && input.size(-1) == weight.size(1),
             "linear: input of shape {} does not end in in_features={} (weight shape {}, expected "
             "(out, in))",
             shape_str(input.shape()), weight.dim() == 2 ? weight.size(1) : -1,
             shape_str(weight.shape()));
  const int64_t n = weight.size(0), k = weight.size(1);
  LOOM_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == n),
             "linear: the bias must have shape ({}), got {}", n, shape_str(bias.shape()));
  // DTensors: the composed ops, whose sharding rules exist, so sharding propagation sees the
  // matmul and the add rather than one opaque node. Where autograd records, it records linear
  // itself (its forward comes back here below autograd and composes): linear's backward takes
  // the weight's gradient as dY^T X, laid out as the weight is, where the composed ops' would be
  // the transpose of X^T dY, and every accumulation of it a transposed add.
  const bool extended =
      input.extension() || weight.extension() || (bias.defined() && bias.extension());
  const bool records = recording_enabled() && (input.requires_grad() || weight.requires_grad() ||
                                               (bias.defined() && bias.requires_grad()));
  if (extended && !records) {
    const Tensor out = matmul(input, transpose(weight, 0, 1));
    return bias.defined() ? add(out, bias) : out;
  }
  if (auto out = dispatch_op(OpId::linear, {input, weight, bias})) return std::move((*out)[0]);
  LOOM_INTERNAL_ASSERT(!extended, "linear: DTensor inputs that require grad reached the kernel");
  const Tensor weight_t = transpose(weight, 0, 1);  // a view the GEMM takes as a flag
  if (!bias.defined()) return matmul(input, weight_t);
  const Device device = op_device("linear", {input, weight, bias});
  LOOM_CHECK(is_floating(input.dtype()) && input.dtype() == weight.dtype() &&
                 input.dtype() == bias.dtype(),
             "linear: expected floating input, weight and bias of one dtype, got {}, {} and {}",
             dtype_name(input.dtype()), dtype_name(weight.dtype()), dtype_name(bias.dtype()));
  Shape out_shape = input.shape();
  out_shape.back() = n;
  const int64_t m = shape_numel(input.shape()) / std::max<int64_t>(k, 1);
  if (device.is_cpu() && input.dtype() == kBFloat16 && cpu::bf16_gemm_native()) {
    // bf16 in, bias added to the f32 accumulator, one rounding to bf16 (gemm_bf16.h).
    const GemmOperand x = as_gemm_operand(reshape(input, {m, k}));
    const GemmOperand w = as_gemm_operand(weight_t);
    const Tensor b = contiguous(bias);
    Tensor out = Tensor::empty({m, n}, kBFloat16, device);
    FlopCounter::record(2 * m * n * k);
    cpu::gemm_bf16(x.transposed, w.transposed, m, n, k, bf16_bits(x.tensor), x.leading,
                   bf16_bits(w.tensor), w.leading, out.raw_data(), /*c_bf16=*/true,
                   std::max<int64_t>(n, 1), bf16_bits(b));
    return reshape(out, out_shape);
  }
  const bool misaligned_bias =
      device.is_cuda() && reinterpret_cast<uintptr_t>(bias.raw_data()) % cuda::kBiasAlignment != 0;
  // cuBLASLt's heuristic rejects bias-epilogue problems with one row or column in the weight
  // (torch's addmm avoids them for that reason): K or N of 1 compose too, as does K == 0.
  if (k <= 1 || n <= 1 || !bias.is_contiguous() || misaligned_bias) {
    return add(matmul(input, weight_t), bias);
  }

  FlopCounter::record(2 * m * n * k);
  if (device.is_meta()) {
    // As cuBLASLt or the CPU's f32 GEMM allocate (the native bf16 path above needs values).
    if (!allocates_like_cpu(device) || input.dtype() == kFloat32) {
      return reshape(Tensor::empty({m, n}, input.dtype(), device), out_shape);
    }
    const bool native = input.dtype() == kBFloat16 && cpu::bf16_gemm_native();
    if (native) return reshape(Tensor::empty({m, n}, kBFloat16, device), out_shape);
    const Tensor x = to(input, kFloat32), w = to(weight_t, kFloat32), b = to(bias, kFloat32);
    return reshape(to(Tensor::empty({m, n}, kFloat32, device), input.dtype()), out_shape);
  }
  // Without native bf16 the CPU GEMM is f32 only; cuBLASLt takes bf16/f16 as they are.
  const DType gemm_dtype = device.is_cuda() ? input.dtype() : kFloat32;
  const GemmOperand x = as_gemm_operand(reshape(to(input, gemm_dtype), {m, k}));
  const GemmOperand w = as_gemm_operand(to(weight_t, gemm_dtype));
  const Tensor b = to(bias, gemm_dtype);
  Tensor out = Tensor::empty({m, n}, gemm_dtype, device);
  const int64_t ldc = std::max<int64_t>(n, 1);
  if (device.is_cuda()) {
    cuda::GemmProblem p{.dtype = gemm_dtype,
                        .transpose_a = x.transposed,
                        .transpose_b = w.transposed,
                        .m = m,
                        .n = n,
                        .k = k,
                        .lda = x.leading,
                        .ldb = w.leading,
                        .ldc = ldc,
                        .stride_a = 0,
                        .stride_b = 0,
                        .stride_c = m * n,
                        .batch = 1};
    cuda::gemm(p, x.tensor.raw_data(), w.tensor.raw_data(), out.raw_data(), device.index,
               b.raw_data());
  } else {
    copy_uncounted_(out, b);  // every row starts as the bias; the GEMM adds the product (beta = 1)
    cpu::sgemm(x.transposed, w.transposed, m, n, k, 1.0f,
               static_cast<const float*>(x.tensor.raw_data()), x.leading,
               static_cast<const float*>(w.tensor.raw_data()), w.leading, 1.0f,
               static_cast<float*>(out.raw_data()), ldc);
  }
  if (out.dtype() != input.dtype()) out = to(out, input.dtype());
  return reshape(out, out_shape);
}

}  // namespace loom::ops
