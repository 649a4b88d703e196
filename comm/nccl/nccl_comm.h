// NcclComm: one NCCL communicator, the CUDA stream its operations run on, and the failure state
// of the group that owns it (internal to the NCCL backend).
//
// Shared (shared_ptr) by a ProcessGroupNccl and every WorkNccl it issued, so a Work can still be
// waited on after its group is gone; the communicator is released with the last of them.
//
// The communicator is created in NCCL's non-blocking mode (ncclConfig_t::blocking = 0, NCCL >=
// 2.14), so no NCCL call can hang this process: initialization and every launch that answers
// ncclInProgress are polled with ncclCommGetAsyncError until ready or until the deadline, and
// ncclCommAbort can interrupt them.
//
// Failure ("poison"): the first failure of any kind (a failed NCCL or CUDA call, an
// asynchronous NCCL error, a watchdog timeout) is recorded, the communicator is aborted
// (ncclCommAbort) and every later operation fails at once with a message naming that first
// failure. Peers cannot be resynchronized after a rank dropped out of a collective, so the group
// is not reusable; build a new one.
//
// Thread safety: launches and error queries hold `comm_mutex_` shared; abort and destruction hold
// it exclusively, so the communicator handle is never freed under a running call. Calls of
// ncclCommGetAsyncError are also serialized among themselves (async_query_mutex_).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "comm/store.h"
#include "tensor/tensor.h"

namespace loom::comm::nccl {

using Clock = std::chrono::steady_clock;

class NcclComm {
 public:
  // The key (in the group's own Store key space) rank 0 publishes the ncclUniqueId under.
  static constexpr const char* kUniqueIdKey = "nccl/unique_id";

  // Collective over `store`: rank 0 generates the ncclUniqueId and publishes it; the others wait
  // for it (up to `timeout`). Then ncclCommInitRankConfig on `device` (non-blocking, named
  // `group`), polled until ready; past `timeout` the half-made communicator is aborted. Every
  // failure throws loom::Error naming the group, the rank, the device and what failed. The caller
  // has checked that `device` exists.
  static std::shared_ptr<NcclComm> create(Store& store, int rank, int size,
                                          const std::string& group, int device, Duration timeout);
  // Waits (up to the creation timeout) for the stream to drain, then ncclCommFinalize +
  // ncclCommDestroy; aborts instead when the group failed or the drain timed out. The kept
  // tensors (keep_until_drained) go only if the stream drained. Never throws.
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int device() const { return device_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& group() const { return group_; }
  cudaStream_t stream() const { return stream_; }
  // A device buffer of one f32 that barrier() all-reduces.
  void* barrier_buffer() const { return barrier_buffer_; }

  // What a launch body calls; every failure throws (the launch then poisons the group).
  class Launch {
   public:
    ncclComm_t comm() const { return comm_; }
    cudaStream_t stream() const { return owner_.stream_; }
    // Checks an NCCL call's result. ncclInProgress (non-blocking mode) is polled with
    // ncclCommGetAsyncError until the call is enqueued, or until the launch's deadline.
    void nccl(ncclResult_t result, std::string_view call);
    void cuda(cudaError_t result, std::string_view call);
    // ncclGroupStart(), body(), ncclGroupEnd(). When body throws, ncclGroupEnd() still runs so
    // this thread's NCCL group depth stays balanced for every other communicator.
    void grouped(const std::function<void()>& body);

   private:
    friend class NcclComm;
    Launch(NcclComm& owner, ncclComm_t comm, std::string_view context, Clock::time_point deadline)
        : owner_(owner), comm_(comm), context_(context), deadline_(deadline) {}
    NcclComm& owner_;
    ncclComm_t comm_;
    std::string_view context_;
    Clock::time_point deadline_;
  };

  // Makes the stream wait for the work already queued on caller_stream() (an event recorded
  // there), then runs `body` with this communicator and stream. `context` describes the
  // operation (OpInfo::description). Throws at once when the group already failed; when `body`
  // (or the ordering) throws,
  // records the failure, aborts the communicator and rethrows it as loom::Error.
  void launch(std::string_view context, Clock::time_point deadline,
              const std::function<void(Launch&)>& body);

  // The first failure's message; empty while the group is healthy.
  std::string failure() const;
  // Throws loom::Error "<context>: group '<g>' is unusable since an earlier failure: <first>".
  void throw_if_failed(std::string_view context) const;
  // The text of that error (for a Work failed by the watchdog).
  std::string unusable_message(std::string_view context) const;
  // Records `message` as the group's failure (when it is the first) and aborts the communicator.
  void fail(const std::string& message);
  // An asynchronous NCCL error (ncclCommGetAsyncError), described for `context`; empty when none.
  std::string async_error(std::string_view context);
  // Keeps the tensors of an operation that may still run on the stream although its Work is gone
  // or failed (a Work dropped unfinished; a failure while the kernel drains after an abort), so
  // the caching allocator cannot hand their memory out under NCCL. Released by ~NcclComm once the
  // stream drained, never when it did not (torch's ProcessGroupNCCL keeps such a graveyard too).
  void keep_until_drained(std::vector<Tensor> tensors);

 private:
  NcclComm(int rank, int size, std::string group, int device, Duration timeout)
      : rank_(rank), size_(size), group_(std::move(group)), device_(device), timeout_(timeout) {}
  void abort_locked();

  const int rank_;
  const int size_;
  const std::string group_;
  const int device_;
  const Duration timeout_;

  mutable std::shared_mutex comm_mutex_;
  ncclComm_t comm_ = nullptr;  // null once aborted
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_event_ = nullptr;  // recorded on the caller's stream before each launch
  void* barrier_buffer_ = nullptr;

  mutable std::mutex failure_mutex_;
  std::string failure_;
  // Serializes ncclCommGetAsyncError calls (launching thread and watchdog; nccl_comm.cc).
  std::mutex async_query_mutex_;
  std::mutex graveyard_mutex_;
  std::vector<Tensor> graveyard_;  // keep_until_drained
};

// The stream whose work an operation is ordered after ("the caller's current stream"). The tensor
// layer queues its kernels and copies on a per-device compute stream (tensor/cuda/stream.h) that
// is a blocking stream, so the legacy default stream is ordered after it: recording the ready
// event on cudaStreamLegacy covers every kernel queued before the collective.
inline cudaStream_t caller_stream() { return cudaStreamLegacy; }

}  // namespace loom::comm::nccl
