// Host emulator for flash_attention_mma.cu's kernels: the kernel code is the file's own text
// (kern_part.inc, extracted by extract.sh with sed, which also instruments the shared- and
// global-memory accesses); only mma.sync, __shfl_xor_sync, __syncthreads and the thread/block
// indices are emulated here, from the PTX ISA's fragment layouts. v2: per-operand strided
// layouts (AttentionLayouts), global accesses checked against each operand's logical elements.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "tensor/cuda/kernels/flash_attention_mma.h"
#include "tensor/cuda/kernels/nn.h"

#undef __device__
#undef __global__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#define __device__
#define __global__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)

struct Idx {
  unsigned x = 0, y = 0, z = 0;
};
thread_local Idx threadIdx, blockIdx;
Idx blockDim{128, 1, 1};

namespace emu {
unsigned char* smem = nullptr;
size_t smem_bytes = 0;
constexpr size_t kGuard = 4096;
std::barrier<>* block_bar = nullptr;
std::barrier<>* warp_bar[4] = {};
thread_local int epoch = 0;
// Warp exchange buffers.
uint32_t a_in[4][32][4], b_in[4][32][2];
const void* ld_in[4][32];
float c_in[4][32][4];
float xch[4][32];
bool race_check = true;
std::mutex shadow_mu;
struct Shadow {
  int w_tid = -1, w_ep = -1, r_tid = -1, r_ep = -1;
  bool r_multi = false;
};
std::vector<Shadow> shadow;
std::atomic<long> races{0}, oob{0};

inline int tid() { return static_cast<int>(threadIdx.x); }

void note(const void* p, size_t n, bool write) {
  const size_t off = static_cast<const unsigned char*>(p) - smem;
  if (off + n > smem_bytes) {
    if (oob.fetch_add(1) < 5)
      std::printf("  OOB smem %s at byte %zu (+%zu) of %zu, tid %d\n", write ? "write" : "read",
                  off, n, smem_bytes, tid());
  }
  if (!race_check) return;
  std::lock_guard<std::mutex> lock(shadow_mu);
  for (size_t i = off; i < off + n && i < shadow.size(); ++i) {
    Shadow& s = shadow[i];
    bool race = false;
    if (write) {
      if (s.w_ep == epoch && s.w_tid != tid()) race = true;
      if (s.r_ep == epoch && (s.r_tid != tid() || s.r_multi)) race = true;
      s.w_ep = epoch;
      s.w_tid = tid();
    } else {
      if (s.w_ep == epoch && s.w_tid != tid()) race = true;
      if (s.r_ep == epoch) {
        if (s.r_tid != tid()) s.r_multi = true;
      } else {
        s.r_ep = epoch;
        s.r_tid = tid();
        s.r_multi = false;
      }
    }
    if (race && races.fetch_add(1) < 5)
      std::printf("  RACE %s byte %zu tid %d epoch %d (w_tid %d w_ep %d r_tid %d r_ep %d)\n",
                  write ? "write" : "read", i, tid(), epoch, s.w_tid, s.w_ep, s.r_tid, s.r_ep);
  }
}
template <typename X>
X& wr(X* p, int i) {
  note(p + i, sizeof(X), true);
  return p[i];
}
template <typename X>
const X& rd(X* p, int i) {
  note(p + i, sizeof(X), false);
  return p[i];
}

template <typename T>
float lo_f(uint32_t x) {
  uint16_t h = x & 0xffff;
  T v;
  std::memcpy(&v, &h, 2);
  return static_cast<float>(v);
}
template <typename T>
float hi_f(uint32_t x) {
  uint16_t h = x >> 16;
  T v;
  std::memcpy(&v, &h, 2);
  return static_cast<float>(v);
}

// ---- global memory: every access the kernels make to q/k/v/out/grad_out/dq/dk/dv ----------------
enum ViewId { kQ, kK, kV, kOut, kGo, kDq, kDk, kDv, kViews };
const char* const kViewName[kViews] = {"q", "k", "v", "out", "grad_out", "dq", "dk", "dv"};
struct GBuf {
  const unsigned char* lo = nullptr;
  const unsigned char* hi = nullptr;
  size_t esz = 2;
  std::vector<int8_t> view;  // per element: the view owning it, -1 for gaps and guards
  std::vector<int32_t> bh, row, writes;
};
std::vector<GBuf*> gbufs;
int kernel_kind = 0;  // 0 forward, 1 dq, 2 dk/dv
long tiles_per_bh = 1;
std::atomic<long> gerr{0};
std::mutex gmu;

// Returns false (and the access is skipped) only when it lies outside every buffer, so a broken
// kernel reports instead of crashing the emulator; all other findings are reported and counted.
void gbad(const char* what, const void* p, int e_view, long e_bh, long e_row) {
  if (gerr.fetch_add(1) < 8)
    std::printf("  GLOBAL %s at %p (kernel %d block %u tid %d; element view %s bh %ld row %ld)\n",
                what, p, kernel_kind, blockIdx.x, tid(), e_view >= 0 ? kViewName[e_view] : "-",
                e_bh, e_row);
}

// Which views kernel `kind` may read / write, and which of them must lie in the block's own tile.
bool allowed(int kind, int v, bool write, bool& tiled) {
  tiled = false;
  if (kind == 0) {
    if (write) return tiled = (v == kOut);
    tiled = v == kQ;
    return v == kQ || v == kK || v == kV;
  }
  if (kind == 1) {
    if (write) return tiled = (v == kDq);
    tiled = v == kQ || v == kGo;
    return v == kQ || v == kGo || v == kK || v == kV;
  }
  if (write) return tiled = (v == kDk || v == kDv);
  tiled = v == kK || v == kV;
  return v == kQ || v == kGo || v == kK || v == kV;
}

bool gnote(const void* p, size_t n, bool write) {
  const auto* c = static_cast<const unsigned char*>(p);
  GBuf* b = nullptr;
  for (GBuf* x : gbufs)
    if (c >= x->lo && c + n <= x->hi) b = x;
  if (!b) {
    gbad(write ? "write outside every buffer" : "read outside every buffer", p, -1, -1, -1);
    return false;
  }
  const size_t off = c - b->lo;
  if (off % b->esz || n % b->esz) {
    gbad("misaligned access", p, -1, -1, -1);
    return true;
  }
  const long blk_bh = blockIdx.x / tiles_per_bh, r0 = (blockIdx.x % tiles_per_bh) * 64;
  for (size_t e = off / b->esz; e < (off + n) / b->esz; ++e) {
    const int v = b->view[e];
    if (v < 0) {
      gbad(write ? "write to a gap/guard element" : "read of a gap/guard element", p, -1, -1, -1);
      continue;
    }
    bool tiled;
    if (!allowed(kernel_kind, v, write, tiled))
      gbad(write ? "write to a view this kernel does not write"
                 : "read of a view this kernel does not read",
           p, v, b->bh[e], b->row[e]);
    if (b->bh[e] != blk_bh)
      gbad(write ? "write to another (b, h)" : "read of another (b, h)", p, v, b->bh[e], b->row[e]);
    if (tiled && (b->row[e] < r0 || b->row[e] >= r0 + 64))
      gbad(write ? "write outside the block's tile" : "read outside the block's tile", p, v,
           b->bh[e], b->row[e]);
    if (write) {
      std::lock_guard<std::mutex> lock(gmu);
      ++b->writes[e];
    }
  }
  return true;
}
}  // namespace emu

void __syncthreads() {
  emu::block_bar->arrive_and_wait();
  ++emu::epoch;
}

float __shfl_xor_sync(unsigned mask, float v, int m) {
  if (mask != 0xffffffffu) std::abort();
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  emu::xch[w][lane] = v;
  emu::warp_bar[w]->arrive_and_wait();
  const float r = emu::xch[w][lane ^ m];
  emu::warp_bar[w]->arrive_and_wait();
  return r;
}

namespace loom::cuda::kernels {
namespace flash {
#include "tiles_part.inc"
}  // namespace flash
namespace {

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: fragment layouts from the PTX ISA
// ("Matrix Fragments for mma.m16n8k16 with floating point type"), lane = 4 * groupID + tig:
//   A a_i (i = 0..7, two per .b32, a_{2r} low half): row = groupID + 8 * (i in {2,3,6,7}),
//     col = 2 * tig + (i & 1) + 8 * (i >= 4)
//   B b_i (i = 0..3): row (k) = 2 * tig + (i & 1) + 8 * (i >= 2), col (n) = groupID
//   C c_i (i = 0..3): row = groupID + 8 * (i >= 2), col = 2 * tig + (i & 1)
template <typename T>
void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = 0; i < 4; ++i) emu::a_in[w][lane][i] = a[i];
  for (int i = 0; i < 2; ++i) emu::b_in[w][lane][i] = b[i];
  emu::warp_bar[w]->arrive_and_wait();
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < 8; ++i) {
      const int row = g + ((i % 4) >= 2 ? 8 : 0);
      const int col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
      const uint32_t reg = emu::a_in[w][l][i / 2];
      A[row][col] = (i & 1) ? emu::hi_f<T>(reg) : emu::lo_f<T>(reg);
    }
    for (int i = 0; i < 4; ++i) {
      const int k = 2 * t + (i & 1) + (i >= 2 ? 8 : 0);
      const uint32_t reg = emu::b_in[w][l][i / 2];
      B[k][g] = (i & 1) ? emu::hi_f<T>(reg) : emu::lo_f<T>(reg);
    }
  }
  emu::warp_bar[w]->arrive_and_wait();
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
    double acc = c[i];
    for (int k = 0; k < 16; ++k) acc += static_cast<double>(A[row][k]) * B[k][col];
    c[i] = static_cast<float>(acc);
  }
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (PTX ISA, "ldmatrix"): lane 8 i + r gives
// the address of row r of 8 x 8 matrix i; lane 4 g + t receives in x[i] matrix i's elements
// [g][2t] (low half) and [g][2t + 1], or with .trans [2t][g] and [2t + 1][g]. Each lane's
// 16-byte row read is checked as shared-memory reads are.
void ldmatrix(uint32_t (&x)[4], const void* row, bool trans) {
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0) std::abort();  // ldmatrix's alignment
  emu::note(row, 16, false);
  emu::ld_in[w][lane] = row;
  emu::warp_bar[w]->arrive_and_wait();
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const auto row_of = [&](int l) { return static_cast<const uint16_t*>(emu::ld_in[w][l]); };
    uint16_t lo, hi;
    if (trans) {
      std::memcpy(&lo, row_of(8 * i + 2 * t) + g, 2);
      std::memcpy(&hi, row_of(8 * i + 2 * t + 1) + g, 2);
    } else {
      std::memcpy(&lo, row_of(8 * i + g) + 2 * t, 2);
      std::memcpy(&hi, row_of(8 * i + g) + 2 * t + 1, 2);
    }
    x[i] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }
  emu::warp_bar[w]->arrive_and_wait();
}
void ldmatrix_x4(uint32_t (&x)[4], const void* row) { ldmatrix(x, row, false); }

// cp.async.cg.shared.global, commit_group and wait_group, per thread as the hardware keeps them:
// a copy's global read is checked when it is issued, its shared-memory write is noted then too
// (the hardware may write at any moment until the wait, so a thread still reading the buffer is
// a race), and its bytes land only when a wait leaves at most n newer groups in flight (a read
// before the wait sees the old bytes).
struct AsyncCopy {
  void* dst;
  const void* src;
  bool valid;
};
thread_local std::vector<AsyncCopy> async_open;
thread_local std::vector<std::vector<AsyncCopy>> async_groups;
void cp_async_16(void* dst, const void* src, bool valid) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0)
    std::abort();                                             // cp.async's 16-byte alignment
  const bool readable = valid && emu::gnote(src, 16, false);  // a bad read is counted, not done
  emu::note(dst, 16, true);
  async_open.push_back({dst, src, readable});
}
void cp_async_commit() {
  async_groups.push_back(std::move(async_open));
  async_open.clear();
}
void cp_async_wait(int newer_in_flight) {
  while (async_groups.size() > static_cast<size_t>(newer_in_flight)) {
    for (const AsyncCopy& c : async_groups.front()) {
      if (c.valid) {
        std::memcpy(c.dst, c.src, 16);
      } else {
        std::memset(c.dst, 0, 16);
      }
    }
    async_groups.erase(async_groups.begin());
  }
}
void ldmatrix_x4_trans(uint32_t (&x)[4], const void* row) { ldmatrix(x, row, true); }

#include "kern_part.inc"

}  // namespace
}  // namespace loom::cuda::kernels

using loom::cuda::kernels::AttentionLayouts;
using loom::cuda::kernels::AttentionRows;
using loom::cuda::kernels::FlashAttentionShape;

// Runs `blocks` blocks of 128 emulated threads, one block at a time.
void run_grid(long blocks, size_t bytes, const std::function<void()>& body) {
  std::vector<unsigned char> buf(bytes + emu::kGuard + 16);
  unsigned char* base = buf.data();
  while (reinterpret_cast<uintptr_t>(base) % 16) ++base;
  emu::smem = base;
  emu::smem_bytes = bytes;
  for (long b = 0; b < blocks; ++b) {
    std::memset(base, 0xff, bytes + emu::kGuard);  // NaN in bf16 and f16
    emu::shadow.assign(bytes + emu::kGuard, emu::Shadow{});
    std::barrier<> bb(128);
    std::barrier<> wb0(32), wb1(32), wb2(32), wb3(32);
    emu::block_bar = &bb;
    emu::warp_bar[0] = &wb0;
    emu::warp_bar[1] = &wb1;
    emu::warp_bar[2] = &wb2;
    emu::warp_bar[3] = &wb3;
    std::vector<std::thread> th;
    for (int t = 0; t < 128; ++t) {
      th.emplace_back([&, t, b] {
        threadIdx.x = t;
        blockIdx.x = static_cast<unsigned>(b);
        emu::epoch = 0;
        body();
      });
    }
    for (auto& x : th) x.join();
    for (size_t i = bytes; i < bytes + emu::kGuard; ++i) {
      if (base[i] != 0xff) {
        std::printf("  smem written past %zu bytes (byte %zu)\n", bytes, i);
        ++emu::oob;
        break;
      }
    }
  }
}

template <typename T>
T to_t(float x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(x);
  else
    return __float2half_rn(x);
}
template <typename T>
float from_t(T x) {
  return static_cast<float>(x);
}
template <typename T>
uint16_t bits(T x) {
  uint16_t h;
  std::memcpy(&h, &x, 2);
  return h;
}
template <typename T>
T from_bits(uint16_t h) {
  T x;
  std::memcpy(&x, &h, 2);
  return x;
}
constexpr uint16_t kSentinel = 0x5A5A;  // outputs' fill (bf16 ~1.5e16, f16 203.25)
constexpr uint16_t kNaN = 0x7FC1;       // inputs' gaps and guards (NaN in bf16 and f16)
constexpr int64_t kGuardElems = 256;    // sentinel elements before and after every buffer

struct Err {
  double max_err = 0, max_ref = 0;
  long bad = 0;  // nonfinite or infinite expectations broken
  void add(double got, double ref) {
    if (!std::isfinite(got) && !(std::isinf(got) && got == ref)) {
      ++bad;
      return;
    }
    if (std::isinf(ref) || std::isinf(got)) {
      if (got != ref) ++bad;
      return;
    }
    max_err = std::max(max_err, std::fabs(got - ref));
    max_ref = std::max(max_ref, std::fabs(ref));
  }
  double rel() const { return max_err / std::max(max_ref, 1e-2); }
};

// One operand: which buffer, where in it, how laid out.
struct ViewSpec {
  int buf = -1;
  int64_t off = 0;
  AttentionRows r;
};
enum Kind { kContig, kFused0, kFused1, kFused2, kBTHD, kHBTD, kPad };
const char* const kKindName[] = {"contig", "fused0", "fused1", "fused2", "bthd", "hbtd", "pad"};

// Layout of `kind` for a (B, H, T, D) operand (matrix bh = b * H + h).
ViewSpec layout_of(Kind kind, int64_t B, int64_t H, int64_t T, int64_t D) {
  ViewSpec v;
  switch (kind) {
    case kContig:
      v.r = {.heads = 1, .batch_stride = T * D, .head_stride = 0, .row_stride = D};
      break;
    case kFused0:
    case kFused1:
    case kFused2:  // (B, T, H, 3, D), slot kind - kFused0
      v.r = {
          .heads = H, .batch_stride = T * H * 3 * D, .head_stride = 3 * D, .row_stride = H * 3 * D};
      v.off = (kind - kFused0) * D;
      break;
    case kBTHD:
      v.r = {.heads = H, .batch_stride = T * H * D, .head_stride = D, .row_stride = H * D};
      break;
    case kHBTD:
      v.r = {.heads = H, .batch_stride = T * D, .head_stride = B * T * D, .row_stride = D};
      break;
    case kPad: {
      const int64_t rs = H * (D + 8) + 8;
      v.r = {.heads = H, .batch_stride = T * rs + 16, .head_stride = D + 8, .row_stride = rs};
      v.off = 8;
      break;
    }
  }
  return v;
}

// Layout modes: per view (q k v out go dq dk dv) its kind and a buffer-sharing group (views with
// the same group share one buffer; only when their T agree, else each gets its own).
struct Mode {
  const char* name;
  Kind kind[emu::kViews];
  int group[emu::kViews];
};
const Mode kModes[] = {
    {"contig",
     {kContig, kContig, kContig, kContig, kContig, kContig, kContig, kContig},
     {0, 1, 2, 3, 4, 5, 6, 7}},
    // GPT: q, k, v slices of one (B, T, H, 3, D) buffer; out, grad_out, dq, dk, dv (B, T, H, D).
    {"gpt",
     {kFused0, kFused1, kFused2, kBTHD, kBTHD, kBTHD, kBTHD, kBTHD},
     {0, 0, 0, 3, 4, 5, 6, 7}},
    // As gpt, and dq, dk, dv slices of one (B, T, H, 3, D) gradient buffer.
    {"fusedgrad",
     {kFused0, kFused1, kFused2, kBTHD, kBTHD, kFused0, kFused1, kFused2},
     {0, 0, 0, 3, 4, 5, 5, 5}},
    // Every operand its own layout, so no operand's strides stand in for another's.
    {"mixed",
     {kPad, kHBTD, kFused2, kBTHD, kFused1, kHBTD, kPad, kContig},
     {0, 1, 2, 3, 4, 5, 6, 7}},
    {"mixed2",
     {kHBTD, kFused1, kPad, kContig, kPad, kBTHD, kContig, kHBTD},
     {0, 1, 2, 3, 4, 5, 6, 7}},
    {"padded", {kPad, kPad, kPad, kPad, kPad, kPad, kPad, kPad}, {0, 1, 2, 3, 4, 5, 6, 7}},
};

int g_fail = 0;
struct GroupStat {
  int pass = 0, fail = 0;
  double out = 0, dq = 0, dk = 0, dv = 0, lse = 0, delta = 0;  // max abs errors
  double rout = 0, rdq = 0, rdk = 0, rdv = 0;                  // max relative (to max |ref|)
};
std::vector<std::pair<std::string, GroupStat>> g_groups;
GroupStat& group(const std::string& name) {
  for (auto& [n, g] : g_groups)
    if (n == name) return g;
  g_groups.emplace_back(name, GroupStat{});
  return g_groups.back().second;
}

template <typename T>
struct Buffer {
  std::vector<T> mem;
  emu::GBuf meta;
};

template <typename T, int D, int Stages>
void run_case(const Mode& mode, int64_t B, int64_t H, FlashAttentionShape s, bool delta_given,
              uint32_t seed, const char* tname) {
  using namespace emu;
  s.d = s.dv = D;
  s.rows = B * H;
  const int64_t R = s.rows, TQ = s.tq, TK = s.tk;
  const int64_t Tof[kViews] = {TQ, TK, TK, TQ, TQ, TQ, TK, TK};
  const bool is_out[kViews] = {false, false, false, true, false, true, true, true};
  // Buffers and views.
  ViewSpec vs[kViews];
  int bufs = 0;
  std::vector<std::pair<std::pair<int, int64_t>, int>> shared;  // (group, T) -> buffer
  for (int v = 0; v < kViews; ++v) {
    vs[v] = layout_of(mode.kind[v], B, H, Tof[v], D);
    const std::pair<int, int64_t> key{mode.group[v], Tof[v]};
    vs[v].buf = -1;
    for (auto& [k, b] : shared)
      if (k == key) vs[v].buf = b;
    if (vs[v].buf < 0) {
      vs[v].buf = bufs++;
      shared.push_back({key, vs[v].buf});
    }
  }
  auto elem = [&](int v, int64_t bh, int64_t row, int64_t d) {
    const AttentionRows& r = vs[v].r;
    return kGuardElems + vs[v].off + (bh / r.heads) * r.batch_stride +
           (bh % r.heads) * r.head_stride + row * r.row_stride + d;
  };
  std::vector<Buffer<T>> buf(bufs);
  std::vector<int64_t> size(bufs, 0);
  for (int v = 0; v < kViews; ++v) size[vs[v].buf] = std::max(size[vs[v].buf], vs[v].off + 1);
  for (int v = 0; v < kViews; ++v)
    if (R > 0 && Tof[v] > 0)
      size[vs[v].buf] =
          std::max(size[vs[v].buf], elem(v, R - 1, Tof[v] - 1, D - 1) - kGuardElems + 1);
  for (int v = 0; v < kViews; ++v)  // the largest offset over all bh (hbtd puts h outside b)
    for (int64_t bh = 0; bh < R && Tof[v] > 0; ++bh)
      size[vs[v].buf] = std::max(size[vs[v].buf], elem(v, bh, Tof[v] - 1, D - 1) - kGuardElems + 1);
  for (int i = 0; i < bufs; ++i) {
    const int64_t n = size[i] + 2 * kGuardElems;
    bool out_buf = false;
    for (int v = 0; v < kViews; ++v)
      if (vs[v].buf == i && is_out[v]) out_buf = true;
    buf[i].mem.assign(n, from_bits<T>(out_buf ? kSentinel : kNaN));
    buf[i].meta.view.assign(n, -1);
    buf[i].meta.bh.assign(n, -1);
    buf[i].meta.row.assign(n, -1);
    buf[i].meta.writes.assign(n, 0);
  }
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  bool layout_ok = true;
  for (int v = 0; v < kViews; ++v) {
    auto& b = buf[vs[v].buf];
    for (int64_t bh = 0; bh < R; ++bh)
      for (int64_t i = 0; i < Tof[v]; ++i)
        for (int d = 0; d < D; ++d) {
          const int64_t e = elem(v, bh, i, d);
          if (e < kGuardElems || e >= (int64_t)b.mem.size() - kGuardElems || b.meta.view[e] >= 0) {
            layout_ok = false;
            continue;
          }
          b.meta.view[e] = static_cast<int8_t>(v);
          b.meta.bh[e] = static_cast<int32_t>(bh);
          b.meta.row[e] = static_cast<int32_t>(i);
          if (!is_out[v]) b.mem[e] = to_t<T>(nd(rng));
        }
  }
  if (!layout_ok) {
    std::printf("harness bug: overlapping layout in mode %s\n", mode.name);
    std::exit(2);
  }
  std::vector<std::vector<T>> inputs_before(bufs);
  for (int i = 0; i < bufs; ++i) inputs_before[i] = buf[i].mem;
  auto at = [&](int v, int64_t bh, int64_t row, int64_t d) -> T& {
    return buf[vs[v].buf].mem[elem(v, bh, row, d)];
  };
  auto ptr = [&](int v) { return buf[vs[v].buf].mem.data() + kGuardElems + vs[v].off; };

  // Reference in double.
  std::vector<double> P(TQ * TK), out_ref(R * TQ * D, 0), lse_ref(R * TQ), dq_ref(R * TQ * D, 0),
      dk_ref(R * TK * D, 0), dv_ref(R * TK * D, 0), delta_ref(R * TQ, 0);
  auto vis = [&](int64_t i, int64_t j) { return !s.causal || j <= i + s.causal_offset; };
  for (int64_t r = 0; r < R; ++r) {
    auto Q = [&](int64_t i, int d) { return (double)from_t(at(kQ, r, i, d)); };
    auto Kk = [&](int64_t j, int d) { return (double)from_t(at(kK, r, j, d)); };
    auto V = [&](int64_t j, int d) { return (double)from_t(at(kV, r, j, d)); };
    auto G = [&](int64_t i, int d) { return (double)from_t(at(kGo, r, i, d)); };
    for (int64_t i = 0; i < TQ; ++i) {
      double m = -INFINITY;
      std::vector<double> sc(TK);
      for (int64_t j = 0; j < TK; ++j) {
        double x = 0;
        for (int d = 0; d < D; ++d) x += Q(i, d) * Kk(j, d);
        sc[j] = vis(i, j) ? x * s.scale : -INFINITY;
        m = std::max(m, sc[j]);
      }
      double l = 0;
      for (int64_t j = 0; j < TK; ++j) l += sc[j] == -INFINITY ? 0 : std::exp(sc[j] - m);
      lse_ref[r * TQ + i] = l > 0 ? m + std::log(l) : -INFINITY;
      for (int64_t j = 0; j < TK; ++j)
        P[i * TK + j] = l > 0 && sc[j] != -INFINITY ? std::exp(sc[j] - m) / l : 0.0;
      for (int d = 0; d < D; ++d) {
        double o = 0;
        for (int64_t j = 0; j < TK; ++j) o += P[i * TK + j] * V(j, d);
        out_ref[(r * TQ + i) * D + d] = o;
      }
    }
    std::vector<double> dP(TQ * TK), dS(TQ * TK);
    for (int64_t i = 0; i < TQ; ++i) {
      double dl = 0;
      for (int64_t j = 0; j < TK; ++j) {
        double x = 0;
        for (int d = 0; d < D; ++d) x += G(i, d) * V(j, d);
        dP[i * TK + j] = x;
        dl += P[i * TK + j] * x;
      }
      delta_ref[r * TQ + i] = dl;
      for (int64_t j = 0; j < TK; ++j)
        dS[i * TK + j] = P[i * TK + j] * (dP[i * TK + j] - dl) * s.scale;
    }
    for (int64_t i = 0; i < TQ; ++i)
      for (int d = 0; d < D; ++d) {
        double x = 0;
        for (int64_t j = 0; j < TK; ++j) x += dS[i * TK + j] * Kk(j, d);
        dq_ref[(r * TQ + i) * D + d] = x;
      }
    for (int64_t j = 0; j < TK; ++j)
      for (int d = 0; d < D; ++d) {
        double x = 0, y = 0;
        for (int64_t i = 0; i < TQ; ++i) {
          x += dS[i * TK + j] * Q(i, d);
          y += P[i * TK + j] * G(i, d);
        }
        dk_ref[(r * TK + j) * D + d] = x;
        dv_ref[(r * TK + j) * D + d] = y;
      }
  }

  // The emulated kernels, launched as mma_attention_forward / mma_attention_backward do.
  using namespace loom::cuda::kernels;
  AttentionLayouts L{.q = vs[kQ].r,
                     .k = vs[kK].r,
                     .v = vs[kV].r,
                     .o = vs[kOut].r,
                     .dq = vs[kDq].r,
                     .dk = vs[kDk].r,
                     .dv = vs[kDv].r};
  // lse and delta: contiguous (rows, tq) with guards.
  const int64_t G = 64;
  std::vector<float> lse(R * TQ + 2 * G, 777.0f), delta(R * TQ + 2 * G, 555.0f);
  emu::races = 0;
  emu::oob = 0;
  emu::gerr = 0;
  emu::gbufs.clear();
  for (auto& b : buf) {
    b.meta.lo = reinterpret_cast<const unsigned char*>(b.mem.data());
    b.meta.hi = reinterpret_cast<const unsigned char*>(b.mem.data() + b.mem.size());
    b.meta.esz = sizeof(T);
    emu::gbufs.push_back(&b.meta);
  }
  if (R > 0 && TQ > 0) {
    const size_t bytes = kForwardSmem<T, D, Stages>;
    emu::kernel_kind = 0;
    emu::tiles_per_bh = ceil_div(TQ, kTile);
    run_grid(R * ceil_div(TQ, kTile), bytes, [&] {
      mma_forward_kernel<T, D, Stages>(ptr(kOut), lse.data() + G, ptr(kQ), ptr(kK), ptr(kV), s, L);
    });
  }
  // The backward takes the reference lse (f32), as the forward would have stored, and grad_out
  // where L.o says (L.o is out's layout in the forward, grad_out's in the backward).
  AttentionLayouts Lb = L;
  Lb.o = vs[kGo].r;
  std::vector<float> lse_in(R * TQ + 2 * G, std::nanf(""));
  for (int64_t i = 0; i < R * TQ; ++i) lse_in[G + i] = static_cast<float>(lse_ref[i]);
  if (delta_given)
    for (int64_t i = 0; i < R * TQ; ++i) delta[G + i] = static_cast<float>(delta_ref[i]);
  if (R > 0) {
    if (TQ > 0) {
      const size_t bytes = kDqSmem<T, D, Stages>;
      emu::kernel_kind = 1;
      emu::tiles_per_bh = ceil_div(TQ, kTile);
      run_grid(R * ceil_div(TQ, kTile), bytes, [&] {
        mma_backward_dq_kernel<T, D, Stages>(ptr(kDq), delta.data() + G, ptr(kGo), ptr(kQ), ptr(kK),
                                             ptr(kV), lse_in.data() + G, s, Lb, delta_given);
      });
    }
    if (TK > 0) {
      const size_t bytes = kDkdvSmem<T, D, Stages>;
      emu::kernel_kind = 2;
      emu::tiles_per_bh = ceil_div(TK, kTile);
      run_grid(R * ceil_div(TK, kTile), bytes, [&] {
        mma_backward_dkdv_kernel<T, D, Stages>(ptr(kDk), ptr(kDv), delta.data() + G, ptr(kGo),
                                               ptr(kQ), ptr(kK), ptr(kV), lse_in.data() + G, s, Lb);
      });
    }
  }
  emu::gbufs.clear();

  // Values.
  Err eo, el, eq, ek, ev, ed;
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t i = 0; i < TQ; ++i)
      for (int d = 0; d < D; ++d) {
        eo.add(from_t(at(kOut, r, i, d)), out_ref[(r * TQ + i) * D + d]);
        eq.add(from_t(at(kDq, r, i, d)), dq_ref[(r * TQ + i) * D + d]);
      }
    for (int64_t j = 0; j < TK; ++j)
      for (int d = 0; d < D; ++d) {
        ek.add(from_t(at(kDk, r, j, d)), dk_ref[(r * TK + j) * D + d]);
        ev.add(from_t(at(kDv, r, j, d)), dv_ref[(r * TK + j) * D + d]);
      }
  }
  for (int64_t i = 0; i < R * TQ; ++i) {
    el.add(lse[G + i], lse_ref[i]);
    ed.add(delta[G + i], delta_given ? (double)(float)delta_ref[i] : delta_ref[i]);
  }
  // Memory: each logical output element written exactly once; everything else in an output
  // buffer (gaps, other slots, guards) still the sentinel; inputs unchanged; lse/delta guards.
  long mem_bad = 0;
  for (int i = 0; i < bufs; ++i) {
    const auto& m = buf[i].meta;
    for (size_t e = 0; e < buf[i].mem.size(); ++e) {
      const int v = m.view[e];
      bool bad = false;
      if (v >= 0 && is_out[v])
        bad = m.writes[e] != 1;
      else if (v >= 0)
        bad = m.writes[e] != 0 || bits(buf[i].mem[e]) != bits(inputs_before[i][e]);
      else
        bad = m.writes[e] != 0 || bits(buf[i].mem[e]) != bits(inputs_before[i][e]);
      if (bad && mem_bad++ < 5)
        std::printf(
            "  MEM buffer %d element %zu (view %s bh %d row %d): %d writes, bits %04x (was %04x)\n",
            i, e, v >= 0 ? kViewName[v] : "gap/guard", m.bh[e], m.row[e], m.writes[e],
            bits(buf[i].mem[e]), bits(inputs_before[i][e]));
    }
  }
  for (int64_t i = 0; i < G; ++i) {
    for (const float x : {lse[i], lse[G + R * TQ + i]})
      if (x != 777.0f && mem_bad++ < 5) std::printf("  MEM lse guard written\n");
    for (const float x : {delta[i], delta[G + R * TQ + i]})
      if (x != 555.0f && mem_bad++ < 5) std::printf("  MEM delta guard written\n");
  }
  const bool bf = std::is_same_v<T, __nv_bfloat16>;
  const double tol = bf ? 3e-2 : 5e-3;
  const bool ok = eo.bad + el.bad + eq.bad + ek.bad + ev.bad + ed.bad == 0 && eo.rel() < tol &&
                  eq.rel() < tol && ek.rel() < tol && ev.rel() < tol && el.max_err < 1e-3 &&
                  ed.rel() < 1e-4 && emu::races == 0 && emu::oob == 0 && emu::gerr == 0 &&
                  mem_bad == 0;
  if (!ok) ++g_fail;
  GroupStat& gs = group(std::string(mode.name) + " " + tname + " D=" + std::to_string(D) +
                        (Stages == 1 ? " 1buf" : ""));
  (ok ? gs.pass : gs.fail)++;
  gs.out = std::max(gs.out, eo.max_err);
  gs.dq = std::max(gs.dq, eq.max_err);
  gs.dk = std::max(gs.dk, ek.max_err);
  gs.dv = std::max(gs.dv, ev.max_err);
  gs.lse = std::max(gs.lse, el.max_err);
  gs.delta = std::max(gs.delta, ed.max_err);
  gs.rout = std::max(gs.rout, eo.rel());
  gs.rdq = std::max(gs.rdq, eq.rel());
  gs.rdk = std::max(gs.rdk, ek.rel());
  gs.rdv = std::max(gs.rdv, ev.rel());
  std::printf(
      "%s %-9s %s D=%3d S=%d B=%ld H=%ld tq=%4ld tk=%4ld causal=%d off=%5ld dg=%d | rel out %.2e "
      "dq "
      "%.2e "
      "dk %.2e dv %.2e | abs lse %.1e delta %.1e | bad %ld/%ld/%ld/%ld/%ld/%ld races %ld oob %ld "
      "global %ld mem %ld\n",
      ok ? "ok  " : "FAIL", mode.name, tname, D, Stages, (long)B, (long)H, (long)TQ, (long)TK,
      s.causal, (long)s.causal_offset, delta_given, eo.rel(), eq.rel(), ek.rel(), ev.rel(),
      el.max_err, ed.max_err, eo.bad, el.bad, eq.bad, ek.bad, ev.bad, ed.bad, emu::races.load(),
      emu::oob.load(), emu::gerr.load(), mem_bad);
  std::fflush(stdout);
}

struct C {
  int64_t B, H, tq, tk;
  bool causal;
  int64_t off;
  bool dg;
};
// level 0: the quick set; 1: all.
std::vector<C> cases_for(int level) {
  std::vector<C> c = {
      {2, 3, 1, 1, false, 0, false},     {2, 3, 17, 33, false, 0, false},
      {1, 3, 65, 130, true, 65, false},  {2, 1, 130, 65, true, -65, false},
      {2, 3, 100, 100, true, -70, true}, {1, 3, 70, 150, true, 0, true},
      {2, 3, 77, 77, false, 0, true},    {1, 1, 129, 129, true, 3, false},
      {2, 3, 50, 60, true, 500, false},  {1, 3, 90, 70, true, -200, false},
      {2, 3, 0, 40, false, 0, false},    {2, 3, 40, 0, false, 0, false},
  };
  if (level > 0) {
    c.push_back({2, 3, 128, 128, true, 0, false});
    c.push_back({2, 3, 131, 131, true, 0, false});
    c.push_back({1, 3, 200, 190, true, -10, true});
  }
  return c;
}

template <typename T, int D, int Stages>
void sweep(const char* tname, const Mode& mode, int level) {
  uint32_t seed = 1;
  for (const C& c : cases_for(level)) {
    FlashAttentionShape s;
    s.tq = c.tq;
    s.tk = c.tk;
    s.causal = c.causal;
    s.causal_offset = c.off;
    s.scale = (seed % 2) ? 1.0f / std::sqrt((float)D) : 0.5f;
    run_case<T, D, Stages>(mode, c.B, c.H, s, c.dg, seed++, tname);
  }
}

// usage: harness [D: 16|32|64|128|all] [mode: contig|gpt|fusedgrad|mixed|mixed2|padded|all]
//                [dtype: bf16|f16|all] [level: 0|1] [tile buffers: 2|1|all (default 2)] [norace]
// (2: the double-buffered kernels; 1: the single-buffered ones a GPU with less shared memory per
// block takes, TilePipeline in flash_attention_mma.cu)
int main(int argc, char** argv) {
  const std::string wd = argc > 1 ? argv[1] : "all", wm = argc > 2 ? argv[2] : "all",
                    wt = argc > 3 ? argv[3] : "all", ws = argc > 5 ? argv[5] : "2";
  const int level = argc > 4 ? std::atoi(argv[4]) : 0;
  emu::race_check = !(argc > 6 && std::strcmp(argv[6], "norace") == 0);
  if (ws != "1" && ws != "2" && ws != "all") {
    std::printf("harness: tile buffers '%s' is not 1, 2 or all\n", ws.c_str());
    return 2;
  }
  for (const Mode& m : kModes) {
    if (wm != "all" && wm != m.name) continue;
    auto stages = [&](auto tag, const char* tn, auto dim) {
      using T = decltype(tag);
      constexpr int D = decltype(dim)::value;
      if (ws != "1") sweep<T, D, 2>(tn, m, level);
      if (ws != "2") sweep<T, D, 1>(tn, m, level);
    };
    auto dims = [&](auto tag, const char* tn) {
      if (wt != "all" && wt != std::string(tn).substr(0, std::string(tn).find(' '))) return;
      if (wd == "all" || wd == "16") stages(tag, tn, std::integral_constant<int, 16>{});
      if (wd == "all" || wd == "32") stages(tag, tn, std::integral_constant<int, 32>{});
      if (wd == "all" || wd == "64") stages(tag, tn, std::integral_constant<int, 64>{});
      if (wd == "all" || wd == "128") stages(tag, tn, std::integral_constant<int, 128>{});
    };
    dims(__nv_bfloat16{}, "bf16");
    dims(__half{}, "f16 ");
  }
  std::printf("\nsummary (max abs errors; rel = max abs err / max(|ref|, 1e-2)):\n");
  for (auto& [n, g] : g_groups)
    std::printf(
        "%-4s %-22s %2d/%2d ok | out %.2e dq %.2e dk %.2e dv %.2e lse %.1e delta %.1e | rel "
        "out %.1e dq %.1e dk %.1e dv %.1e\n",
        g.fail ? "FAIL" : "ok", n.c_str(), g.pass, g.pass + g.fail, g.out, g.dq, g.dk, g.dv, g.lse,
        g.delta, g.rout, g.rdq, g.rdk, g.rdv);
  std::printf("%d failing cases\n", g_fail);
  return g_fail ? 1 : 0;
}
