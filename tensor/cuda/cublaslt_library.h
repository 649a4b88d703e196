// cuBLASLt, loaded on first use (dlopen) rather than linked.
//
// Why: libcublasLt is a 540 MB library whose load costs ~150 MB of resident memory in every
// process that links it (measured: dlopen of libcublasLt.so.13 adds 151 MiB RSS), and every
// Loom binary links the tensor layer. CPU ranks never call a GPU GEMM, so they should not pay
// it: eight CPU ranks on one machine would carry 1.2 GB of it. Only the first CUDA GEMM loads it.
#pragma once

#include <cublasLt.h>

namespace loom::cuda {

// The cuBLASLt entry points Loom uses, resolved from the loaded library.
struct CublasLtApi {
  decltype(&cublasLtCreate) Create;
  decltype(&cublasLtGetStatusName) GetStatusName;
  decltype(&cublasLtGetStatusString) GetStatusString;
  decltype(&cublasLtMatmul) Matmul;
  decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&cublasLtMatrixLayoutSetAttribute) MatrixLayoutSetAttribute;
};

// Loads libcublasLt.so.<CUBLAS_VER_MAJOR> (the loader's search path, then /usr/local/cuda/lib64)
// once per process. Throws loom::Error naming the library, the places tried and dlerror() when
// it or one of its symbols is missing.
const CublasLtApi& cublaslt();

}  // namespace loom::cuda
