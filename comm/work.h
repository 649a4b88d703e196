// Work: the handle an asynchronous collective returns (torch's c10d::Work).
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <vector>

#include "tensor/tensor.h"

namespace loom::comm {

class Work {
 public:
  Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  virtual ~Work() = default;

  // Blocks until the operation finished; rethrows its error (a loom::Error naming the group, op,
  // sequence number and, where known, the missing ranks).
  virtual void wait();
  // Orders everything the caller queues next after this operation, blocking the host only where
  // the backend must (torch's Work.wait() on NCCL). CPU backends block like wait(). The NCCL
  // backend makes this rank's compute stream (tensor/cuda/stream.h, where every tensor op runs)
  // wait on the device for the op's completion event and returns at once, so the host can keep
  // queueing work (DDP's optimizer step, a pipeline stage's forward). An error already known is
  // rethrown; one found later fails the group, and the next operation on it names that failure.
  virtual void block_current_stream() { wait(); }
  virtual bool is_completed() const;
  // The error, when completed with one (nullptr otherwise).
  std::exception_ptr exception() const;
  // Output tensors of ops that allocate them (all_gather into a list, gather, ...).
  std::vector<Tensor> result() const;

  // Runs `callback` with the error (nullptr on success) once the operation completes, on the
  // thread that completes it — or at once, here, if it already has. For bookkeeping only (the
  // flight recorder): it must be quick and must not wait on the group.
  void on_done(std::function<void(const std::exception_ptr&)> callback);

  // Called by backends.
  void mark_completed(std::vector<Tensor> result = {});
  void mark_failed(std::exception_ptr error);

 protected:
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool completed_ = false;
  std::exception_ptr error_;
  std::vector<Tensor> result_;
  std::vector<std::function<void(const std::exception_ptr&)>> done_callbacks_;

 private:
  void run_done_callbacks();
};

}  // namespace loom::comm
