// Where a context-parallel attention's pieces sit in the whole attention's dropout mask, so each
// piece (a query chunk against the gathered keys, a ring block, a rank's heads after Ulysses'
// all-to-all) drops what one rank attending over the whole sequence drops.
#pragma once

#include <cstdint>

#include "tensor/ops_nn.h"

namespace loom::parallel::cp {

class DropoutPlacement {
 public:
  // The caller's dropout for q (B, H, T_local, D): its region, if any, places the batch and head
  // dims (a tensor-parallel rank's heads; its sequence dims are the local ones and are replaced),
  // none means q's batch and heads are the whole; the sequence is the whole's `seq_len` tokens.
  DropoutPlacement(const AttentionDropout& dropout, const Tensor& q, int64_t seq_len);

  // The dropout of a piece whose heads start `head_offset` into q's heads and whose queries and
  // keys start at global positions first_query and first_key (p = 0: none).
  AttentionDropout at(int64_t head_offset, int64_t first_query, int64_t first_key) const;

 private:
  AttentionDropout dropout_;
};

}  // namespace loom::parallel::cp
