// The fiber scheduler behind emulated_device.h: a block's threads are ucontext fibers on the
// launching thread, switched at collectives.
#include "tools/cuda_emulator/device/emulated_device.h"

#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

uint3 threadIdx{}, blockIdx{};
dim3 blockDim{1, 1, 1}, gridDim{1, 1, 1};

namespace loom_emu {
namespace {

constexpr std::size_t kStackBytes = std::size_t{256} << 10;  // kernels keep tiles in registers
constexpr int kMaxThreads = 1024;

enum class Wait { kNone, kBlock, kWarp, kDone };

struct Fiber {
  ucontext_t context{};
  std::unique_ptr<unsigned char[]> stack;
  uint3 index{};
  Wait wait = Wait::kNone;
};

struct WarpState {
  long generation = 0;
  // Two generations of deposits: a lane that has passed generation g can deposit for g + 1
  // while slower lanes still read g's.
  alignas(16) unsigned char deposits[2][32][kSlotBytes];
};

struct Scheduler {
  ucontext_t main{};
  std::vector<Fiber> fibers;
  std::vector<WarpState> warps;
  int current = -1;
  const std::function<void()>* body = nullptr;
  std::vector<unsigned char> shared;
  unsigned char* shared_aligned = nullptr;
};

// One launch at a time in the process: static shared variables and the indices are global.
std::mutex& launch_mutex() {
  static std::mutex m;
  return m;
}

Scheduler& sched() {
  static Scheduler* s = new Scheduler;
  return *s;
}

void fiber_entry() {
  Scheduler& s = sched();
  (*s.body)();
  s.fibers[s.current].wait = Wait::kDone;
  // Returning switches to uc_link, the scheduler.
}

void yield_to_scheduler() {
  Scheduler& s = sched();
  Fiber& self = s.fibers[s.current];
  swapcontext(&self.context, &s.main);
}

[[noreturn]] void deadlock(const Scheduler& s) {
  std::string where;
  for (size_t i = 0; i < s.fibers.size(); ++i) {
    const Fiber& f = s.fibers[i];
    if (f.wait == Wait::kDone) continue;
    where += " thread " + std::to_string(i) +
             (f.wait == Wait::kBlock ? " at __syncthreads" : " at a warp collective") + ";";
  }
  std::fprintf(stderr,
               "cuda emulator: block (%u, %u, %u) deadlocks: its live threads wait at collectives "
               "no other thread reaches:%s\n",
               blockIdx.x, blockIdx.y, blockIdx.z, where.c_str());
  std::abort();
}

// Runs the block's fibers until every one has returned.
void run_block(Scheduler& s, int threads) {
  for (int t = 0; t < threads; ++t) {
    Fiber& f = s.fibers[t];
    f.wait = Wait::kNone;
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack.get();
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = &s.main;
    makecontext(&f.context, fiber_entry, 0);
  }
  for (int w = 0; w < (threads + 31) / 32; ++w) s.warps[w].generation = 0;
  for (;;) {
    bool ran = false;
    for (int t = 0; t < threads; ++t) {
      Fiber& f = s.fibers[t];
      if (f.wait != Wait::kNone) continue;
      s.current = t;
      threadIdx = f.index;
      swapcontext(&s.main, &f.context);
      ran = true;
    }
    // Complete the collectives every live thread has reached.
    bool released = false, live = false, all_at_block = true;
    for (int t = 0; t < threads; ++t) {
      if (s.fibers[t].wait == Wait::kDone) continue;
      live = true;
      if (s.fibers[t].wait != Wait::kBlock) all_at_block = false;
    }
    if (!live) return;
    if (all_at_block) {
      for (int t = 0; t < threads; ++t)
        if (s.fibers[t].wait == Wait::kBlock) s.fibers[t].wait = Wait::kNone;
      released = true;
    }
    for (int w = 0; w * 32 < threads; ++w) {
      bool any = false, all = true;
      for (int t = w * 32; t < std::min(threads, w * 32 + 32); ++t) {
        const Wait wait = s.fibers[t].wait;
        if (wait == Wait::kDone) continue;
        if (wait == Wait::kWarp) {
          any = true;
        } else {
          all = false;
        }
      }
      if (any && all) {
        ++s.warps[w].generation;
        for (int t = w * 32; t < std::min(threads, w * 32 + 32); ++t)
          if (s.fibers[t].wait == Wait::kWarp) s.fibers[t].wait = Wait::kNone;
        released = true;
      }
    }
    if (!ran && !released) deadlock(s);
  }
}

}  // namespace

void launch(dim3 grid, dim3 block, std::size_t dynamic_shared_bytes,
            const std::function<void()>& body) {
  std::lock_guard<std::mutex> lock(launch_mutex());
  Scheduler& s = sched();
  const long threads = static_cast<long>(block.x) * block.y * block.z;
  if (threads <= 0 || threads > kMaxThreads) {
    throw std::runtime_error("cuda emulator: a block of " + std::to_string(threads) +
                             " threads (expected 1..1024)");
  }
  if (dynamic_shared_bytes > kSharedMemoryPerBlockOptin) {
    throw std::runtime_error("cuda emulator: " + std::to_string(dynamic_shared_bytes) +
                             " bytes of dynamic shared memory per block (at most " +
                             std::to_string(kSharedMemoryPerBlockOptin) + ", an sm_90's limit)");
  }
  if (s.fibers.size() < static_cast<size_t>(threads)) {
    const size_t before = s.fibers.size();
    s.fibers.resize(threads);
    for (size_t t = before; t < s.fibers.size(); ++t)
      s.fibers[t].stack = std::make_unique<unsigned char[]>(kStackBytes);
    s.warps.resize((threads + 31) / 32);
  }
  for (long t = 0; t < threads; ++t) {
    s.fibers[t].index =
        uint3{static_cast<unsigned>(t % block.x), static_cast<unsigned>((t / block.x) % block.y),
              static_cast<unsigned>(t / (block.x * block.y))};
  }
  s.shared.assign(dynamic_shared_bytes + 16, 0);
  s.shared_aligned = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<std::uintptr_t>(s.shared.data()) + 15) & ~std::uintptr_t{15});
  s.body = &body;
  blockDim = block;
  gridDim = grid;
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = uint3{x, y, z};
        run_block(s, static_cast<int>(threads));
      }
    }
  }
  s.body = nullptr;
}

unsigned char* dynamic_shared() { return sched().shared_aligned; }

void block_barrier() {
  Scheduler& s = sched();
  s.fibers[s.current].wait = Wait::kBlock;
  yield_to_scheduler();
}

void warp_barrier() {
  Scheduler& s = sched();
  s.fibers[s.current].wait = Wait::kWarp;
  yield_to_scheduler();
}

const unsigned char* warp_exchange(const void* value, std::size_t bytes) {
  Scheduler& s = sched();
  const int t = s.current;
  WarpState& warp = s.warps[t / 32];
  const long generation = warp.generation;
  if (bytes > kSlotBytes) {
    std::fprintf(stderr, "cuda emulator: a warp collective of %zu bytes (at most %zu)\n", bytes,
                 kSlotBytes);
    std::abort();
  }
  unsigned char* slot = warp.deposits[generation & 1][t % 32];
  std::memset(slot, 0, kSlotBytes);
  std::memcpy(slot, value, bytes);
  s.fibers[t].wait = Wait::kWarp;
  yield_to_scheduler();
  return &warp.deposits[generation & 1][0][0];
}

}  // namespace loom_emu
