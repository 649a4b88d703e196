#include "tensor/cuda/block_pool.h"

#include <fmt/format.h>

#include <vector>

#include "base/error.h"
#include "tensor/cuda/human_bytes.h"

namespace loom::cuda {

std::string stats_str(const AllocatorStats& s) {
  return fmt::format("allocated {} (peak {}), reserved {} in {} segment{}, {} active block{}",
                     human_bytes(s.allocated_bytes), human_bytes(s.peak_allocated_bytes),
                     human_bytes(s.reserved_bytes), s.segments, s.segments == 1 ? "" : "s",
                     s.active_blocks, s.active_blocks == 1 ? "" : "s");
}

std::size_t BlockPool::round_size(std::size_t bytes) {
  if (bytes < kMinBlockSize) return kMinBlockSize;
  return (bytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

std::size_t BlockPool::segment_size(std::size_t rounded) {
  if (rounded <= kSmallSize) return kSmallSegment;
  if (rounded < kMinLargeAlloc) return kLargeSegment;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

BlockPool::~BlockPool() {
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    release_cached_locked();
  } catch (const std::exception&) {
    // Destructors must not throw; the process is ending or the device is already broken.
  }
  // Blocks of segments still in use: forget the bookkeeping, leave the memory to the device.
  std::vector<Block*> left;
  for (Block* b : free_small_) left.push_back(b);
  for (Block* b : free_large_) left.push_back(b);
  for (auto& [ptr, b] : active_) left.push_back(b);
  for (Block* b : left) delete b;
}

void* BlockPool::allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  const std::size_t rounded = round_size(bytes);
  const bool small = rounded <= kSmallSize;
  std::lock_guard<std::mutex> lock(mutex_);
  Block* block = take_free_block(rounded, small);
  if (block == nullptr) block = new_segment(rounded, small);
  split(block, rounded);
  block->allocated = true;
  block->requested = bytes;
  active_.emplace(block->ptr, block);
  stats_.allocated_bytes += block->size;
  stats_.requested_bytes += bytes;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  ++stats_.active_blocks;
  ++stats_.allocations;
  return block->ptr;
}

void BlockPool::free(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = active_.find(ptr);
  LOOM_CHECK(it != active_.end(),
             "caching allocator on {}: free of {} which this allocator did not hand out (or "
             "already took back); {}",
             raw_.name(), ptr, stats_str(stats_));
  Block* block = it->second;
  active_.erase(it);
  stats_.allocated_bytes -= block->size;
  stats_.requested_bytes -= block->requested;
  --stats_.active_blocks;
  block->allocated = false;
  block->requested = 0;
  // Merge with free neighbours so the segment can serve large requests (and be released) again.
  FreeSet& pool = free_set(block->small);
  if (block->next != nullptr && !block->next->allocated) {
    pool.erase(block->next);
    merge_into(block, block->next);
  }
  if (block->prev != nullptr && !block->prev->allocated) {
    Block* prev = block->prev;
    pool.erase(prev);
    merge_into(prev, block);
    block = prev;
  }
  pool.insert(block);
}

std::size_t BlockPool::release_cached() {
  std::lock_guard<std::mutex> lock(mutex_);
  return release_cached_locked();
}

AllocatorStats BlockPool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void BlockPool::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

BlockPool::Block* BlockPool::take_free_block(std::size_t rounded, bool small) {
  FreeSet& pool = free_set(small);
  Block key;
  key.size = rounded;
  key.ptr = nullptr;
  const auto it = pool.lower_bound(&key);
  if (it == pool.end()) return nullptr;
  Block* block = *it;
  pool.erase(it);
  return block;
}

BlockPool::Block* BlockPool::new_segment(std::size_t rounded, bool small) {
  const std::size_t bytes = segment_size(rounded);
  void* ptr = nullptr;
  try {
    ptr = raw_.allocate(bytes);
  } catch (const Error& first) {
    // Cached segments may be what fills the device: give them back and try once more.
    ++stats_.cache_flushes;
    if (release_cached_locked() == 0) {
      LOOM_FAIL(
          "caching allocator on {}: cannot allocate a segment of {} for a request of {}: "
          "{}; nothing cached to release ({})",
          raw_.name(), human_bytes(bytes), human_bytes(rounded), first.what(), stats_str(stats_));
    }
    try {
      ptr = raw_.allocate(bytes);
    } catch (const Error& second) {
      LOOM_FAIL(
          "caching allocator on {}: cannot allocate a segment of {} for a request of {} "
          "even after releasing the cache: {} ({})",
          raw_.name(), human_bytes(bytes), human_bytes(rounded), second.what(), stats_str(stats_));
    }
  }
  auto* block = new Block;
  block->ptr = static_cast<char*>(ptr);
  block->size = bytes;
  block->small = small;
  stats_.reserved_bytes += bytes;
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  ++stats_.segments;
  ++stats_.raw_allocations;
  return block;
}

std::size_t BlockPool::release_cached_locked() {
  std::size_t released = 0;
  for (FreeSet* pool : {&free_small_, &free_large_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* block = *it;
      if (block->prev != nullptr || block->next != nullptr) {  // part of a segment in use
        ++it;
        continue;
      }
      raw_.free(block->ptr);
      released += block->size;
      stats_.reserved_bytes -= block->size;
      --stats_.segments;
      ++stats_.raw_frees;
      it = pool->erase(it);
      delete block;
    }
  }
  return released;
}

void BlockPool::split(Block* block, std::size_t rounded) {
  const std::size_t remaining = block->size - rounded;
  const bool worth_it = block->small ? remaining >= kMinBlockSize : remaining > kSmallSize;
  if (!worth_it) return;
  auto* rest = new Block;
  rest->ptr = block->ptr + rounded;
  rest->size = remaining;
  rest->small = block->small;
  rest->prev = block;
  rest->next = block->next;
  if (block->next != nullptr) block->next->prev = rest;
  block->next = rest;
  block->size = rounded;
  free_set(rest->small).insert(rest);
}

void BlockPool::merge_into(Block* into, Block* gone) {
  into->size += gone->size;
  into->next = gone->next;
  if (gone->next != nullptr) gone->next->prev = into;
  delete gone;
}

}  // namespace loom::cuda
