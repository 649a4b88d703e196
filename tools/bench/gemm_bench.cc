// gemm_bench: single-thread f32 GEMM throughput of the CPU GEMM candidates (OpenBLAS, BLIS,
// oneDNN) on GPT-2's forward matmul shapes, against one core's measured AVX-512 FMA peak.
// This measurement chose the library behind //tensor/cpu:gemm (see docs/cpu_gemm.md).
//
//   bazel run -c opt //tools/bench:gemm_bench -- --shapes all --repeats 5
//
// Every product is row-major C[M,N] = A[M,K] @ B[K,N]; the LM head's weight is stored (vocab, C),
// so there B is read transposed. Each library runs on one thread, set through its own API
// (openblas_set_num_threads, bli_thread_set_num_threads, omp_set_num_threads for oneDNN's OpenMP
// runtime); the "cpu/wall" line checks that: ~1.00 means one busy thread.
//
// OpenBLAS and BLIS both export cblas_sgemm. To be sure which one runs, OpenBLAS's cblas_sgemm is
// looked up inside libopenblas itself (dlsym on its handle) and BLIS is called through its native
// bli_sgemm, whatever order the linker put the libraries in.
#include <blis.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <immintrin.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

extern "C" {
void openblas_set_num_threads(int num_threads);
char* openblas_get_corename(void);
char* openblas_get_config(void);
}

namespace {

using Clock = std::chrono::steady_clock;

// The three clocks every timed region reads. Under KVM with paravirt steal accounting (this
// machine's kernel has it), CPU time excludes the time the hypervisor gave the core to another
// guest, so --clock cpu measures what the library does while it has the core; --clock wall is
// the plain wall clock, inflated by steal on a shared host.
struct Stamp {
  double wall = 0;     // steady clock
  double process = 0;  // CPU time of every thread of the process
  double thread = 0;   // CPU time of the calling thread only
};

double timespec_seconds(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

Stamp stamp() {
  return {std::chrono::duration<double>(Clock::now().time_since_epoch()).count(),
          timespec_seconds(CLOCK_PROCESS_CPUTIME_ID), timespec_seconds(CLOCK_THREAD_CPUTIME_ID)};
}

Stamp operator-(const Stamp& x, const Stamp& y) {
  return {x.wall - y.wall, x.process - y.process, x.thread - y.thread};
}

// (steal, total) jiffies of all CPUs from /proc/stat: a VM's "steal" is time the hypervisor ran
// something else while this guest wanted the CPU; it inflates wall-clock timings.
std::pair<double, double> steal_and_total_jiffies() {
  FILE* f = std::fopen("/proc/stat", "r");
  if (f == nullptr) return {0, 0};
  double v[8] = {};
  const int got = std::fscanf(f, "cpu %lf %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3],
                              &v[4], &v[5], &v[6], &v[7]);
  std::fclose(f);
  if (got != 8) return {0, 0};
  double total = 0;
  for (double x : v) total += x;
  return {v[7], total};
}

// ---- One core's FMA peak -------------------------------------------------------------------
// `Chains` independent accumulator chains hide the FMA latency (4 cycles x 2 pipes needs >= 8);
// a and b are loop-invariant, so without -ffast-math the compiler must issue every FMA. AVX2 has
// 16 ymm registers: 14 chains + a + b fill them exactly (16 chains would spill to the stack).
constexpr int kChains512 = 16;
constexpr int kChains256 = 14;

template <int Chains>
__attribute__((target("avx512f"), noinline)) double fma_peak_avx512(int64_t iters) {
  __m512 acc[Chains];
  for (int i = 0; i < Chains; ++i) acc[i] = _mm512_set1_ps(1.0f + 1e-3f * i);
  const __m512 a = _mm512_set1_ps(0.999999f);
  const __m512 b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < Chains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  float out[16];
  double total = 0;
  for (int i = 0; i < Chains; ++i) {
    _mm512_storeu_ps(out, acc[i]);
    total += out[0];
  }
  return total;
}

template <int Chains>
__attribute__((target("avx2,fma"), noinline)) double fma_peak_avx2(int64_t iters) {
  __m256 acc[Chains];
  for (int i = 0; i < Chains; ++i) acc[i] = _mm256_set1_ps(1.0f + 1e-3f * i);
  const __m256 a = _mm256_set1_ps(0.999999f);
  const __m256 b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < Chains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  float out[8];
  double total = 0;
  for (int i = 0; i < Chains; ++i) {
    _mm256_storeu_ps(out, acc[i]);
    total += out[0];
  }
  return total;
}

// Best of `trials` timed runs, in GFLOP/s; `flops_per_iter` = chains * lanes * 2.
double measure_peak(double (*kernel)(int64_t), int flops_per_iter, int trials, bool cpu_clock) {
  const int64_t iters = 20'000'000;
  volatile double sink = kernel(iters / 10);  // warm up (clock ramp, AVX-512 license)
  double best = 0;
  for (int t = 0; t < trials; ++t) {
    const Stamp start = stamp();
    sink = sink + kernel(iters);
    const Stamp took = stamp() - start;
    const double seconds = cpu_clock ? took.process : took.wall;
    best = std::max(best, flops_per_iter * static_cast<double>(iters) / seconds * 1e-9);
  }
  return best;
}

// ---- Libraries ---------------------------------------------------------------------------
struct Shape {
  std::string set;   // "small" or "124m"
  std::string name;  // "qkv", "attn_proj", ...
  int64_t m, n, k;
  bool transpose_b;  // B stored (N, K)
};

// C = A @ op(B), row-major, alpha = 1, beta = 0.
using GemmFn = std::function<void(const Shape&, const float* a, const float* b, float* c)>;

struct Library {
  std::string name;
  GemmFn gemm;
};

using CblasSgemm = void (*)(int order, int transa, int transb, int m, int n, int k, float alpha,
                            const float* a, int lda, const float* b, int ldb, float beta, float* c,
                            int ldc);

// Returns the file that defines `symbol_address`, e.g. ".../libopenblas.so.0".
std::string library_file_of(const void* symbol_address) {
  Dl_info info{};
  if (dladdr(symbol_address, &info) == 0 || info.dli_fname == nullptr) return "?";
  return info.dli_fname;
}

CblasSgemm openblas_cblas_sgemm(std::string* file) {
  *file = library_file_of(reinterpret_cast<const void*>(&openblas_get_config));
  void* handle = dlopen(file->c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) {
    fmt::print(stderr, "gemm_bench: cannot reopen {}: {}\n", *file, dlerror());
    std::exit(1);
  }
  auto fn = reinterpret_cast<CblasSgemm>(dlsym(handle, "cblas_sgemm"));
  if (fn == nullptr || library_file_of(reinterpret_cast<const void*>(fn)) != *file) {
    fmt::print(stderr, "gemm_bench: cblas_sgemm not found inside {}\n", *file);
    std::exit(1);
  }
  return fn;
}

std::vector<Library> make_libraries(bool print_info) {
  std::vector<Library> libs;

  // OpenBLAS (pthread build): its own thread-count call.
  openblas_set_num_threads(1);
  std::string openblas_file;
  CblasSgemm openblas_sgemm = openblas_cblas_sgemm(&openblas_file);
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  libs.push_back(
      {"OpenBLAS", [openblas_sgemm](const Shape& s, const float* a, const float* b, float* c) {
         constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
         openblas_sgemm(kRowMajor, kNoTrans, s.transpose_b ? kTrans : kNoTrans, s.m, s.n, s.k, 1.0f,
                        a, s.k, b, s.transpose_b ? s.k : s.n, 0.0f, c, s.n);
       }});

  // BLIS (OpenMP build): native API with row strides (rs = ld, cs = 1).
  bli_thread_set_num_threads(1);
  libs.push_back({"BLIS", [](const Shape& s, const float* a, const float* b, float* c) {
                    float one = 1.0f, zero = 0.0f;
                    bli_sgemm(BLIS_NO_TRANSPOSE, s.transpose_b ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE,
                              s.m, s.n, s.k, &one, const_cast<float*>(a), s.k, 1,
                              const_cast<float*>(b), s.transpose_b ? s.k : s.n, 1, &zero, c, s.n,
                              1);
                  }});

  // oneDNN (OpenMP runtime): dnnl_sgemm uses omp_get_max_threads() of the calling thread.
  // OMP_NUM_THREADS is read once when libgomp loads (before main), so setenv here is too late;
  // omp_set_num_threads is what works.
  omp_set_num_threads(1);
  libs.push_back(
      {"oneDNN", [](const Shape& s, const float* a, const float* b, float* c) {
         dnnl_status_t status = dnnl_sgemm('N', s.transpose_b ? 'T' : 'N', s.m, s.n, s.k, 1.0f, a,
                                           s.k, b, s.transpose_b ? s.k : s.n, 0.0f, c, s.n);
         if (status != dnnl_success) {
           fmt::print(stderr, "gemm_bench: dnnl_sgemm failed ({})\n", static_cast<int>(status));
           std::exit(1);
         }
       }});

  if (print_info) {
    const dnnl_version_t* v = dnnl_version();
    const int isa = dnnl_get_effective_cpu_isa();
    fmt::print("OpenBLAS: {} | core {} | OPENBLAS_CORETYPE={} | cblas_sgemm from {}\n",
               openblas_get_config(), openblas_get_corename(), coretype ? coretype : "(unset)",
               openblas_file);
    fmt::print("BLIS:     {} | arch {} | bli_sgemm from {}\n", bli_info_get_version_str(),
               bli_arch_string(bli_arch_query_id()),
               library_file_of(reinterpret_cast<const void*>(&bli_sgemm)));
    fmt::print("oneDNN:   {}.{}.{} ({}) | effective ISA 0x{:x}{} | dnnl_sgemm from {}\n", v->major,
               v->minor, v->patch, v->hash, isa,
               isa == dnnl_cpu_isa_avx512_core   ? " = avx512_core"
               : isa == dnnl_cpu_isa_avx2        ? " = avx2"
               : isa >= dnnl_cpu_isa_avx512_core ? " (avx512_core + extensions)"
                                                 : "",
               library_file_of(reinterpret_cast<const void*>(&dnnl_sgemm)));
  }
  return libs;
}

// ---- Shapes --------------------------------------------------------------------------------
// A GPT block's forward matmuls for n_embd = c and m = batch * seq tokens, plus the LM head.
std::vector<Shape> gpt_shapes(const std::string& set, int64_t m, int64_t c, int64_t vocab) {
  return {
      {set, "qkv", m, 3 * c, c, false},          {set, "attn_proj", m, c, c, false},
      {set, "mlp_up", m, 4 * c, c, false},       {set, "mlp_down", m, c, 4 * c, false},
      {set, "lm_head (B^T)", m, vocab, c, true},
  };
}

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], AlignedFree>;

Buffer alloc(int64_t count) {
  const size_t bytes = ((count * sizeof(float) + 63) / 64) * 64;
  return Buffer(static_cast<float*>(std::aligned_alloc(64, bytes)));
}

void fill_random(float* p, int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t i = 0; i < count; ++i) p[i] = dist(rng);
}

// Seconds per call over the repeats, by the clock the table uses and by the wall clock.
struct Result {
  double best = 0;
  double median = 0;
  double median_wall = 0;
};

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Single-thread f32 GEMM throughput of OpenBLAS, BLIS and oneDNN on GPT-2 shapes"};
  std::string shapes_flag = "all";
  std::string clock_flag = "cpu";
  int repeats = 5;
  int64_t m_small = 8 * 64;
  int64_t m_124m = 1024;
  double min_seconds = 0.05;
  app.add_option("--shapes", shapes_flag, "small | 124m | all")
      ->check(CLI::IsMember({"small", "124m", "all"}));
  app.add_option("--repeats", repeats, "timed repeats per shape and library (best and median)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--clock", clock_flag,
                 "cpu: process CPU time (excludes VM steal; counts every thread) | wall")
      ->check(CLI::IsMember({"cpu", "wall"}));
  app.add_option("--m-small", m_small, "tokens M = B*T for the small GPT (default 8*64)");
  app.add_option("--m-124m", m_124m,
                 "tokens M for GPT-2 124M (default 1024; the 8*1024 batch takes 8x longer)");
  app.add_option("--min-seconds", min_seconds,
                 "each repeat loops a shape until at least this long (small shapes)");
  CLI11_PARSE(app, argc, argv);
  const bool cpu_clock = clock_flag == "cpu";

  std::vector<Shape> shapes;
  if (shapes_flag != "124m") {
    for (auto& s : gpt_shapes("small", m_small, 128, 512)) shapes.push_back(s);
  }
  if (shapes_flag != "small") {
    for (auto& s : gpt_shapes("124m", m_124m, 768, 50257)) shapes.push_back(s);
  }

  fmt::print("gemm_bench: one thread, f32, row-major C[M,N] = A[M,K] @ B[K,N]\n");
  std::vector<Library> libs = make_libraries(/*print_info=*/true);
  const auto [steal0, total0] = steal_and_total_jiffies();

  const bool has_avx512 = __builtin_cpu_supports("avx512f");
  const double peak_avx2 =
      measure_peak(fma_peak_avx2<kChains256>, kChains256 * 8 * 2, 5, cpu_clock);
  const double peak =
      has_avx512 ? measure_peak(fma_peak_avx512<kChains512>, kChains512 * 16 * 2, 5, cpu_clock)
                 : peak_avx2;
  fmt::print(
      "FMA peak, one core: AVX-512 {:.1f} GFLOP/s{} ({} chains), AVX2 {:.1f} GFLOP/s "
      "({} chains); best of 5\n",
      has_avx512 ? peak : 0.0, has_avx512 ? "" : " (no AVX-512: using AVX2)", kChains512, peak_avx2,
      kChains256);

  std::vector<std::vector<Result>> results(shapes.size(), std::vector<Result>(libs.size()));
  std::vector<Stamp> lib_total(libs.size());

  for (size_t si = 0; si < shapes.size(); ++si) {
    const Shape& s = shapes[si];
    Buffer a = alloc(s.m * s.k), b = alloc(s.k * s.n), c = alloc(s.m * s.n), ref = alloc(s.m * s.n);
    fill_random(a.get(), s.m * s.k, 1);
    fill_random(b.get(), s.k * s.n, 2);

    // Calls per repeat, so a repeat of a small shape lasts >= min_seconds. Warm up every
    // library (first-call setup, page faults) and check it against the first one.
    std::vector<int> calls(libs.size(), 1);
    for (size_t li = 0; li < libs.size(); ++li) {
      float* out = li == 0 ? ref.get() : c.get();
      const Stamp start = stamp();
      libs[li].gemm(s, a.get(), b.get(), out);
      const double once = (stamp() - start).wall;
      calls[li] = std::max(1, static_cast<int>(std::ceil(min_seconds / std::max(once, 1e-7))));
      if (li > 0) {
        double max_err = 0;
        for (int64_t i = 0; i < s.m * s.n; ++i) {
          max_err = std::max(max_err, std::abs(double(out[i]) - double(ref[i])) /
                                          (1.0 + std::abs(double(ref[i]))));
        }
        if (max_err > 1e-5 * s.k) {
          fmt::print(stderr, "gemm_bench: {} disagrees with {} on {}/{}: max rel err {}\n",
                     libs[li].name, libs[0].name, s.set, s.name, max_err);
          return 1;
        }
      }
    }

    // Interleave the libraries repeat by repeat so a load change on the machine hits all alike.
    std::vector<std::vector<double>> secs(libs.size()), wall_secs(libs.size());
    for (int r = 0; r < repeats; ++r) {
      for (size_t li = 0; li < libs.size(); ++li) {
        const Stamp start = stamp();
        for (int i = 0; i < calls[li]; ++i) libs[li].gemm(s, a.get(), b.get(), c.get());
        const Stamp took = stamp() - start;
        lib_total[li] = {lib_total[li].wall + took.wall, lib_total[li].process + took.process,
                         lib_total[li].thread + took.thread};
        secs[li].push_back((cpu_clock ? took.process : took.wall) / calls[li]);
        wall_secs[li].push_back(took.wall / calls[li]);
      }
    }
    for (size_t li = 0; li < libs.size(); ++li) {
      results[si][li] = {*std::min_element(secs[li].begin(), secs[li].end()), median_of(secs[li]),
                         median_of(wall_secs[li])};
    }
  }
  const auto [steal1, total1] = steal_and_total_jiffies();

  // ---- Table ----
  fmt::print("GFLOP/s = 2*M*N*K / {} time, best of {} repeats; %peak against the {} peak\n\n",
             cpu_clock ? "CPU" : "wall", repeats, has_avx512 ? "AVX-512" : "AVX2");
  const auto row_label = [](const std::string& set, const std::string& what) {
    return fmt::format("{:<6} {:<34}", set, what);
  };
  std::string header =
      row_label("model", fmt::format("{:<14} {:>6} {:>6} {:>5}", "shape", "M", "N", "K"));
  for (auto& lib : libs) header += fmt::format(" | {:>8} {:>5}", lib.name, "%peak");
  fmt::print("{}\n{}\n", header, std::string(header.size(), '-'));
  const auto cell = [&](double gflops) {
    return fmt::format(" | {:>8.1f} {:>4.0f}%", gflops, 100.0 * gflops / peak);
  };
  for (size_t si = 0; si < shapes.size(); ++si) {
    const Shape& s = shapes[si];
    std::string line =
        row_label(s.set, fmt::format("{:<14} {:>6} {:>6} {:>5}", s.name, s.m, s.n, s.k));
    for (size_t li = 0; li < libs.size(); ++li) {
      line += cell(2.0 * s.m * s.n * s.k / results[si][li].best * 1e-9);
    }
    fmt::print("{}\n", line);
  }
  // Totals: a set's shapes back to back, median repeats, time-weighted: what that model's
  // forward matmuls would see. Once by the table's clock, once by the wall clock.
  for (const bool wall : {false, true}) {
    if (wall && !cpu_clock) continue;
    for (const std::string set : {"small", "124m"}) {
      double flops = 0;
      std::vector<double> seconds(libs.size(), 0);
      for (size_t si = 0; si < shapes.size(); ++si) {
        if (shapes[si].set != set) continue;
        flops += 2.0 * shapes[si].m * shapes[si].n * shapes[si].k;
        for (size_t li = 0; li < libs.size(); ++li) {
          seconds[li] += wall ? results[si][li].median_wall : results[si][li].median;
        }
      }
      if (flops == 0) continue;
      std::string line = row_label(
          set, fmt::format("TOTAL, median, {} clock", wall || !cpu_clock ? "wall" : "CPU"));
      for (size_t li = 0; li < libs.size(); ++li) line += cell(flops / seconds[li] * 1e-9);
      fmt::print("{}\n", line);
    }
  }
  // All of a library's CPU time on the calling thread means it ran single-threaded.
  std::string threads = row_label("", "calling thread's share of CPU time");
  for (size_t li = 0; li < libs.size(); ++li) {
    threads +=
        fmt::format(" | {:>14.2f}", lib_total[li].thread / std::max(lib_total[li].process, 1e-9));
  }
  fmt::print("{}\n", threads);
  if (total1 > total0) {
    fmt::print("VM steal during the run: {:.1f}% of all CPU time{}\n",
               100.0 * (steal1 - steal0) / (total1 - total0),
               cpu_clock ? " (excluded by the CPU clock)" : " (included in wall time)");
  }
  return 0;
}
