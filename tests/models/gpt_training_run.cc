#include "tests/models/gpt_training_run.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <mutex>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "data/token_data.h"
#include "dtensor/dtensor.h"
#include "models/gpt/family.h"
#include "models/gpt/gpt.h"
#include "optim/clip_grad.h"
#include "optim/optimizer.h"
#include "tensor/ops.h"
#include "tests/testing/tensor_checks.h"
#include "train/parallel_dims.h"
#include "train/parallel_model.h"
#include "train/trainer.h"

namespace loom::models::gpt_run {

data::TokenCorpus fox_corpus(int64_t vocab_size) {
  // A repetitive byte text with some structure to learn.
  const std::string text =
      "the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. ";
  std::vector<int32_t> tokens;
  for (int i = 0; i < 40; ++i) {
    for (char c : text) tokens.push_back(static_cast<unsigned char>(c));
  }
  return data::TokenCorpus::from_tokens(std::move(tokens), vocab_size, "test text");
}

namespace {
data::TokenCorpus corpus() { return fox_corpus(256); }
}  // namespace

GPTConfig config(double dropout) {
  return GPTConfig{.n_layer = 2,
                   .n_head = 4,
                   .n_embd = 32,
                   .block_size = 32,
                   .vocab_size = 257,
                   .dropout = dropout,
                   .attn_dropout = dropout};
}

namespace {

constexpr uint64_t kModelSeed = 5, kDataSeed = 11;
constexpr double kLr = 3e-3, kWeightDecay = 0.1;

// The oracle: the same computation on one rank, written as plainly as possible (no mesh, no
// DDP, no library composition), so the layouts under test are checked against an independent
// loop. AdamW groups as the Trainer's: weight decay on matrices only.
Result train_one_rank(double dropout) {
  const auto data = corpus();
  GPT model(config(dropout), kModelSeed);
  std::vector<Tensor> decay, no_decay, parameters;
  for (const auto& [name, p] : model.named_parameters()) {
    (p.dim() >= 2 ? decay : no_decay).push_back(p);
    parameters.push_back(p);
  }
  optim::AdamW opt_decay(decay, {.lr = kLr, .weight_decay = kWeightDecay});
  optim::AdamW opt_no_decay(no_decay, {.lr = kLr, .weight_decay = 0.0});
  Result result;
  for (int step = 0; step < kSteps; ++step) {
    opt_decay.zero_grad();
    opt_no_decay.zero_grad();
    const auto batch = data::batch_slice(data, kDataSeed, step, 0, kGlobalBatch, kSeqLen);
    Tensor loss = model.loss(batch.inputs, batch.targets);
    backward(loss);
    result.losses.push_back(loss.item<double>());
    result.grad_norms.push_back(optim::clip_grad_norm_(parameters, kClip));
    result.lrs.push_back(kLr);
    auto& grads = result.step_grads.emplace_back();  // clipped: what AdamW takes
    for (const auto& [name, p] : model.named_parameters()) grads[name] = ops::to_vector(p.grad());
    opt_decay.step();
    opt_no_decay.step();
  }
  for (const auto& [name, p] : model.named_parameters()) {
    result.params[name] = ops::to_vector(p);
    result.grads[name] = ops::to_vector(p.grad());
  }
  return result;
}

}  // namespace

Result train(std::shared_ptr<const DeviceMesh> mesh, Layout layout) {
  if (!mesh) return train_one_rank(layout.dropout);
  // The job's own code: the library composition and step driver (train/), as loom_train runs it.
  const train::ParallelConfig parallel{.dims = {.pp = mesh->size("pp"),
                                                .dp_replicate = mesh->size("dp_replicate"),
                                                .dp_shard = mesh->size("dp_shard"),
                                                .tp = mesh->size("tp")},
                                       .tp_plan = layout.plan,
                                       .grad_accum = layout.accum,
                                       .pipeline = {.schedule = layout.schedule,
                                                    .microbatches = layout.microbatches,
                                                    .virtual_stages = layout.virtual_stages},
                                       .activation_checkpoint = layout.activation_checkpoint};
  parallel.validate(mesh->numel(), kGlobalBatch, kSeqLen);
  const auto data = corpus();
  const auto model = train::build_parallel_model(*models::gpt_args(config(layout.dropout)),
                                                 kModelSeed, mesh, parallel);
  train::Trainer trainer(
      *model, mesh, {.lr = [](int) { return kLr; }, .weight_decay = kWeightDecay, .clip = kClip});
  Result result;
  for (int step = 0; step < kSteps; ++step) {
    const auto batch = train::local_batch(data, kDataSeed, step, *mesh, kGlobalBatch, kSeqLen);
    record_step(result, trainer.step(batch.inputs, batch.targets), model.get());
  }
  record_final_state(result, *model);
  return result;
}

const Result& reference(double dropout) {
  static std::mutex mutex;  // ranks' threads may ask at once
  static std::map<double, Result> runs;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = runs.find(dropout);
  if (it == runs.end()) it = runs.emplace(dropout, train(nullptr, {.dropout = dropout})).first;
  return it->second;
}

namespace {

// The gradients `model` holds, gathered whole.
std::map<std::string, std::vector<double>> gathered_grads(const train::ParallelModel& model) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& [name, p] : model.named_parameters()) {
    const Tensor grad = p.grad();
    if (grad.defined()) out[name] = ops::to_vector(is_dtensor(grad) ? full_tensor(grad) : grad);
  }
  return out;
}

}  // namespace

void record_step(Result& result, const train::StepResult& step, const train::ParallelModel* model) {
  result.losses.push_back(step.loss);
  result.grad_norms.push_back(step.grad_norm);
  result.lrs.push_back(step.lr);
  if (model != nullptr) result.step_grads.push_back(gathered_grads(*model));
}

void record_final_state(Result& result, const train::ParallelModel& model) {
  result.grads = gathered_grads(model);
  for (const auto& [name, p] : model.named_parameters()) {
    result.params[name] = ops::to_vector(is_dtensor(p) ? full_tensor(p) : p);
    result.layouts[name] = is_dtensor(p) ? fmt::format("{} {}", dtensor_spec(p).mesh->str(),
                                                       placements_str(dtensor_spec(p).placements))
                                         : "plain";
  }
}

void expect_same(const Runs& runs) {
  using loom::testing::expect_close;
  const Result &actual = runs.actual, &expected = runs.expected;
  const std::string& layout = runs.layout;
  // Per step, 1e-5 relative.
  expect_close({.actual = actual.losses,
                .expected = expected.losses,
                .tol = {.rtol = 1e-5},
                .what = layout + " losses"});
  expect_close({.actual = actual.grad_norms,
                .expected = expected.grad_norms,
                .tol = {.rtol = 1e-5},
                .what = layout + " gradient norms"});
  // Parameters: param_rtol of the model's largest parameter magnitude (the norms' weights, ~1),
  // plus, per element, what AdamW makes of the element's gradient difference. AdamW steps an
  // element by lr m/(sqrt(v) + eps), m and v running means of its gradient g and g^2, so a
  // gradient that differs by d moves the step by up to about 2 lr d / (|g| + eps): nothing where
  // |g| is large against d, up to lr where g is rounding noise that nearly cancels (a key bias's
  // gradient is mathematically zero: adding b to every key adds q.b to a whole softmax row), and
  // the summation order, which differs between layouts, decides it. The bound takes d and g from
  // the last step's gradients (compared themselves below, at 1e-5 of the largest) and the sum of
  // the steps' learning rates. Measured (an AVX2 machine, where the bound of param_rtol alone
  // failed CI on single elements): h.0.mlp.c_fc.weight[598] under dropout has a first-step
  // gradient of 7.39e-9 on one rank and 7.48e-9 under accumulation (1.2 % apart: terms that
  // cancel), so AdamW's first steps differ by lr (0.430 - 0.425); the element ends 1.02e-5 apart,
  // where param_rtol allowed 1.01e-5 and this bound allows 4.3e-5 (1e-5 plus 3.1e-5 from that
  // step), while elements with gradients far above eps keep about param_rtol alone.
  // d and g at each step: every run records its steps' gradients (record_step with the model).
  double model_scale = 0;
  for (const auto& [name, values] : expected.params) {
    for (double v : values) model_scale = std::max(model_scale, std::abs(v));
  }
  constexpr double kAdamEps = 1e-8;  // train::TrainerOptions' default, which every run here uses
  ASSERT_FALSE(actual.params.empty()) << layout;
  if (runs.compare_params) {
    ASSERT_EQ(expected.step_grads.size(), expected.lrs.size()) << layout;
    ASSERT_EQ(actual.step_grads.size(), expected.lrs.size())
        << layout << ": record_step without the model";
  }
  for (const auto& [name, got] : actual.params) {
    if (!runs.compare_params) break;  // a pipeline rank holds its stages' only
    ASSERT_TRUE(expected.params.count(name)) << layout << " " << name;
    const std::vector<double>& want = expected.params.at(name);
    ASSERT_EQ(got.size(), want.size()) << layout << " " << name;
    std::vector<double> allowed(got.size(), runs.param_rtol * model_scale);
    for (size_t t = 0; t < expected.lrs.size(); ++t) {
      const std::vector<double>& here = actual.step_grads[t].at(name);
      const std::vector<double>& there = expected.step_grads[t].at(name);
      ASSERT_EQ(here.size(), got.size()) << layout << " " << name << " step " << t;
      for (size_t i = 0; i < got.size(); ++i) {
        allowed[i] +=
            2 * expected.lrs[t] * std::abs(here[i] - there[i]) / (std::abs(there[i]) + kAdamEps);
      }
    }
    int64_t bad = 0, worst = -1;
    for (size_t i = 0; i < got.size(); ++i) {
      const double excess = std::abs(got[i] - want[i]) - allowed[i];
      if (!(excess <= 0)) {
        ++bad;
        if (worst < 0 || excess > std::abs(got[worst] - want[worst]) - allowed[worst]) {
          worst = static_cast<int64_t>(i);
        }
      }
    }
    EXPECT_EQ(bad, 0) << fmt::format(
        "{} {}: {} of {} elements beyond param_rtol {} x {} plus AdamW's 2 lr d / (|g| + eps); "
        "worst at [{}]: actual {}, expected {}, allowed {}",
        layout, name, bad, got.size(), runs.param_rtol, model_scale, worst,
        worst >= 0 ? got[worst] : 0.0, worst >= 0 ? want[worst] : 0.0,
        worst >= 0 ? allowed[worst] : 0.0);
  }
  // The last step's gradients, gathered (clipped: the norm's check above covers the scale),
  // within 1e-5 of the model's largest gradient: the same rounding-order noise, on values of one
  // step.
  double grad_scale = 0;
  for (const auto& [name, values] : expected.grads) {
    for (double v : values) grad_scale = std::max(grad_scale, std::abs(v));
  }
  ASSERT_EQ(actual.grads.size(), actual.params.size()) << layout << ": a parameter has no gradient";
  for (const auto& [name, got] : actual.grads) {
    expect_close({.actual = got,
                  .expected = expected.grads.at(name),
                  .tol = {.atol = 1e-5 * grad_scale},
                  .what = layout + " gradient of " + name});
  }
}

std::shared_ptr<const DeviceMesh> mesh_of(comm::ProcessGroup& pg, int64_t dp, int64_t tp,
                                          int64_t pp) {
  return mesh_of(pg, {.pp = pp, .dp_replicate = dp, .tp = tp});
}

std::shared_ptr<const DeviceMesh> mesh_of(comm::ProcessGroup& pg, const train::ParallelDims& dims) {
  return dims.build_mesh(pg.shared_from_this());
}

}  // namespace loom::models::gpt_run
