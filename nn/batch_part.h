// Which rows of a step's batch the forward running on this thread computes, so that dropout
// draws, on every layout, the masks one rank draws for the whole batch in one forward.
//
// A step's batch is cut into equal parts along dim 0 at several levels: data-parallel ranks
// (and fault-tolerant replicas before them), then gradient accumulation's micro-batches or a
// pipeline's microbatches. Whoever cuts opens a BatchPart for the forward of each part; parts
// nest (a microbatch of a dp rank's share is a part of a part). A mask element is a pure
// function of (seed, the element's index in the whole batch's tensor), so a module that knows
// its rows' place (nn::Dropout, through batch_region) draws exactly its slice of the masks.
//
// The masks of one forward also depend on each Dropout's call count, which every forward
// advances: so the parts of one batch must all start from the same counts, as one forward of the
// whole batch would draw them once. BatchParts does both: it takes the counts once, and each
// part(m) puts them back and opens the part.
//
//   const nn::BatchParts parts(nn::DropoutCalls::of(model), count);
//   for (int m = 0; m < count; ++m) {
//     const nn::BatchPart part = parts.part(m);
//     loss = model(micro_batch(m)) ...
//   }
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "tensor/ops_nn.h"
#include "tensor/rng.h"
#include "tensor/tensor.h"

namespace loom::nn {

class Dropout;
class Module;

// Part `index` of `count` equal parts (along dim 0) of the rows the enclosing scope computes
// (the whole batch outside any). Every scope of a thread nests in the one open before it.
class BatchPart {
 public:
  BatchPart(int64_t index, int64_t count);
  ~BatchPart();
  BatchPart(const BatchPart&) = delete;
  BatchPart& operator=(const BatchPart&) = delete;

  // The open scopes composed: this forward's rows are part `index` of `count` equal parts of
  // the whole batch ({0, 1} outside any scope).
  struct Place {
    int64_t index = 0;
    int64_t count = 1;
  };
  static Place current();
  // Opens `place` as the only scope for its lifetime (what a recompute under activation
  // checkpointing sees: the place its forward ran at), the previous scopes hidden meanwhile.
  class Reopen {
   public:
    explicit Reopen(Place place);
    ~Reopen();
    Reopen(const Reopen&) = delete;
    Reopen& operator=(const Reopen&) = delete;

   private:
    Place previous_;
  };

 private:
  Place previous_;
};

// Where a tensor of `shape` whose dim 0 is this forward's rows sits in the whole batch's tensor
// (dim 0 the batch's rows, the other dims as they are), for ops::dropout and AttentionDropout:
// `region` unchanged outside any BatchPart. `region`, when given, places the tensor as a piece
// of this forward's larger one (a tensor-parallel rank's heads, say); the result places it in
// the whole batch's.
RngRegion batch_region(const Shape& shape, const RngRegion& region = {});

// The next dropout of an attention call on a rank's probabilities of `shape` (B, H_local, Tq,
// Tk), from `dropout` (null: none): placed among every head's by `projection`, the weight that
// makes the heads (`rows_per_head` output rows per head, head-major: GPT's c_attn, Llama's wq),
// a row shard under tensor parallelism whose first row names the rank's first head; then at this
// forward's rows of the batch (Dropout::next_mask).
AttentionDropout attention_dropout(Dropout* dropout, const Tensor& projection,
                                   int64_t rows_per_head, const Shape& shape);

// The region of an activation of `shape` in the whole batch's: its rows placed by batch_region,
// and under a sequence context (context parallelism: this rank holds chunks of every sequence),
// when it has three dims or more (batch, sequence, features...), its positions along dim 1 in
// runs (RngRegion). What nn::Dropout draws its mask by.
RngRegion activation_region(const Shape& shape);

// Each Dropout's call count under some modules: restored before each part of a batch so that
// every part draws with the counts the batch's one forward would.
class DropoutCalls {
 public:
  static DropoutCalls of(Module& root);
  static DropoutCalls of(const std::vector<Module*>& roots);
  void restore() const;

 private:
  std::vector<std::pair<Dropout*, uint64_t>> calls_;
};

// The `count` equal parts of one batch, run one after another on this thread (micro-batches,
// a stage's microbatches, replayed replicas' shares).
class BatchParts {
 public:
  BatchParts() = default;
  // `calls`: taken before the first part's forward.
  BatchParts(DropoutCalls calls, int64_t count) : calls_(std::move(calls)), count_(count) {}
  int64_t count() const { return count_; }
  // Part `index`'s scope: the dropout counts put back, its rows current.
  [[nodiscard]] BatchPart part(int64_t index) const {
    calls_.restore();
    return BatchPart(index, count_);
  }

 private:
  DropoutCalls calls_;
  int64_t count_ = 0;
};

}  // namespace loom::nn
