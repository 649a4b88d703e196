#include "comm/nccl/process_group_nccl.h"

#include <fmt/format.h>

#include <numeric>

#include "base/error.h"
#include "comm/nccl/nccl_utils.h"
#include "comm/nccl/work_nccl.h"
#include "tensor/cuda/cuda_runtime.h"

namespace loom::comm {

using nccl::NcclComm;
using nccl::to_nccl_dtype;
using nccl::to_nccl_reduce_op;

namespace {

size_t nbytes(const Tensor& t) { return static_cast<size_t>(t.numel()) * element_size(t.dtype()); }

// True when `pieces` all have `count` elements and lie back to back in one storage, so one buffer
// of pieces.size() * count elements starting at pieces[0] holds them in order.
bool back_to_back(const std::vector<Tensor>& pieces, int64_t count) {
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].numel() != count || pieces[i].storage() != pieces[0].storage() ||
        pieces[i].offset() != pieces[0].offset() + static_cast<int64_t>(i) * count) {
      return false;
    }
  }
  return true;
}

// Device-to-device copy of a rank's own piece, ordered on the group's stream.
void copy_on_stream(NcclComm::Launch& launch, const Tensor& dst, const Tensor& src) {
  if (nbytes(src) == 0) return;
  launch.cuda(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), nbytes(src), cudaMemcpyDeviceToDevice,
                              launch.stream()),
              "cudaMemcpyAsync(own piece, device to device)");
}

}  // namespace

std::shared_ptr<ProcessGroupNccl> ProcessGroupNccl::create(std::shared_ptr<Store> store, int rank,
                                                           int size, ProcessGroupOptions options,
                                                           int device_index) {
  LOOM_CHECK(size >= 1 && rank >= 0 && rank < size,
             "ProcessGroupNccl::create for group '{}': rank {} is not in [0, {})", options.name,
             rank, size);
  std::vector<int> global_ranks(size);
  std::iota(global_ranks.begin(), global_ranks.end(), 0);
  return create_with_ranks(std::move(store), rank, std::move(global_ranks), std::move(options),
                           device_index);
}

std::shared_ptr<ProcessGroupNccl> ProcessGroupNccl::create_with_ranks(std::shared_ptr<Store> store,
                                                                      int rank,
                                                                      std::vector<int> global_ranks,
                                                                      ProcessGroupOptions options,
                                                                      int device) {
  const int size = static_cast<int>(global_ranks.size());
  LOOM_CHECK(store != nullptr,
             "ProcessGroupNccl::create for group '{}' (rank {} of {}): the store is null",
             options.name, rank, size);
  LOOM_CHECK(
      cuda::available(),
      "ProcessGroupNccl::create for group '{}' (rank {} of {}) on cuda:{}: CUDA is unavailable: {}",
      options.name, rank, size, device, cuda::unavailable_reason());
  const int count = cuda::device_count();
  LOOM_CHECK(
      device >= 0 && device < count,
      "ProcessGroupNccl::create for group '{}' (rank {} of {}): there is no CUDA device cuda:{}; "
      "this process sees {} device{}",
      options.name, rank, size, device, count, count == 1 ? "" : "s");
  auto comm = NcclComm::create(*store, rank, size, options.name, device, options.timeout);
  return std::shared_ptr<ProcessGroupNccl>(
      new ProcessGroupNccl(std::move(store), rank, std::move(global_ranks), std::move(options),
                           device, std::move(comm)));
}

ProcessGroupNccl::ProcessGroupNccl(std::shared_ptr<Store> store, int rank,
                                   std::vector<int> global_ranks, ProcessGroupOptions options,
                                   int device, std::shared_ptr<NcclComm> comm)
    : ProcessGroup(std::move(store), rank, static_cast<int>(global_ranks.size()), global_ranks,
                   std::move(options)),
      device_(device),
      comm_(std::move(comm)),
      watchdog_(std::make_unique<nccl::NcclWatchdog>(name(), device)) {}

ProcessGroupNccl::~ProcessGroupNccl() {
  // Stop the watchdog first; the communicator goes with the last Work that shares it.
  watchdog_.reset();
}

cudaStream_t ProcessGroupNccl::stream() const { return comm_->stream(); }

std::string ProcessGroupNccl::failure() const { return comm_->failure(); }

std::shared_ptr<Work> ProcessGroupNccl::issue(const OpInfo& info, std::vector<Tensor> tensors,
                                              const std::function<void(Launch&)>& body) {
  comm_->throw_if_failed(info.description);
  cuda::DeviceGuard on_device(device_);
  const Duration op_timeout = timeout();
  auto work =
      std::make_shared<nccl::WorkNccl>(comm_, info.description, op_timeout, std::move(tensors));
  comm_->launch(info.description, nccl::Clock::now() + op_timeout, [&](Launch& launch) {
    body(launch);
    launch.cuda(cudaEventRecord(work->end_event(), launch.stream()),
                "cudaEventRecord(completion event, NCCL stream)");
  });
  watchdog_->track(work);
  return work;
}

std::shared_ptr<Work> ProcessGroupNccl::run_all_reduce(const OpInfo& info, const Tensor& tensor,
                                                       ReduceOp op) {
  const ncclDataType_t dtype = to_nccl_dtype(tensor.dtype());
  const ncclRedOp_t nccl_op = to_nccl_reduce_op(op, tensor.dtype());
  return issue(info, {tensor}, [&](Launch& l) {
    l.nccl(ncclAllReduce(tensor.raw_data(), tensor.raw_data(), tensor.numel(), dtype, nccl_op,
                         l.comm(), l.stream()),
           "ncclAllReduce");
  });
}

std::shared_ptr<Work> ProcessGroupNccl::run_broadcast(const OpInfo& info, const Tensor& tensor,
                                                      int root) {
  const ncclDataType_t dtype = to_nccl_dtype(tensor.dtype());
  return issue(info, {tensor}, [&](Launch& l) {
    l.nccl(ncclBroadcast(tensor.raw_data(), tensor.raw_data(), tensor.numel(), dtype, root,
                         l.comm(), l.stream()),
           "ncclBroadcast");
  });
}

std::shared_ptr<Work> ProcessGroupNccl::run_all_gather(const OpInfo& info,
                                                       const std::vector<Tensor>& outputs,
                                                       const Tensor& input) {
  const ncclDataType_t dtype = to_nccl_dtype(input.dtype());
  std::vector<Tensor> tensors = outputs;
  tensors.push_back(input);
  if (back_to_back(outputs, input.numel())) {
    return issue(info, std::move(tensors), [&](Launch& l) {
      l.nccl(ncclAllGather(input.raw_data(), outputs[0].raw_data(), input.numel(), dtype, l.comm(),
                           l.stream()),
             "ncclAllGather");
    });
  }
  // Uneven (or scattered) outputs: rank r broadcasts its input into everyone's outputs[r].
  return issue(info, std::move(tensors), [&](Launch& l) {
    l.grouped([&] {
      for (int r = 0; r < size(); ++r) {
        const void* send = r == rank() ? input.raw_data() : outputs[r].raw_data();
        l.nccl(ncclBroadcast(send, outputs[r].raw_data(), outputs[r].numel(), dtype, r, l.comm(),
                             l.stream()),
               "ncclBroadcast (grouped, uneven all_gather)");
      }
    });
  });
}

std::shared_ptr<Work> ProcessGroupNccl::run_reduce_scatter(const OpInfo& info, const Tensor& output,
                                                           const std::vector<Tensor>& inputs,
                                                           ReduceOp op) {
  const ncclDataType_t dtype = to_nccl_dtype(output.dtype());
  const ncclRedOp_t nccl_op = to_nccl_reduce_op(op, output.dtype());
  std::vector<Tensor> tensors = inputs;
  tensors.push_back(output);
  if (back_to_back(inputs, output.numel())) {
    return issue(info, std::move(tensors), [&](Launch& l) {
      l.nccl(ncclReduceScatter(inputs[0].raw_data(), output.raw_data(), output.numel(), dtype,
                               nccl_op, l.comm(), l.stream()),
             "ncclReduceScatter");
    });
  }
  // Uneven (or scattered) inputs: one reduce per rank r, rooted at r, of everyone's inputs[r].
  // Non-roots pass their send buffer as the (unused) receive buffer, as NCCL allows.
  return issue(info, std::move(tensors), [&](Launch& l) {
    l.grouped([&] {
      for (int r = 0; r < size(); ++r) {
        void* recv = r == rank() ? output.raw_data() : inputs[r].raw_data();
        l.nccl(ncclReduce(inputs[r].raw_data(), recv, inputs[r].numel(), dtype, nccl_op, r,
                          l.comm(), l.stream()),
               "ncclReduce (grouped, uneven reduce_scatter)");
      }
    });
  });
}

std::shared_ptr<Work> ProcessGroupNccl::run_all_to_all(const OpInfo& info,
                                                       const std::vector<Tensor>& outputs,
                                                       const std::vector<Tensor>& inputs) {
  const ncclDataType_t dtype = to_nccl_dtype(inputs[0].dtype());
  std::vector<Tensor> tensors = outputs;
  tensors.insert(tensors.end(), inputs.begin(), inputs.end());
  return issue(info, std::move(tensors), [&](Launch& l) {
    copy_on_stream(l, outputs[rank()], inputs[rank()]);
    l.grouped([&] {
      for (int r = 0; r < size(); ++r) {
        if (r == rank()) continue;
        l.nccl(ncclSend(inputs[r].raw_data(), inputs[r].numel(), dtype, r, l.comm(), l.stream()),
               "ncclSend (grouped, all_to_all)");
        l.nccl(ncclRecv(outputs[r].raw_data(), outputs[r].numel(), dtype, r, l.comm(), l.stream()),
               "ncclRecv (grouped, all_to_all)");
      }
    });
  });
}

std::shared_ptr<Work> ProcessGroupNccl::run_gather(const OpInfo& info,
                                                   const std::vector<Tensor>& outputs,
                                                   const Tensor& input, int root) {
  const ncclDataType_t dtype = to_nccl_dtype(input.dtype());
  std::vector<Tensor> tensors = outputs;
  tensors.push_back(input);
  return issue(info, std::move(tensors), [&](Launch& l) {
    if (rank() != root) {
      l.nccl(ncclSend(input.raw_data(), input.numel(), dtype, root, l.comm(), l.stream()),
             "ncclSend (gather)");
      return;
    }
    copy_on_stream(l, outputs[root], input);
    l.grouped([&] {
      for (int r = 0; r < size(); ++r) {
        if (r == root) continue;
        l.nccl(ncclRecv(outputs[r].raw_data(), outputs[r].numel(), dtype, r, l.comm(), l.stream()),
               "ncclRecv (grouped, gather)");
      }
    });
  });
}

std::shared_ptr<Work> ProcessGroupNccl::run_scatter(const OpInfo& info, const Tensor& output,
                                                    const std::vector<Tensor>& inputs, int root) {
  const ncclDataType_t dtype = to_nccl_dtype(output.dtype());
  std::vector<Tensor> tensors = inputs;
  tensors.push_back(output);
  return issue(info, std::move(tensors), [&](Launch& l) {
    if (rank() != root) {
      l.nccl(ncclRecv(output.raw_data(), output.numel(), dtype, root, l.comm(), l.stream()),
             "ncclRecv (scatter)");
      return;
    }
    copy_on_stream(l, output, inputs[root]);
    l.grouped([&] {
      for (int r = 0; r < size(); ++r) {
        if (r == root) continue;
        l.nccl(ncclSend(inputs[r].raw_data(), inputs[r].numel(), dtype, r, l.comm(), l.stream()),
               "ncclSend (grouped, scatter)");
      }
    });
  });
}

std::shared_ptr<Work> ProcessGroupNccl::run_send(const OpInfo& info, const Tensor& tensor, int dst,
                                                 int tag) {
  LOOM_CHECK(
      tag == 0,
      "{}: the NCCL backend has no message tags (a send matches the peer's next recv from this "
      "rank, in issue order); pass tag 0, got {}",
      info.description, tag);
  const ncclDataType_t dtype = to_nccl_dtype(tensor.dtype());
  return issue(info, {tensor}, [&](Launch& l) {
    l.nccl(ncclSend(tensor.raw_data(), tensor.numel(), dtype, dst, l.comm(), l.stream()),
           "ncclSend");
  });
}

std::shared_ptr<Work> ProcessGroupNccl::run_recv(const OpInfo& info, const Tensor& tensor, int src,
                                                 int tag) {
  LOOM_CHECK(
      tag == 0,
      "{}: the NCCL backend has no message tags (a recv matches the peer's next send to this "
      "rank, in issue order); pass tag 0, got {}",
      info.description, tag);
  const ncclDataType_t dtype = to_nccl_dtype(tensor.dtype());
  return issue(info, {tensor}, [&](Launch& l) {
    l.nccl(ncclRecv(tensor.raw_data(), tensor.numel(), dtype, src, l.comm(), l.stream()),
           "ncclRecv");
  });
}

std::shared_ptr<Work> ProcessGroupNccl::run_barrier(const OpInfo& info) {
  return issue(info, {}, [&](Launch& l) {
    void* buffer = comm_->barrier_buffer();
    l.nccl(ncclAllReduce(buffer, buffer, 1, ncclFloat32, ncclSum, l.comm(), l.stream()),
           "ncclAllReduce (barrier, 1 element)");
  });
}

std::shared_ptr<ProcessGroup> ProcessGroupNccl::make_group(std::shared_ptr<Store> store, int rank,
                                                           std::vector<int> group_ranks_global,
                                                           ProcessGroupOptions options) {
  return create_with_ranks(std::move(store), rank, std::move(group_ranks_global),
                           std::move(options), device_);
}

}  // namespace loom::comm
