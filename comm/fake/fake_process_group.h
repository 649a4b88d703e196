// FakeProcessGroup: a process group whose operations move no data and never touch a network, for
// tracing a job on the meta device (tensor/device.h) — torch's FakeProcessGroup, with point to
// point added so a pipeline can be traced too. What `loom plan` (train/job_plan.h) runs the job's
// own step on.
//
// Every operation goes through ProcessGroup's front end exactly as on Gloo or NCCL: validation,
// sequence numbers, counters, observers (so CommDebugMode counts a traced step's collectives as
// it counts a real one's). Then:
//   - collectives complete at once. Outputs keep what they hold, except all_gather, which copies
//     this rank's input into every output of its shape: peers are taken to be like this rank,
//     which is what a job's consistency checks (DDP's "every rank holds the same parameters")
//     need to pass. Meta tensors carry values only in small storage (tensor/device.h).
//   - send and recv pair up among the ranks traced together in one process (a FakeWorld): a
//     send is handed to the matching recv (same group name, peer and tag, in order), which copies
//     its values (small meta storage: the pipeline's shape messages) and completes; until then
//     the recv's Work is pending. A send to a rank that is not traced completes at once; a recv
//     from one completes at once without values. A recv whose send never comes fails after the
//     group's timeout, naming the group, the peer and the tag, or at once after abort().
//
// Tensors must be on the group's device, meta.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "comm/process_group.h"

namespace loom::comm {

class FakeWorld;

class FakeProcessGroup : public ProcessGroup {
 public:
  // The world groups of `traced` (global ranks of a world of `world_size`), one per traced rank,
  // in the order given, sharing one FakeWorld: each traced rank runs its part of the job on its
  // own thread with its group. Throws naming the rank when one is out of range or repeated.
  static std::vector<std::shared_ptr<ProcessGroup>> create_world(int world_size,
                                                                 const std::vector<int>& traced,
                                                                 ProcessGroupOptions options = {});

  // Fails every receive pending or to come in this group's world with `reason`: what a tracing
  // harness calls when a traced rank fails, so its peers stop waiting at once.
  void abort(const std::string& reason);
  // Point-to-point messages of this group's world that never paired (a send no rank received, a
  // receive no rank sent), one line each; empty when all did. Meaningful once every traced rank
  // is done: how a trace checks that the job's sends and receives pair up.
  std::vector<std::string> unmatched_messages() const;

  std::string backend_name() const override { return "fake"; }
  Device device() const override { return Device::meta(); }

  // Private: use create_world() or new_group().
  FakeProcessGroup(std::shared_ptr<FakeWorld> world, std::shared_ptr<Store> store, int rank,
                   int size, std::vector<int> global_ranks, ProcessGroupOptions options);

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
  std::shared_ptr<FakeWorld> world_;
};

}  // namespace loom::comm
