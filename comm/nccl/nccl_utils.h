// Value mappings and error text shared by the NCCL backend's files. Nothing here needs a GPU:
// tests check the mappings and the error messages on CPU-only machines.
#pragma once

#include <nccl.h>

#include <string>
#include <string_view>

#include "comm/types.h"
#include "tensor/dtype.h"

namespace loom::comm::nccl {

// f32 -> ncclFloat32, bf16 -> ncclBfloat16, f16 -> ncclFloat16, i32 -> ncclInt32,
// i64 -> ncclInt64. Throws loom::Error naming the dtype for anything else.
ncclDataType_t to_nccl_dtype(DType dtype);

// sum -> ncclSum, avg -> ncclAvg, max -> ncclMax, min -> ncclMin, product -> ncclProd. Every
// Loom dtype supports every op (ncclAvg on integers truncates toward zero, which is the
// ProcessGroup contract); an op/dtype pair NCCL lacks throws loom::Error naming both.
ncclRedOp_t to_nccl_reduce_op(ReduceOp op, DType dtype);

// "ncclInvalidArgument", "ncclRemoteError", ... ("ncclResult(42)" for an unknown value).
std::string nccl_result_name(ncclResult_t result);

// The text of one failed NCCL call, e.g.
//   all_reduce #3 (sum, f32, 8 elements) on group 'tp' (rank 1 of 2) on cuda:1: NCCL call
//   ncclAllReduce failed: ncclInvalidArgument (invalid argument (run with NCCL_DEBUG=WARN for
//   details)); NCCL's last error: "AllReduce : invalid root 3"
// `context` names the operation, group and rank; `comm` may be null (ncclGetLastError accepts
// that).
std::string nccl_error_message(std::string_view context, int device, std::string_view call,
                               ncclResult_t result, ncclComm_t comm);

// The same for a failed CUDA runtime call made by the backend.
std::string cuda_error_message(std::string_view context, int device, std::string_view call,
                               cudaError_t result);

}  // namespace loom::comm::nccl
