// Optimizers over a list of parameters (leaves with .grad()), as torch.optim: SGD (with
// momentum, weight decay) and AdamW (decoupled weight decay). Updates run in place on the
// parameters' data with grad mode off; parameters without a gradient are skipped.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace loom::optim {

class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params);
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  // Sets every parameter's grad to undefined (set_to_none).
  void zero_grad();
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }

 protected:
  std::vector<Tensor> params_;
  double lr_ = 0;
};

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double weight_decay = 0.0;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  void step() override;

 private:
  SGDOptions options_;
  std::vector<Tensor> momentum_buffers_;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options);
  void step() override;
  // The moments (torch's state["exp_avg"], state["exp_avg_sq"]) of every parameter, laid out as
  // the parameters (a sharded parameter's are sharded alike); empty before the first step.
  std::vector<Tensor> state_tensors() const;

  // The state of parameter i (torch's optimizer.state[p]): its moments, laid out as the
  // parameter, and its step count. init_state() gives every parameter zero moments where it has
  // none yet — exactly a fresh state — so a checkpoint can load into them in place.
  void init_state();
  size_t size() const { return params_.size(); }
  Tensor& exp_avg(size_t i) { return exp_avg_.at(i); }
  Tensor& exp_avg_sq(size_t i) { return exp_avg_sq_.at(i); }
  int64_t& step_count(size_t i) { return steps_.at(i); }

 private:
  AdamWOptions options_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
  std::vector<int64_t> steps_;  // per parameter
};

}  // namespace loom::optim
