// A checkpoint written by Hugging Face transformers itself (GPT2LMHeadModel.save_pretrained,
// safetensors) loads into Loom's GPT and gives the logits transformers computed, on one rank and
// sharded over tp = 2 with sequence parallelism. The fixture (tests/models/fixtures/, made by
// make_hf_gpt2_fixture.py: torch 2.15, transformers 5.24) is a tiny random model whose biases and
// norms are all perturbed, so a transposed Conv1D weight, a q/k/v order or a tied-head mistake
// cannot hide behind zeros or ones.
//
// Tolerance: 1e-5 of the logits' largest magnitude (~1.1). Both sides compute in f32 with
// GELU tanh, LayerNorm eps 1e-5 and the same operations, in different summation orders.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "autograd/grad_mode.h"
#include "comm/testing/multi_rank.h"
#include "dtensor/dtensor.h"
#include "models/gpt/hf.h"
#include "models/gpt/plans.h"
#include "tensor/ops.h"
#include "tests/models/hf_reference.h"
#include "tests/testing/tensor_checks.h"

namespace loom::models {
namespace {

using loom::testing::expect_close;
using loom::testing::RelativeTo;
using loom::testing::Tolerance;

constexpr const char* kCheckpoint = "tests/models/fixtures/hf_gpt2_tiny.safetensors";
constexpr const char* kExpected = "tests/models/fixtures/hf_gpt2_tiny_logits.json";

struct Reference : testing::HfReference {
  GPTConfig config;
};

Reference read_reference() {
  Reference r{testing::read_hf_reference(kExpected), {}};
  const auto& c = r.json.at("config");
  r.config = GPTConfig{.n_layer = c.at("n_layer"),
                       .n_head = c.at("n_head"),
                       .n_embd = c.at("n_embd"),
                       .block_size = c.at("block_size"),
                       .vocab_size = c.at("vocab_size")};
  return r;
}

// 1e-5 of the logits' largest magnitude (see the top).
constexpr Tolerance kTol{.rtol = 1e-5, .relative_to = RelativeTo::kLargest};

TEST(GPT2HFReferenceTest, TransformersCheckpointGivesTransformersLogits) {
  const Reference ref = read_reference();
  GPT model(ref.config, /*seed=*/99);
  load_gpt2_hf(model, kCheckpoint);
  NoGradGuard no_grad;
  const Tensor logits = model(ref.ids);
  ASSERT_EQ(logits.shape(), ref.logits_shape);
  expect_close({.actual = logits, .expected = ref.logits, .tol = kTol, .what = "logits"});
}

TEST(GPT2HFReferenceTest, TransformersCheckpointOnTensorParallelRanks) {
  const Reference ref = read_reference();
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{2});
    GPT model(ref.config, /*seed=*/99);
    parallelize_gpt(model, mesh, {.sequence_parallel = true});
    load_gpt2_hf(model, kCheckpoint);  // each rank keeps its shards (vocabulary 67 splits 34 + 33)
    NoGradGuard no_grad;
    const Tensor logits = full_tensor(model(ref.ids));
    ASSERT_EQ(logits.shape(), ref.logits_shape);
    expect_close({.actual = logits, .expected = ref.logits, .tol = kTol, .what = "logits"});
  });
}

}  // namespace
}  // namespace loom::models
