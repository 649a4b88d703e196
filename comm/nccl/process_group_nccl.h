// ProcessGroupNccl: the GPU backend of ProcessGroup (torch.distributed's ProcessGroupNCCL).
//
// One NCCL communicator per group, on one CUDA device per rank (ranks of one group must use
// distinct GPUs; NCCL does not support two ranks on one device). The communicator is created from
// an ncclUniqueId that rank 0 generates and publishes through the group's Store; new_group()
// does the same in the new group's own key space (a PrefixStore).
//
// Streams. Each group has its own non-blocking CUDA stream. Every operation records an event on
// the caller's stream (the legacy default stream, which follows every kernel queued on the
// tensor layer's blocking compute stream, tensor/cuda/stream.h) and makes the group's stream
// wait for it, so the operation sees every write queued before it was issued. It then launches
// the NCCL call(s) and records a completion event. Operations of one group run one at a time in
// issue order; operations of different groups may overlap, and all of them overlap the compute
// stream's later work. Work::wait() blocks the host until the completion event fired (see
// comm/nccl/work_nccl.h); after it, the outputs may be used anywhere. Work::block_current_stream()
// makes the compute stream wait for that event instead, and returns at once. Until then, neither
// read nor write the op's tensors (the Work keeps them alive).
//
// Operations (all tensors contiguous, on cuda:<device_index()>; dtypes f32, bf16, f16, i32, i64;
// reduce ops sum, avg (ncclAvg; integers truncate), max, min, product):
//   all_reduce      ncclAllReduce, in place
//   broadcast       ncclBroadcast, in place
//   all_gather      outputs laid out back to back in one buffer with equal sizes (as
//                   all_gather_into_tensor makes them): one ncclAllGather; otherwise (uneven or
//                   scattered outputs) one grouped ncclBroadcast per rank
//   reduce_scatter  inputs back to back with equal sizes: one ncclReduceScatter; otherwise one
//                   grouped ncclReduce per rank (rank r is the root of inputs[r])
//   all_to_all, gather, scatter
//                   grouped ncclSend/ncclRecv; a rank's piece for itself is a device-to-device
//                   cudaMemcpyAsync on the group's stream
//   send, recv      ncclSend/ncclRecv on the group's communicator and stream. NCCL has no tags:
//                   a send matches the peer's next recv from this rank in issue order, and so
//                   tag must be 0 (any other tag throws, rather than silently meaning nothing).
//                   Point-to-point ops are ordered with the group's collectives, so both peers
//                   must issue them at the same point relative to those collectives.
//   barrier         ncclAllReduce of one f32 on a device buffer the group owns; wait() on its
//                   Work returns once every rank reached the barrier.
//
// Errors. Every NCCL and CUDA call is checked; failures throw loom::Error naming the op
// (OpInfo::description: kind, sequence number, dtype/sizes, group, rank), the device, the call,
// the NCCL error name and text, and ncclGetLastError(). A watchdog thread polls each outstanding
// op's event and ncclCommGetAsyncError; when an op is not complete after the group's timeout (as
// it was when the op was issued) or an asynchronous error appears, it aborts the communicator
// (ncclCommAbort), fails that op's Work with a message naming the group, op, sequence number and
// timeout, and poisons the group: every later op throws at once, naming that first failure.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/nccl/nccl_comm.h"
#include "comm/process_group.h"
#include "comm/store.h"

namespace loom::comm {

namespace nccl {
class NcclWatchdog;
}  // namespace nccl

class ProcessGroupNccl final : public ProcessGroup {
 public:
  // Collective: every rank of the group calls it with the same `size` and options.name, over
  // stores that share one key space (a PrefixStore per group). `device_index` is this rank's
  // GPU. Throws loom::Error naming the group, rank and device when CUDA is unavailable (with
  // loom::cuda::unavailable_reason()), when the device does not exist, when rank 0's unique id
  // does not arrive within options.timeout, or when NCCL initialization fails or times out.
  static std::shared_ptr<ProcessGroupNccl> create(std::shared_ptr<Store> store, int rank, int size,
                                                  ProcessGroupOptions options, int device_index);
  ~ProcessGroupNccl() override;

  std::string backend_name() const override { return "nccl"; }
  Device device() const override { return Device::cuda(device_); }
  int device_index() const { return device_; }
  // The group's NCCL stream (for callers that order their own work after the group's).
  cudaStream_t stream() const;
  // The first failure's message; empty while the group is usable.
  std::string failure() const;

 protected:
  std::shared_ptr<Work> run_all_reduce(const OpInfo& info, const Tensor& tensor,
                                       ReduceOp op) override;
  std::shared_ptr<Work> run_broadcast(const OpInfo& info, const Tensor& tensor, int root) override;
  std::shared_ptr<Work> run_all_gather(const OpInfo& info, const std::vector<Tensor>& outputs,
                                       const Tensor& input) override;
  std::shared_ptr<Work> run_reduce_scatter(const OpInfo& info, const Tensor& output,
                                           const std::vector<Tensor>& inputs, ReduceOp op) override;
  std::shared_ptr<Work> run_all_to_all(const OpInfo& info, const std::vector<Tensor>& outputs,
                                       const std::vector<Tensor>& inputs) override;
  std::shared_ptr<Work> run_gather(const OpInfo& info, const std::vector<Tensor>& outputs,
                                   const Tensor& input, int root) override;
  std::shared_ptr<Work> run_scatter(const OpInfo& info, const Tensor& output,
                                    const std::vector<Tensor>& inputs, int root) override;
  std::shared_ptr<Work> run_send(const OpInfo& info, const Tensor& tensor, int dst,
                                 int tag) override;
  std::shared_ptr<Work> run_recv(const OpInfo& info, const Tensor& tensor, int src,
                                 int tag) override;
  std::shared_ptr<Work> run_barrier(const OpInfo& info) override;
  std::shared_ptr<ProcessGroup> make_group(std::shared_ptr<Store> store, int rank,
                                           std::vector<int> group_ranks_global,
                                           ProcessGroupOptions options) override;

 private:
  using Launch = nccl::NcclComm::Launch;
  ProcessGroupNccl(std::shared_ptr<Store> store, int rank, std::vector<int> global_ranks,
                   ProcessGroupOptions options, int device, std::shared_ptr<nccl::NcclComm> comm);
  static std::shared_ptr<ProcessGroupNccl> create_with_ranks(std::shared_ptr<Store> store, int rank,
                                                             std::vector<int> global_ranks,
                                                             ProcessGroupOptions options,
                                                             int device);

  // Launches `body` (the front end checked every tensor is on device()) ordered after the
  // caller's stream, records the completion event and hands the Work to the watchdog.
  std::shared_ptr<Work> issue(const OpInfo& info, std::vector<Tensor> tensors,
                              const std::function<void(Launch&)>& body);

  const int device_;
  std::shared_ptr<nccl::NcclComm> comm_;
  std::unique_ptr<nccl::NcclWatchdog> watchdog_;
};

}  // namespace loom::comm
