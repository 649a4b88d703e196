#include "train/one_stage_model.h"

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "optim/clip_grad.h"
#include "tensor/ops.h"

namespace loom::train {

namespace {

class OneStageModel : public ParallelModel {
 public:
  OneStageModel(OneStageModelParts parts, int grad_accum)
      : parts_(std::move(parts)), grad_accum_(grad_accum) {}

  void zero_grad() override { parts_.data_parallel->zero_grad(); }

  double forward_backward(const Tensor& inputs, const Tensor& targets) override {
    LOOM_CHECK(inputs.size(0) % grad_accum_ == 0,
               "forward_backward: {} sequences do not split into grad_accum {} micro-batches",
               inputs.size(0), grad_accum_);
    const int64_t micro = inputs.size(0) / grad_accum_;
    double total = 0;
    for (int m = 0; m < grad_accum_; ++m) {
      const Tensor x = ops::narrow(inputs, 0, m * micro, micro),
                   y = ops::narrow(targets, 0, m * micro, micro);
      Tensor loss = div(parts_.loss(x, y), static_cast<double>(grad_accum_));
      parts_.data_parallel->backward(m + 1 == grad_accum_, [&] { backward(loss); });
      total += loss.item<double>();
    }
    return total;
  }

  double clip_grad_norm(double max_norm) override {
    return optim::clip_grad_norm_(parts_.model->parameters(), max_norm);
  }
  std::vector<std::pair<std::string, Tensor>> named_parameters() const override {
    return parts_.model->named_parameters();
  }
  std::vector<std::pair<std::string, nn::Module*>> named_modules() const override {
    return parts_.model->named_modules();
  }
  Tensor logits(const Tensor& ids) override {
    NoGradGuard no_grad;
    const Tensor out = (*parts_.model)(ids);
    return is_dtensor(out) ? full_tensor(out) : out;  // vocab-sharded under tp
  }
  void load(const std::string& path) override { parts_.load(path); }
  void save(const std::string& path, bool write) override { parts_.save(path, write); }

 private:
  OneStageModelParts parts_;
  int grad_accum_;
};

}  // namespace

std::unique_ptr<ParallelModel> one_stage_model(OneStageModelParts parts, int grad_accum) {
  return std::make_unique<OneStageModel>(std::move(parts), grad_accum);
}

}  // namespace loom::train
