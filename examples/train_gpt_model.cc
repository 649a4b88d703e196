#include "examples/train_gpt_model.h"

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "models/checkpoint/gpt2_hf.h"
#include "models/gpt/gpt.h"
#include "models/gpt/pipeline.h"
#include "optim/clip_grad.h"
#include "parallel/ddp/ddp.h"
#include "tensor/ops.h"

namespace loom::examples {

namespace {

class DataTensorParallelGPT : public TrainableGPT {
 public:
  DataTensorParallelGPT(const models::GPTConfig& config, uint64_t seed,
                        std::shared_ptr<const DeviceMesh> mesh, const ModelLayout& layout)
      : model_(std::make_shared<models::GPT>(config, seed)), grad_accum_(layout.grad_accum) {
    model_->to(layout.device);  // before the TP plan and DDP take hold of the parameters
    if (mesh->size("tp") > 1) {
      models::parallelize_gpt(*model_, std::make_shared<const DeviceMesh>((*mesh)["tp"]),
                              layout.tp_plan);
    }
    if (layout.mixed_precision) nn::apply_mixed_precision(*model_, *layout.mixed_precision);
    ddp_ = std::make_unique<ddp::DistributedDataParallel>(model_, mesh->group("dp"));
  }

  void zero_grad() override { ddp_->zero_grad(); }

  double forward_backward(const Tensor& inputs, const Tensor& targets) override {
    const int64_t micro = inputs.size(0) / grad_accum_;
    double total = 0;
    for (int m = 0; m < grad_accum_; ++m) {
      const Tensor x = ops::narrow(inputs, 0, m * micro, micro),
                   y = ops::narrow(targets, 0, m * micro, micro);
      Tensor loss = div(model_->loss(x, y), static_cast<double>(grad_accum_));
      if (m + 1 < grad_accum_) {
        auto guard = ddp_->no_sync();
        backward(loss);
      } else {
        backward(loss);
      }
      total += loss.item<double>();
    }
    return total;
  }

  double clip_grad_norm(double max_norm) override {
    return optim::clip_grad_norm_(model_->parameters(), max_norm);
  }

  std::vector<std::pair<std::string, Tensor>> named_parameters() const override {
    return model_->named_parameters();
  }

  Tensor logits(const Tensor& ids) override {
    NoGradGuard no_grad;
    const Tensor out = (*model_)(ids);
    return is_dtensor(out) ? full_tensor(out) : out;  // vocab-sharded under tp
  }

  void load(const std::string& path) override { models::load_gpt2_hf(*model_, path); }
  void save(const std::string& path, bool write) override {
    models::save_gpt2_hf(*model_, path, write);
  }

 private:
  std::shared_ptr<models::GPT> model_;
  std::unique_ptr<ddp::DistributedDataParallel> ddp_;
  int grad_accum_;
};

class PipelinedGPT : public TrainableGPT {
 public:
  PipelinedGPT(const models::GPTConfig& config, uint64_t seed,
               std::shared_ptr<const DeviceMesh> mesh, const ModelLayout& layout)
      : model_(config, seed, std::move(mesh),
               {.schedule = layout.schedule,
                .microbatches = layout.microbatches,
                .virtual_stages = layout.virtual_stages,
                .tp_plan = layout.tp_plan,
                .mixed_precision = layout.mixed_precision}) {}

  void zero_grad() override { model_.zero_grad(); }
  double forward_backward(const Tensor& inputs, const Tensor& targets) override {
    return model_.step(inputs, targets);
  }
  double clip_grad_norm(double max_norm) override { return model_.clip_grad_norm(max_norm); }
  std::vector<std::pair<std::string, Tensor>> named_parameters() const override {
    return model_.named_parameters();
  }
  Tensor logits(const Tensor& ids) override { return model_.logits(ids); }
  void load(const std::string& path) override {
    for (const auto& stage : model_.stages()) models::load_gpt2_hf(*stage, path);
  }
  void save(const std::string& path, bool write) override {
    const auto whole = model_.whole_model_on_first_rank();  // collective; the model on rank 0
    if (whole && write) models::save_gpt2_hf(*whole, path);
  }

 private:
  models::GPTPipeline model_;
};

}  // namespace

std::unique_ptr<TrainableGPT> make_trainable_gpt(const models::GPTConfig& config, uint64_t seed,
                                                 std::shared_ptr<const DeviceMesh> mesh,
                                                 const ModelLayout& layout) {
  if (mesh->size("pp") > 1) {
    // GPTPipeline places its stages on the mesh's device: the process groups' (Gloo: CPU, NCCL:
    // this rank's GPU), which train_gpt chose from --device.
    LOOM_CHECK(mesh->device() == layout.device,
               "train_gpt: the mesh's groups work on {} but --device gave {}", mesh->device().str(),
               layout.device.str());
    return std::make_unique<PipelinedGPT>(config, seed, std::move(mesh), layout);
  }
  return std::make_unique<DataTensorParallelGPT>(config, seed, std::move(mesh), layout);
}

}  // namespace loom::examples
