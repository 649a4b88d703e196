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
  virtual bool is_completed() const;
  // The error, when completed with one (nullptr otherwise).
  std::exception_ptr exception() const;
  // Output tensors of ops that allocate them (all_gather into a list, gather, ...).
  std::vector<Tensor> result() const;

  // Called by backends.
  void mark_completed(std::vector<Tensor> result = {});
  void mark_failed(std::exception_ptr error);

 protected:
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool completed_ = false;
  std::exception_ptr error_;
  std::vector<Tensor> result_;
};

}  // namespace loom::comm
