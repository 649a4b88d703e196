#include "parallel/ddp/ddp.h"

#include "autograd/grad_mode.h"
#include "base/error.h"
#include "dtensor/dtensor.h"

namespace loom::ddp {

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 std::shared_ptr<comm::ProcessGroup> group,
                                                 ReducerOptions options)
    : module_(std::move(module)) {
  LOOM_CHECK(module_ != nullptr, "DistributedDataParallel: the module is null");
  LOOM_CHECK(group != nullptr, "DistributedDataParallel: the process group is null");
  auto named = module_->named_parameters();
  // The reducer first: it checks that every rank holds the same parameters (a mismatch must
  // fail with both sides named, not desynchronize the broadcasts below).
  reducer_ = std::make_unique<Reducer>(named, group, options);
  // Replicas start from rank 0's values (local shards for DTensor parameters).
  NoGradGuard no_grad;
  for (auto& [name, p] : named) {
    const Tensor& local = is_dtensor(p) ? local_shard(p) : p;
    group->broadcast(local, 0)->wait();
  }
}

}  // namespace loom::ddp
