// The kernels of kernels/*.h in a CPU-only build (--config=cpu): no .cu file is compiled, and each
// launcher throws naming the flag. They are never reached in practice: such a build reports no
// CUDA device (cuda_runtime.h, kernels_built()), so no CUDA tensor exists to launch them on.
#include "base/error.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/cuda/kernels/adamw.h"
#include "tensor/cuda/kernels/elementwise.h"
#include "tensor/cuda/kernels/flash_attention_mma.h"
#include "tensor/cuda/kernels/foreach.h"
#include "tensor/cuda/kernels/nn.h"
#include "tensor/cuda/kernels/reduce.h"

namespace loom::cuda::kernels {

namespace {
[[noreturn]] void unavailable(const char* kernel) {
  LOOM_FAIL("CUDA kernel {}: {}", kernel, kCpuOnlyBuild);
}
}  // namespace

void unary(UnaryOp, DType, const StridedArg&, const StridedArg&, float, int) {
  unavailable("unary");
}
void binary(BinaryOp, DType, const StridedArg&, const StridedArg&, const StridedArg&, float, int) {
  unavailable("binary");
}
void silu_mul_backward(DType, const StridedArg&, const StridedArg&, const StridedArg&,
                       const StridedArg&, const StridedArg&, int) {
  unavailable("silu_mul_backward");
}
void where(DType, const StridedArg&, const StridedArg&, const StridedArg&, const StridedArg&, int) {
  unavailable("where");
}
void copy(DType, const StridedArg&, DType, const StridedArg&, int) { unavailable("copy"); }
void fill(DType, const StridedArg&, double, int) { unavailable("fill"); }
void accumulate_f32(float*, DType, const void*, int64_t, int) { unavailable("accumulate_f32"); }

void softmax_forward(DType, void*, const void*, RowShape, bool, int) {
  unavailable("softmax_forward");
}
void softmax_backward(DType, void*, const void*, const void*, RowShape, bool, int) {
  unavailable("softmax_backward");
}
void layer_norm_forward(DType, void*, float*, float*, const void*, const void*, const void*,
                        int64_t, int64_t, float, int) {
  unavailable("layer_norm_forward");
}
void layer_norm_backward(DType, void*, float*, float*, const void*, const void*, const float*,
                         const float*, const void*, int64_t, int64_t, int) {
  unavailable("layer_norm_backward");
}
void rms_norm_forward(DType, void*, float*, const void*, const void*, int64_t, int64_t, float,
                      int) {
  unavailable("rms_norm_forward");
}
void rms_norm_backward(DType, void*, float*, const void*, const void*, const float*, const void*,
                       int64_t, int64_t, int) {
  unavailable("rms_norm_backward");
}
void rope_forward(DType, void*, const void*, const float*, const float*, int64_t, int64_t, int64_t,
                  int64_t, bool, int) {
  unavailable("rope_forward");
}
void embedding_forward(DType, void*, const void*, int64_t, int64_t, const int64_t*, int64_t,
                       int64_t, int64_t, int64_t*, int) {
  unavailable("embedding_forward");
}
void embedding_backward(DType, void*, const void*, const int64_t*, int64_t, int64_t, int64_t,
                        int64_t*, int64_t*, int) {
  unavailable("embedding_backward");
}
void cross_entropy_forward(DType, float*, float*, const void*, const int64_t*, int64_t, int64_t,
                           int64_t, int64_t, int64_t, int64_t*, int) {
  unavailable("cross_entropy_forward");
}
void count_targets(int64_t*, const int64_t*, int64_t, int64_t, int) {
  unavailable("count_targets");
}
void divide_by_count(float*, const int64_t*, int) { unavailable("divide_by_count"); }
void cross_entropy_backward(DType, void*, const void*, const float*, const int64_t*, const float*,
                            int64_t, int64_t, int64_t, int64_t, int64_t, int, const int64_t*,
                            int64_t*, int) {
  unavailable("cross_entropy_backward");
}
void philox_fill(DType, void*, const StridedArg&, int64_t, uint64_t, RandomKind, double, double,
                 int) {
  unavailable("philox_fill");
}
void flash_attention_forward(DType, void*, float*, const void*, const void*, const void*,
                             const FlashAttentionShape&, int) {
  unavailable("flash_attention_forward");
}
void flash_attention_backward(DType, void*, void*, void*, float*, const void*, const void*,
                              const void*, const void*, const float*, const FlashAttentionShape&,
                              int, bool) {
  unavailable("flash_attention_backward");
}
void attention_probs(float*, float*, int64_t, int64_t, int64_t, float, bool, int64_t, bool, int) {
  unavailable("attention_probs");
}
void attention_dropout_scale(float*, int64_t, int64_t, int64_t, const AttentionDropoutMask&, int) {
  unavailable("attention_dropout_scale");
}
void attention_grad_scores(float*, const float*, int64_t, int64_t, float, int, const float*) {
  unavailable("attention_grad_scores");
}

int64_t sum_rows_chunks(int64_t, int64_t) { return 1; }
void sum_rows(DType, void*, const void*, int64_t, int64_t, double, void*, int) {
  unavailable("sum_rows");
}
int64_t sum_cols_chunks(int64_t) { return 1; }
void sum_cols(DType, void*, const void*, int64_t, int64_t, double, void*, int) {
  unavailable("sum_cols");
}
void max_rows(DType, void*, int64_t*, const void*, int64_t, int64_t, int) {
  unavailable("max_rows");
}
void top_k_rows(DType, int64_t*, const void*, int64_t, int64_t, int64_t, int) {
  unavailable("top_k_rows");
}

void adamw_multi_tensor(const AdamWTensor*, int64_t, const AdamWHyper&, int) {
  unavailable("adamw_multi_tensor");
}
void foreach_sum_of_squares(const ForeachTensor*, int64_t, float*, float*, int) {
  unavailable("foreach_sum_of_squares");
}
void foreach_mul(const ForeachTensor*, int64_t, float, int) { unavailable("foreach_mul"); }
void foreach_cast_from_f32(const ForeachCast*, int64_t, DType, int) {
  unavailable("foreach_cast_from_f32");
}

// The switch keeps its value (tests flip it); nothing takes the tensor-core path.
namespace {
bool tensor_cores_switch = true;
}  // namespace
void set_tensor_core_attention(bool enabled) { tensor_cores_switch = enabled; }
bool tensor_core_attention_enabled() { return tensor_cores_switch; }
void set_attention_shared_memory_limit(size_t) {}
TensorCoreAttentionPlan tensor_core_attention_plan(DType, int64_t, int) {
  unavailable("tensor_core_attention_plan");
}
bool tensor_core_attention_takes(DType, const FlashAttentionShape&,
                                 std::initializer_list<const void*>,
                                 std::initializer_list<AttentionRows>) {
  return false;
}
void mma_attention_forward(DType, void*, float*, const void*, const void*, const void*,
                           const FlashAttentionShape&, const AttentionLayouts&, int) {
  unavailable("mma_attention_forward");
}
void attention_row_dots(DType, float*, const void*, const void*, const AttentionRows&,
                        const AttentionRows&, int64_t, int64_t, int64_t, int) {
  unavailable("attention_row_dots");
}
void mma_attention_backward(DType, void*, void*, void*, float*, const void*, const void*,
                            const void*, const void*, const float*, const FlashAttentionShape&,
                            const AttentionLayouts&, int, bool) {
  unavailable("mma_attention_backward");
}

}  // namespace loom::cuda::kernels
