// What the TCP and shared-memory algorithms share (private to comm/gloo): a tensor's bytes, and
// the balanced split of a buffer into one chunk per rank. Both transports split the same way,
// so every element is reduced from the same pieces in the same order either way.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "tensor/tensor.h"

namespace loom::comm::gloo_detail {

inline size_t nbytes(const Tensor& t) {
  return static_cast<size_t>(t.numel()) * element_size(t.dtype());
}
inline char* bytes(const Tensor& t) { return static_cast<char*>(t.raw_data()); }

// memmove that skips empty and same-place copies (in-place collectives pass aliases).
inline void copy_bytes(void* dst, const void* src, size_t n) {
  if (n != 0 && dst != src) std::memmove(dst, src, n);
}

// Chunk `index` of `count` elements split into `parts`: the first count % parts get one more.
struct Chunk {
  int64_t offset;
  int64_t count;
};
inline Chunk chunk_of(int64_t count, int parts, int index) {
  const int64_t base = count / parts;
  const int64_t extra = count % parts;
  const int64_t offset = index * base + std::min<int64_t>(index, extra);
  return {offset, base + (index < extra ? 1 : 0)};
}

}  // namespace loom::comm::gloo_detail
