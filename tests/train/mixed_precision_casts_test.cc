// Issue 31's "no per-use casts": a bf16 mixed-precision step on a GPU casts each f32 master weight
// to bf16 once, all of them in one multi-tensor cast (nn/mixed_precision.h), and no activation,
// since every kernel on a GPU takes bf16 directly (norms, RoPE, cross entropy, attention, the
// elementwise families). The H200's first profile found 50 casts per GPT-2 step of each Linear's
// f32 input, 28 % of the step.
//
// The job's policy (train/job_checks.h) keeps the logits bf16, so the loss reads them as they are.
// The step is traced on the meta device with the GPU's kernel paths (train/step_trace.h), the op
// profiler counting the copies by signature ("copy_ bf16(shape) f32(shape)": destination first).
// Every cast between f32 and bf16 must have a parameter's shape: the weights' casts, their
// gradients' casts back (exactly one per parameter per step), and gradients that a kernel summed
// in f32 before autograd gave them the weight's dtype.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "base/profiler.h"
#include "models/gpt/family.h"
#include "models/llama/config.h"
#include "models/llama/family.h"
#include "tensor/shape.h"
#include "train/job_checks.h"
#include "train/step_trace.h"

namespace loom::train {
namespace {

constexpr int kTracedSteps = 2;  // trace_training_step traces two steps

// Calls of each "copy_ <to>(shape) <from>(shape)" signature, keyed by the shape.
std::map<std::string, int64_t> casts(const std::string& to, const std::string& from) {
  std::map<std::string, int64_t> out;
  const std::string prefix = "copy_ " + to + "(";
  for (const profiler::Entry& e : profiler::entries()) {
    if (e.name.rfind(prefix, 0) != 0) continue;
    const size_t split = e.name.find(") " + from + "(");
    if (split == std::string::npos) continue;
    const std::string shape = e.name.substr(prefix.size() - 1, split + 1 - (prefix.size() - 1));
    EXPECT_EQ(e.name.substr(split + 2 + from.size()), shape)
        << e.name << ": a cast between different shapes";
    out[shape] += e.calls;
  }
  return out;
}

// Activation shapes a model casts on purpose, each with why.
using DeliberateCasts = std::map<std::string, std::string>;

void expect_one_cast_per_weight(const models::ModelArgs& args,
                                const DeliberateCasts& deliberate = {}) {
  // The job's own policy (train/job_checks.h) on one rank: logits stay bf16.
  JobConfig job;
  job.dp = 1;
  job.tp = 1;
  job.nproc = 1;
  job.mixed_precision = "bf16";
  const ParallelConfig parallel = parallel_config(job);
  std::map<std::string, int64_t> parameter_shapes;  // shape -> parameters of that shape
  const ModelBuilder build = [&](std::shared_ptr<const DeviceMesh> mesh) {
    auto model = build_parallel_model(args, /*seed=*/3, std::move(mesh), parallel);
    parameter_shapes.clear();
    for (const auto& [name, p] : model->named_parameters())
      ++parameter_shapes[shape_str(p.shape())];
    return model;
  };
  profiler::enable({.by_shape = true});
  profiler::reset();
  trace_training_step(parallel.dims, build,
                      {.local_batch = 2, .seq_len = 32, .ranks = {0}, .target = Device::cuda()});
  profiler::disable();
  ASSERT_FALSE(parameter_shapes.empty());
  ASSERT_FALSE(profiler::entries().empty()) << "the profiler saw no op of the traced step";
  // f32 to bf16: every weight in one multi-tensor cast per step's forward (ops::foreach_to, one
  // launch per 64 weights on a GPU), and in the backward each gradient that a kernel summed in
  // f32 (norm weights and biases) once, given the weight's dtype as autograd requires; never an
  // activation.
  int64_t together = 0;
  for (const profiler::Entry& e : profiler::entries()) {
    if (e.name == "foreach_to") together += e.calls;
  }
  EXPECT_EQ(together, kTracedSteps) << "the weights' casts: one foreach_to per forward";
  for (const auto& [shape, calls] : casts("bf16", "f32")) {
    if (deliberate.count(shape)) continue;
    ASSERT_TRUE(parameter_shapes.count(shape))
        << "a cast to bf16 of a " << shape << " tensor, which no parameter has: an activation ("
        << calls << " calls over " << kTracedSteps << " steps)";
    EXPECT_LE(calls, kTracedSteps * parameter_shapes.at(shape)) << shape;
  }
  // bf16 to f32: the casts' backward, each weight's gradient once per step, and nothing else.
  std::map<std::string, int64_t> to_f32 = casts("f32", "bf16");
  for (const auto& [shape, why] : deliberate) to_f32.erase(shape);
  for (const auto& [shape, calls] : to_f32) {
    ASSERT_TRUE(parameter_shapes.count(shape))
        << "a cast to f32 of a " << shape << " tensor, which no parameter has: an activation ("
        << calls << " calls over " << kTracedSteps << " steps)";
    EXPECT_EQ(calls, kTracedSteps * parameter_shapes.at(shape)) << shape;
  }
  EXPECT_EQ(to_f32.size(), parameter_shapes.size());
}

TEST(MixedPrecisionCasts, GPTOnAGpuCastsEachWeightOncePerStepAndNoActivation) {
  expect_one_cast_per_weight(*models::gpt_args(
      {.n_layer = 2, .n_head = 2, .n_embd = 64, .block_size = 32, .vocab_size = 96}));
}

TEST(MixedPrecisionCasts, LlamaOnAGpuCastsEachWeightOncePerStepAndNoActivation) {
  models::LlamaConfig config = models::LlamaConfig::preset("llama-tiny");
  expect_one_cast_per_weight(*models::llama_args(config));
}

// The mixture of experts adds a router (softmax or sigmoid scores, top-k), the tokens' sort by
// expert, grouped expert GEMMs and the weighted combine: none of them may cast an activation.
// (The token permutations were embedding gathers, whose scatter-add backward gave an f32 gradient
// of the expert outputs, cast back to bf16: autograd/gather_rows.h now keeps them bf16.) The
// router alone computes in f32, on purpose (as torchtitan and DeepSeek-V3: the top-k choice and
// the scores' softmax are where bf16's 8 bits would change the routing): its logits (tokens, E)
// and the chosen scores (tokens, k) cross between f32 and bf16.
TEST(MixedPrecisionCasts, LlamaMoeOnAGpuCastsEachWeightOncePerStepAndNoActivation) {
  models::LlamaConfig config = models::LlamaConfig::preset("llama-moe-tiny");
  const int64_t tokens = 2 * 32;  // the traced step's batch and sequence
  expect_one_cast_per_weight(
      *models::llama_args(config),
      {{fmt::format("({}, {})", tokens, config.moe->num_experts), "the router's logits in f32"},
       {fmt::format("({}, {})", tokens, config.moe->top_k), "the chosen scores, to bf16"}});
}

}  // namespace
}  // namespace loom::train
