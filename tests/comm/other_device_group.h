// A process group of one rank that says its tensors live on cuda:0 and runs nothing: what a
// machine without a GPU can use to check that tensors off a group's device are rejected by name
// before any backend code runs (the ProcessGroup front end, the DDP reducer, ...). Reaching the
// backend throws.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/in_memory_store.h"
#include "comm/process_group.h"

namespace loom::comm::test {

class OtherDeviceGroup final : public ProcessGroup {
 public:
  OtherDeviceGroup()
      : ProcessGroup(std::make_shared<InMemoryStore>(), 0, 1, {0},
                     ProcessGroupOptions{.name = "elsewhere"}) {}
  std::string backend_name() const override { return "fake"; }
  Device device() const override { return Device::cuda(0); }

 protected:
  static std::shared_ptr<Work> reached() {
    LOOM_FAIL("the backend was reached with a tensor on the wrong device");
  }
  std::shared_ptr<Work> run_all_reduce(const OpInfo&, const Tensor&, ReduceOp) override {
    return reached();
  }
  std::shared_ptr<Work> run_broadcast(const OpInfo&, const Tensor&, int) override {
    return reached();
  }
  std::shared_ptr<Work> run_all_gather(const OpInfo&, const std::vector<Tensor>&,
                                       const Tensor&) override {
    return reached();
  }
  std::shared_ptr<Work> run_reduce_scatter(const OpInfo&, const Tensor&, const std::vector<Tensor>&,
                                           ReduceOp) override {
    return reached();
  }
  std::shared_ptr<Work> run_all_to_all(const OpInfo&, const std::vector<Tensor>&,
                                       const std::vector<Tensor>&) override {
    return reached();
  }
  std::shared_ptr<Work> run_gather(const OpInfo&, const std::vector<Tensor>&, const Tensor&,
                                   int) override {
    return reached();
  }
  std::shared_ptr<Work> run_scatter(const OpInfo&, const Tensor&, const std::vector<Tensor>&,
                                    int) override {
    return reached();
  }
  std::shared_ptr<Work> run_send(const OpInfo&, const Tensor&, int, int) override {
    return reached();
  }
  std::shared_ptr<Work> run_recv(const OpInfo&, const Tensor&, int, int) override {
    return reached();
  }
  std::shared_ptr<Work> run_barrier(const OpInfo&) override { return reached(); }
  std::shared_ptr<ProcessGroup> make_group(std::shared_ptr<Store>, int, std::vector<int>,
                                           ProcessGroupOptions) override {
    return nullptr;
  }
};

}  // namespace loom::comm::test
