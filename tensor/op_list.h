// Every dispatched op, declared once.
//
// An op is declared by one X(name, grad, extensions) line below. Everything else keys on it:
//   - OpId::name and op_name(): what the op passes to dispatch_op() (tensor/dispatch.h) and what
//     error messages print;
//   - the call_op table (tensor/op_table.cc), which runs the plain op from an OpCall;
//   - autograd's formulas (autograd/formulas_*.cc), one per kDifferentiable op;
//   - DTensor's sharding strategies (dtensor/sharding/*.cc), one per kExtended op.
// The tables are arrays indexed by OpId and are checked complete against this list when built
// (and by tests/tensor/op_list_test.cc, tests/autograd/formulas_test.cc and
// tests/dtensor/ops_elementwise_test.cc), so a new line here names every place left to fill.
//
//   grad        kDifferentiable: when grad mode is on and an input requires grad, autograd
//               records the op through its formula. kNoGrad: the op's outputs never require grad
//               (comparisons, *_like factories, in-place writes, backward kernels); it runs
//               below autograd.
//   extensions  kExtended: inputs carrying an extension (DTensors) route the op to that
//               extension's handler, so a sharding strategy must exist. kPlainOnly: the op never
//               reaches an extension handler (linear decomposes extended inputs into matmul and
//               add before dispatching; to_device copies plain tensors between devices).
//
// Enumerators are the op names themselves (OpId::add_scalar), like torch's aten::add: the name
// is the one spelling of the op everywhere.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

// clang-format off
#define LOOM_FOR_EACH_OP(X)                                         \
  /* Views. */                                                      \
  X(view, kDifferentiable, kExtended)                               \
  X(reshape, kDifferentiable, kExtended)                            \
  X(transpose, kDifferentiable, kExtended)                          \
  X(permute, kDifferentiable, kExtended)                            \
  X(narrow, kDifferentiable, kExtended)                             \
  X(slice, kDifferentiable, kExtended)                              \
  X(expand, kDifferentiable, kExtended)                             \
  X(unsqueeze, kDifferentiable, kExtended)                          \
  X(squeeze, kDifferentiable, kExtended)                            \
  /* Copies and conversions. */                                     \
  X(copy_, kNoGrad, kExtended)                                      \
  X(clone, kDifferentiable, kExtended)                              \
  X(to_dtype, kDifferentiable, kExtended)                           \
  X(to_device, kDifferentiable, kPlainOnly)                         \
  X(cat, kDifferentiable, kExtended)                                \
  X(match_layout, kNoGrad, kExtended)                               \
  X(zeros_like, kNoGrad, kExtended)                                 \
  X(ones_like, kNoGrad, kExtended)                                  \
  X(fill_, kNoGrad, kExtended)                                      \
  /* Elementwise. */                                                \
  X(add, kDifferentiable, kExtended)                                \
  X(sub, kDifferentiable, kExtended)                                \
  X(mul, kDifferentiable, kExtended)                                \
  X(div, kDifferentiable, kExtended)                                \
  X(maximum, kDifferentiable, kExtended)                            \
  X(eq, kNoGrad, kExtended)                                         \
  X(gt, kNoGrad, kExtended)                                         \
  X(add_scalar, kDifferentiable, kExtended)                         \
  X(sub_scalar, kDifferentiable, kExtended)                         \
  X(rsub_scalar, kDifferentiable, kExtended)                        \
  X(mul_scalar, kDifferentiable, kExtended)                         \
  X(div_scalar, kDifferentiable, kExtended)                         \
  X(neg, kDifferentiable, kExtended)                                \
  X(abs, kDifferentiable, kExtended)                                \
  X(exp, kDifferentiable, kExtended)                                \
  X(log, kDifferentiable, kExtended)                                \
  X(tanh, kDifferentiable, kExtended)                               \
  X(sigmoid, kDifferentiable, kExtended)                            \
  X(silu, kDifferentiable, kExtended)                               \
  X(sqrt, kDifferentiable, kExtended)                               \
  X(rsqrt, kDifferentiable, kExtended)                              \
  X(pow, kDifferentiable, kExtended)                                \
  X(relu, kDifferentiable, kExtended)                               \
  X(gelu, kDifferentiable, kExtended)                               \
  X(gelu_backward, kNoGrad, kExtended)                              \
  X(silu_backward, kNoGrad, kExtended)                              \
  X(silu_mul, kDifferentiable, kExtended)                           \
  X(silu_mul_backward, kNoGrad, kExtended)                          \
  X(where, kDifferentiable, kExtended)                              \
  X(masked_fill, kDifferentiable, kExtended)                        \
  X(add_, kNoGrad, kExtended)                                       \
  X(mul_scalar_, kNoGrad, kExtended)                                \
  /* Reductions and products. */                                    \
  X(sum, kDifferentiable, kExtended)                                \
  X(mean, kDifferentiable, kExtended)                               \
  X(max_dim, kDifferentiable, kExtended)                            \
  X(max_dim_backward, kNoGrad, kExtended)                           \
  X(matmul, kDifferentiable, kExtended)                             \
  X(linear, kDifferentiable, kPlainOnly)                            \
  X(slice_backward, kNoGrad, kExtended)                             \
  /* Neural-network ops (tensor/ops_nn.h). */                       \
  X(softmax, kDifferentiable, kExtended)                            \
  X(log_softmax, kDifferentiable, kExtended)                        \
  X(softmax_backward, kNoGrad, kExtended)                           \
  X(log_softmax_backward, kNoGrad, kExtended)                       \
  X(layer_norm, kDifferentiable, kExtended)                         \
  X(layer_norm_backward, kNoGrad, kExtended)                        \
  X(rms_norm, kDifferentiable, kExtended)                           \
  X(rms_norm_backward, kNoGrad, kExtended)                          \
  X(rope, kDifferentiable, kExtended)                               \
  X(embedding, kDifferentiable, kExtended)                          \
  X(embedding_backward, kNoGrad, kExtended)                         \
  X(cross_entropy, kDifferentiable, kExtended)                      \
  X(cross_entropy_backward, kNoGrad, kExtended)                     \
  X(scaled_dot_product_attention, kDifferentiable, kExtended)       \
  X(scaled_dot_product_attention_backward, kNoGrad, kExtended)      \
  X(dropout, kDifferentiable, kExtended)                            \
  X(dropout_backward, kNoGrad, kExtended)
// clang-format on

namespace loom {

enum class OpId : uint16_t {
#define LOOM_OP_ENUMERATOR(name, grad, extensions) name,
  LOOM_FOR_EACH_OP(LOOM_OP_ENUMERATOR)
#undef LOOM_OP_ENUMERATOR
};

enum class OpGrad : uint8_t { kDifferentiable, kNoGrad };
enum class OpExtensions : uint8_t { kExtended, kPlainOnly };

struct OpInfo {
  OpId id;
  std::string_view name;
  OpGrad grad;
  OpExtensions extensions;
};

inline constexpr std::array kOpInfos = {
#define LOOM_OP_INFO(name, grad, extensions) \
  OpInfo{OpId::name, #name, OpGrad::grad, OpExtensions::extensions},
    LOOM_FOR_EACH_OP(LOOM_OP_INFO)
#undef LOOM_OP_INFO
};

inline constexpr size_t kNumOps = kOpInfos.size();

constexpr const OpInfo& op_info(OpId op) { return kOpInfos[static_cast<size_t>(op)]; }
constexpr std::string_view op_name(OpId op) { return op_info(op).name; }
constexpr size_t op_index(OpId op) { return static_cast<size_t>(op); }
// Every op, in declaration order.
constexpr std::span<const OpInfo> all_ops() { return kOpInfos; }
// The op called `name`, if there is one.
std::optional<OpId> find_op(std::string_view name);

// One slot per op, indexed by OpId: call_op's functions, autograd's formulas, DTensor's
// strategies. `missing(wanted)` names the first op for which `wanted(info)` holds and whose slot
// is still empty, so each table can check itself against the list.
template <typename T>
class PerOp {
 public:
  T& operator[](OpId op) { return slots_[op_index(op)]; }
  const T& operator[](OpId op) const { return slots_[op_index(op)]; }

  template <typename Wanted>
  std::optional<OpId> missing(Wanted wanted) const {
    for (const OpInfo& info : all_ops()) {
      if (wanted(info) && !slots_[op_index(info.id)]) return info.id;
    }
    return std::nullopt;
  }

 private:
  std::array<T, kNumOps> slots_{};
};

}  // namespace loom
