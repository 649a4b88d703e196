#include "comm/nccl/nccl_comm.h"

#include <fmt/format.h>

#include <cstring>
#include <thread>

#include "base/error.h"
#include "base/logging.h"
#include "comm/nccl/nccl_utils.h"
#include "tensor/cuda/cuda_runtime.h"

namespace loom::comm::nccl {

namespace {

int64_t to_ms(Duration d) { return static_cast<int64_t>(d.count()); }

// Polls a non-blocking communicator until it leaves ncclInProgress. Returns its final state, or
// ncclInProgress when `deadline` passed first. `query_mutex` serializes ncclCommGetAsyncError
// on one communicator: during an in-progress group it completes the group's job, which NCCL
// does not guard against two threads (the launcher and the watchdog) doing at once.
ncclResult_t poll_until_ready(ncclComm_t comm, Clock::time_point deadline,
                              std::mutex& query_mutex) {
  auto sleep = std::chrono::microseconds(10);
  while (true) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t query;
    {
      std::lock_guard<std::mutex> serialized(query_mutex);
      query = ncclCommGetAsyncError(comm, &state);
    }
    if (query != ncclSuccess) return query;
    if (state != ncclInProgress) return state;
    if (Clock::now() >= deadline) return ncclInProgress;
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
  }
}

// The ncclUniqueId exchange: rank 0 publishes, the others wait up to `timeout`.
ncclUniqueId exchange_unique_id(Store& store, int rank, const std::string& context, int device,
                                Duration timeout) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (rank == 0) {
    const ncclResult_t result = ncclGetUniqueId(&id);
    LOOM_CHECK(result == ncclSuccess, "{}",
               nccl_error_message(context, device, "ncclGetUniqueId", result, nullptr));
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    store.set(NcclComm::kUniqueIdKey, Bytes(bytes, bytes + sizeof(id)));
    return id;
  }
  try {
    store.wait({NcclComm::kUniqueIdKey}, timeout);
  } catch (const Error& e) {
    LOOM_FAIL(
        "{} on cuda:{}: rank 0 did not publish the NCCL unique id within {} ms (is rank 0 "
        "creating this group too?): {}",
        context, device, to_ms(timeout), e.what());
  }
  const Bytes value = store.get(NcclComm::kUniqueIdKey);
  LOOM_CHECK(value.size() == sizeof(id),
             "{} on cuda:{}: the NCCL unique id in the store has {} bytes, expected {} (is another "
             "backend using the key '{}'?)",
             context, device, value.size(), sizeof(id), NcclComm::kUniqueIdKey);
  std::memcpy(&id, value.data(), sizeof(id));
  return id;
}

}  // namespace

std::shared_ptr<NcclComm> NcclComm::create(Store& store, int rank, int size,
                                           const std::string& group, int device, Duration timeout) {
  const std::string context = fmt::format(
      "creating the NCCL communicator of group '{}' (rank {} of {})", group, rank, size);
  std::shared_ptr<NcclComm> self(new NcclComm(rank, size, group, device, timeout));
  cuda::DeviceGuard on_device(device);

  auto check_cuda = [&](cudaError_t result, std::string_view call) {
    if (result != cudaSuccess) {
      (void)cudaGetLastError();
      LOOM_FAIL("{}", cuda_error_message(context, device, call, result));
    }
  };
  // Stream, event and barrier buffer first: if one fails, the destructor frees the others and
  // there is no communicator to abort yet.
  check_cuda(cudaStreamCreateWithFlags(&self->stream_, cudaStreamNonBlocking),
             "cudaStreamCreateWithFlags(cudaStreamNonBlocking)");
  check_cuda(cudaEventCreateWithFlags(&self->ready_event_, cudaEventDisableTiming),
             "cudaEventCreateWithFlags(cudaEventDisableTiming)");
  check_cuda(cudaMalloc(&self->barrier_buffer_, sizeof(float)), "cudaMalloc(barrier buffer)");
  check_cuda(cudaMemset(self->barrier_buffer_, 0, sizeof(float)), "cudaMemset(barrier buffer)");

  const ncclUniqueId id = exchange_unique_id(store, rank, context, device, timeout);

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = self->group_.c_str();
  const Clock::time_point deadline = Clock::now() + timeout;
  ncclComm_t comm = nullptr;
  ncclResult_t result = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (result == ncclInProgress) result = poll_until_ready(comm, deadline, self->async_query_mutex_);
  if (result != ncclSuccess) {
    std::string message =
        result == ncclInProgress
            ? fmt::format(
                  "{} on cuda:{}: ncclCommInitRankConfig did not finish within {} ms; "
                  "every one of the {} ranks must create this group (check that they all "
                  "reached it and that each uses its own GPU)",
                  context, device, to_ms(timeout), size)
            : nccl_error_message(context, device, "ncclCommInitRankConfig", result, comm);
    if (comm != nullptr) (void)ncclCommAbort(comm);
    LOOM_FAIL("{}", message);
  }
  self->comm_ = comm;
  return self;
}

NcclComm::~NcclComm() {
  try {
    cuda::DeviceGuard on_device(device_);
    std::unique_lock lock(comm_mutex_);
    const Clock::time_point deadline = Clock::now() + timeout_;
    cudaError_t drained = stream_ != nullptr ? cudaStreamQuery(stream_) : cudaSuccess;
    while (drained == cudaErrorNotReady && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      drained = cudaStreamQuery(stream_);
    }
    if (comm_ != nullptr) {
      ncclResult_t finalized = ncclInternalError;
      if (drained == cudaSuccess) {
        finalized = ncclCommFinalize(comm_);
        if (finalized == ncclInProgress)
          finalized = poll_until_ready(comm_, deadline, async_query_mutex_);
      }
      if (finalized == ncclSuccess) {
        (void)ncclCommDestroy(comm_);
      } else {
        LOOM_LOG(
            warn,
            "NCCL group '{}' (rank {} of {}) on cuda:{}: outstanding operations did not finish "
            "within {} ms of destroying the group ({}, {}); aborting the communicator",
            group_, rank_, size_, device_, to_ms(timeout_), cudaGetErrorName(drained),
            nccl_result_name(finalized));
        abort_locked();
      }
      comm_ = nullptr;
    }
    {
      std::lock_guard<std::mutex> graveyard_lock(graveyard_mutex_);
      if (drained == cudaSuccess) {
        graveyard_.clear();
      } else if (!graveyard_.empty()) {
        LOOM_LOG(warn,
                 "NCCL group '{}' (rank {}) on cuda:{}: its stream did not drain ({}); the memory "
                 "of {} tensors "
                 "its unfinished operations used is left allocated rather than reused under them",
                 group_, rank_, device_, cudaGetErrorName(drained), graveyard_.size());
        new std::vector<Tensor>(std::move(graveyard_));  // deliberately leaked
      }
    }
    if (barrier_buffer_ != nullptr) (void)cudaFree(barrier_buffer_);
    if (ready_event_ != nullptr) (void)cudaEventDestroy(ready_event_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  } catch (const std::exception& e) {
    LOOM_LOG(error, "NCCL group '{}' (rank {}): releasing the communicator failed: {}", group_,
             rank_, e.what());
  }
}

void NcclComm::Launch::nccl(ncclResult_t result, std::string_view call) {
  if (result == ncclInProgress)
    result = poll_until_ready(comm_, deadline_, owner_.async_query_mutex_);
  if (result == ncclSuccess) return;
  if (result == ncclInProgress) {
    LOOM_FAIL("{} on cuda:{}: NCCL did not finish enqueuing {} before the group's timeout",
              context_, owner_.device_, call);
  }
  LOOM_FAIL("{}", nccl_error_message(context_, owner_.device_, call, result, comm_));
}

void NcclComm::Launch::cuda(cudaError_t result, std::string_view call) {
  if (result == cudaSuccess) return;
  (void)cudaGetLastError();  // report it once
  LOOM_FAIL("{}", cuda_error_message(context_, owner_.device_, call, result));
}

void NcclComm::Launch::grouped(const std::function<void()>& body) {
  nccl(ncclGroupStart(), "ncclGroupStart");
  try {
    body();
  } catch (...) {
    (void)ncclGroupEnd();
    throw;
  }
  nccl(ncclGroupEnd(), "ncclGroupEnd");
}

void NcclComm::launch(std::string_view context, Clock::time_point deadline,
                      const std::function<void(Launch&)>& body) {
  throw_if_failed(context);
  std::string error;
  {
    std::shared_lock lock(comm_mutex_);
    if (comm_ == nullptr) {
      error = unusable_message(context);
    } else {
      Launch launch(*this, comm_, context, deadline);
      try {
        launch.cuda(cudaEventRecord(ready_event_, caller_stream()),
                    "cudaEventRecord(ready event, caller stream)");
        launch.cuda(cudaStreamWaitEvent(stream_, ready_event_, 0),
                    "cudaStreamWaitEvent(NCCL stream, ready event)");
        body(launch);
        return;
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
  }
  // Outside the shared lock: fail() takes it exclusively to abort.
  fail(error);
  throw Error(error);
}

std::string NcclComm::failure() const {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return failure_;
}

std::string NcclComm::unusable_message(std::string_view context) const {
  return fmt::format(
      "{} on cuda:{}: group '{}' is unusable since an earlier failure (its NCCL "
      "communicator was aborted; create a new group): {}",
      context, device_, group_, failure());
}

void NcclComm::throw_if_failed(std::string_view context) const {
  if (!failure().empty()) throw Error(unusable_message(context));
}

void NcclComm::fail(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (!failure_.empty()) return;
    failure_ = message;
  }
  LOOM_LOG(error,
           "NCCL group '{}' (rank {} of {}) on cuda:{} failed; aborting its communicator: {}",
           group_, rank_, size_, device_, message);
  std::unique_lock lock(comm_mutex_);
  abort_locked();
}

void NcclComm::abort_locked() {
  if (comm_ == nullptr) return;
  const ncclResult_t result = ncclCommAbort(comm_);
  if (result != ncclSuccess && result != ncclInProgress) {
    LOOM_LOG(warn, "NCCL group '{}' (rank {}): ncclCommAbort returned {} ({})", group_, rank_,
             nccl_result_name(result), ncclGetErrorString(result));
  }
  comm_ = nullptr;
}

void NcclComm::keep_until_drained(std::vector<Tensor> tensors) {
  if (tensors.empty()) return;
  std::lock_guard<std::mutex> lock(graveyard_mutex_);
  for (Tensor& t : tensors) graveyard_.push_back(std::move(t));
}

std::string NcclComm::async_error(std::string_view context) {
  std::shared_lock lock(comm_mutex_);
  if (comm_ == nullptr) return "";
  ncclResult_t state = ncclSuccess;
  ncclResult_t query;
  {
    std::lock_guard<std::mutex> serialized(async_query_mutex_);  // see poll_until_ready
    query = ncclCommGetAsyncError(comm_, &state);
  }
  if (query != ncclSuccess) {
    return nccl_error_message(context, device_, "ncclCommGetAsyncError", query, comm_);
  }
  if (state == ncclSuccess || state == ncclInProgress) return "";
  return nccl_error_message(context, device_, "(asynchronous error, ncclCommGetAsyncError)", state,
                            comm_);
}

}  // namespace loom::comm::nccl
