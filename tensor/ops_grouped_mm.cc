#include "tensor/ops_grouped_mm.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "base/error.h"
#include "tensor/cpu/gemm.h"
#include "tensor/cpu/parallel.h"
#include "tensor/cuda/gemm_cublaslt.h"
#include "tensor/device.h"
#include "tensor/flop_counter.h"
#include "tensor/op_device.h"
#include "tensor/ops_copy.h"
#include "tensor/ops_create.h"
#include "tensor/shape.h"

namespace loom::ops {

namespace {

void check_operands(const Tensor& a, const Tensor& b, std::string_view op, const char* a_name,
                    const char* b_name) {
  LOOM_CHECK(a.defined() && b.defined() && is_floating(a.dtype()) && a.dtype() == b.dtype(),
             "{}: expected {} and {} floating, of one dtype; got {} and {}", op, a_name, b_name,
             a.defined() ? dtype_name(a.dtype()) : "undefined",
             b.defined() ? dtype_name(b.dtype()) : "undefined");
}

// The dtype the products run in: CPU computes in f32 (the one sgemm), CUDA in the operands' (and
// a meta trace as the device it stands for, tensor/device.h).
DType compute_dtype(const Tensor& t) {
  return allocates_like_cpu(t.device()) ? kFloat32 : t.dtype();
}

// One group's C = op(A) @ op(B) at element offsets, on the operands' device.
void group_gemm(const Device& device, DType dtype, bool transpose_a, bool transpose_b, int64_t m,
                int64_t n, int64_t k, const Tensor& a, int64_t a_offset, int64_t lda,
                const Tensor& b, int64_t b_offset, int64_t ldb, Tensor& c, int64_t c_offset,
                int64_t ldc) {
  if (device.is_cuda()) {
    const size_t e = element_size(dtype);
    const cuda::GemmProblem p{.dtype = dtype,
                              .transpose_a = transpose_a,
                              .transpose_b = transpose_b,
                              .m = m,
                              .n = n,
                              .k = k,
                              .lda = lda,
                              .ldb = ldb,
                              .ldc = ldc};
    cuda::gemm(p, static_cast<const char*>(a.raw_data()) + a_offset * e,
               static_cast<const char*>(b.raw_data()) + b_offset * e,
               static_cast<char*>(c.raw_data()) + c_offset * e, device.index);
    return;
  }
  cpu::sgemm(transpose_a, transpose_b, m, n, k, 1.0f, a.data<float>() + a_offset, lda,
             b.data<float>() + b_offset, ldb, 0.0f, c.data<float>() + c_offset, ldc);
}

// Runs the groups' GEMMs (`run(g)`, with `work[g]` its rows) on the CPU: a group bigger than one
// thread's fair share runs alone on every thread (the GEMM's own threading), the others are dealt
// to the threads by size (largest first, to the least loaded), each running single-threaded in
// one parallel region: many small uneven experts keep every core busy, where one GEMM after
// another would split each small product over the threads.
void run_groups_on_cpu(const std::vector<int64_t>& work, const std::function<void(int64_t)>& run) {
  const int64_t threads = cpu::kernel_threads();
  int64_t total = 0;
  for (int64_t w : work) total += w;
  std::vector<int64_t> small;
  for (int64_t g = 0; g < static_cast<int64_t>(work.size()); ++g) {
    if (work[g] == 0) continue;
    if (threads <= 1 || work[g] * threads >= total) {
      run(g);
    } else {
      small.push_back(g);
    }
  }
  if (small.empty()) return;
  std::sort(small.begin(), small.end(), [&](int64_t a, int64_t b) {
    return work[a] > work[b] || (work[a] == work[b] && a < b);
  });
  std::vector<std::vector<int64_t>> lists(threads);
  std::vector<int64_t> load(threads, 0);
  for (int64_t g : small) {
    const auto t = std::min_element(load.begin(), load.end()) - load.begin();
    lists[t].push_back(g);
    load[t] += work[g];
  }
  cpu::parallel_for(threads, /*grain=*/1, /*align=*/1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t g : lists[t]) run(g);
    }
  });
}

// Every group's GEMM: on CUDA one after another on the stream, on the CPU as run_groups_on_cpu.
void run_groups(const Device& device, std::span<const int64_t> offsets,
                const std::function<void(int64_t)>& run) {
  const int64_t groups = static_cast<int64_t>(offsets.size()) - 1;
  if (device.is_cuda()) {
    for (int64_t g = 0; g < groups; ++g) run(g);
    return;
  }
  std::vector<int64_t> work(groups);
  for (int64_t g = 0; g < groups; ++g) work[g] = offsets[g + 1] - offsets[g];
  run_groups_on_cpu(work, run);
}

}  // namespace

void check_group_offsets(std::span<const int64_t> offsets, int64_t groups, int64_t rows,
                         std::string_view op) {
  LOOM_CHECK(static_cast<int64_t>(offsets.size()) == groups + 1,
             "{}: {} group offsets for {} groups; expected groups + 1 = {}", op, offsets.size(),
             groups, groups + 1);
  LOOM_CHECK(offsets.front() == 0 && offsets.back() == rows,
             "{}: group offsets run from {} to {}; expected 0 to the {} rows", op, offsets.front(),
             offsets.back(), rows);
  for (size_t g = 0; g + 1 < offsets.size(); ++g) {
    LOOM_CHECK(offsets[g] <= offsets[g + 1],
               "{}: group offsets decrease at group {} ({} then {}); they must not", op, g,
               offsets[g], offsets[g + 1]);
  }
}

Tensor grouped_mm(const Tensor& a_in, const Tensor& b_in, std::span<const int64_t> offsets,
                  bool transpose_b) {
  constexpr std::string_view op = "grouped_mm";
  check_operands(a_in, b_in, op, "a", "b");
  LOOM_CHECK(a_in.dim() == 2 && b_in.dim() == 3,
             "{}: expected a (N, K) and b (G, R, C); got shapes {} and {}", op,
             shape_str(a_in.shape()), shape_str(b_in.shape()));
  const Device device = op_device(op, {a_in, b_in});
  const int64_t groups = b_in.size(0), rows = a_in.size(0);
  const int64_t k = transpose_b ? b_in.size(2) : b_in.size(1);
  const int64_t n = transpose_b ? b_in.size(1) : b_in.size(2);
  LOOM_CHECK(a_in.size(1) == k, "{}: a's rows have {} elements, but b {}{} takes {}", op,
             a_in.size(1), shape_str(b_in.shape()), transpose_b ? " transposed" : "", k);
  check_group_offsets(offsets, groups, rows, op);
  const DType dtype = compute_dtype(a_in);
  const Tensor a = contiguous(to(a_in, dtype)), b = contiguous(to(b_in, dtype));
  // Every row belongs to one group, so every row is written (k == 0: zeros).
  Tensor out = k == 0 ? zeros({rows, n}, dtype, device) : Tensor::empty({rows, n}, dtype, device);
  FlopCounter::record(2 * rows * n * k);  // a meta trace's too: what `loom plan` times
  if (device.is_meta()) return to(out, a_in.dtype());
  const auto run = [&](int64_t g) {
    const int64_t m = offsets[g + 1] - offsets[g];
    if (m == 0 || n == 0 || k == 0) return;
    group_gemm(device, dtype, false, transpose_b, m, n, k, a, offsets[g] * k, k, b,
               g * b.size(1) * b.size(2), b.size(2), out, offsets[g] * n, n);
  };
  run_groups(device, offsets, run);
  return to(out, a_in.dtype());
}

Tensor grouped_mm_weight_grad(const Tensor& dy_in, const Tensor& x_in,
                              std::span<const int64_t> offsets) {
  constexpr std::string_view op = "grouped_mm_weight_grad";
  check_operands(dy_in, x_in, op, "dy", "x");
  LOOM_CHECK(dy_in.dim() == 2 && x_in.dim() == 2 && dy_in.size(0) == x_in.size(0),
             "{}: expected dy (N, M) and x (N, K) with the same rows; got shapes {} and {}", op,
             shape_str(dy_in.shape()), shape_str(x_in.shape()));
  const Device device = op_device(op, {dy_in, x_in});
  const int64_t groups = static_cast<int64_t>(offsets.size()) - 1;
  LOOM_CHECK(groups >= 0, "{}: group offsets are empty; expected groups + 1 of them", op);
  const int64_t rows = x_in.size(0), m = dy_in.size(1), k = x_in.size(1);
  check_group_offsets(offsets, groups, rows, op);
  const DType dtype = compute_dtype(x_in);
  const Tensor dy = contiguous(to(dy_in, dtype)), x = contiguous(to(x_in, dtype));
  Tensor dw = zeros({groups, m, k}, dtype, device);
  FlopCounter::record(2 * rows * m * k);
  if (device.is_meta()) return to(dw, x_in.dtype());
  const auto run = [&](int64_t g) {
    const int64_t count = offsets[g + 1] - offsets[g];
    if (count == 0 || m == 0 || k == 0) return;
    // dw[g] (M, K) = dy[g]^T (M, count) @ x[g] (count, K)
    group_gemm(device, dtype, /*transpose_a=*/true, false, m, k, count, dy, offsets[g] * m, m, x,
               offsets[g] * k, k, dw, g * m * k, k);
  };
  run_groups(device, offsets, run);
  return to(dw, x_in.dtype());
}

}  // namespace loom::ops
