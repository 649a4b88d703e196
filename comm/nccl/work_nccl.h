// WorkNccl: the Work of one NCCL operation, and the watchdog that finishes Works nobody waits on
// (internal to the NCCL backend; callers see comm::Work).
//
// Completion is a CUDA event recorded on the group's NCCL stream right after the operation.
// poll() decides, in this order: the group already failed -> fail with "unusable since an
// earlier failure: <first>"; the event completed -> done; the event query failed -> fail;
// ncclCommGetAsyncError reports an error -> fail; the timeout (the group's timeout when the op
// was issued) passed -> fail with a message naming the op, its sequence number and the timeout.
// Every failure poisons the group and aborts its communicator (NcclComm::fail).
//
// wait() blocks the calling thread, polling, until poll() decides (a host-side wait, like Gloo's:
// when it returns, the outputs are ready for any stream and for the host). block_current_stream()
// is what PyTorch's WorkNCCL::wait() does: the device's compute stream waits for the completion
// event and the host goes on (the Work keeps the op's tensors alive until the watchdog sees the
// event, so the caching allocator cannot hand their memory out while NCCL still uses it).
// Work::is_completed() is not virtual, so it turns true when the watchdog (every kPollInterval)
// or a wait() observes the event: it can lag the GPU by about a millisecond.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/nccl/nccl_comm.h"
#include "comm/work.h"
#include "tensor/tensor.h"

namespace loom::comm::nccl {

class WorkNccl final : public Work {
 public:
  // Creates the completion event on the current device (the caller holds a DeviceGuard); the
  // issuer records it on comm->stream() after launching. `keep_alive` (the op's tensors) is held
  // until the op finishes, so dropping the Work early cannot free memory NCCL still uses.
  WorkNccl(std::shared_ptr<NcclComm> comm, std::string description, Duration timeout,
           std::vector<Tensor> keep_alive);
  ~WorkNccl() override;

  void wait() override;
  // The compute stream waits for end_event() on the device; the host returns at once.
  void block_current_stream() override;
  // Checks the op's state once (see the file comment); true once it finished, either way.
  // Thread-safe; never throws.
  bool poll() noexcept;

  cudaEvent_t end_event() const { return end_event_; }
  const std::string& description() const { return description_; }

 private:
  void finish(const std::string& error);
  // True unless the completion event is known to have fired (its query succeeded).
  bool may_still_run() const;
  std::string failed_group_message() const;

  std::shared_ptr<NcclComm> comm_;
  const std::string description_;
  const Duration timeout_;
  const Clock::time_point deadline_;
  cudaEvent_t end_event_ = nullptr;
  std::vector<Tensor> keep_alive_;  // touched only by the thread that claims the finish
  std::atomic<bool> claimed_{false};
};

// One thread per group that polls its outstanding Works every kPollInterval, so a timeout or an
// asynchronous NCCL error is detected (and the communicator aborted) even when nobody waits.
class NcclWatchdog {
 public:
  static constexpr std::chrono::milliseconds kPollInterval{1};

  NcclWatchdog(std::string group, int device);
  // Stops the thread. Works still outstanding stay valid; their wait() polls by itself.
  ~NcclWatchdog();
  NcclWatchdog(const NcclWatchdog&) = delete;
  NcclWatchdog& operator=(const NcclWatchdog&) = delete;

  void track(std::shared_ptr<WorkNccl> work);

 private:
  void run();

  const std::string group_;
  const int device_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<WorkNccl>> works_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace loom::comm::nccl
