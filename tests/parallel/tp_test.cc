// Tensor parallelism against one rank: the same MLP, same seeds, same input, on tp = 2 and 3
// (3 splits the hidden width 16 unevenly: 6, 6, 4).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "base/error.h"
#include "comm/testing/multi_rank.h"
#include "dtensor/comm_debug_mode.h"
#include "dtensor/dtensor.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "parallel/tp/parallelize.h"
#include "tensor/memory_stats.h"
#include "tensor/ops.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

using comm::CollectiveKind;
using testing::expect_close;
using ::testing::HasSubstr;
using testing::Tolerance;

class Mlp : public nn::Module {
 public:
  explicit Mlp(int64_t hidden = 16, uint64_t seed = 11) : Module("Mlp") {
    fc1 = register_module("fc1",
                          std::make_shared<nn::Linear>(8, hidden, nn::LinearOptions{.seed = seed}));
    fc2 = register_module(
        "fc2", std::make_shared<nn::Linear>(hidden, 8, nn::LinearOptions{.seed = seed + 2}));
  }
  Tensor forward(const Tensor& x) override { return (*fc2)(gelu((*fc1)(x))); }
  std::shared_ptr<nn::Linear> fc1, fc2;
};

// Sharded matmuls sum in a different order than the full one: allow f32 rounding (1e-5
// relative on values of order 1): |actual - expected| <= 1e-5 * (1 + |expected|).
constexpr Tolerance kTol{.rtol = 1e-5, .atol = 1e-5};

TEST(TensorParallelTest, ColwiseThenRowwiseMlpMatchesOneRank) {
  const Tensor x = ops::uniform({4, 8}, 5, -1.0, 1.0);
  Mlp reference;
  Tensor ref_out = reference(x);
  backward(sum(mul(ref_out, ref_out)));
  for (int world : {2, 3}) {
    comm::testing::run_on_ranks(world, [&](comm::ProcessGroup& pg) {
      auto mesh = std::make_shared<const DeviceMesh>(
          pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{pg.size()});
      Mlp model;
      tp::parallelize_module(model, mesh,
                             {{"fc1", std::make_shared<tp::ColwiseParallel>()},
                              {"fc2", std::make_shared<tp::RowwiseParallel>()}});
      EXPECT_EQ(dtensor_spec(model.fc1->weight()).placements, (Placements{Shard(0)}));
      EXPECT_EQ(dtensor_spec(model.fc2->weight()).placements, (Placements{Shard(1)}));
      Tensor out;
      {
        CommDebugMode comm;
        out = model(x);
        // Megatron's MLP: one all-reduce in forward (the row-parallel output).
        EXPECT_EQ(comm.count(CollectiveKind::kAllReduce), 1) << comm.summary();
        EXPECT_EQ(comm.total_count(), 1) << comm.summary();
      }
      EXPECT_FALSE(is_dtensor(out)) << "use_local_output returns plain tensors";
      expect_close({.actual = out, .expected = ref_out, .tol = kTol, .what = "output"});
      backward(sum(mul(out, out)));
      for (const auto& [name, p] : model.named_parameters()) {
        ASSERT_TRUE(p.grad().defined()) << name;
        EXPECT_EQ(dtensor_spec(p.grad()).placements, dtensor_spec(p).placements) << name;
        expect_close({.actual = full_tensor(p.grad()),
                      .expected = reference.state_dict().at(name).grad(),
                      .tol = kTol,
                      .what = "grad of " + name});
      }
    });
  }
}

TEST(TensorParallelTest, ColwiseInputShardedOnRowsMatchesOneRank) {
  // input_layouts = Shard(0): each rank passes its own rows; the hook gathers them.
  const Tensor x = ops::uniform({4, 8}, 5, -1.0, 1.0);
  Mlp reference;
  const Tensor ref_out = reference(x);
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{pg.size()});
    Mlp model;
    tp::parallelize_module(model, mesh,
                           {{"fc1", std::make_shared<tp::ColwiseParallel>(
                                        tp::LayoutOptions{.input_layouts = Shard(0)})},
                            {"fc2", std::make_shared<tp::RowwiseParallel>()}});
    expect_close({.actual = model(ops::narrow(x, 0, 2 * pg.rank(), 2)),
                  .expected = ref_out,
                  .tol = kTol,
                  .what = "output"});
  });
}

TEST(TensorParallelTest, PlanErrorsNameTheEntryAndModule) {
  comm::testing::run_on_ranks(2, [](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{2});
    Mlp model;
    try {
      tp::parallelize_module(model, mesh, {{"fc3", std::make_shared<tp::ColwiseParallel>()}});
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(),
                  HasSubstr("plan entry 'fc3' (ColwiseParallel) matches no submodule of Mlp"));
    }
    class WithNorm : public nn::Module {
     public:
      WithNorm() : Module("WithNorm") {
        register_module("ln", std::make_shared<nn::LayerNorm>(Shape{4}));
      }
    } with_norm;
    try {
      tp::parallelize_module(with_norm, mesh, {{"ln", std::make_shared<tp::RowwiseParallel>()}});
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_THAT(
          e.what(),
          HasSubstr(
              "RowwiseParallel applies to Linear and Embedding modules, but 'ln' is a LayerNorm"));
    }
    // A module two keys match is refused before anything changes (found from outside: the
    // first style was applied, the second refused, the model left half parallelized).
    EXPECT_THAT(testing::error_of([&] {
                  tp::parallelize_module(model, mesh,
                                         {{"fc1", std::make_shared<tp::ColwiseParallel>()},
                                          {"fc*", std::make_shared<tp::RowwiseParallel>()}});
                }),
                HasSubstr("parallelize_module: 'fc1' (plan entry 'fc*', RowwiseParallel) and "
                          "'fc1' (plan entry 'fc1') would both change fc1's parameters"));
    for (const auto& [name, p] : model.named_parameters()) {
      EXPECT_FALSE(is_dtensor(p)) << name << " changed by a refused plan";
    }
    // So is a style on a module whose parent's style changes the parent's parameters (a user's
    // style over a whole block, as examples/gated_mlp_plan.cc writes, and another on its layer).
    struct WholeModuleStyle : tp::ParallelStyle {
      void apply(nn::Module&, const std::string& fqn,
                 std::shared_ptr<const DeviceMesh>) const override {
        ADD_FAILURE() << "applied " << fqn << " of a refused plan";
      }
      std::string name() const override { return "WholeModuleStyle"; }
    };
    class Outer : public nn::Module {
     public:
      Outer() : Module("Outer") { register_module("mlp", std::make_shared<Mlp>()); }
    } outer;
    EXPECT_THAT(testing::error_of([&] {
                  tp::parallelize_module(outer, mesh,
                                         {{"mlp", std::make_shared<WholeModuleStyle>()},
                                          {"mlp.fc1", std::make_shared<tp::ColwiseParallel>()}});
                }),
                HasSubstr("'mlp.fc1' (plan entry 'mlp.fc1', ColwiseParallel) and 'mlp' (plan "
                          "entry 'mlp') would both change mlp.fc1's parameters"));
  });
}

TEST(TensorParallelTest, AStyleForTheModuleItselfMatchesOneRank) {
  // PyTorch's parallelize_module(linear, mesh, ColwiseParallel()): no plan key names the root.
  nn::Linear reference(8, 6);
  const Tensor x = ops::uniform({3, 8}, 9, -1.0, 1.0);
  const Tensor ref_out = reference(x);
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{2});
    nn::Linear linear(8, 6);
    linear.load_state_dict(reference.state_dict());
    tp::parallelize_module(
        linear, mesh,
        std::make_shared<tp::ColwiseParallel>(tp::LayoutOptions{.output_layouts = Replicate()}));
    EXPECT_EQ(dtensor_spec(linear.weight()).placements, (Placements{Shard(0)}));
    expect_close({.actual = linear(x), .expected = ref_out, .tol = kTol, .what = "output"});
  });
}

// A full (unsharded) state dict loaded into a module already parallelized: each rank takes its
// piece of every value (torch's set_model_state_dict with full_state_dict), over 3 ranks'
// uneven shards of a colwise weight (7 rows: 3, 2, 2) and a rowwise one's columns; a shape that
// does not fit is named with its key.
TEST(TensorParallelTest, AFullStateDictLoadsIntoAParallelizedModule) {
  Mlp reference(7);
  const Tensor x = ops::uniform({3, 8}, 9, -1.0, 1.0);
  const Tensor ref_out = reference(x);
  comm::testing::run_on_ranks(3, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{3});
    Mlp mlp(7, /*seed=*/101);  // other values: the load must replace them
    tp::parallelize_module(mlp, mesh,
                           {{"fc1", std::make_shared<tp::ColwiseParallel>()},
                            {"fc2", std::make_shared<tp::RowwiseParallel>()}});
    mlp.load_state_dict(reference.state_dict());
    EXPECT_EQ(dtensor_spec(mlp.fc1->weight()).placements, (Placements{Shard(0)}));
    expect_close({.actual = mlp(x), .expected = ref_out, .tol = kTol, .what = "output"});
    nn::StateDict wrong = reference.state_dict();
    wrong["fc2.bias"] = ops::zeros({9});
    EXPECT_THAT(testing::error_of([&] { mlp.load_state_dict(wrong); }),
                HasSubstr("load_state_dict: 'fc2.bias' has shape (9,) in the checkpoint but (8,)"));
  });
}

// A pre-norm residual block with sequence parallelism, as the GPT plan lays one out: the norm
// and dropout run on each rank's tokens, the MLP gathers the sequence and scatters its output.
class ResidualBlock : public nn::Module {
 public:
  ResidualBlock() : Module("ResidualBlock") {
    ln = register_module("ln", std::make_shared<nn::LayerNorm>(Shape{8}));
    mlp = register_module("mlp", std::make_shared<Mlp>());
    drop = register_module("drop", std::make_shared<nn::Dropout>(0.25, 17));
  }
  Tensor forward(const Tensor& x) override { return (*drop)(add(x, (*mlp)((*ln)(x)))); }
  std::shared_ptr<nn::LayerNorm> ln;
  std::shared_ptr<Mlp> mlp;
  std::shared_ptr<nn::Dropout> drop;
};

TEST(TensorParallelTest, SequenceParallelBlockMatchesOneRank) {
  const Tensor x = ops::uniform({2, 6, 8}, 5, -1.0, 1.0);  // (batch, sequence, features)
  ResidualBlock reference;
  const Tensor ref_out = reference(x);
  backward(sum(mul(ref_out, ref_out)));
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{2});
    ResidualBlock model;
    tp::parallelize_module(model, mesh,
                           {{"ln", std::make_shared<tp::SequenceParallel>()},
                            {"mlp", std::make_shared<tp::PrepareModuleInput>(
                                        tp::PrepareInputOptions{Shard(1), Replicate(), false})},
                            {"mlp.fc1", std::make_shared<tp::ColwiseParallel>()},
                            {"mlp.fc2", std::make_shared<tp::RowwiseParallel>(
                                            tp::LayoutOptions{.output_layouts = Shard(1)})},
                            {"drop", std::make_shared<tp::SequenceParallel>(
                                         tp::SequenceParallelOptions{.use_local_output = true})}});
    EXPECT_EQ(dtensor_spec(model.ln->weight()).placements, (Placements{Replicate()}));
    const Tensor local_x = ops::narrow(x, 1, 3 * pg.rank(), 3);  // this rank's tokens
    Tensor out;
    {
      CommDebugMode comm;
      out = model(local_x);
      // The sequence is gathered once before the MLP and its output reduce-scattered once.
      EXPECT_EQ(comm.count(CollectiveKind::kAllGather), 1) << comm.summary();
      EXPECT_EQ(comm.count(CollectiveKind::kReduceScatter), 1) << comm.summary();
      EXPECT_EQ(comm.total_count(), 2) << comm.summary();
    }
    EXPECT_FALSE(is_dtensor(out));
    expect_close({.actual = out,
                  .expected = ops::narrow(ref_out, 1, 3 * pg.rank(), 3),
                  .tol = kTol,
                  .what = "this rank's tokens of the output"});
    // Each rank's loss is its tokens' share: the gradients' collectives sum the shares.
    backward(sum(mul(out, out)));
    for (const auto& [name, p] : model.named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << name;
      EXPECT_EQ(dtensor_spec(p.grad()).placements, dtensor_spec(p).placements) << name;
      expect_close({.actual = full_tensor(p.grad()),
                    .expected = reference.state_dict().at(name).grad(),
                    .tol = kTol,
                    .what = "grad of " + name});
    }
  });
}

// Megatron's sequence parallelism (PrepareInputOptions::regather_in_backward): between forward
// and backward the MLP keeps its input's sequence shard instead of the gathered sequence, and
// gathers it again when backward reaches it: exactly the gathered bytes less the shard's are
// saved, backward issues one more all-gather, and every gradient is bitwise the same.
TEST(TensorParallelTest, RegatherInBackwardKeepsTheShardAndGathersAgain) {
  constexpr int64_t kBatch = 2, kSeq = 64, kWidth = 8;
  const Tensor x = ops::uniform({kBatch, kSeq, kWidth}, 5, -1.0, 1.0);
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{2});
    struct Run {
      int64_t held_after_forward = 0;
      int64_t backward_gathers = 0;
      std::vector<std::pair<std::string, Tensor>> grads;
    };
    MemoryTracker tracker;  // outlives every tensor of both runs
    auto run = [&](bool regather) {
      ResidualBlock model;
      tp::parallelize_module(
          model, mesh,
          {{"ln", std::make_shared<tp::SequenceParallel>()},
           {"mlp", std::make_shared<tp::PrepareModuleInput>(
                       tp::PrepareInputOptions{Shard(1), Replicate(), false, regather})},
           {"mlp.fc1", std::make_shared<tp::ColwiseParallel>()},
           {"mlp.fc2",
            std::make_shared<tp::RowwiseParallel>(tp::LayoutOptions{.output_layouts = Shard(1)})},
           {"drop", std::make_shared<tp::SequenceParallel>(
                        tp::SequenceParallelOptions{.use_local_output = true})}});
      Run r;
      Tensor loss;
      const Tensor local_x = ops::narrow(x, 1, kSeq / 2 * pg.rank(), kSeq / 2);
      {
        ScopedMemoryTracker scope(tracker);
        const int64_t before = tracker.stats().current_bytes;
        const Tensor out = model(local_x);
        loss = sum(mul(out, out));
        r.held_after_forward = tracker.stats().current_bytes - before;
      }
      CommDebugMode comm;
      backward(loss);
      r.backward_gathers = comm.count(CollectiveKind::kAllGather);
      for (const auto& [name, p] : model.named_parameters()) {
        r.grads.emplace_back(name, full_tensor(p.grad()));
      }
      return r;
    };
    const Run gathered = run(false), regathered = run(true);
    const int64_t gathered_bytes = kBatch * kSeq * kWidth * 4;
    EXPECT_EQ(gathered.held_after_forward - regathered.held_after_forward,
              gathered_bytes - gathered_bytes / 2);
    EXPECT_EQ(regathered.backward_gathers, gathered.backward_gathers + 1);
    ASSERT_EQ(regathered.grads.size(), gathered.grads.size());
    for (size_t i = 0; i < gathered.grads.size(); ++i) {
      testing::expect_bitwise_equal({.actual = regathered.grads[i].second,
                                     .expected = gathered.grads[i].second,
                                     .what = "grad of " + gathered.grads[i].first});
    }
  });
}

TEST(TensorParallelTest, PrepareModuleOutputAndDTensorOutputs) {
  class Wrapper : public nn::Module {
   public:
    Wrapper() : Module("Wrapper") { mlp = register_module("mlp", std::make_shared<Mlp>()); }
    Tensor forward(const Tensor& x) override { return (*mlp)(x); }
    std::shared_ptr<Mlp> mlp;
  };
  const Tensor x = ops::uniform({4, 8}, 5, -1.0, 1.0);
  Wrapper reference;
  const Tensor ref_out = reference(x);
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{2});
    Wrapper model;
    // fc2 hands a row-sharded DTensor (use_local_output = false) to the wrapper's output hook,
    // which keeps its placements and gathers it for the caller.
    tp::parallelize_module(
        model, mesh,
        {{"mlp.fc1", std::make_shared<tp::ColwiseParallel>()},
         {"mlp.fc2", std::make_shared<tp::RowwiseParallel>(
                         tp::LayoutOptions{.output_layouts = Shard(0), .use_local_output = false})},
         {"mlp", std::make_shared<tp::PrepareModuleOutput>(
                     tp::PrepareOutputOptions{Replicate(), Replicate(), true})}});
    const Tensor inner = (*model.mlp->fc2)((*model.mlp->fc1)(x));
    ASSERT_TRUE(is_dtensor(inner));
    EXPECT_EQ(dtensor_spec(inner).placements, (Placements{Shard(0)}));
    CommDebugMode comm;
    const Tensor out = model(x);
    EXPECT_EQ(comm.count(CollectiveKind::kReduceScatter), 1) << comm.summary();
    EXPECT_EQ(comm.count(CollectiveKind::kAllGather), 1) << comm.summary();
    EXPECT_FALSE(is_dtensor(out));
    expect_close({.actual = out, .expected = ref_out, .tol = kTol, .what = "output"});
  });
}

TEST(TensorParallelTest, VocabParallelEmbeddingWithOddVocabularyMatchesOneRank) {
  const Tensor ids = ops::from_vector_i64({0, 6, 3, 4, 6, 1}, {2, 3});
  nn::Embedding reference(7, 4, 3);
  const Tensor ref_out = reference(ids);
  backward(sum(mul(ref_out, ref_out)));
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{2});
    class Holder : public nn::Module {
     public:
      Holder() : Module("Holder") {
        emb = register_module("emb", std::make_shared<nn::Embedding>(7, 4, 3));
      }
      std::shared_ptr<nn::Embedding> emb;
    } model;
    tp::parallelize_module(model, mesh, {{"emb", std::make_shared<tp::RowwiseParallel>()}});
    EXPECT_EQ(local_shard(model.emb->weight()).size(0), pg.rank() == 0 ? 4 : 3);  // rows 0-3 | 4-6
    const Tensor out = (*model.emb)(ids);
    expect_close({.actual = out, .expected = ref_out, .tol = kTol, .what = "lookup"});
    backward(sum(mul(out, out)));
    EXPECT_EQ(dtensor_spec(model.emb->weight().grad()).placements, (Placements{Shard(0)}));
    expect_close({.actual = full_tensor(model.emb->weight().grad()),
                  .expected = reference.weight().grad(),
                  .tol = kTol,
                  .what = "grad"});
  });
}

// The vocabulary-parallel table's gradient is computed for each rank's own rows (Megatron's
// VocabParallelEmbedding), not as the whole (V, C) gradient then sliced: backward never holds
// the whole table's f32 accumulator, and the rows are bitwise one rank's.
constexpr int64_t kVocab = 1000, kDim = 64;
TEST(TensorParallelTest, VocabParallelEmbeddingBackwardComputesOnlyItsOwnRows) {
  std::vector<int64_t> id_values;
  for (int64_t i = 0; i < 64; ++i) id_values.push_back((i * 37) % kVocab);
  const Tensor ids = ops::from_vector_i64(id_values, {4, 16});
  nn::Embedding reference(kVocab, kDim, 3);
  const Tensor ref_out = reference(ids);
  backward(sum(mul(ref_out, ref_out)));
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    MemoryTracker tracker;  // outlives the gradient it counts
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{2});
    class Holder : public nn::Module {
     public:
      Holder() : Module("Holder") {
        emb = register_module("emb", std::make_shared<nn::Embedding>(kVocab, kDim, 3));
      }
      std::shared_ptr<nn::Embedding> emb;
    } model;
    tp::parallelize_module(model, mesh, {{"emb", std::make_shared<tp::RowwiseParallel>()}});
    const Tensor out = (*model.emb)(ids);
    const Tensor loss = sum(mul(out, out));
    {
      ScopedMemoryTracker scope(tracker);
      backward(loss);
    }
    EXPECT_LT(tracker.stats().peak_bytes, kVocab * kDim * 4) << "rank " << pg.rank();
    testing::expect_bitwise_equal({.actual = full_tensor(model.emb->weight().grad()),
                                   .expected = reference.weight().grad(),
                                   .what = "grad of the table"});
  });
}

TEST(TensorParallelTest, SequenceParallelNeedsALeafModule) {
  comm::testing::run_on_ranks(2, [](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{2});
    ResidualBlock model;
    try {
      tp::parallelize_module(model, mesh, {{"mlp", std::make_shared<tp::SequenceParallel>()}});
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_THAT(
          e.what(),
          HasSubstr("SequenceParallel applies to leaf modules (norms, dropout), but 'mlp' (Mlp) "
                    "has submodules"));
    }
  });
}

TEST(TensorParallelTest, FqnPatternsMatchLikeFnmatch) {
  EXPECT_TRUE(tp::fqn_matches("h.*.attn.c_attn", "h.0.attn.c_attn"));
  EXPECT_TRUE(tp::fqn_matches("h.*.attn.c_attn", "h.11.attn.c_attn"));
  EXPECT_FALSE(tp::fqn_matches("h.*.attn.c_attn", "h.0.attn.c_proj"));
  EXPECT_TRUE(tp::fqn_matches("*c_fc", "h.3.mlp.c_fc"));
}

}  // namespace
}  // namespace loom
