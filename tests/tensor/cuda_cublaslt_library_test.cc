// cuBLASLt is loaded on first use, not at process start: a binary that links the tensor layer
// does not map the library until a CUDA GEMM asks for it, and then every entry point resolves.
// Loading needs the toolkit's library, not a GPU, so this runs on CPU machines too.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "tensor/cuda/cublaslt_library.h"

namespace loom::cuda {
namespace {

bool mapped(const std::string& library) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(library) != std::string::npos) return true;
  }
  return false;
}

TEST(CublasLtLibraryTest, LoadsOnFirstUseOnly) {
  EXPECT_FALSE(mapped("libcublasLt")) << "cuBLASLt was loaded before any GEMM asked for it";
  const CublasLtApi& api = cublaslt();
  EXPECT_TRUE(mapped("libcublasLt"));
  EXPECT_NE(api.Create, nullptr);
  EXPECT_NE(api.Matmul, nullptr);
  EXPECT_NE(api.MatrixLayoutSetAttribute, nullptr);
  EXPECT_EQ(&cublaslt(), &api);  // once per process
  EXPECT_STREQ(api.GetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
}

}  // namespace
}  // namespace loom::cuda
