// axpy_on_device in a CPU-only build (--config=cpu): no .cu file is compiled.
#include "base/error.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/cuda/smoke_kernel.h"

namespace loom::cuda {

void axpy_on_device(float, const float*, float*, std::int64_t, cudaStream_t) {
  LOOM_FAIL("CUDA kernel axpy_on_device: {}", kCpuOnlyBuild);
}

}  // namespace loom::cuda
