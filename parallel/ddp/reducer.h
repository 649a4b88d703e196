// The DDP reducer: averages gradients over a data-parallel group while backward still runs.
//
// Each bucket is one flat buffer; every parameter's .grad becomes a view into its bucket (for a
// DTensor parameter, the local shard of its gradient does), and gradients accumulate there in
// place. A post-accumulate-grad hook marks a parameter ready; when the last parameter of a
// bucket is ready, the bucket's all-reduce(avg) is launched asynchronously on the group, during
// backward. finalize() (called by DistributedDataParallel after backward) waits for all of them.
//
// Devices: parameters must be on the group's device, where the buckets are allocated. On NCCL
// the all-reduces run on the group's own stream, each ordered after the gradients written
// before it by an event on the compute stream, so they overlap the rest of backward; finalize()
// makes the compute stream wait for their completion events instead of blocking the host
// (Work::block_current_stream).
//
// Collective contract: every rank of the group builds the reducer with the same parameters and
// runs the same number of backward passes.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "parallel/ddp/bucket_assignment.h"
#include "tensor/tensor.h"

namespace loom::ddp {

struct ReducerOptions {
  BucketCaps caps;
  // When false (default), a parameter that got no gradient by finalize() is an error naming it;
  // when true, it is treated as a zero gradient.
  bool find_unused_parameters = false;
};

class Reducer {
 public:
  Reducer(std::vector<std::pair<std::string, Tensor>> named_parameters,
          std::shared_ptr<comm::ProcessGroup> group, ReducerOptions options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // While disabled (DDP's no_sync), gradients accumulate locally and nothing is launched.
  void set_sync_enabled(bool enabled) { sync_enabled_ = enabled; }
  // Waits for every launched bucket; launches the ones still pending (unused parameters) or
  // throws naming the parameters that got no gradient.
  void finalize();
  // Zeros every bucket (the next backward accumulates from zero) and re-binds .grad views.
  void zero_grad();

  size_t bucket_count() const { return buckets_.size(); }
  // Parameter names per bucket, in bucket order (for tests and logging).
  std::vector<std::vector<std::string>> bucket_names() const;
  // Buckets whose all-reduce was launched before finalize() was called in the last backward:
  // the overlap the reducer exists for.
  int64_t buckets_launched_during_backward() const { return launched_during_backward_; }

 private:
  struct Slot {
    std::string name;
    Tensor param;
    int64_t offset;  // element offset in the bucket buffer
    Tensor view;     // (local) shape view into the buffer
  };
  struct Bucket {
    Tensor buffer;  // flat, contiguous
    std::vector<size_t> slots;
    size_t pending = 0;
    std::shared_ptr<comm::Work> work;
  };

  void mark_ready(size_t slot_index);
  void launch(size_t bucket_index);
  void bind_grad(size_t slot_index);
  void reset_iteration();

  std::vector<Slot> slots_;
  std::vector<size_t> bucket_of_slot_;
  std::vector<Bucket> buckets_;
  std::vector<bool> ready_;
  size_t next_bucket_ = 0;  // buckets launch in index order
  std::shared_ptr<comm::ProcessGroup> group_;
  ReducerOptions options_;
  bool sync_enabled_ = true;
  bool in_backward_ = false;
  int64_t launched_during_backward_ = 0;
  std::shared_ptr<bool> alive_;  // hooks outliving the reducer become no-ops
};

}  // namespace loom::ddp
