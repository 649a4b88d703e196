#include "tensor/cpu/gemm_bf16.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "tensor/cpu/gemm.h"

namespace loom::cpu {

namespace {

using Tag = dnnl::memory::data_type;

// Everything a primitive depends on.
using ProblemKey =
    std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool>;

struct Problem {
  dnnl::memory::desc a, b, c, bias, scratchpad;
  dnnl::matmul primitive;
};

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// Row-major (rows, cols) with row stride `ld`, or its transpose as stored.
dnnl::memory::desc matrix(int64_t rows, int64_t cols, int64_t ld, bool transposed, Tag type) {
  return transposed ? dnnl::memory::desc({rows, cols}, type, {1, ld})
                    : dnnl::memory::desc({rows, cols}, type, {ld, 1});
}

const Problem& problem(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
                       int64_t lda, int64_t ldb, int64_t ldc, bool c_bf16, bool with_bias) {
  static std::mutex mutex;
  static std::map<ProblemKey, Problem> problems;
  const ProblemKey key{transpose_a, transpose_b, m, n, k, lda, ldb, ldc, c_bf16, with_bias};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = problems.find(key);
  if (it != problems.end()) return it->second;
  Problem p;
  p.a = matrix(m, k, lda, transpose_a, Tag::bf16);
  p.b = matrix(k, n, ldb, transpose_b, Tag::bf16);
  p.c = matrix(m, n, ldc, false, c_bf16 ? Tag::bf16 : Tag::f32);
  if (with_bias) p.bias = dnnl::memory::desc({1, n}, Tag::bf16, {n, 1});
  try {
    const dnnl::matmul::desc desc =
        with_bias ? dnnl::matmul::desc(p.a, p.b, p.bias, p.c) : dnnl::matmul::desc(p.a, p.b, p.c);
    // The caller's scratchpad: with the library's (the default) a primitive's scratch space is
    // shared by every thread that runs it, and ranks that are threads of one process (tests,
    // comm_bench) then overwrite each other's partial sums (seen: wrong bf16 gradients in a
    // multi-rank test, once in several runs).
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
    p.scratchpad = pd.scratchpad_desc();
    p.primitive = dnnl::matmul(pd);
  } catch (const dnnl::error& e) {
    LOOM_FAIL(
        "gemm_bf16: oneDNN cannot build a bf16 matmul for m={}, n={}, k={} (transpose_a={}, "
        "transpose_b={}, lda={}, ldb={}, ldc={}): {}",
        m, n, k, transpose_a, transpose_b, lda, ldb, ldc, e.what());
  }
  return problems.emplace(key, std::move(p)).first->second;
}

void check_args(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, int64_t lda,
                int64_t ldb, int64_t ldc) {
  LOOM_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm_bf16: sizes must be >= 0, got m={}, n={}, k={}", m,
             n, k);
  const int64_t a_cols = transpose_a ? m : k, b_cols = transpose_b ? k : n;
  LOOM_CHECK(lda >= std::max<int64_t>(1, a_cols),
             "gemm_bf16: lda={} is too small; A is stored {}, so lda must be >= max(1, {})", lda,
             transpose_a ? "transposed" : "as is", a_cols);
  LOOM_CHECK(ldb >= std::max<int64_t>(1, b_cols),
             "gemm_bf16: ldb={} is too small; B is stored {}, so ldb must be >= max(1, {})", ldb,
             transpose_b ? "transposed" : "as is", b_cols);
  LOOM_CHECK(ldc >= std::max<int64_t>(1, n), "gemm_bf16: ldc={} is too small for n={}", ldc, n);
}

void run(const Problem& p, dnnl::stream& stream, const uint16_t* a, const uint16_t* b, void* c,
         const uint16_t* bias) {
  auto& engine = cpu_engine();
  dnnl::memory am(p.a, engine, const_cast<uint16_t*>(a));
  dnnl::memory bm(p.b, engine, const_cast<uint16_t*>(b));
  dnnl::memory cm(p.c, engine, c);
  // Per thread, grown to the largest asked for.
  thread_local std::vector<char> scratch;
  if (scratch.size() < p.scratchpad.get_size()) scratch.resize(p.scratchpad.get_size());
  dnnl::memory sm(p.scratchpad, engine, scratch.data());
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sm}};
  if (bias != nullptr)
    args.emplace(DNNL_ARG_BIAS, dnnl::memory(p.bias, engine, const_cast<uint16_t*>(bias)));
  p.primitive.execute(stream, args);
}

// C = 0 (f32 or bf16 zeros are all-zero bits) for K == 0, plus the bias when given.
void fill_without_product(int64_t m, int64_t n, void* c, bool c_bf16, int64_t ldc,
                          const uint16_t* bias) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const uint16_t value = bias ? bias[j] : 0;
      if (c_bf16) {
        static_cast<uint16_t*>(c)[i * ldc + j] = value;
      } else {
        const uint32_t bits = static_cast<uint32_t>(value) << 16;
        float f;
        std::memcpy(&f, &bits, sizeof(f));
        static_cast<float*>(c)[i * ldc + j] = f;
      }
    }
  }
}

}  // namespace

bool bf16_gemm_native() {
  static const bool native = [] {
    const char* env = std::getenv("LOOM_BF16_GEMM");
    if (env != nullptr && std::string(env) == "0") return false;
    const int isa = static_cast<int>(dnnl_get_effective_cpu_isa());
    return (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
  }();
  return native;
}

namespace {

void batch_with_bias(int64_t batch, bool transpose_a, bool transpose_b, int64_t m, int64_t n,
                     int64_t k, const uint16_t* a, int64_t lda, std::span<const int64_t> a_offsets,
                     const uint16_t* b, int64_t ldb, std::span<const int64_t> b_offsets, void* c,
                     bool c_bf16, int64_t ldc, std::span<const int64_t> c_offsets,
                     const uint16_t* bias) {
  check_args(transpose_a, transpose_b, m, n, k, lda, ldb, ldc);
  LOOM_CHECK(static_cast<int64_t>(a_offsets.size()) == batch &&
                 static_cast<int64_t>(b_offsets.size()) == batch &&
                 static_cast<int64_t>(c_offsets.size()) == batch,
             "gemm_bf16: {} entries, but {}, {} and {} offsets", batch, a_offsets.size(),
             b_offsets.size(), c_offsets.size());
  if (batch == 0 || m == 0 || n == 0) return;
  const size_t c_size = c_bf16 ? 2 : 4;
  if (k == 0) {
    for (int64_t i = 0; i < batch; ++i) {
      fill_without_product(m, n, static_cast<char*>(c) + c_offsets[i] * c_size, c_bf16, ldc, bias);
    }
    return;
  }
  kernel_threads();  // applies set_gemm_threads on this thread (oneDNN runs OpenMP)
  const Problem& p =
      problem(transpose_a, transpose_b, m, n, k, lda, ldb, ldc, c_bf16, bias != nullptr);
  thread_local dnnl::stream stream(cpu_engine());
  try {
    for (int64_t i = 0; i < batch; ++i) {
      run(p, stream, a + a_offsets[i], b + b_offsets[i],
          static_cast<char*>(c) + c_offsets[i] * c_size, bias);
    }
  } catch (const dnnl::error& e) {
    LOOM_FAIL("gemm_bf16: oneDNN failed on m={}, n={}, k={}: {}", m, n, k, e.what());
  }
}

}  // namespace

void gemm_bf16(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
               const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, void* c, bool c_bf16,
               int64_t ldc, const uint16_t* bias) {
  const int64_t zero = 0;
  batch_with_bias(1, transpose_a, transpose_b, m, n, k, a, lda, {&zero, 1}, b, ldb, {&zero, 1}, c,
                  c_bf16, ldc, {&zero, 1}, bias);
}

void gemm_bf16_batched_at(int64_t batch, bool transpose_a, bool transpose_b, int64_t m, int64_t n,
                          int64_t k, const uint16_t* a, int64_t lda,
                          std::span<const int64_t> a_offsets, const uint16_t* b, int64_t ldb,
                          std::span<const int64_t> b_offsets, void* c, bool c_bf16, int64_t ldc,
                          std::span<const int64_t> c_offsets) {
  batch_with_bias(batch, transpose_a, transpose_b, m, n, k, a, lda, a_offsets, b, ldb, b_offsets, c,
                  c_bf16, ldc, c_offsets, nullptr);
}

}  // namespace loom::cpu
