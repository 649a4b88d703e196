#include "models/data_parallel.h"

#include <fmt/format.h>

#include "parallel/ddp/ddp.h"
#include "parallel/fsdp/fully_shard.h"

namespace loom::models {

std::vector<DataParallel::Block> gpt_blocks(const GPTStage& module) {
  std::vector<DataParallel::Block> blocks;
  for (size_t i = 0; i < module.h.size(); ++i) {
    blocks.push_back({fmt::format("h.{}", module.range().first_block + static_cast<int64_t>(i)),
                      module.h[i].get()});
  }
  return blocks;
}

GPTDataParallel::GPTDataParallel(const std::shared_ptr<GPTStage>& module, const DeviceMesh& mesh,
                                 const std::optional<nn::MixedPrecisionPolicy>& mixed_precision)
    : DataParallel(module, gpt_blocks(*module), mesh, mixed_precision) {}

DataParallel::DataParallel(std::shared_ptr<nn::Module> module, std::vector<Block> blocks,
                           const DeviceMesh& mesh,
                           const std::optional<nn::MixedPrecisionPolicy>& mixed_precision)
    : module_(std::move(module)) {
  const int64_t replicate = mesh.size("dp_replicate"), shard = mesh.size("dp_shard");
  if (shard == 1) {
    if (mixed_precision) nn::apply_mixed_precision(*module_, *mixed_precision);
    if (replicate > 1) {
      ddp_ = std::make_shared<ddp::DistributedDataParallel>(module_, mesh.group("dp_replicate"));
      kind_ = fmt::format("ddp (dp_replicate={})", replicate);
    }
    return;
  }
  fully_sharded_ = true;
  const auto dp_mesh = std::make_shared<const DeviceMesh>(
      replicate > 1 ? mesh[std::vector<std::string>{"dp_replicate", "dp_shard"}]
                    : mesh["dp_shard"]);
  kind_ = replicate > 1 ? fmt::format("hsdp (dp_replicate={}, dp_shard={})", replicate, shard)
                        : fmt::format("fsdp (dp_shard={})", shard);
  fsdp::MixedPrecisionPolicy policy;
  if (mixed_precision) {
    policy = {.param_dtype = mixed_precision->param_dtype,
              .reduce_dtype = kFloat32,
              .cast_forward_inputs = mixed_precision->cast_forward_inputs};
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    const bool last = i + 1 == blocks.size();
    fsdp::fully_shard(*blocks[i].module, dp_mesh,
                      {.reshard_after_forward = !last, .mp_policy = policy}, blocks[i].name);
  }
  if (mixed_precision) policy.output_dtype = mixed_precision->output_dtype;
  fsdp::fully_shard(*module_, dp_mesh, {.reshard_after_forward = false, .mp_policy = policy},
                    "root");
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
}

}  // namespace loom::models
