#include "comm/nccl/work_nccl.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/error.h"
#include "base/logging.h"
#include "comm/nccl/nccl_utils.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/cuda/stream.h"

namespace loom::comm::nccl {

WorkNccl::WorkNccl(std::shared_ptr<NcclComm> comm, std::string description, Duration timeout,
                   std::vector<Tensor> keep_alive)
    : comm_(std::move(comm)),
      description_(std::move(description)),
      timeout_(timeout),
      deadline_(Clock::now() + timeout),
      keep_alive_(std::move(keep_alive)) {
  const cudaError_t result = cudaEventCreateWithFlags(&end_event_, cudaEventDisableTiming);
  if (result != cudaSuccess) {
    (void)cudaGetLastError();
    end_event_ = nullptr;
    LOOM_FAIL("{}", cuda_error_message(description_, comm_->device(), "cudaEventCreateWithFlags",
                                       result));
  }
}

bool WorkNccl::may_still_run() const {
  return end_event_ != nullptr && cudaEventQuery(end_event_) != cudaSuccess;
}

WorkNccl::~WorkNccl() {
  // Dropped before anyone saw it finish (a step abandoned after an error, a group destroyed with
  // work queued): its tensors stay with the communicator until the stream drains.
  if (!claimed_.load(std::memory_order_acquire) && may_still_run()) {
    comm_->keep_until_drained(std::move(keep_alive_));
  }
  if (end_event_ != nullptr) (void)cudaEventDestroy(end_event_);
}

void WorkNccl::finish(const std::string& error) {
  if (claimed_.exchange(true, std::memory_order_acq_rel)) return;
  // Failed while the kernel may still write (an abort drains in the background): keep the
  // tensors with the communicator instead of handing their memory back.
  if (!error.empty() && may_still_run()) comm_->keep_until_drained(std::move(keep_alive_));
  keep_alive_.clear();
  if (error.empty()) {
    mark_completed();
  } else {
    mark_failed(std::make_exception_ptr(Error(error)));
  }
}

std::string WorkNccl::failed_group_message() const {
  // When this op is the one that failed the group (its description starts the first failure,
  // and descriptions carry the sequence number), report that failure itself.
  const std::string first = comm_->failure();
  return first.starts_with(description_ + " ") ? first : comm_->unusable_message(description_);
}

bool WorkNccl::poll() noexcept {
  if (claimed_.load(std::memory_order_acquire)) return true;
  try {
    // A failed group fails every op not yet seen complete: after ncclCommAbort an event can
    // complete over garbage, so failure is checked before the event and again after it.
    if (!comm_->failure().empty()) {
      finish(failed_group_message());
      return true;
    }
    const cudaError_t status = cudaEventQuery(end_event_);
    if (status == cudaSuccess) {
      finish(comm_->failure().empty() ? std::string() : failed_group_message());
      return true;
    }
    if (status != cudaErrorNotReady) {
      (void)cudaGetLastError();
      const std::string message = cuda_error_message(description_, comm_->device(),
                                                     "cudaEventQuery(completion event)", status);
      comm_->fail(message);
      finish(message);
      return true;
    }
    if (std::string async = comm_->async_error(description_); !async.empty()) {
      comm_->fail(async);
      finish(async);
      return true;
    }
    if (Clock::now() >= deadline_) {
      const std::string message = fmt::format(
          "{} on cuda:{}: timed out: not complete after {} ms (the group's timeout; NCCL "
          "watchdog). The NCCL communicator was aborted and group '{}' is unusable from now on. A "
          "peer rank probably did not issue this operation, or issued a different one "
          "(LOOM_DEBUG=collectives compares them across ranks)",
          description_, comm_->device(), timeout_.count(), comm_->group());
      comm_->fail(message);
      finish(message);
      return true;
    }
    return false;
  } catch (const std::exception& e) {
    const std::string message =
        fmt::format("{}: checking completion failed: {}", description_, e.what());
    comm_->fail(message);
    finish(message);
    return true;
  }
}

void WorkNccl::block_current_stream() {
  if (poll()) return wait();  // already finished, either way: wait() returns or rethrows at once
  cuda::DeviceGuard on_device(comm_->device());
  const cudaError_t result =
      cudaStreamWaitEvent(cuda::compute_stream(comm_->device()), end_event_, 0);
  if (result != cudaSuccess) {
    (void)cudaGetLastError();
    LOOM_FAIL("{}",
              cuda_error_message(description_, comm_->device(),
                                 "cudaStreamWaitEvent(compute stream, completion event)", result));
  }
}

void WorkNccl::wait() {
  auto sleep = std::chrono::microseconds(5);
  while (!poll()) {
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(500));
  }
  Work::wait();  // returns at once (or after the claiming thread marks it); rethrows the error
}

NcclWatchdog::NcclWatchdog(std::string group, int device)
    : group_(std::move(group)), device_(device), thread_([this] { run(); }) {}

NcclWatchdog::~NcclWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void NcclWatchdog::track(std::shared_ptr<WorkNccl> work) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    works_.push_back(std::move(work));
  }
  cv_.notify_all();
}

void NcclWatchdog::run() {
  // Event queries do not need it, but a thread that talks to one device should be on it.
  (void)cudaSetDevice(device_);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    if (works_.empty()) {
      cv_.wait(lock, [&] { return stop_ || !works_.empty(); });
      continue;
    }
    std::vector<std::shared_ptr<WorkNccl>> batch = works_;
    lock.unlock();
    std::vector<const WorkNccl*> finished;
    for (const auto& work : batch) {
      if (work->poll()) finished.push_back(work.get());
    }
    lock.lock();
    std::erase_if(works_, [&](const std::shared_ptr<WorkNccl>& work) {
      return std::find(finished.begin(), finished.end(), work.get()) != finished.end();
    });
    lock.unlock();
    batch.clear();  // a finished Work nobody else holds is released here, outside the lock
    lock.lock();
    if (!stop_) cv_.wait_for(lock, kPollInterval, [&] { return stop_; });
  }
}

}  // namespace loom::comm::nccl
