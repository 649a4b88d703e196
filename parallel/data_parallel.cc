#include "parallel/data_parallel.h"

#include <fmt/format.h>

#include "autograd/grad_mode.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "nn/moe/moe.h"
#include "parallel/ddp/ddp.h"
#include "parallel/fsdp/fully_shard.h"
#include "tensor/ops.h"

namespace loom::parallel {

DataParallel::DataParallel(std::shared_ptr<nn::Module> module, std::vector<Block> blocks,
                           const ParallelMeshes& meshes,
                           const std::optional<nn::MixedPrecisionPolicy>& mixed_precision,
                           const std::function<void()>& materialize)
    : module_(std::move(module)) {
  LOOM_CHECK(meshes.dp_replicate && meshes.dp_shard && meshes.fsdp,
             "DataParallel: the ParallelMeshes lack the data-parallel meshes (dp_replicate, "
             "dp_shard, fsdp); make them with train::ParallelDims::meshes");
  const int64_t replicate = meshes.dp_replicate->size(0), shard = meshes.dp_shard->size(0);
  // Expert parallelism's experts: FSDP over the ranks holding the same experts when there are
  // several (their gradients already sum the ep ranks' tokens: 1 / ep after FSDP's mean), else
  // left out of FSDP and reduced by hand (reduce_expert_gradients).
  std::vector<nn::GroupedExperts*> sharded_experts;
  if (meshes.ep) {
    LOOM_CHECK(shard > 1, "DataParallel: expert parallelism needs dp_shard x cp > 1, got {}",
               shard);
    const bool expert_fsdp = meshes.ep_shard->size(0) > 1;
    for (const auto& [name, sub] : module_->named_modules()) {
      auto* experts = dynamic_cast<nn::GroupedExperts*>(sub);
      if (experts == nullptr) continue;
      if (expert_fsdp) {
        sharded_experts.push_back(experts);
        continue;
      }
      for (const Tensor& p : experts->parameters()) {
        if (is_dtensor(p) && *dtensor_spec(p).mesh == *meshes.ep) expert_params_.push_back(p);
      }
    }
    if (meshes.dp_replicate->size(0) > 1) expert_groups_.push_back(meshes.dp_replicate->group(0));
    expert_scale_ = 1.0 / static_cast<double>(replicate * shard);
  }
  if (shard == 1) {
    if (materialize) materialize();
    if (mixed_precision) nn::apply_mixed_precision(*module_, *mixed_precision);
    if (replicate > 1) {
      ddp_ = std::make_shared<ddp::DistributedDataParallel>(module_, meshes.dp_replicate->group(0));
      kind_ = fmt::format("ddp (dp_replicate={})", replicate);
    }
    return;
  }
  fully_sharded_ = true;
  kind_ = replicate > 1 ? fmt::format("hsdp (dp_replicate={}, dp_shard={})", replicate, shard)
                        : fmt::format("fsdp (dp_shard={})", shard);
  fsdp::MixedPrecisionPolicy policy;
  if (mixed_precision) {
    policy = {.param_dtype = mixed_precision->param_dtype,
              .reduce_dtype = kFloat32,
              .cast_forward_inputs = mixed_precision->cast_forward_inputs};
  }
  for (nn::GroupedExperts* experts : sharded_experts) {
    fsdp::fully_shard(
        *experts, meshes.ep_fsdp,
        {.mp_policy = policy, .gradient_scale = 1.0 / static_cast<double>(meshes.ep->size(0))},
        "experts");
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    const bool last = i + 1 == blocks.size();
    fsdp::fully_shard(
        *blocks[i].module, meshes.fsdp,
        {.reshard_after_forward = !last, .mp_policy = policy, .ignored_params = expert_params_},
        blocks[i].name);
  }
  if (mixed_precision) policy.output_dtype = mixed_precision->output_dtype;
  fsdp::fully_shard(
      *module_, meshes.fsdp,
      {.reshard_after_forward = false, .mp_policy = policy, .ignored_params = expert_params_},
      "root");
  if (materialize) materialize();
}

DataParallel::~DataParallel() = default;

void DataParallel::zero_grad() {
  if (ddp_) return ddp_->zero_grad();
  module_->zero_grad();
}

void DataParallel::backward(bool last, const std::function<void()>& run) {
  if (ddp_) {
    if (last) return run();
    auto guard = ddp_->no_sync();
    return run();
  }
  if (!fully_sharded_) return run();
  fsdp::set_requires_gradient_sync(*module_, last);
  run();
  if (!last) fsdp::set_requires_gradient_sync(*module_, true);
  if (last) reduce_expert_gradients();
}

void DataParallel::reduce_expert_gradients() {
  NoGradGuard no_grad;
  for (const Tensor& p : expert_params_) {
    // Every rank reduces every expert weight, in order: one without a gradient takes part as
    // zeros rather than leave its peers waiting.
    if (!p.grad().defined()) p.set_grad(ops::zeros_like(p));
    const Tensor local = local_shard(p.grad());
    for (const auto& group : expert_groups_) group->all_reduce(local, comm::ReduceOp::kSum)->wait();
    ops::mul_(local, expert_scale_);
  }
}

}  // namespace loom::parallel
