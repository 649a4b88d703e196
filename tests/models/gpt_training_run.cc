#include "tests/models/gpt_training_run.h"

#include <gtest/gtest.h>

#include <cmath>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "dtensor/dtensor.h"
#include "models/data/token_data.h"
#include "models/gpt/gpt.h"
#include "models/gpt/pipeline.h"
#include "optim/clip_grad.h"
#include "optim/optimizer.h"
#include "parallel/ddp/ddp.h"
#include "tensor/ops.h"
#include "tests/testing/tensor_checks.h"

namespace loom::models::gpt_run {

namespace {
data::TokenData corpus() {
  data::TokenData d;
  d.vocab_size = 256;
  d.description = "synthetic";
  // A repetitive byte text with some structure to learn.
  const std::string text =
      "the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. ";
  for (int i = 0; i < 40; ++i) {
    for (char c : text) d.tokens.push_back(static_cast<unsigned char>(c));
  }
  return d;
}

}  // namespace

GPTConfig config() {
  return GPTConfig{.n_layer = 2, .n_head = 4, .n_embd = 32, .block_size = 32, .vocab_size = 257};
}

Result train(std::shared_ptr<const DeviceMesh> mesh, Layout layout) {
  const int64_t dp = mesh ? mesh->size("dp") : 1, tp = mesh ? mesh->size("tp") : 1,
                pp = mesh ? mesh->size("pp") : 1;
  const int64_t dp_rank = mesh ? mesh->coordinate(mesh->dim_index("dp")) : 0;
  const Device device =
      mesh ? mesh->device() : Device::cpu();  // the groups' device (NCCL: this rank's GPU)
  const auto data = corpus();
  std::shared_ptr<GPT> model;
  std::unique_ptr<GPTPipeline> pipelined;
  std::unique_ptr<ddp::DistributedDataParallel> ddp;
  if (pp > 1) {
    pipelined =
        std::make_unique<GPTPipeline>(config(), /*seed=*/5, mesh,
                                      GPTPipelineOptions{.schedule = layout.schedule,
                                                         .microbatches = layout.microbatches,
                                                         .virtual_stages = layout.virtual_stages,
                                                         .tp_plan = layout.plan});
  } else {
    model = std::make_shared<GPT>(config(), /*seed=*/5);
    model->to(device);
    if (mesh && tp > 1)
      parallelize_gpt(*model, std::make_shared<const DeviceMesh>((*mesh)["tp"]), layout.plan);
    if (mesh) ddp = std::make_unique<ddp::DistributedDataParallel>(model, mesh->group("dp"));
  }
  const auto named = pipelined ? pipelined->named_parameters() : model->named_parameters();
  std::vector<Tensor> parameters;
  for (const auto& [name, p] : named) parameters.push_back(p);
  optim::AdamW opt(parameters, {.lr = 3e-3, .weight_decay = 0.1});
  Result result;
  const int64_t per_rank = kGlobalBatch / dp, micro = per_rank / layout.accum;
  for (int step = 0; step < kSteps; ++step) {
    double step_loss = 0;
    if (pipelined) {
      pipelined->zero_grad();
      const auto batch = data::batch_slice(data, 11, step, dp_rank * per_rank, per_rank, kSeqLen);
      step_loss = pipelined->step(ops::to(batch.inputs, device), ops::to(batch.targets, device));
      result.grad_norms.push_back(pipelined->clip_grad_norm(kClip));
    } else {
      if (ddp)
        ddp->zero_grad();
      else
        opt.zero_grad();
      for (int m = 0; m < layout.accum; ++m) {
        const auto batch =
            data::batch_slice(data, 11, step, dp_rank * per_rank + m * micro, micro, kSeqLen);
        Tensor loss =
            div(model->loss(ops::to(batch.inputs, device), ops::to(batch.targets, device)),
                static_cast<double>(layout.accum));
        if (ddp && m + 1 < layout.accum) {
          auto guard = ddp->no_sync();
          backward(loss);
        } else {
          backward(loss);
        }
        step_loss += loss.item<double>();
      }
      result.grad_norms.push_back(optim::clip_grad_norm_(parameters, kClip));
    }
    opt.step();
    if (mesh) {
      Tensor t = ops::full({1}, step_loss, kFloat32, device);
      mesh->group("dp")->all_reduce(t, comm::ReduceOp::kAvg)->wait();
      step_loss = ops::to_vector(t)[0];
    }
    result.losses.push_back(step_loss);
  }
  for (const auto& [name, p] : named)
    result.params[name] = ops::to_vector(is_dtensor(p) ? full_tensor(p) : p);
  return result;
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
  // Parameters: 1e-5 relative to the model's largest parameter magnitude (the LayerNorm weights,
  // ~1). Not per tensor: AdamW divides each gradient by its own running RMS, so a parameter
  // whose gradient is tiny — the attention key bias's is mathematically zero (adding b to every
  // key adds q.b to a whole softmax row), the query bias's is small — takes near-unit steps
  // driven by f32 rounding noise that depends on the summation order. Measured here: up to
  // ~3e-6 absolute on such elements (5e-5 of their own tensor's scale), against ~1e-8 elsewhere.
  double model_scale = 0;
  for (const auto& [name, values] : expected.params) {
    for (double v : values) model_scale = std::max(model_scale, std::abs(v));
  }
  ASSERT_FALSE(actual.params.empty()) << layout;
  for (const auto& [name, got] : actual.params) {  // a pipeline rank holds its stages' only
    ASSERT_TRUE(expected.params.count(name)) << layout << " " << name;
    expect_close({.actual = got,
                  .expected = expected.params.at(name),
                  .tol = {.atol = 1e-5 * model_scale},
                  .what = layout + " " + name});
  }
}

std::shared_ptr<const DeviceMesh> mesh_of(comm::ProcessGroup& pg, int64_t dp, int64_t tp,
                                          int64_t pp) {
  return std::make_shared<const DeviceMesh>(pg.shared_from_this(),
                                            std::vector<std::string>{"pp", "dp", "tp"},
                                            std::vector<int64_t>{pp, dp, tp});
}

}  // namespace loom::models::gpt_run
