#include "parallel/cp/sequence_layout.h"

#include "autograd/functions.h"
#include "base/error.h"

namespace loom::parallel::cp {

std::vector<int64_t> SequenceLayout::chunks_of(int64_t r) const {
  if (chunks_per_rank() == 1) return {r};
  return {r, 2 * cp - 1 - r};
}

std::vector<int64_t> SequenceLayout::chunks() const { return chunks_of(rank); }

std::vector<int64_t> SequenceLayout::positions() const {
  std::vector<int64_t> out;
  const int64_t len = chunk_len();
  for (int64_t chunk : chunks()) {
    for (int64_t t = 0; t < len; ++t) out.push_back(chunk * len + t);
  }
  return out;
}

Tensor SequenceLayout::shard(const Tensor& x, int64_t dim) const {
  LOOM_CHECK(x.size(dim) == seq_len,
             "context parallel: a sequence of {} tokens along dim {}, but the layout splits {}",
             x.size(dim), dim, seq_len);
  std::vector<Tensor> pieces;
  for (int64_t chunk : chunks()) pieces.push_back(narrow(x, dim, chunk * chunk_len(), chunk_len()));
  return pieces.size() == 1 ? pieces.front() : cat(pieces, dim);
}

void SequenceLayout::check(const std::string& what) const {
  const int64_t parts = cp * chunks_per_rank();
  LOOM_CHECK(
      seq_len % parts == 0,
      "{}: {} tokens do not split into {} equal chunks ({}cp {}{}); give a multiple of "
      "{}{}",
      what, seq_len, parts, chunks_per_rank() == 2 ? "2 x " : "", cp,
      chunks_per_rank() == 2 ? ": two per rank, the head-tail split that balances causal work" : "",
      parts,
      chunks_per_rank() == 2 ? ", or --no-cp-load-balance for one contiguous chunk per rank" : "");
}

}  // namespace loom::parallel::cp
