// DistributedDataParallel: a module replicated over a data-parallel group, whose gradients are
// averaged over the group during backward (torch.nn.parallel.DistributedDataParallel).
//
//   ddp::DistributedDataParallel model(gpt, meshes.dp_replicate->group(0));
//   Tensor loss = model.module().loss(x, y);   // or model(x)
//   backward(loss);                            // buckets all-reduce as gradients become ready
//   optimizer.step();
//   model.zero_grad();                         // zeros the buckets (keeps .grad as bucket views)
//
// Parameters are broadcast from the group's rank 0 at construction, so replicas start equal.
// Gradient accumulation: run all but the last micro-batch under `auto guard = model.no_sync();`.
#pragma once

#include <memory>

#include "comm/process_group.h"
#include "nn/module.h"
#include "parallel/ddp/reducer.h"

namespace loom::ddp {

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<nn::Module> module,
                          std::shared_ptr<comm::ProcessGroup> group, ReducerOptions options = {});

  Tensor operator()(const Tensor& input) { return (*module_)(input); }
  nn::Module& module() { return *module_; }
  Reducer& reducer() { return *reducer_; }
  void zero_grad() { reducer_->zero_grad(); }

  // While alive, backward passes accumulate gradients locally without communication.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(Reducer& reducer) : reducer_(reducer) { reducer_.set_sync_enabled(false); }
    ~NoSyncGuard() { reducer_.set_sync_enabled(true); }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    Reducer& reducer_;
  };
  [[nodiscard]] std::unique_ptr<NoSyncGuard> no_sync() {
    return std::make_unique<NoSyncGuard>(*reducer_);
  }

 private:
  std::shared_ptr<nn::Module> module_;
  std::unique_ptr<Reducer> reducer_;
};

}  // namespace loom::ddp
