#include "comm/nccl/nccl_utils.h"

#include <fmt/format.h>

#include "base/error.h"

namespace loom::comm::nccl {

ncclDataType_t to_nccl_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
  }
  LOOM_FAIL("NCCL backend: dtype {} (value {}) has no NCCL type; use f32, bf16, f16, i32 or i64",
            dtype_name(dtype), static_cast<int>(dtype));
}

ncclRedOp_t to_nccl_reduce_op(ReduceOp op, DType dtype) {
  // Validate the dtype first, so an unknown dtype is reported as such.
  (void)to_nccl_dtype(dtype);
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kProduct:
      return ncclProd;
  }
  LOOM_FAIL("NCCL backend: reduce op {} on {} is not supported; use sum, avg, max, min or product",
            static_cast<int>(op), dtype_name(dtype));
}

std::string nccl_result_name(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      break;
  }
  return fmt::format("ncclResult({})", static_cast<int>(result));
}

std::string nccl_error_message(std::string_view context, int device, std::string_view call,
                               ncclResult_t result, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  const std::string last_text =
      (last != nullptr && last[0] != '\0') ? fmt::format("\"{}\"", last) : std::string("none");
  return fmt::format("{} on cuda:{}: NCCL call {} failed: {} ({}); NCCL's last error: {}", context,
                     device, call, nccl_result_name(result), ncclGetErrorString(result), last_text);
}

std::string cuda_error_message(std::string_view context, int device, std::string_view call,
                               cudaError_t result) {
  return fmt::format("{} on cuda:{}: CUDA call {} failed: {} ({})", context, device, call,
                     cudaGetErrorName(result), cudaGetErrorString(result));
}

}  // namespace loom::comm::nccl
