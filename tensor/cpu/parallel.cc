#include "tensor/cpu/parallel.h"

#include <omp.h>

#include <algorithm>
#include <exception>

#include "tensor/cpu/gemm.h"

namespace loom::cpu {

void parallel_for(int64_t n, int64_t grain, int64_t align,
                  const std::function<void(int64_t begin, int64_t end)>& body) {
  if (n <= 0) return;
  const int threads = static_cast<int>(
      std::min<int64_t>(kernel_threads(), std::max<int64_t>(1, n / std::max<int64_t>(grain, 1))));
  if (threads <= 1) {
    body(0, n);
    return;
  }
  align = std::max<int64_t>(align, 1);
  const int64_t blocks = (n + align - 1) / align;
  std::exception_ptr error;
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), count = omp_get_num_threads();
    const int64_t begin = std::min(n, blocks * t / count * align);
    const int64_t end = std::min(n, blocks * (t + 1) / count * align);
    try {
      if (begin < end) body(begin, end);
    } catch (...) {
#pragma omp critical(loom_parallel_for_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace loom::cpu
