#include "tensor/ops_elementwise.h"

#include <array>
#include <cmath>
#include <optional>
#include <span>

#include "base/error.h"
#include "tensor/cpu/element_types.h"
#include "tensor/cpu/strided_loop.h"
#include "tensor/cpu/transpose.h"
#include "tensor/cpu/vector_math.h"
#include "tensor/cuda/kernels/adamw.h"
#include "tensor/dispatch.h"
#include "tensor/flop_counter.h"
#include "tensor/op_device.h"
#include "tensor/ops_copy.h"
#include "tensor/ops_create.h"
#include "tensor/ops_cuda.h"
#include "tensor/ops_views.h"

namespace loom::ops {

namespace {

DType promote(DType a, DType b) {
  if (a == b) return a;
  if (is_floating(a) && is_floating(b)) return kFloat32;
  if (is_floating(a)) return a;
  if (is_floating(b)) return b;
  return kInt64;
}

using BinaryOp = cuda::kernels::BinaryOp;
using UnaryOp = cuda::kernels::UnaryOp;

void check_defined(const Tensor& t, std::string_view op) {
  LOOM_CHECK(t.defined(), "{}: got an undefined tensor", op);
}

// Whether every tensor is a contiguous f32 CPU tensor: the vectorized kernels' case.
bool fast_f32(std::initializer_list<Tensor> tensors) {
  for (const Tensor& t : tensors) {
    if (!t.defined() || t.dtype() != kFloat32 || !t.device().is_cpu() || !t.is_contiguous())
      return false;
  }
  return true;
}

// Meta tensors that the CPU's fast_f32 kernels would take (tensor/device.h, meta_target): those
// kernels write in place, so a trace of a CPU job allocates nothing for them.
bool meta_like_fast_f32(std::initializer_list<Tensor> tensors) {
  for (const Tensor& t : tensors) {
    if (!t.defined() || t.dtype() != kFloat32 || !t.device().is_meta() ||
        !allocates_like_cpu(t.device()) || !t.is_contiguous())
      return false;
  }
  return true;
}

// The vectorized kernel of an arithmetic op (tensor/cpu/vector_math.h), if it has one.
std::optional<cpu::Arith> vector_arith(BinaryOp code) {
  switch (code) {
    case BinaryOp::kAdd:
      return cpu::Arith::kAdd;
    case BinaryOp::kSub:
      return cpu::Arith::kSub;
    case BinaryOp::kMul:
      return cpu::Arith::kMul;
    case BinaryOp::kDiv:
      return cpu::Arith::kDiv;
    default:
      return std::nullopt;
  }
}

std::optional<cpu::Arith> vector_arith(UnaryOp code) {
  switch (code) {
    case UnaryOp::kAddScalar:
      return cpu::Arith::kAdd;
    case UnaryOp::kSubScalar:
      return cpu::Arith::kSub;
    case UnaryOp::kMulScalar:
      return cpu::Arith::kMul;
    case UnaryOp::kDivScalar:
      return cpu::Arith::kDiv;
    case UnaryOp::kRsubScalar:
      return cpu::Arith::kRsub;
    default:
      return std::nullopt;
  }
}

// out = a (op) b in f32 where an operand is stored transposed (a weight's gradient taken through
// a transposed view, added to its accumulated gradient), by cpu::arith_f32_matrix over the row
// blocks of the (outer dims x rows, cols) layout; false when the layout is not one it takes.
bool arith_transposed_f32(cpu::Arith op, const Tensor& out, const Tensor& a, const Tensor& b) {
  if (out.dtype() != kFloat32 || a.dtype() != kFloat32 || b.dtype() != kFloat32) return false;
  const auto layout = cpu::collapse_runs<3>(out.shape(), {out.strides(), a.strides(), b.strides()});
  if (!cpu::takes_matrix_layout(layout)) return false;
  const cpu::MatrixView out_view = cpu::matrix_view(nullptr, layout, 0);
  if (!out_view.row_major()) return false;  // the output is written row by row
  float* o = out.data<float>();
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  cpu::parallel_for_each_row_block(
      layout, [&](const std::array<int64_t, 3>& bases, int64_t r0, int64_t r1) {
        cpu::arith_f32_matrix(op, cpu::matrix_view(pa + bases[1], layout, 1),
                              cpu::matrix_view(pb + bases[2], layout, 2), o + bases[0],
                              out_view.row_stride, r0, r1, layout.sizes.back());
      });
  return true;
}

// out[i] = f(a[i], b[i]) over the broadcast shape, computing in ComputeType; on CUDA the kernel
// of `code` computes the same.
template <typename F>
Tensor binary(const Tensor& a_dev, const Tensor& b_dev, std::string_view op, BinaryOp code, F f,
              bool floating_only = false) {
  check_defined(a_dev, op);
  check_defined(b_dev, op);
  const std::array<const Tensor*, 2> operands{&a_dev, &b_dev};
  const Device device = op_device(op, std::span<const Tensor* const>(operands));
  const DType dtype = promote(a_dev.dtype(), b_dev.dtype());
  LOOM_CHECK(!floating_only || is_floating(dtype), "{}: expected floating tensors, got {} and {}",
             op, dtype_name(a_dev.dtype()), dtype_name(b_dev.dtype()));
  // Same shapes (the usual case) need no broadcast shape built.
  Shape broadcast;
  const bool same_shape = a_dev.shape() == b_dev.shape();
  if (!same_shape) broadcast = broadcast_shapes(a_dev.shape(), b_dev.shape(), op);
  const Shape& shape = same_shape ? a_dev.shape() : broadcast;
  // Each operand by reference when it needs no move, conversion or expansion (the usual case:
  // no tensor handle is copied); otherwise the prepared tensor, held in `held`.
  const auto prepare = [&](const Tensor& t, Tensor& held) -> const Tensor& {
    if (t.device() == device && t.dtype() == dtype && t.shape() == shape) return t;
    held = to(on_device(t, device), dtype);
    if (held.shape() != shape) held = expand(held, shape);
    return held;
  };
  Tensor a_held, b_held;
  const Tensor& ax = prepare(a_dev, a_held);
  const Tensor& bx = prepare(b_dev, b_held);
  Tensor out = Tensor::empty(shape, dtype, device);
  if (device.is_meta()) return out;  // shapes only (tensor/device.h)
  if (device.is_cuda()) {
    cuda_backend::binary(code, out, ax, bx);
    return out;
  }
  if (const auto arith = vector_arith(code); arith && fast_f32({ax, bx})) {
    cpu::arith_f32(*arith, ax.data<float>(), bx.data<float>(), out.data<float>(), out.numel());
    return out;
  }
  if (const auto arith = vector_arith(code); arith && arith_transposed_f32(*arith, out, ax, bx)) {
    return out;
  }
  cpu::visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* o = static_cast<T*>(out.raw_data());
    const T* pa = static_cast<const T*>(ax.raw_data());
    const T* pb = static_cast<const T*>(bx.raw_data());
    cpu::parallel_for_each_run<3>(
        shape, {out.strides(), ax.strides(), bx.strides()},
        [&](const auto& off, int64_t count, const auto& in) {
          T* oo = o + off[0];
          const T* aa = pa + off[1];
          const T* bb = pb + off[2];
          if (in[0] == 1 && in[1] == 1 && in[2] == 1) {
            for (int64_t j = 0; j < count; ++j) {
              oo[j] = cpu::from_compute<T>(f(cpu::to_compute(aa[j]), cpu::to_compute(bb[j])));
            }
          } else {
            for (int64_t j = 0; j < count; ++j) {
              oo[j * in[0]] = cpu::from_compute<T>(
                  f(cpu::to_compute(aa[j * in[1]]), cpu::to_compute(bb[j * in[2]])));
            }
          }
        });
  });
  return out;
}

// out[i] = f(a[i]), computing in ComputeType (on CUDA: the kernel of `code`, with `scalar`).
// kFloatingOnly restricts `a` to the floating dtypes (computed in f32; integer dtypes fail naming
// `op`), otherwise any dtype is accepted.
template <bool kFloatingOnly, typename F>
Tensor unary(const Tensor& a, std::string_view op, UnaryOp code, float scalar, F f) {
  check_defined(a, op);
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  if (a.device().is_meta()) return out;
  if (a.device().is_cuda()) {
    LOOM_CHECK(!kFloatingOnly || is_floating(a.dtype()),
               "{}: expected a floating dtype (f32, bf16, f16), got {}", op, dtype_name(a.dtype()));
    cuda_backend::unary(code, out, a, scalar);
    return out;
  }
  const auto kernel = [&](auto tag) {
    using T = decltype(tag);
    T* o = static_cast<T*>(out.raw_data());
    const T* pa = static_cast<const T*>(a.raw_data());
    cpu::parallel_for_each_run<2>(a.shape(), {out.strides(), a.strides()},
                                  [&](const auto& off, int64_t count, const auto& in) {
                                    for (int64_t j = 0; j < count; ++j) {
                                      o[off[0] + j * in[0]] = cpu::from_compute<T>(
                                          f(cpu::to_compute(pa[off[1] + j * in[1]])));
                                    }
                                  });
  };
  if constexpr (kFloatingOnly) {
    cpu::visit_floating_dtype(a.dtype(), op.data(), kernel);
  } else {
    cpu::visit_dtype(a.dtype(), kernel);
  }
  return out;
}

template <typename F>
Tensor unary_floating(const Tensor& a, std::string_view op, UnaryOp code, F f,
                      float scalar = 0.0f) {
  return unary</*kFloatingOnly=*/true>(a, op, code, scalar, f);
}

template <typename F>
Tensor unary_any(const Tensor& a, std::string_view op, UnaryOp code, F f) {
  return unary</*kFloatingOnly=*/false>(a, op, code, 0.0f, f);
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

}  // namespace

#define LOOM_DISPATCH_OR_RETURN(op, ...) \
  if (auto out = dispatch_op(op, __VA_ARGS__)) return std::move((*out)[0])

Tensor add(const Tensor& a, const Tensor& b) {
  LOOM_DISPATCH_OR_RETURN(OpId::add, {a, b});
  return binary(a, b, "add", BinaryOp::kAdd, [](auto x, auto y) { return x + y; });
}
Tensor sub(const Tensor& a, const Tensor& b) {
  LOOM_DISPATCH_OR_RETURN(OpId::sub, {a, b});
  return binary(a, b, "sub", BinaryOp::kSub, [](auto x, auto y) { return x - y; });
}
Tensor mul(const Tensor& a, const Tensor& b) {
  LOOM_DISPATCH_OR_RETURN(OpId::mul, {a, b});
  return binary(a, b, "mul", BinaryOp::kMul, [](auto x, auto y) { return x * y; });
}
Tensor div(const Tensor& a, const Tensor& b) {
  LOOM_DISPATCH_OR_RETURN(OpId::div, {a, b});
  return binary(
      a, b, "div", BinaryOp::kDiv, [](auto x, auto y) { return x / y; }, /*floating_only=*/true);
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  LOOM_DISPATCH_OR_RETURN(OpId::maximum, {a, b});
  return binary(a, b, "maximum", BinaryOp::kMaximum,
                [](auto x, auto y) { return x > y || x != x ? x : y; });
}
Tensor eq(const Tensor& a, const Tensor& b) {
  LOOM_DISPATCH_OR_RETURN(OpId::eq, {a, b});
  return binary(a, b, "eq", BinaryOp::kEq,
                [](auto x, auto y) { return x == y ? decltype(x){1} : decltype(x){0}; });
}
Tensor gt(const Tensor& a, const Tensor& b) {
  LOOM_DISPATCH_OR_RETURN(OpId::gt, {a, b});
  return binary(a, b, "gt", BinaryOp::kGt,
                [](auto x, auto y) { return x > y ? decltype(x){1} : decltype(x){0}; });
}

// Scalar forms: the scalar is applied in f32 for floating tensors (as PyTorch does for a
// Python float with a float tensor) and promotes integer tensors to f32.
namespace {
template <typename F>
Tensor scalar_op(const Tensor& a, double b, std::string_view op, UnaryOp code, F f) {
  check_defined(a, op);
  const Tensor x = is_floating(a.dtype()) ? a : to(a, kFloat32);
  const float s = static_cast<float>(b);
  if (const auto arith = vector_arith(code); arith && fast_f32({x})) {
    Tensor out = Tensor::empty(x.shape(), kFloat32);
    cpu::arith_scalar_f32(*arith, x.data<float>(), s, out.data<float>(), x.numel());
    return out;
  }
  return unary_floating(
      x, op, code, [&](float v) { return f(v, s); }, s);
}
}  // namespace

Tensor add(const Tensor& a, double b) {
  LOOM_DISPATCH_OR_RETURN(OpId::add_scalar, {a}, {b});
  return scalar_op(a, b, "add", UnaryOp::kAddScalar, [](float x, float s) { return x + s; });
}
Tensor sub(const Tensor& a, double b) {
  LOOM_DISPATCH_OR_RETURN(OpId::sub_scalar, {a}, {b});
  return scalar_op(a, b, "sub", UnaryOp::kSubScalar, [](float x, float s) { return x - s; });
}
Tensor rsub(const Tensor& a, double b) {
  LOOM_DISPATCH_OR_RETURN(OpId::rsub_scalar, {a}, {b});
  return scalar_op(a, b, "rsub", UnaryOp::kRsubScalar, [](float x, float s) { return s - x; });
}
Tensor mul(const Tensor& a, double b) {
  LOOM_DISPATCH_OR_RETURN(OpId::mul_scalar, {a}, {b});
  return scalar_op(a, b, "mul", UnaryOp::kMulScalar, [](float x, float s) { return x * s; });
}
Tensor div(const Tensor& a, double b) {
  LOOM_DISPATCH_OR_RETURN(OpId::div_scalar, {a}, {b});
  return scalar_op(a, b, "div", UnaryOp::kDivScalar, [](float x, float s) { return x / s; });
}

Tensor neg(const Tensor& a) {
  LOOM_DISPATCH_OR_RETURN(OpId::neg, {a});
  return unary_any(a, "neg", UnaryOp::kNeg, [](auto x) { return -x; });
}
Tensor abs(const Tensor& a) {
  LOOM_DISPATCH_OR_RETURN(OpId::abs, {a});
  return unary_any(a, "abs", UnaryOp::kAbs, [](auto x) { return x < 0 ? -x : x; });
}
Tensor exp(const Tensor& a) {
  LOOM_DISPATCH_OR_RETURN(OpId::exp, {a});
  return unary_floating(a, "exp", UnaryOp::kExp, [](float x) { return std::exp(x); });
}
Tensor log(const Tensor& a) {
  LOOM_DISPATCH_OR_RETURN(OpId::log, {a});
  return unary_floating(a, "log", UnaryOp::kLog, [](float x) { return std::log(x); });
}
Tensor tanh(const Tensor& a) {
  LOOM_DISPATCH_OR_RETURN(OpId::tanh, {a});
  return unary_floating(a, "tanh", UnaryOp::kTanh, [](float x) { return std::tanh(x); });
}
// Written so that exp never overflows: for x < 0, e^x / (1 + e^x).
inline float sigmoid_f(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + std::exp(-x));
  const float e = std::exp(x);
  return e / (1.0f + e);
}
Tensor sigmoid(const Tensor& a) {
  LOOM_DISPATCH_OR_RETURN(OpId::sigmoid, {a});
  return unary_floating(a, "sigmoid", UnaryOp::kSigmoid, [](float x) { return sigmoid_f(x); });
}
Tensor silu(const Tensor& a) {
  LOOM_DISPATCH_OR_RETURN(OpId::silu, {a});
  return unary_floating(a, "silu", UnaryOp::kSilu, [](float x) { return x * sigmoid_f(x); });
}
Tensor sqrt(const Tensor& a) {
  LOOM_DISPATCH_OR_RETURN(OpId::sqrt, {a});
  return unary_floating(a, "sqrt", UnaryOp::kSqrt, [](float x) { return std::sqrt(x); });
}
Tensor rsqrt(const Tensor& a) {
  LOOM_DISPATCH_OR_RETURN(OpId::rsqrt, {a});
  return unary_floating(a, "rsqrt", UnaryOp::kRsqrt, [](float x) { return 1.0f / std::sqrt(x); });
}
Tensor pow(const Tensor& a, double exponent) {
  LOOM_DISPATCH_OR_RETURN(OpId::pow, {a}, {exponent});
  const float e = static_cast<float>(exponent);
  if (exponent == 2.0)
    return unary_floating(a, "pow", UnaryOp::kSquare, [](float x) { return x * x; });
  return unary_floating(
      a, "pow", UnaryOp::kPow, [e](float x) { return std::pow(x, e); }, e);
}
Tensor relu(const Tensor& a) {
  LOOM_DISPATCH_OR_RETURN(OpId::relu, {a});
  // NaN propagates (x != x), as in torch.relu and this file's maximum.
  return unary_floating(a, "relu", UnaryOp::kRelu,
                        [](float x) { return x > 0.0f || x != x ? x : 0.0f; });
}
Tensor gelu(const Tensor& a) {
  LOOM_DISPATCH_OR_RETURN(OpId::gelu, {a});
  if (fast_f32({a})) {  // the vectorized, threaded kernel (tensor/cpu/vector_math.h)
    Tensor out = Tensor::empty(a.shape(), kFloat32);
    cpu::gelu_f32(a.data<float>(), out.data<float>(), a.numel());
    return out;
  }
  if (allocates_like_cpu(a.device()) && a.dtype() == kBFloat16) {
    // Mixed precision: the f32 kernel between two conversions (one rounding, as the scalar
    // loop's), ~8x faster than the scalar loop on bf16 elements.
    return to(gelu(to(a, kFloat32)), kBFloat16);
  }
  return unary_floating(a, "gelu", UnaryOp::kGelu, [](float x) {
    return 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + kGeluCubic * x * x * x)));
  });
}
Tensor gelu_backward(const Tensor& grad, const Tensor& x) {
  LOOM_DISPATCH_OR_RETURN(OpId::gelu_backward, {grad, x});
  if (fast_f32({grad, x}) && grad.shape() == x.shape()) {
    Tensor out = Tensor::empty(x.shape(), kFloat32);
    cpu::gelu_backward_f32(grad.data<float>(), x.data<float>(), out.data<float>(), x.numel());
    return out;
  }
  if (allocates_like_cpu(x.device()) && grad.dtype() == kBFloat16 && x.dtype() == kBFloat16 &&
      grad.shape() == x.shape()) {
    return to(gelu_backward(to(grad, kFloat32), to(x, kFloat32)), kBFloat16);
  }
  return binary(
      grad, x, "gelu_backward", BinaryOp::kGeluBackward,
      [](float g, float v) {
        const float inner = kGeluScale * (v + kGeluCubic * v * v * v);
        const float t = std::tanh(inner);
        const float d_inner = kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
        return g * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * d_inner);
      },
      /*floating_only=*/true);
}

// silu's derivative s (1 + x (1 - s)) given s = sigmoid(x), rounded after each operation as the
// composed ops (sigmoid, rsub, mul, add, mul) rounded it: GCC contracts x * (1 - s) + 1 into one
// FMA under -march=x86-64-v3, so the product is pinned to a register (an empty asm) first. The
// fused ops then give the composed formula's values bit for bit on the CPU, and training runs do
// not move by a rounding.
inline float silu_derivative(float x, float s) {
  float x_times = x * (1.0f - s);
#if defined(__x86_64__) || defined(__i386__)
  asm("" : "+x"(x_times));  // an SSE/AVX register: rounded to f32, out of reach of an FMA
#else
  volatile float rounded = x_times;  // elsewhere, a store and a load do the same
  x_times = rounded;
#endif
  return s * (1.0f + x_times);
}

Tensor silu_backward(const Tensor& grad, const Tensor& x) {
  LOOM_DISPATCH_OR_RETURN(OpId::silu_backward, {grad, x});
  return binary(
      grad, x, "silu_backward", BinaryOp::kSiluBackward,
      [](float g, float v) { return g * silu_derivative(v, sigmoid_f(v)); },
      /*floating_only=*/true);
}

Tensor silu_mul(const Tensor& gate, const Tensor& up) {
  LOOM_DISPATCH_OR_RETURN(OpId::silu_mul, {gate, up});
  return binary(
      gate, up, "silu_mul", BinaryOp::kSiluMul,
      [](float g, float u) { return g * sigmoid_f(g) * u; }, /*floating_only=*/true);
}

SiluMulGrads silu_mul_backward(const Tensor& grad, const Tensor& gate, const Tensor& up) {
  if (auto r = dispatch_op(OpId::silu_mul_backward, {grad, gate, up})) return {(*r)[0], (*r)[1]};
  constexpr std::string_view op = "silu_mul_backward";
  check_defined(grad, op);
  check_defined(gate, op);
  check_defined(up, op);
  const Device device = op_device(op, {grad, gate, up});
  const DType dtype = promote(grad.dtype(), promote(gate.dtype(), up.dtype()));
  LOOM_CHECK(is_floating(dtype), "{}: expected floating tensors, got {}, {} and {}", op,
             dtype_name(grad.dtype()), dtype_name(gate.dtype()), dtype_name(up.dtype()));
  const Shape shape =
      broadcast_shapes(grad.shape(), broadcast_shapes(gate.shape(), up.shape(), op), op);
  const auto prepared = [&](const Tensor& t) {
    return expand(to(on_device(t, device), dtype), shape);
  };
  const Tensor g = prepared(grad), x = prepared(gate), u = prepared(up);
  SiluMulGrads out{Tensor::empty(shape, dtype, device), Tensor::empty(shape, dtype, device)};
  if (device.is_meta()) return out;
  if (device.is_cuda()) {
    cuda_backend::silu_mul_backward(out.grad_gate, out.grad_up, g, x, u);
    return out;
  }
  cpu::visit_floating_dtype(dtype, "silu_mul_backward", [&](auto tag) {
    using T = decltype(tag);
    T* dg = static_cast<T*>(out.grad_gate.raw_data());
    T* du = static_cast<T*>(out.grad_up.raw_data());
    const T* pg = static_cast<const T*>(g.raw_data());
    const T* px = static_cast<const T*>(x.raw_data());
    const T* pu = static_cast<const T*>(u.raw_data());
    cpu::parallel_for_each_run<5>(
        shape,
        {out.grad_gate.strides(), out.grad_up.strides(), g.strides(), x.strides(), u.strides()},
        [&](const auto& off, int64_t count, const auto& in) {
          for (int64_t j = 0; j < count; ++j) {
            const float gv = cpu::to_compute(pg[off[2] + j * in[2]]);
            const float xv = cpu::to_compute(px[off[3] + j * in[3]]);
            const float uv = cpu::to_compute(pu[off[4] + j * in[4]]);
            const float s = sigmoid_f(xv);
            dg[off[0] + j * in[0]] = cpu::from_compute<T>(gv * uv * silu_derivative(xv, s));
            du[off[1] + j * in[1]] = cpu::from_compute<T>(gv * (xv * s));
          }
        });
  });
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  LOOM_DISPATCH_OR_RETURN(OpId::where, {cond, a, b});
  check_defined(cond, "where");
  check_defined(a, "where");
  check_defined(b, "where");
  const Device device = op_device("where", {cond, a, b});
  const Shape shape =
      broadcast_shapes(cond.shape(), broadcast_shapes(a.shape(), b.shape(), "where"), "where");
  const Tensor c = to(expand(on_device(cond, device), shape), kFloat32);
  // cond != 0 ? a : b == b + (a - b) * [cond != 0] would lose NaN/inf exactness; select instead.
  const DType dtype = promote(a.dtype(), b.dtype());
  const Tensor ax = expand(to(on_device(a, device), dtype), shape);
  const Tensor bx = expand(to(on_device(b, device), dtype), shape);
  Tensor out = Tensor::empty(shape, dtype, device);
  if (device.is_meta()) return out;
  if (device.is_cuda()) {
    cuda_backend::where(out, c, ax, bx);
    return out;
  }
  cpu::visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const float* pc = static_cast<const float*>(c.raw_data());
    const T* pa = static_cast<const T*>(ax.raw_data());
    const T* pb = static_cast<const T*>(bx.raw_data());
    T* o = static_cast<T*>(out.raw_data());
    cpu::parallel_for_each_run<4>(shape, {out.strides(), c.strides(), ax.strides(), bx.strides()},
                                  [&](const auto& off, int64_t count, const auto& in) {
                                    for (int64_t j = 0; j < count; ++j) {
                                      o[off[0] + j * in[0]] = pc[off[1] + j * in[1]] != 0.0f
                                                                  ? pa[off[2] + j * in[2]]
                                                                  : pb[off[3] + j * in[3]];
                                    }
                                  });
  });
  return out;
}

Tensor masked_fill(const Tensor& self, const Tensor& mask, double value) {
  LOOM_DISPATCH_OR_RETURN(OpId::masked_fill, {self, mask}, {value});
  check_defined(self, "masked_fill");
  LOOM_CHECK(broadcast_shapes(self.shape(), mask.shape(), "masked_fill") == self.shape(),
             "masked_fill: mask of shape {} does not broadcast to self's shape {}",
             shape_str(mask.shape()), shape_str(self.shape()));
  return where(mask, full({}, value, self.dtype()), self);
}

namespace {

// Whether an in-place op writes `self` by a GPU's elementwise kernel directly (a GPU, or a meta
// trace of one), instead of computing a temporary and copying it back: self holds each element
// once (contiguous), and `other`, when given, has self's dtype and device, broadcasts to self's
// shape, and lives in another storage or is self itself. Each element is read and then written
// by one thread, so a shifted or transposed view of self, read after another thread wrote it,
// takes the temporary.
bool gpu_writes_in_place(const Tensor& self, const Tensor* other) {
  if (allocates_like_cpu(self.device()) || self.extension() || !self.is_contiguous()) return false;
  if (other == nullptr) return true;
  if (other->extension() || other->dtype() != self.dtype() || other->device() != self.device())
    return false;
  if (other->shape() != self.shape() &&
      broadcast_shapes(self.shape(), other->shape(), "add_") != self.shape())
    return false;
  return self.storage() != other->storage() ||
         (other->offset() == self.offset() && other->shape() == self.shape() &&
          other->strides() == self.strides());
}

// A GPU's f32 tensor gaining a same-shaped contiguous tensor of a lower floating precision (a bf16
// gradient accumulated into an f32 .grad): one kernel converting as it adds.
bool gpu_accumulates_converting(const Tensor& self, const Tensor& other) {
  return !allocates_like_cpu(self.device()) && !self.extension() && !other.extension() &&
         self.dtype() == kFloat32 && is_floating(other.dtype()) && other.dtype() != kFloat32 &&
         self.device() == other.device() && self.shape() == other.shape() && self.is_contiguous() &&
         other.is_contiguous() && self.storage() != other.storage();
}

}  // namespace

void add_(const Tensor& self, const Tensor& other) {
  if (dispatch_op(OpId::add_, {self, other})) return;
  FlopCounter::record_in_place(self, 3);
  if (gpu_accumulates_converting(self, other)) {
    if (self.device().is_cuda()) cuda_backend::accumulate_f32(self, other);
    return;
  }
  if (gpu_writes_in_place(self, &other)) {
    if (self.device().is_cuda()) {
      cuda_backend::binary(BinaryOp::kAdd, self, self,
                           other.shape() == self.shape() ? other : expand(other, self.shape()));
    }
    return;
  }
  // The vectorized kernel writing into self (each element read, then written: the values of
  // add's loop, without its temporary and the copy back), unless `other` overlaps self shifted.
  const bool overlaps_shifted =
      self.storage() == other.storage() && self.offset() != other.offset();
  if (meta_like_fast_f32({self, other}) && self.shape() == other.shape()) return;
  if (fast_f32({self, other}) && self.shape() == other.shape() && !overlaps_shifted) {
    cpu::arith_f32(cpu::Arith::kAdd, self.data<float>(), other.data<float>(), self.data<float>(),
                   self.numel());
    return;
  }
  copy_(self, add(self, other));
}

void mul_(const Tensor& self, double scalar) {
  if (dispatch_op(OpId::mul_scalar_, {self}, {scalar})) return;
  FlopCounter::record_in_place(self, 2);
  if (is_floating(self.dtype()) && gpu_writes_in_place(self, nullptr)) {
    if (self.device().is_cuda()) {
      cuda_backend::unary(UnaryOp::kMulScalar, self, self, static_cast<float>(scalar));
    }
    return;
  }
  if (meta_like_fast_f32({self})) return;
  if (fast_f32({self})) {
    cpu::arith_scalar_f32(cpu::Arith::kMul, self.data<float>(), static_cast<float>(scalar),
                          self.data<float>(), self.numel());
    return;
  }
  copy_(self, mul(self, scalar));
}

#undef LOOM_DISPATCH_OR_RETURN

bool adamw_fusable(const AdamWParameter& x) {
  const Tensor& p = x.param;
  for (const Tensor* t : {&x.param, &x.grad, &x.exp_avg, &x.exp_avg_sq}) {
    if (!t->defined() || t->extension() || t->dtype() != kFloat32 || !t->is_contiguous() ||
        t->shape() != p.shape() || t->device() != p.device())
      return false;
  }
  return p.device().is_cpu() || p.device().is_cuda() || p.device().is_meta();
}

void adamw_update_fused_(std::span<const AdamWParameter> params, const AdamWHyperparameters& h) {
  std::optional<Device> cuda_device;  // the one GPU whose parameters go to the kernel
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i].param;
    LOOM_CHECK(adamw_fusable(params[i]),
               "adamw_update_fused_: parameter {} ({}, grad {}) is not four contiguous f32 "
               "tensors of one shape on one device; compose its update from ops instead",
               i, p.description(), params[i].grad.description());
    if (!p.device().is_cuda()) continue;
    if (!cuda_device) cuda_device = p.device();
    LOOM_CHECK(p.device() == *cuda_device,
               "adamw_update_fused_: parameters on {} and {}; give one GPU's per call",
               cuda_device->str(), p.device().str());
  }
  // The f32 hyperparameters both kernels compute with.
  const cuda::kernels::AdamWHyper f{.lr = static_cast<float>(h.lr),
                                    .beta1 = static_cast<float>(h.beta1),
                                    .beta2 = static_cast<float>(h.beta2),
                                    .eps = static_cast<float>(h.eps),
                                    .weight_decay = static_cast<float>(h.weight_decay)};
  std::vector<cuda::kernels::AdamWTensor> on_cuda;
  for (const AdamWParameter& x : params) {
    // One pass reading the four f32 tensors and writing param and the moments back; nothing
    // allocated, on a meta trace either (the CPU and CUDA passes both work in place).
    FlopCounter::record_in_place(x.param, 7);
    if (x.param.device().is_meta()) continue;
    if (x.param.device().is_cuda()) {
      on_cuda.push_back({.param = x.param.data<float>(),
                         .grad = x.grad.data<float>(),
                         .exp_avg = x.exp_avg.data<float>(),
                         .exp_avg_sq = x.exp_avg_sq.data<float>(),
                         .n = x.param.numel(),
                         .bias1 = static_cast<float>(x.bias1),
                         .bias2 = static_cast<float>(x.bias2)});
      continue;
    }
    cpu::adamw_f32(x.param.data<float>(), x.grad.data<float>(), x.exp_avg.data<float>(),
                   x.exp_avg_sq.data<float>(), x.param.numel(),
                   {.lr = f.lr,
                    .beta1 = f.beta1,
                    .beta2 = f.beta2,
                    .eps = f.eps,
                    .weight_decay = f.weight_decay,
                    .bias1 = static_cast<float>(x.bias1),
                    .bias2 = static_cast<float>(x.bias2)});
  }
  if (on_cuda.empty()) return;
  cuda::kernels::adamw_multi_tensor(on_cuda.data(), static_cast<int64_t>(on_cuda.size()), f,
                                    cuda_device->index);
}

}  // namespace loom::ops
