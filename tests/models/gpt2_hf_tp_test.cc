// GPT-2 HF checkpoints with tensor-parallel (DTensor) parameters: loading copies each rank's
// slice into its local shard (no communication), and saving gathers with full_tensor on every
// rank while rank 0 writes a file identical in content to the one-rank model's (and alone keeps
// the gathered parameters).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "autograd/grad_mode.h"
#include "base/error.h"
#include "comm/testing/multi_rank.h"
#include "dtensor/dtensor.h"
#include "models/gpt/gpt.h"
#include "models/gpt/hf.h"
#include "models/gpt/plans.h"
#include "models/hf/safetensors.h"
#include "tensor/memory_stats.h"
#include "tensor/ops.h"
#include "tests/models/gpt2_hf_test_config.h"
#include "tests/testing/tensor_checks.h"

namespace loom::models {
namespace {

GPTConfig small_config() { return gpt2_hf_test_config(); }

Tensor tokens(const GPTConfig& config) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 2 * config.block_size; ++i)
    ids.push_back((i * 5 + 1) % config.vocab_size);
  return ops::from_vector_i64(ids, {2, config.block_size});
}

TEST(GPT2HFTensorParallelTest, LoadsShardsAndSavesTheFullModel) {
  const GPTConfig config = small_config();
  GPT reference(config, 41);
  std::vector<double> expected;
  {
    NoGradGuard no_grad;
    expected = ops::to_vector(reference(tokens(config)));
  }
  const std::string in_path = ::testing::TempDir() + "/tp_in.safetensors";
  const std::string out_path = ::testing::TempDir() + "/tp_out.safetensors";
  save_gpt2_hf(reference, in_path);
  int64_t whole_bytes = 0;
  for (const auto& [name, p] : reference.named_parameters()) whole_bytes += 4 * p.numel();

  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{2});
    GPT model(config, 42 + pg.rank());  // different values on each rank before loading
    parallelize_gpt(model, mesh);
    ASSERT_TRUE(is_dtensor(model.h[0]->attn->c_attn->weight()));
    load_gpt2_hf(model, in_path);
    NoGradGuard no_grad;
    // The logits come out sharded by vocabulary (the plan's loss-parallel head).
    const Tensor logits = model(tokens(config));
    ASSERT_TRUE(is_dtensor(logits));
    // Sharded GEMMs and the all-reduce sum in another order: f32 rounding, 1e-5 of the scale.
    loom::testing::expect_close(
        {.actual = full_tensor(logits),
         .expected = expected,
         .tol = {.rtol = 1e-5, .atol = 1e-7, .relative_to = loom::testing::RelativeTo::kLargest},
         .what = "logits"});
    // Only the writing rank keeps the gathered parameters: the other holds one at a time (it
    // had held the whole model too, for nothing).
    MemoryTracker saving;
    {
      ScopedMemoryTracker scope(saving);
      save_gpt2_hf(model, out_path, /*write=*/pg.rank() == 0);
    }
    if (pg.rank() == 1) {
      EXPECT_LT(saving.stats().peak_bytes, whole_bytes / 2)
          << "a rank that does not write held " << saving.stats().peak_bytes << " of the model's "
          << whole_bytes << " bytes";
    }
  });

  const SafetensorsFile in = load_safetensors(in_path), out = load_safetensors(out_path);
  ASSERT_EQ(in.tensors.size(), out.tensors.size());
  for (const auto& [name, tensor] : in.tensors) {
    ASSERT_TRUE(out.tensors.count(name)) << name;
    EXPECT_EQ(ops::to_vector(out.tensors.at(name)), ops::to_vector(tensor)) << name;
  }
}

}  // namespace
}  // namespace loom::models
