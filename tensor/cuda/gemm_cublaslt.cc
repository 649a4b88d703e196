#include "tensor/cuda/gemm_cublaslt.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "tensor/cuda/cublaslt_library.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/cuda/stream.h"

namespace loom::cuda {
namespace {

std::string describe(const GemmProblem& p) {
  return fmt::format(
      "gemm({}, {}{}, M={} N={} K={}, lda={} ldb={} ldc={}, batch={} strides {}/{}/{})",
      dtype_name(p.dtype), p.transpose_a ? "A^T" : "A", p.transpose_b ? " B^T" : " B", p.m, p.n,
      p.k, p.lda, p.ldb, p.ldc, p.batch, p.stride_a, p.stride_b, p.stride_c);
}

void check_lt(cublasStatus_t status, const char* call, const GemmProblem& p, int device) {
  LOOM_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLASLt call {} failed on cuda:{}: {} ({}) for {}",
             call, device, cublaslt().GetStatusName(status), cublaslt().GetStatusString(status),
             describe(p));
}

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return CUDA_R_32F;
    case DType::kBFloat16:
      return CUDA_R_16BF;
    case DType::kFloat16:
      return CUDA_R_16F;
    default:
      break;
  }
  LOOM_FAIL("gemm: cuBLASLt GEMMs take f32, bf16 or f16, got {}", dtype_name(dtype));
}

// Largest power of two (<= 256) dividing the address and every batch step of an operand: the
// alignment cuBLASLt may assume for each of the batch's matrices.
uint32_t alignment(const void* ptr, int64_t stride, DType dtype) {
  uint64_t bits = reinterpret_cast<uintptr_t>(ptr) | 256u;
  if (stride != 0) bits |= static_cast<uint64_t>(stride) * element_size(dtype);
  return static_cast<uint32_t>(bits & (~bits + 1));
}

// Descriptors and algorithm for one problem, kept for the process.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

using PlanKey =
    std::tuple<int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
               int64_t, int64_t, int64_t, uint32_t, uint32_t, uint32_t, uint32_t>;

struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::mutex mutex;  // guards plans
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
};

// Handles, workspaces and plans by device; never destroyed (see stream.cc).
struct States {
  std::mutex mutex;
  std::vector<std::unique_ptr<DeviceState>> by_device;
};

DeviceState& state(int device, const GemmProblem& p) {
  static States* states = new States;
  std::lock_guard<std::mutex> lock(states->mutex);
  if (static_cast<size_t>(device) >= states->by_device.size()) states->by_device.resize(device + 1);
  auto& slot = states->by_device[device];
  if (!slot) {
    auto s = std::make_unique<DeviceState>();
    DeviceGuard guard(device);
    check_lt(cublaslt().Create(&s->handle), "cublasLtCreate", p, device);
    s->workspace = device_malloc(kWorkspaceBytes, device);
    slot = std::move(s);
  }
  return *slot;
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                                   int64_t batch, int64_t stride, const GemmProblem& p,
                                   int device) {
  cublasLtMatrixLayout_t layout = nullptr;
  check_lt(cublaslt().MatrixLayoutCreate(&layout, type, static_cast<uint64_t>(rows),
                                         static_cast<uint64_t>(cols), ld),
           "cublasLtMatrixLayoutCreate", p, device);
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    check_lt(cublaslt().MatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                 sizeof(count)),
             "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)", p, device);
    check_lt(cublaslt().MatrixLayoutSetAttribute(
                 layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
             "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)", p, device);
  }
  return layout;
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt (column-major) gets
// B as its first operand and A as its second, with the same transpose flags.
std::unique_ptr<Plan> make_plan(const GemmProblem& p, DeviceState& s, uint32_t align_a,
                                uint32_t align_b, uint32_t align_c, const void* bias, int device) {
  auto plan = std::make_unique<Plan>();
  const cudaDataType_t type = cuda_type(p.dtype);
  check_lt(cublaslt().MatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
           "cublasLtMatmulDescCreate", p, device);
  const cublasOperation_t op_first = p.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = p.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublaslt().MatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                             sizeof(op_first)),
           "cublasLtMatmulDescSetAttribute(TRANSA)", p, device);
  check_lt(cublaslt().MatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                             sizeof(op_second)),
           "cublasLtMatmulDescSetAttribute(TRANSB)", p, device);
  if (bias != nullptr) {
    // Column-major D is (N, M): the epilogue's bias has one value per row of D, i.e. per output
    // column of the row-major C, in D's dtype (cuBLASLt's default). The heuristic reads the
    // pointer's alignment (cublasLt.h: BIAS_POINTER), so it is set before the heuristic runs;
    // plans are keyed by that alignment and later calls only swap the pointer (gemm()).
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    check_lt(cublaslt().MatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                               sizeof(epilogue)),
             "cublasLtMatmulDescSetAttribute(EPILOGUE_BIAS)", p, device);
    check_lt(cublaslt().MatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                               sizeof(bias)),
             "cublasLtMatmulDescSetAttribute(BIAS_POINTER)", p, device);
  }
  // Stored shapes, column-major: B is (N, K) or, transposed, (K, N); A is (K, M) or (M, K).
  plan->a = p.transpose_b ? make_layout(type, p.k, p.n, p.ldb, p.batch, p.stride_b, p, device)
                          : make_layout(type, p.n, p.k, p.ldb, p.batch, p.stride_b, p, device);
  plan->b = p.transpose_a ? make_layout(type, p.m, p.k, p.lda, p.batch, p.stride_a, p, device)
                          : make_layout(type, p.k, p.m, p.lda, p.batch, p.stride_a, p, device);
  plan->c = make_layout(type, p.n, p.m, p.ldc, p.batch, p.stride_c, p, device);

  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(cublaslt().MatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", p, device);
  const uint64_t workspace = kWorkspaceBytes;
  (void)cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &workspace, sizeof(workspace));
  (void)cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                &align_b, sizeof(align_b));
  (void)cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                &align_a, sizeof(align_a));
  (void)cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                &align_c, sizeof(align_c));
  (void)cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                &align_c, sizeof(align_c));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublaslt().MatmulAlgoGetHeuristic(
      s.handle, plan->desc, plan->a, plan->b, plan->c, plan->c, pref, 1, &result, &found);
  (void)cublaslt().MatmulPreferenceDestroy(pref);
  check_lt(status, "cublasLtMatmulAlgoGetHeuristic", p, device);
  LOOM_CHECK(found > 0, "gemm on cuda:{}: cuBLASLt has no algorithm for {}", device, describe(p));
  plan->algo = result.algo;
  return plan;
}

}  // namespace

void gemm(const GemmProblem& p, const void* a, const void* b, void* c, int device,
          const void* bias) {
  LOOM_CHECK(p.m >= 0 && p.n >= 0 && p.k >= 0 && p.batch >= 0, "gemm: sizes must be >= 0, got {}",
             describe(p));
  LOOM_CHECK(bias == nullptr || (p.batch == 1 && p.k > 0 &&
                                 reinterpret_cast<uintptr_t>(bias) % kBiasAlignment == 0),
             "gemm: a bias epilogue needs batch 1, K > 0 and a {}-byte aligned bias, got batch {}, "
             "K {} and "
             "address {} for {}",
             kBiasAlignment, p.batch, p.k, bias, describe(p));
  if (p.m == 0 || p.n == 0 || p.batch == 0) return;
  DeviceState& s = state(device, p);
  const cudaStream_t stream = compute_stream(device);
  DeviceGuard guard(device);
  if (p.k == 0) {  // cuBLASLt rejects K == 0; the product of empty matrices is zeros
    for (int64_t i = 0; i < p.batch; ++i) {
      char* ci = static_cast<char*>(c) + i * p.stride_c * element_size(p.dtype);
      LOOM_CUDA_CHECK_ON(cudaMemset2DAsync(ci, p.ldc * element_size(p.dtype), 0,
                                           p.n * element_size(p.dtype), p.m, stream),
                         device);
    }
    return;
  }
  const uint32_t align_a = alignment(a, p.stride_a, p.dtype);
  const uint32_t align_b = alignment(b, p.stride_b, p.dtype);
  const uint32_t align_c = alignment(c, p.stride_c, p.dtype);
  const bool with_bias = bias != nullptr;
  const uint32_t align_bias = with_bias ? alignment(bias, 0, p.dtype) : 0;  // 0: no epilogue
  const PlanKey key{static_cast<int>(p.dtype),
                    p.transpose_a,
                    p.transpose_b,
                    p.m,
                    p.n,
                    p.k,
                    p.lda,
                    p.ldb,
                    p.ldc,
                    p.stride_a,
                    p.stride_b,
                    p.stride_c,
                    p.batch,
                    align_a,
                    align_b,
                    align_c,
                    align_bias};
  // The lock also covers the call when the plan's descriptor takes this call's bias pointer.
  std::unique_lock<std::mutex> lock(s.mutex);
  Plan* plan = nullptr;
  if (auto it = s.plans.find(key); it != s.plans.end()) {
    plan = it->second.get();
  } else {  // inserted only once built: a failed plan leaves no empty entry behind
    auto made = make_plan(p, s, align_a, align_b, align_c, bias, device);
    plan = made.get();
    s.plans.emplace(key, std::move(made));
  }
  if (with_bias) {
    check_lt(cublaslt().MatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                               sizeof(bias)),
             "cublasLtMatmulDescSetAttribute(BIAS_POINTER)", p, device);
  } else {
    lock.unlock();
  }
  const float alpha = 1.0f, beta = 0.0f;
  check_lt(
      cublaslt().Matmul(s.handle, plan->desc, &alpha, b, plan->a, a, plan->b, &beta, c, plan->c, c,
                        plan->c, &plan->algo, s.workspace, kWorkspaceBytes, stream),
      "cublasLtMatmul", p, device);
}

std::size_t gemm_plan_cache_size(int device) {
  GemmProblem none;
  DeviceState& s = state(device, none);
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.plans.size();
}

}  // namespace loom::cuda
