// What a sequence sharded over ranks looks like to the ops that need all of it: a thread-local
// context a parallelism installs around a model's forward and backward (context parallelism,
// parallel/cp/context_parallel.h), torch's context_parallel() context manager in miniature.
//
// Under a context, loom::scaled_dot_product_attention asks the context to attend over the whole
// sequence (gathering or passing keys and values between ranks), and a model asks it for the
// global positions of the tokens it holds (learned position embeddings, RoPE tables): model code
// needs no other change to run on a sharded sequence. Without one, positions are 0..T-1 and
// attention is the local op.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/ops_nn.h"
#include "tensor/tensor.h"

namespace loom {

class SequenceContext {
 public:
  virtual ~SequenceContext() = default;
  // The global positions of this rank's `local_len` tokens, in the order it holds them.
  virtual std::vector<int64_t> positions(int64_t local_len) const = 0;
  // The whole sequence's length when this rank holds `local_len` of its tokens.
  virtual int64_t sequence_length(int64_t local_len) const = 0;
  // Attention of this rank's queries over the whole sequence's keys and values (each (B, H,
  // T_local, D), the rank's tokens in its order), as loom::scaled_dot_product_attention(q, k, v,
  // is_causal, scale, 0, dropout, enable_gqa) over the whole sequence would give for those
  // queries (enable_gqa: k and v may have fewer heads than q, grouped-query attention; dropout's
  // region, if any, places q's batch and heads, its sequence dims being the context's to place).
  // Runs with no context installed.
  virtual Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal,
                           double scale, bool enable_gqa, const AttentionDropout& dropout) = 0;
};

// The context installed on this thread, or null.
SequenceContext* current_sequence_context();

// Installs `context` (null: none) on this thread for its lifetime, then restores the previous.
class SequenceContextGuard {
 public:
  explicit SequenceContextGuard(SequenceContext* context);
  ~SequenceContextGuard();
  SequenceContextGuard(const SequenceContextGuard&) = delete;
  SequenceContextGuard& operator=(const SequenceContextGuard&) = delete;

 private:
  SequenceContext* previous_;
};

// The global positions of this rank's `local_len` tokens: 0..local_len-1 without a context.
std::vector<int64_t> sequence_positions(int64_t local_len);
// The positions of this rank's `local_len` tokens as runs of consecutive ones, in its order.
struct PositionRun {
  int64_t local = 0;   // the run's first token among this rank's
  int64_t global = 0;  // its position in the whole sequence
  int64_t length = 0;
};
std::vector<PositionRun> sequence_runs(int64_t local_len);
// Rows of `table` (dim 0 indexed by position, e.g. RoPE's cos and sin) for this rank's
// `local_len` tokens, in its order: a narrow without a context, the runs of its positions
// concatenated under one.
Tensor sequence_rows(const Tensor& table, int64_t local_len);

}  // namespace loom
