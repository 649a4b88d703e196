#include "tensor/cpu/gemm.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "base/error.h"

namespace loom::cpu {

namespace {

// 0: the backend's default thread count; otherwise what set_gemm_threads asked for.
std::atomic<int> g_gemm_threads{0};

// OpenMP's thread count is an ICV of each calling thread (omp_set_num_threads on one thread does
// not reach the others), so the process-wide setting is applied lazily on whichever thread calls.
void apply_thread_setting() {
  const int wanted = g_gemm_threads.load(std::memory_order_relaxed);
  if (wanted > 0 && omp_get_max_threads() != wanted) omp_set_num_threads(wanted);
}

// Checks sizes and leading dims of one GEMM; `what` names the entry point in messages.
void check_gemm_args(const char* what, bool transpose_a, bool transpose_b, int64_t m, int64_t n,
                     int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                     const float* c, int64_t ldc, bool check_pointers = true) {
  LOOM_CHECK(m >= 0 && n >= 0 && k >= 0, "{}: sizes must be >= 0, got m={}, n={}, k={}", what, m, n,
             k);
  // Row-major: a leading dim is the row stride of the matrix as stored, so it must cover that
  // matrix's columns.
  const int64_t a_cols = transpose_a ? m : k;
  const int64_t b_cols = transpose_b ? k : n;
  LOOM_CHECK(lda >= std::max<int64_t>(1, a_cols),
             "{}: lda={} is too small; A is stored {} ({}x{}), so lda must be >= max(1, {})", what,
             lda, transpose_a ? "transposed" : "as is", transpose_a ? k : m, a_cols, a_cols);
  LOOM_CHECK(ldb >= std::max<int64_t>(1, b_cols),
             "{}: ldb={} is too small; B is stored {} ({}x{}), so ldb must be >= max(1, {})", what,
             ldb, transpose_b ? "transposed" : "as is", transpose_b ? n : k, b_cols, b_cols);
  LOOM_CHECK(ldc >= std::max<int64_t>(1, n),
             "{}: ldc={} is too small; C is {}x{}, so ldc must be >= max(1, {})", what, ldc, m, n,
             n);
  if (!check_pointers) return;
  LOOM_CHECK(a != nullptr || m == 0 || k == 0, "{}: A is null for a {}x{} operand", what, m, k);
  LOOM_CHECK(b != nullptr || k == 0 || n == 0, "{}: B is null for a {}x{} operand", what, k, n);
  LOOM_CHECK(c != nullptr || m == 0 || n == 0, "{}: C is null for a {}x{} result", what, m, n);
}

// C = beta * C over the (m, n) block; beta == 0 writes zeros without reading C.
void scale_c(int64_t m, int64_t n, float beta, float* c, int64_t ldc) {
  if (beta == 1.0f) return;
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    if (beta == 0.0f) {
      std::fill(row, row + n, 0.0f);
    } else {
      for (int64_t j = 0; j < n; ++j) row[j] *= beta;
    }
  }
}

// One GEMM whose arguments were checked.
void sgemm_unchecked(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
                     float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                     float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) {
    scale_c(m, n, beta, c, ldc);
    return;
  }
  const dnnl_status_t status = dnnl_sgemm(transpose_a ? 'T' : 'N', transpose_b ? 'T' : 'N', m, n, k,
                                          alpha, a, lda, b, ldb, beta, c, ldc);
  LOOM_CHECK(status == dnnl_success,
             "sgemm: dnnl_sgemm failed with status {} for transa={}, transb={}, m={}, n={}, "
             "k={}, lda={}, ldb={}, ldc={}",
             static_cast<int>(status), transpose_a, transpose_b, m, n, k, lda, ldb, ldc);
}

}  // namespace

void sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc) {
  check_gemm_args("sgemm", transpose_a, transpose_b, m, n, k, a, lda, b, ldb, c, ldc);
  apply_thread_setting();
  sgemm_unchecked(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void sgemm_batched(int64_t batch, bool transpose_a, bool transpose_b, int64_t m, int64_t n,
                   int64_t k, float alpha, const float* a, int64_t lda, int64_t stride_a,
                   const float* b, int64_t ldb, int64_t stride_b, float beta, float* c, int64_t ldc,
                   int64_t stride_c) {
  LOOM_CHECK(batch >= 0, "sgemm_batched: batch must be >= 0, got {}", batch);
  // An empty batch touches no memory, so its pointers may be null.
  check_gemm_args("sgemm_batched", transpose_a, transpose_b, m, n, k, a, lda, b, ldb, c, ldc,
                  /*check_pointers=*/batch > 0);
  LOOM_CHECK(stride_a >= 0 && stride_b >= 0 && stride_c >= 0,
             "sgemm_batched: strides must be >= 0 (0 broadcasts one matrix), got stride_a={}, "
             "stride_b={}, stride_c={}",
             stride_a, stride_b, stride_c);
  if (batch > 1 && m > 0 && n > 0) {
    const int64_t c_extent = (m - 1) * ldc + n;  // elements one C matrix spans
    LOOM_CHECK(stride_c >= c_extent,
               "sgemm_batched: stride_c={} makes the {} C matrices ({}x{}, ldc={}) overlap; "
               "stride_c must be >= (m-1)*ldc + n = {}",
               stride_c, batch, m, n, ldc, c_extent);
  }
  if (batch == 0 || m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) {  // A and B are not read (and may be null when k == 0)
    for (int64_t i = 0; i < batch; ++i) scale_c(m, n, beta, c + i * stride_c, ldc);
    return;
  }
  apply_thread_setting();
  for (int64_t i = 0; i < batch; ++i) {
    sgemm_unchecked(transpose_a, transpose_b, m, n, k, alpha, a + i * stride_a, lda,
                    b + i * stride_b, ldb, beta, c + i * stride_c, ldc);
  }
}

void sgemm_batched_at(int64_t batch, bool transpose_a, bool transpose_b, int64_t m, int64_t n,
                      int64_t k, float alpha, const float* a, int64_t lda,
                      std::span<const int64_t> a_offsets, const float* b, int64_t ldb,
                      std::span<const int64_t> b_offsets, float beta, float* c, int64_t ldc,
                      std::span<const int64_t> c_offsets) {
  LOOM_CHECK(batch >= 0, "sgemm_batched_at: batch must be >= 0, got {}", batch);
  const auto expected = static_cast<size_t>(batch);
  LOOM_CHECK(
      a_offsets.size() == expected && b_offsets.size() == expected && c_offsets.size() == expected,
      "sgemm_batched_at: batch {} needs {} offsets per operand, got {} (A), {} (B), {} (C)", batch,
      batch, a_offsets.size(), b_offsets.size(), c_offsets.size());
  check_gemm_args("sgemm_batched_at", transpose_a, transpose_b, m, n, k, a, lda, b, ldb, c, ldc,
                  /*check_pointers=*/batch > 0);
  for (size_t i = 0; i < expected; ++i) {
    LOOM_CHECK(a_offsets[i] >= 0 && b_offsets[i] >= 0 && c_offsets[i] >= 0,
               "sgemm_batched_at: offsets must be >= 0, got A {}, B {}, C {} at entry {}",
               a_offsets[i], b_offsets[i], c_offsets[i], i);
  }
  if (batch == 0 || m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) {
    for (int64_t i = 0; i < batch; ++i) scale_c(m, n, beta, c + c_offsets[i], ldc);
    return;
  }
  // One entry after another, each GEMM on every thread. (Entries split over the threads, one
  // whole GEMM each, ran attention's small products faster, but oneDNN rounds a threaded GEMM of
  // K >= 32 differently from a one-thread one, and the equivalence suite's multi-rank runs then
  // drifted from one rank's past their bound: measured, not taken.)
  apply_thread_setting();
  for (int64_t i = 0; i < batch; ++i) {
    sgemm_unchecked(transpose_a, transpose_b, m, n, k, alpha, a + a_offsets[i], lda,
                    b + b_offsets[i], ldb, beta, c + c_offsets[i], ldc);
  }
}

const char* gemm_library_name() {
  static const std::string name = [] {
    const dnnl_version_t* v = dnnl_version();
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
           std::to_string(v->patch) + " (dnnl_sgemm)";
  }();
  return name.c_str();
}

void set_gemm_threads(int n) {
  LOOM_CHECK(n >= 1, "set_gemm_threads: n must be >= 1, got {}", n);
  g_gemm_threads.store(n, std::memory_order_relaxed);
  omp_set_num_threads(n);
}

int kernel_threads() {
  apply_thread_setting();
  return omp_get_max_threads();
}

}  // namespace loom::cpu
