#include "tensor/cuda/kernels/device_common.cuh"
#include "tensor/cuda/kernels/elementwise.h"

namespace loom::cuda::kernels {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi), as tensor/ops_elementwise.cc
constexpr float kGeluCubic = 0.044715f;

// The sigmoid in a form whose exp never overflows (as tensor/ops_elementwise.cc's).
__device__ __forceinline__ float sigmoid_f(float x) {
  return x >= 0.0f ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x));
}
__device__ __forceinline__ float silu_f(float x) { return x * sigmoid_f(x); }

// The op switch is uniform across the grid, so it costs one predictable branch per element.
template <typename V>
__device__ __forceinline__ V apply_unary(UnaryOp op, V x, float s) {
  if constexpr (std::is_integral_v<V>) {
    switch (op) {
      case UnaryOp::kNeg:
        return -x;
      case UnaryOp::kAbs:
        return x < 0 ? -x : x;
      default:
        return x;  // kCopy; floating-only ops never reach integer dtypes
    }
  } else {
    switch (op) {
      case UnaryOp::kCopy:
        return x;
      case UnaryOp::kNeg:
        return -x;
      case UnaryOp::kAbs:
        return fabsf(x);
      case UnaryOp::kExp:
        return expf(x);
      case UnaryOp::kLog:
        return logf(x);
      case UnaryOp::kTanh:
        return tanhf(x);
      case UnaryOp::kSigmoid:
        return sigmoid_f(x);
      case UnaryOp::kSilu:
        return silu_f(x);
      case UnaryOp::kSqrt:
        return sqrtf(x);
      case UnaryOp::kRsqrt:
        return 1.0f / sqrtf(x);
      case UnaryOp::kPow:
        return powf(x, s);
      case UnaryOp::kSquare:
        return x * x;
      case UnaryOp::kRelu:
        return x > 0.0f || x != x ? x : 0.0f;
      case UnaryOp::kGelu:
        return 0.5f * x * (1.0f + tanhf(kGeluScale * (x + kGeluCubic * x * x * x)));
      case UnaryOp::kAddScalar:
        return x + s;
      case UnaryOp::kSubScalar:
        return x - s;
      case UnaryOp::kRsubScalar:
        return s - x;
      case UnaryOp::kMulScalar:
        return x * s;
      case UnaryOp::kDivScalar:
        return x / s;
    }
    return x;
  }
}

template <typename V>
__device__ __forceinline__ V apply_binary(BinaryOp op, V x, V y, float s) {
  switch (op) {
    case BinaryOp::kAdd:
      return x + y;
    case BinaryOp::kSub:
      return x - y;
    case BinaryOp::kMul:
      return x * y;
    case BinaryOp::kDiv:
      return x / y;
    case BinaryOp::kMaximum:
      return x > y || x != x ? x : y;
    case BinaryOp::kEq:
      return x == y ? V(1) : V(0);
    case BinaryOp::kGt:
      return x > y ? V(1) : V(0);
    case BinaryOp::kGeluBackward:
      if constexpr (!std::is_integral_v<V>) {
        const float inner = kGeluScale * (y + kGeluCubic * y * y * y);
        const float t = tanhf(inner);
        const float d_inner = kGeluScale * (1.0f + 3.0f * kGeluCubic * y * y);
        return x * (0.5f * (1.0f + t) + 0.5f * y * (1.0f - t * t) * d_inner);
      }
      return x;
    case BinaryOp::kSiluBackward:
      if constexpr (!std::is_integral_v<V>) {
        // d/dx x s(x) = s (1 + x (1 - s)).
        const float sig = sigmoid_f(y);
        return x * (sig * (1.0f + y * (1.0f - sig)));
      }
      return x;
    case BinaryOp::kSiluMul:
      if constexpr (!std::is_integral_v<V>) return silu_f(x) * y;
      return x;
    case BinaryOp::kMulScaled:
      if constexpr (!std::is_integral_v<V>) return x * y * s;
      return x * y;
  }
  return x;
}

template <typename T>
__global__ void unary_kernel(UnaryOp op, Collapsed<2> c, T* out, const T* in, float s) {
  LOOM_GRID_STRIDE(i, c.numel) {
    int64_t off[2];
    offsets_of(c, i, off);
    out[off[0]] = convert<T>(apply_unary(op, load(in + off[1]), s));
  }
}

template <typename T>
__global__ void binary_kernel(BinaryOp op, Collapsed<3> c, T* out, const T* a, const T* b,
                              float s) {
  LOOM_GRID_STRIDE(i, c.numel) {
    int64_t off[3];
    offsets_of(c, i, off);
    out[off[0]] = convert<T>(apply_binary(op, load(a + off[1]), load(b + off[2]), s));
  }
}

// Both gradients of silu(gate) * up from one read of grad, gate and up.
template <typename T>
__global__ void silu_mul_backward_kernel(Collapsed<5> c, T* grad_gate, T* grad_up, const T* grad,
                                         const T* gate, const T* up) {
  LOOM_GRID_STRIDE(i, c.numel) {
    int64_t off[5];
    offsets_of(c, i, off);
    const float g = load(grad + off[2]), x = load(gate + off[3]), u = load(up + off[4]);
    const float s = sigmoid_f(x);
    grad_gate[off[0]] = convert<T>(g * u * (s * (1.0f + x * (1.0f - s))));
    grad_up[off[1]] = convert<T>(g * (x * s));
  }
}

template <typename T>
__global__ void where_kernel(Collapsed<4> c, T* out, const float* cond, const T* a, const T* b) {
  LOOM_GRID_STRIDE(i, c.numel) {
    int64_t off[4];
    offsets_of(c, i, off);
    out[off[0]] = cond[off[1]] != 0.0f ? a[off[2]] : b[off[3]];
  }
}

// One element of a copy, converting between dtypes as `to` does (through f32 for floating ones).
template <typename D, typename S>
__device__ __forceinline__ void copy_element(D* out, const S* in) {
  if constexpr (std::is_same_v<D, S>) {
    *out = *in;
  } else if constexpr (std::is_integral_v<D> && std::is_integral_v<S>) {
    *out = static_cast<D>(*in);
  } else {
    *out = convert<D>(static_cast<float>(load(in)));
  }
}

template <typename D, typename S>
__global__ void copy_kernel(Collapsed<2> c, D* out, const S* in) {
  LOOM_GRID_STRIDE(i, c.numel) {
    int64_t off[2];
    offsets_of(c, i, off);
    copy_element(out + off[0], in + off[1]);
  }
}

// Both sides contiguous (the common case: casts for mixed precision, clones): no index math.
template <typename D, typename S>
__global__ void copy_contiguous_kernel(int64_t n, D* out, const S* in) {
  LOOM_GRID_STRIDE(i, n) { copy_element(out + i, in + i); }
}

template <typename S>
__global__ void accumulate_f32_kernel(int64_t n, float* out, const S* in) {
  LOOM_GRID_STRIDE(i, n) { out[i] += static_cast<float>(load(in + i)); }
}

template <typename T>
__global__ void fill_kernel(Collapsed<1> c, T* out, T value) {
  LOOM_GRID_STRIDE(i, c.numel) {
    int64_t off[1];
    offsets_of(c, i, off);
    out[off[0]] = value;
  }
}

}  // namespace

void unary(UnaryOp op, DType dtype, const StridedArg& out, const StridedArg& in, float scalar,
           int device) {
  const Collapsed<2> c = collapse<2>({&out, &in});
  if (c.numel == 0) return;
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    unary_kernel<T><<<grid_for(c.numel), kThreads, 0, compute_stream(device)>>>(
        op, c, static_cast<T*>(out.data), static_cast<const T*>(in.data), scalar);
  });
  check_launch("unary_kernel", device);
}

void binary(BinaryOp op, DType dtype, const StridedArg& out, const StridedArg& a,
            const StridedArg& b, float scalar, int device) {
  const Collapsed<3> c = collapse<3>({&out, &a, &b});
  if (c.numel == 0) return;
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    binary_kernel<T><<<grid_for(c.numel), kThreads, 0, compute_stream(device)>>>(
        op, c, static_cast<T*>(out.data), static_cast<const T*>(a.data),
        static_cast<const T*>(b.data), scalar);
  });
  check_launch("binary_kernel", device);
}

void silu_mul_backward(DType dtype, const StridedArg& grad_gate, const StridedArg& grad_up,
                       const StridedArg& grad, const StridedArg& gate, const StridedArg& up,
                       int device) {
  const Collapsed<5> c = collapse<5>({&grad_gate, &grad_up, &grad, &gate, &up});
  if (c.numel == 0) return;
  visit_floating(dtype, "silu_mul_backward", [&](auto tag) {
    using T = decltype(tag);
    silu_mul_backward_kernel<T><<<grid_for(c.numel), kThreads, 0, compute_stream(device)>>>(
        c, static_cast<T*>(grad_gate.data), static_cast<T*>(grad_up.data),
        static_cast<const T*>(grad.data), static_cast<const T*>(gate.data),
        static_cast<const T*>(up.data));
  });
  check_launch("silu_mul_backward_kernel", device);
}

void where(DType dtype, const StridedArg& out, const StridedArg& cond, const StridedArg& a,
           const StridedArg& b, int device) {
  const Collapsed<4> c = collapse<4>({&out, &cond, &a, &b});
  if (c.numel == 0) return;
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    where_kernel<T><<<grid_for(c.numel), kThreads, 0, compute_stream(device)>>>(
        c, static_cast<T*>(out.data), static_cast<const float*>(cond.data),
        static_cast<const T*>(a.data), static_cast<const T*>(b.data));
  });
  check_launch("where_kernel", device);
}

void copy(DType out_dtype, const StridedArg& out, DType in_dtype, const StridedArg& in,
          int device) {
  const Collapsed<2> c = collapse<2>({&out, &in});
  if (c.numel == 0) return;
  visit_dtype(out_dtype, [&](auto out_tag) {
    using D = decltype(out_tag);
    visit_dtype(in_dtype, [&](auto in_tag) {
      using S = decltype(in_tag);
      auto* o = static_cast<D*>(out.data);
      const auto* i = static_cast<const S*>(in.data);
      const cudaStream_t stream = compute_stream(device);
      if (c.ndim == 1 && c.strides[0][0] == 1 && c.strides[1][0] == 1) {
        copy_contiguous_kernel<D, S><<<grid_for(c.numel), kThreads, 0, stream>>>(c.numel, o, i);
      } else {
        copy_kernel<D, S><<<grid_for(c.numel), kThreads, 0, stream>>>(c, o, i);
      }
    });
  });
  check_launch("copy_kernel", device);
}

void accumulate_f32(float* out, DType in_dtype, const void* in, int64_t n, int device) {
  if (n == 0) return;
  visit_dtype(in_dtype, [&](auto tag) {
    using S = decltype(tag);
    accumulate_f32_kernel<S>
        <<<grid_for(n), kThreads, 0, compute_stream(device)>>>(n, out, static_cast<const S*>(in));
  });
  check_launch("accumulate_f32_kernel", device);
}

void fill(DType dtype, const StridedArg& out, double value, int device) {
  const Collapsed<1> c = collapse<1>({&out});
  if (c.numel == 0) return;
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    // Converted on the host exactly as the CPU's fill_ does (through f32 for floating types).
    T stored;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      stored = __float2bfloat16_rn(static_cast<float>(value));
    } else if constexpr (std::is_same_v<T, __half>) {
      stored = __float2half_rn(static_cast<float>(value));
    } else {
      stored = static_cast<T>(value);
    }
    fill_kernel<T><<<grid_for(c.numel), kThreads, 0, compute_stream(device)>>>(
        c, static_cast<T*>(out.data), stored);
  });
  check_launch("fill_kernel", device);
}

}  // namespace loom::cuda::kernels
