// BlockPool: the bookkeeping of a caching allocator for one device, in the spirit of PyTorch's
// CUDACachingAllocator, independent of CUDA so that it is tested on CPU with a fake allocator.
//
// Why: cudaMalloc/cudaFree synchronize the device and cost tens of microseconds to
// milliseconds; a training step allocates thousands of tensors. The pool asks its RawAllocator
// for large *segments* and hands out *blocks* carved from them; a freed block goes back to the
// pool (merged with free neighbours of its segment) and is reused by later requests of a fitting
// size. Memory returns to the RawAllocator only through release_cached() (or, once, when a raw
// allocation fails: the pool then releases its cache and retries).
//
// Rules (PyTorch's constants):
//   - Requests round up to a multiple of kMinBlockSize (512 B); 0 bytes gives nullptr.
//   - Rounded requests <= kSmallSize (1 MiB) come from the small pool, whose segments are
//     kSmallSegment (2 MiB); larger ones from the large pool, with segments of kLargeSegment
//     (20 MiB) for requests below kMinLargeAlloc (10 MiB), else the request rounded up to
//     kRoundLarge (2 MiB). Keeping small blocks apart stops them fragmenting big segments.
//   - Best fit: the smallest free block of the right pool that holds the request. A block is
//     split when the remainder is worth keeping: >= kMinBlockSize in the small pool,
//     > kSmallSize in the large pool.
//
// Streams: Loom runs one compute stream per device (tensor/cuda/stream.h), so a block freed on
// the host can be handed out again at once: any kernel that still reads it was queued before
// any kernel that will write it. Memory used on another stream (NCCL's) must be kept alive by
// its user until that stream is done with it (ProcessGroupNCCL's Work holds its tensors).
//
// Thread-safe: one mutex per pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

namespace loom::cuda {

// Where a BlockPool's segments come from: cudaMalloc/cudaFree for a real device, a fake in tests.
class RawAllocator {
 public:
  virtual ~RawAllocator() = default;
  // `bytes` (> 0) of fresh memory. Throws loom::Error when it cannot (out of memory).
  virtual void* allocate(std::size_t bytes) = 0;
  // Returns memory from allocate(). Throws loom::Error on failure.
  virtual void free(void* ptr) = 0;
  // "cuda:0", for error messages.
  virtual std::string name() const = 0;
};

struct AllocatorStats {
  std::size_t allocated_bytes = 0;       // in blocks handed out (rounded sizes)
  std::size_t requested_bytes = 0;       // in blocks handed out (as requested)
  std::size_t reserved_bytes = 0;        // in segments held from the RawAllocator
  std::size_t peak_allocated_bytes = 0;  // max of allocated_bytes since the last reset_peak()
  std::size_t peak_reserved_bytes = 0;   // max of reserved_bytes since the last reset_peak()
  std::int64_t active_blocks = 0;        // blocks handed out and not yet freed
  std::int64_t segments = 0;             // segments held
  std::int64_t allocations = 0;          // allocate() calls that returned memory
  std::int64_t raw_allocations = 0;      // RawAllocator::allocate calls that succeeded
  std::int64_t raw_frees = 0;            // RawAllocator::free calls
  std::int64_t cache_flushes = 0;        // releases forced by a failed raw allocation
};

// "allocated 1.50 MiB (peak 2.00 MiB), reserved 20.00 MiB in 1 segment, 3 active blocks"
std::string stats_str(const AllocatorStats& stats);

class BlockPool {
 public:
  static constexpr std::size_t kMinBlockSize = 512;
  static constexpr std::size_t kSmallSize = std::size_t{1} << 20;
  static constexpr std::size_t kSmallSegment = std::size_t{2} << 20;
  static constexpr std::size_t kMinLargeAlloc = std::size_t{10} << 20;
  static constexpr std::size_t kLargeSegment = std::size_t{20} << 20;
  static constexpr std::size_t kRoundLarge = std::size_t{2} << 20;

  // `raw` must outlive the pool.
  explicit BlockPool(RawAllocator& raw) : raw_(raw) {}
  // Returns every segment to the RawAllocator (blocks still in use are leaked to it: their
  // owners outlive the pool, which happens only at process exit).
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A block of at least `bytes` bytes; nullptr for 0. Throws loom::Error naming the request,
  // the device and the pool's state when the RawAllocator cannot provide it even after the
  // cache is released.
  void* allocate(std::size_t bytes);
  // Returns a pointer from allocate() to the pool; nullptr is a no-op. Throws loom::Error for a
  // pointer this pool did not hand out (or already took back).
  void free(void* ptr);
  // Returns every segment with no block in use to the RawAllocator; the bytes released.
  std::size_t release_cached();

  AllocatorStats stats() const;
  // Sets the peaks to the current values.
  void reset_peak();

  // Size a request is rounded to, and the segment a fresh request of that size gets.
  static std::size_t round_size(std::size_t bytes);
  static std::size_t segment_size(std::size_t rounded);

 private:
  struct Block {
    char* ptr = nullptr;
    std::size_t size = 0;
    std::size_t requested = 0;  // 0 when free
    bool small = false;         // which pool
    bool allocated = false;
    Block* prev = nullptr;  // neighbours within the same segment, by address
    Block* next = nullptr;
  };
  // Free blocks by (size, address): lower_bound finds the best fit.
  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };
  using FreeSet = std::set<Block*, BySize>;

  FreeSet& free_set(bool small) { return small ? free_small_ : free_large_; }
  Block* take_free_block(std::size_t rounded, bool small);
  Block* new_segment(std::size_t rounded, bool small);
  std::size_t release_cached_locked();
  void split(Block* block, std::size_t rounded);
  void merge_into(Block* into, Block* gone);

  RawAllocator& raw_;
  mutable std::mutex mutex_;
  FreeSet free_small_;
  FreeSet free_large_;
  std::unordered_map<void*, Block*> active_;  // by pointer, blocks handed out
  AllocatorStats stats_;
};

}  // namespace loom::cuda
