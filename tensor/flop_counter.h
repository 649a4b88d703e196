// Counts the floating-point operations of the matrix products a thread runs inside a scope
// (torch.utils.flop_counter.FlopCounterMode): 2 * m * n * k per GEMM (matmul, linear and their
// batched forms) and attention's two products, forward and backward, on every device including
// meta, so a traced step (train/job_plan.h) knows its compute without running it. Elementwise
// ops, norms and softmax are not counted (as torch's counter: they are memory-bound).
//
// Beside the FLOPs it counts the memory traffic of the ops that write storage that already
// exists (bytes read and written: copy_ 2 per byte, fill_ 1, add_ 3, mul_ 2, the fused AdamW
// 7 per element's bytes): a trace sees an out-of-place op's cost in its output's allocation, but
// an in-place one allocates nothing — a DDP step's bucket copies and zeroing, or the optimizer
// over every parameter. Ops that fill an output they just allocated (zeros, clone, cat) are not
// counted again (ops::copy_uncounted_).
//
//   FlopCounter flops;
//   model.forward_backward(x, y);
//   flops.total();
//
// Products run again by an activation checkpoint's recompute (inside a RecomputeScope, which
// nn/checkpoint.h opens) are counted in total() and also apart, in recomputed(): the step's
// time needs them, its MFU does not (model FLOPs are the products of one forward and backward).
#pragma once

#include <cstdint>

namespace loom {

class Tensor;

class FlopCounter {
 public:
  FlopCounter();  // counts this thread's products until destroyed (scopes nest; each counts)
  ~FlopCounter();
  FlopCounter(const FlopCounter&) = delete;
  FlopCounter& operator=(const FlopCounter&) = delete;

  int64_t total() const { return total_; }
  int64_t recomputed() const { return recomputed_; }          // the part a recompute ran again
  int64_t in_place_bytes() const { return in_place_bytes_; }  // in-place ops' bytes moved

  // Adds `flops` to every counter open on this thread (what the ops call).
  static void record(int64_t flops);
  // Adds the bytes an in-place op moved, `passes` times `written`'s bytes (reads and writes: 2
  // for a copy), to every counter open on this thread.
  static void record_in_place(const Tensor& written, int passes);

  // While alive, this thread's ops count in no counter (work that is not the step's: a check of
  // shapes on meta tensors).
  class Paused {
   public:
    Paused();
    ~Paused();
    Paused(const Paused&) = delete;
    Paused& operator=(const Paused&) = delete;

   private:
    FlopCounter* innermost_;
  };

  // While alive, this thread's products are a recompute's (scopes nest).
  class RecomputeScope {
   public:
    RecomputeScope();
    ~RecomputeScope();
    RecomputeScope(const RecomputeScope&) = delete;
    RecomputeScope& operator=(const RecomputeScope&) = delete;

   private:
    bool previous_;
  };

 private:
  int64_t total_ = 0;
  int64_t recomputed_ = 0;
  int64_t in_place_bytes_ = 0;
  FlopCounter* outer_;
};

}  // namespace loom
