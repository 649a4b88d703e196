#include "train/pipelined_model.h"

#include <utility>
#include <vector>

namespace loom::train {

namespace {

class PipelinedModel : public ParallelModel {
 public:
  PipelinedModel(std::unique_ptr<models::PipelineModel> model, PipelinedModelParts parts)
      : model_(std::move(model)), parts_(std::move(parts)) {}

  void zero_grad() override { model_->zero_grad(); }
  double forward_backward(const Tensor& inputs, const Tensor& targets) override {
    return model_->step(inputs, targets);
  }
  double clip_grad_norm(double max_norm) override { return model_->clip_grad_norm(max_norm); }
  std::vector<std::pair<std::string, Tensor>> named_parameters() const override {
    return model_->named_parameters();
  }
  std::vector<std::pair<std::string, nn::Module*>> named_modules() const override {
    std::vector<std::pair<std::string, nn::Module*>> out;
    for (const auto& stage : model_->stages()) {
      for (const auto& named : stage->named_modules()) out.push_back(named);
    }
    return out;
  }
  Tensor logits(const Tensor& ids) override { return model_->logits(ids); }
  void load(const std::string& path) override {
    for (const auto& stage : model_->stages()) parts_.load_stage(*stage, path);
  }
  void save(const std::string& path, bool write) override {
    std::unique_ptr<nn::Module> whole;
    if (model_->on_first_rank()) whole = parts_.make_whole();
    model_->gather_whole(whole.get());  // collective; the whole model on the first rank
    if (whole && write) parts_.save_whole(*whole, path);
  }

 private:
  std::unique_ptr<models::PipelineModel> model_;
  PipelinedModelParts parts_;
};

}  // namespace

std::unique_ptr<ParallelModel> pipelined_model(std::unique_ptr<models::PipelineModel> model,
                                               PipelinedModelParts parts) {
  return std::make_unique<PipelinedModel>(std::move(model), std::move(parts));
}

models::PipelineModelOptions pipeline_model_options(const ParallelConfig& parallel) {
  return {.schedule = parallel.pipeline.schedule,
          .microbatches = parallel.microbatches(),
          .virtual_stages = parallel.pipeline.virtual_stages,
          .sequence_parallel = parallel.tp_plan.sequence_parallel,
          .mixed_precision = parallel.mixed_precision};
}

}  // namespace loom::train
