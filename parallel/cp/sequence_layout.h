// Which tokens of every sequence a context-parallel rank holds (torchtitan's and Megatron's
// load-balanced split): the sequence is cut into 2·cp equal chunks and rank r holds chunks r and
// 2·cp − 1 − r (the head–tail split: under a causal mask every rank then has the same work), or,
// without load balancing, one contiguous chunk r of cp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace loom::parallel::cp {

struct SequenceLayout {
  int64_t cp = 1;       // ranks sharing each sequence
  int64_t rank = 0;     // this rank's index among them
  int64_t seq_len = 0;  // the whole sequence's tokens
  bool load_balance = true;

  int64_t chunks_per_rank() const { return load_balance && cp > 1 ? 2 : 1; }
  int64_t chunk_len() const { return seq_len / (cp * chunks_per_rank()); }
  int64_t local_len() const { return seq_len / cp; }
  // The global chunks this rank holds, in the order it holds them.
  std::vector<int64_t> chunks() const;
  // The global chunks rank `r` holds.
  std::vector<int64_t> chunks_of(int64_t r) const;
  // The global position of each token this rank holds, in its order.
  std::vector<int64_t> positions() const;
  // This rank's tokens of `x` along `dim` (x holds whole sequences there): its chunks,
  // concatenated (a view when it is one chunk).
  Tensor shard(const Tensor& x, int64_t dim) const;

  // Throws naming both numbers unless seq_len splits into 2·cp chunks (cp with no load
  // balancing): `what` names the caller ("--seq-len").
  void check(const std::string& what) const;
};

}  // namespace loom::parallel::cp
