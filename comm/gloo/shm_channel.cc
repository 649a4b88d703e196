#include "comm/gloo/shm_channel.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <immintrin.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>

#include "base/error.h"
#include "comm/types.h"

namespace loom::comm::gloo_detail {

namespace {

constexpr uint64_t kMagic = 0x4c4f4f4d53484d31ull;  // "LOOMSHM1"
// How long a waiter spins before sleeping on the futex: long enough to catch a peer on another
// core arriving a moment later (a futex sleep and wake costs ~10 us), short enough not to steal
// much from a peer that shares this core.
constexpr auto kSpin = std::chrono::microseconds(20);
// A sleeping waiter wakes this often to check the deadline and whether peers' processes live.
constexpr auto kPoll = std::chrono::milliseconds(10);
constexpr auto kLivenessEvery = std::chrono::milliseconds(50);

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000000),
              static_cast<long>(timeout.count() % 1000000000)};
  // Shared (not FUTEX_PRIVATE_FLAG): the word lives in memory other processes map.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// True when `pid` is gone or a zombie (killed, not yet reaped by its parent).
bool process_exited(int pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) == -1 && errno == ESRCH) return true;
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(") ");
  if (close == std::string::npos || close + 2 >= text.size()) return false;
  const char state = text[close + 2];
  return state == 'Z' || state == 'X';
}

// "all_gather #3 (48 bytes)"; the variant (dtype, reduce op or root, packed) only when it is
// what differs.
std::string describe_stamp(const ShmStamp& s, bool with_variant) {
  return fmt::format("{} #{} ({} bytes{})", collective_name(static_cast<CollectiveKind>(s.kind)),
                     s.index, s.bytes,
                     with_variant ? fmt::format(", variant {:#x}", s.aux) : std::string());
}

}  // namespace

struct alignas(64) ShmChannel::RankCell {
  std::atomic<uint64_t> arrived;  // barriers this rank has arrived at
  std::atomic<uint32_t> left;     // 1 once its channel is destroyed
  int32_t pid;
  ShmStamp stamps[2];  // stamps[b % 2]: what it ran at barrier b
};

struct alignas(64) ShmChannel::Header {
  uint64_t magic;
  uint32_t world;
  uint64_t slot_bytes;
  std::atomic<uint32_t> generation;  // futex word: bumped on every arrival and close
  std::atomic<uint32_t> waiters;     // ranks sleeping on it
  std::atomic<int32_t> closed_by;    // 0: open; r + 1: rank r closed it
};

static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free to work across processes");

namespace {
// The header, then the rank cells, then (page-aligned) the slots.
size_t cells_offset() { return round_up(sizeof(ShmChannel::Header), 64); }
size_t slots_offset(int world) {
  return round_up(cells_offset() + static_cast<size_t>(world) * sizeof(ShmChannel::RankCell), 4096);
}
}  // namespace

size_t ShmChannel::segment_bytes(int world, size_t slot_bytes) {
  return slots_offset(world) + 2 * static_cast<size_t>(world) * slot_bytes;
}

ShmChannel::ShmChannel(const std::string& name, int rank, int world, size_t slot_bytes, bool create)
    : name_(name),
      rank_(rank),
      world_(world),
      slot_bytes_(slot_bytes),
      mapped_bytes_(segment_bytes(world, slot_bytes)) {
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
  LOOM_CHECK(fd >= 0, "shared memory: cannot open '{}': {}", name, std::strerror(errno));
  void* base = ::mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int mmap_errno = errno;
  ::close(fd);
  LOOM_CHECK(base != MAP_FAILED, "shared memory: cannot map {} bytes of '{}': {}", mapped_bytes_,
             name, std::strerror(mmap_errno));
  base_ = static_cast<char*>(base);
  header_ = reinterpret_cast<Header*>(base_);
  if (create) {
    new (header_) Header{kMagic, static_cast<uint32_t>(world), slot_bytes, {0}, {0}, {0}};
    for (int r = 0; r < world; ++r) {
      new (&cell(r)) RankCell{{0}, {0}, 0, {}};
    }
  } else {
    if (header_->magic != kMagic || header_->world != static_cast<uint32_t>(world) ||
        header_->slot_bytes != slot_bytes) {
      ::munmap(base_, mapped_bytes_);
      LOOM_FAIL("shared memory: '{}' is not this group's segment (world {}, {} byte slots)", name,
                world, slot_bytes);
    }
  }
  data_ = base_ + slots_offset(world);
  cell(rank).pid = static_cast<int32_t>(::getpid());
}

ShmChannel::~ShmChannel() {
  cell(rank_).left.store(1);
  wake_all();
  ::munmap(base_, mapped_bytes_);
}

ShmChannel::RankCell& ShmChannel::cell(int r) const {
  return reinterpret_cast<RankCell*>(base_ + cells_offset())[r];
}

char* ShmChannel::slot(int r) const {
  return data_ +
         ((round_ % 2) * static_cast<size_t>(world_) + static_cast<size_t>(r)) * slot_bytes_;
}

void ShmChannel::wake_all() {
  header_->generation.fetch_add(1);
  if (header_->waiters.load() > 0) futex_wake_all(&header_->generation);
}

void ShmChannel::close(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(close_mutex_);
    if (closed_here_.load()) return;
    close_reason_ = reason;
    closed_here_.store(true);
  }
  int32_t open = 0;
  header_->closed_by.compare_exchange_strong(open, rank_ + 1);
  wake_all();
}

void ShmChannel::arrive_and_wait(const ShmStamp& stamp, Clock::time_point deadline) {
  const uint64_t barrier = ++barriers_;
  cell(rank_).stamps[barrier % 2] = stamp;
  cell(rank_).arrived.store(barrier);
  wake_all();
  auto first_missing = [&]() -> int {
    for (int r = 0; r < world_; ++r) {
      if (cell(r).arrived.load(std::memory_order_acquire) < barrier) return r;
    }
    return -1;
  };
  int missing = first_missing();
  const auto spin_end = Clock::now() + kSpin;
  for (int i = 1; missing >= 0; ++i) {
    _mm_pause();
    if (i % 64 == 0 && (Clock::now() > spin_end || closed_here_.load())) break;
    missing = first_missing();
  }
  auto next_liveness = Clock::now() + kLivenessEvery;
  // Whether the wait for `r` has failed: this rank or the channel closed, the deadline passed,
  // or `r` left.
  const auto failed = [&](int r, Clock::time_point now) {
    return closed_here_.load() || header_->closed_by.load() != 0 || now >= deadline ||
           cell(r).left.load() != 0;
  };
  while (missing >= 0) {
    const auto now = Clock::now();
    if (failed(missing, now)) {
      // `missing` was found missing earlier: it may have arrived since, finished the op and
      // destroyed its group (it leaves after its last barrier, so its arrival is visible once
      // its leaving is). Only a rank still missing fails the wait.
      missing = first_missing();
      if (missing < 0) break;
      if (failed(missing, now)) fail_waiting(missing, deadline);
    }
    if (now >= next_liveness) {
      for (int r = 0; r < world_; ++r) {
        if (cell(r).arrived.load() < barrier && process_exited(cell(r).pid))
          fail_waiting(r, deadline);
      }
      next_liveness = now + kLivenessEvery;
    }
    header_->waiters.fetch_add(1);
    const uint32_t generation = header_->generation.load();
    missing = first_missing();
    if (missing >= 0 && header_->closed_by.load() == 0) {
      futex_wait(&header_->generation, generation,
                 std::min<std::chrono::nanoseconds>(kPoll, deadline - now));
    }
    header_->waiters.fetch_sub(1);
    missing = first_missing();
  }
  check_stamps(barrier, stamp);
}

void ShmChannel::fail_waiting(int missing, Clock::time_point deadline) {
  if (closed_here_.load()) {
    std::lock_guard<std::mutex> lock(close_mutex_);
    throw TransferError(
        TransferFailure::kAborted, missing,
        fmt::format("this rank closed the group's connections ({})", close_reason_));
  }
  // Every failure below is a peer's: say so before it unwinds (a concurrent transfer this
  // rank's unwinding aborts is then counted as the peer's too).
  peer_failed_.store(true);
  if (const int closer = header_->closed_by.load() - 1; closer >= 0) {
    throw TransferError(
        TransferFailure::kConnection, closer,
        fmt::format("the connection to rank {} broke (it closed the group's shared memory)",
                    closer));
  }
  if (cell(missing).left.load() != 0) {
    throw TransferError(
        TransferFailure::kConnection, missing,
        fmt::format("the connection to rank {} broke (it destroyed its process group)", missing));
  }
  if (process_exited(cell(missing).pid)) {
    throw TransferError(TransferFailure::kConnection, missing,
                        fmt::format("the connection to rank {} broke (its process {} exited)",
                                    missing, cell(missing).pid));
  }
  LOOM_INTERNAL_ASSERT(Clock::now() >= deadline, "shared memory: woken without a cause");
  throw TransferError(TransferFailure::kTimeout, missing,
                      fmt::format("no data from rank {} before the deadline (it did not reach "
                                  "this rank's step in the group's shared memory)",
                                  missing));
}

void ShmChannel::check_stamps(uint64_t barrier, const ShmStamp& mine) const {
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    const ShmStamp& theirs = cell(r).stamps[barrier % 2];
    LOOM_CHECK(theirs == mine,
               "rank {} is running {} while this rank runs {}: every rank of a group must issue "
               "the same collectives in the same order, with the same sizes",
               r, describe_stamp(theirs, theirs.aux != mine.aux),
               describe_stamp(mine, theirs.aux != mine.aux));
  }
}

}  // namespace loom::comm::gloo_detail
