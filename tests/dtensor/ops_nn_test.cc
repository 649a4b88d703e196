// nn strategies (dtensor/sharding/nn.cc) against the single-rank result, forward and backward:
// softmax/log_softmax, layer_norm (parameter gradients come back Partial and take the
// parameter's layout), rope (batch, head or sequence shards), vocabulary- and feature-parallel
// embedding, loss-parallel cross entropy (only all-reduces, never the logits gathered),
// attention with heads sharded, with and without dropout.
//
// Tolerances: a row-wise op (softmax, layer norm, attention per (batch, head)) whose rows stay
// whole on a rank computes each row exactly as the single-rank kernel does, so those outputs
// compare bit for bit. Where a sum is split across ranks (layer norm's weight/bias gradients
// summed over rows, loss-parallel logsumexp over vocabulary shards, means of non-integers) the
// f32 rounding differs: 1e-5 relative.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/functions_nn.h"
#include "comm/testing/multi_rank.h"
#include "dtensor/comm_debug_mode.h"
#include "dtensor/dtensor.h"
#include "tests/dtensor/ops_test_util.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

using comm::CollectiveKind;
using comm::ProcessGroup;
using comm::ReduceOp;
using comm::testing::run_on_ranks;
using loom::testing::check_op;
using loom::testing::expect_close;
using loom::testing::float_tensor;
using loom::testing::integer_tensor;
using loom::testing::kExact;
using loom::testing::mesh_1d;
using loom::testing::mesh_2x2;
using loom::testing::OpCollectives;
using loom::testing::Tolerance;
using Inputs = std::vector<Tensor>;

constexpr Tolerance kSplitSum{.rtol = 1e-5, .atol = 1e-6};

TEST(OpsNnTest, SoftmaxOnANonNormalizedShardedDim) {
  for (int world : {2, 3}) {
    run_on_ranks(world, [world](ProcessGroup& pg) {
      auto mesh = mesh_1d(pg);
      const Tensor x = float_tensor({2, 3 * world + 1, 6}, 1);
      for (const Placements& placements : {Placements{Shard(0)}, Placements{Shard(1)}}) {
        const std::string p = placements_str(placements);
        check_op(mesh, {"softmax(-1) of " + p,
                        {{x, placements}},
                        [](const Inputs& in) { return softmax(in[0], -1); },
                        placements});
        check_op(mesh, {"log_softmax(-1) of " + p,
                        {{x, placements}},
                        [](const Inputs& in) { return log_softmax(in[0], -1); },
                        placements});
      }
      // Normalizing over the sharded dim needs the whole dim: the output is not sharded there.
      // Gathered on 2 ranks; on 3 the shard moves to dim 0, and the gradient moves back.
      const OpCollectives softmax_whole_dim =
          world == 2 ? OpCollectives{.forward = {.all_gather = 1}}
                     : OpCollectives{.forward = {.all_to_all = 1}, .backward = {.all_to_all = 1}};
      check_op(mesh, {"softmax(1) of S(1)",
                      {{x, {Shard(1)}}},
                      [](const Inputs& in) { return softmax(in[0], 1); },
                      std::nullopt,
                      softmax_whole_dim});
    });
  }
  run_on_ranks(4, [](ProcessGroup& pg) {
    const Tensor x = float_tensor({3, 5, 7}, 2);
    check_op(mesh_2x2(pg), {"softmax(-1) of [S(0),S(1)]",
                            {{x, {Shard(0), Shard(1)}}},
                            [](const Inputs& in) { return softmax(in[0], -1); },
                            Placements{Shard(0), Shard(1)}});
  });
}

TEST(OpsNnTest, LayerNormWithShardedRowsAndReplicatedParameters) {
  const auto ln = [](const Inputs& in) {
    return layer_norm(in[0], {in[0].size(-1)}, in[1], in[2]);
  };
  for (int world : {2, 3}) {
    run_on_ranks(world, [world, ln](ProcessGroup& pg) {
      auto mesh = mesh_1d(pg);
      const int64_t c = 8;
      const Tensor x = float_tensor({3 * world + 1, 3, c}, 1);
      const Tensor weight = float_tensor({c}, 2), bias = float_tensor({c}, 3);
      // The output and grad_x are row-wise (exact); grad_weight/grad_bias are Partial sums over
      // each rank's rows, all-reduced into the replicated parameters' layout (kSplitSum).
      for (const Placements& placements : {Placements{Shard(0)}, Placements{Shard(1)}}) {
        check_op(mesh, {"layer_norm x " + placements_str(placements) + ", weight/bias R",
                        {{x, placements}, {weight, {Replicate()}}, {bias, {Replicate()}}},
                        ln,
                        placements,
                        {.backward = {.all_reduce = 2}},
                        kExact,
                        kSplitSum});
      }
      // Normalizing over a sharded dim gathers it first (on 3 ranks: moves the shard to dim 0).
      // The backward kernel gets x as it was, S(2), and moves it again; on 3 ranks grad_x moves
      // back and the parameter gradients, Partial over the rows, are all-reduced.
      const OpCollectives layer_norm_whole_dim =
          world == 2 ? OpCollectives{.forward = {.all_gather = 1}, .backward = {.all_gather = 1}}
                     : OpCollectives{.forward = {.all_to_all = 1},
                                     .backward = {.all_reduce = 2, .all_to_all = 2}};
      check_op(mesh, {"layer_norm x S(2)",
                      {{x, {Shard(2)}}, {weight, {Replicate()}}, {bias, {Replicate()}}},
                      ln,
                      std::nullopt,
                      layer_norm_whole_dim,
                      kExact,
                      kSplitSum});
    });
  }
  run_on_ranks(4, [ln](ProcessGroup& pg) {
    const Tensor x = float_tensor({4, 5, 6}, 4), weight = float_tensor({6}, 5),
                 bias = float_tensor({6}, 6);
    check_op(mesh_2x2(pg), {"layer_norm [S(0),S(1)]",
                            {{x, {Shard(0), Shard(1)}},
                             {weight, {Replicate(), Replicate()}},
                             {bias, {Replicate(), Replicate()}}},
                            ln,
                            Placements{Shard(0), Shard(1)},
                            // Each parameter gradient is Partial on both mesh dims: one
                            // all-reduce per mesh dim.
                            {.backward = {.all_reduce = 4}},
                            kExact,
                            kSplitSum});
  });
}

TEST(OpsNnTest, LayerNormParameterGradientIsPartialUntilItTakesTheParameterLayout) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = mesh_1d(pg);
    Tensor x = distribute_tensor(float_tensor({5, 4}, 1), mesh, {Shard(0)}, std::nullopt);
    Tensor weight = distribute_tensor(float_tensor({4}, 2), mesh, {Replicate()}, std::nullopt);
    Tensor bias = distribute_tensor(float_tensor({4}, 3), mesh, {Replicate()}, std::nullopt);
    weight.set_requires_grad(true);
    bias.set_requires_grad(true);
    Tensor y = layer_norm(x, {4}, weight, bias);
    // The backward kernel leaves the parameter gradients Partial(sum) (each rank summed its own
    // rows); accumulating into the replicated leaf all-reduces them, once each.
    CommDebugMode comm;
    backward(sum(mul(y, y)));
    EXPECT_EQ(comm.count(CollectiveKind::kAllReduce), 2) << comm.summary();
    EXPECT_EQ(comm.count(CollectiveKind::kAllGather), 0) << comm.summary();
    EXPECT_EQ(dtensor_spec(weight.grad()).placements, (Placements{Replicate()}));
    EXPECT_EQ(dtensor_spec(bias.grad()).placements, (Placements{Replicate()}));
  });
}

TEST(OpsNnTest, DropoutOnShardsDrawsTheirSliceOfTheGlobalMask) {
  // Each element's keep/drop is a function of (seed, global index): a shard drops exactly what
  // one rank dropping the whole tensor does, bit for bit, with no communication.
  const auto drop = [](const Inputs& in) { return dropout(in[0], 0.3, 1234); };
  for (int world : {2, 3}) {
    run_on_ranks(world, [world, drop](ProcessGroup& pg) {
      auto mesh = mesh_1d(pg);
      const Tensor x = float_tensor({2, 3 * world + 1, 5}, 1);  // uneven along dim 1
      for (const Placements& placements :
           {Placements{Shard(0)}, Placements{Shard(1)}, Placements{Shard(2)}}) {
        check_op(mesh,
                 {"dropout of " + placements_str(placements), {{x, placements}}, drop, placements});
        const Tensor sharded = distribute_tensor(x, mesh, placements, std::nullopt);
        CommDebugMode comm;
        dropout(sharded, 0.3, 1234);
        EXPECT_EQ(comm.total_count(), 0) << placements_str(placements) << ": " << comm.summary();
      }
      // Linear for a fixed mask: a Partial input stays Partial.
      const Tensor partial = from_local(x, mesh, {Partial()});
      CommDebugMode comm;
      const Tensor y = dropout(partial, 0.3, 1234);
      EXPECT_EQ(comm.total_count(), 0) << comm.summary();
      EXPECT_EQ(dtensor_spec(y).placements, (Placements{Partial()}));
    });
  }
  run_on_ranks(4, [drop](ProcessGroup& pg) {
    check_op(mesh_2x2(pg), {"dropout of [S(1),S(0)]",
                            {{float_tensor({5, 6}, 2), {Shard(1), Shard(0)}}},
                            drop,
                            Placements{Shard(1), Shard(0)}});
  });
}

// A call's region places the whole distributed tensor (a data-parallel rank's rows of the
// global batch, a context-parallel rank's chunks of the sequence); each shard draws its slice
// of what that place draws.
TEST(OpsNnTest, DropoutWithARegionPlacesTheWholeAndEachShardInIt) {
  const RngRegion rows{{8, 7, 4}, {4, 0, 0}};
  const RngRegion chunks{{2, 20, 4}, {0, 0, 0}, /*runs_dim=*/1, {0, 3, 3, 3, 15, 4}};
  run_on_ranks(2, [&](ProcessGroup& pg) {
    auto mesh = mesh_1d(pg);
    for (const RngRegion& region : {rows, chunks}) {
      const Tensor x = float_tensor({region.runs.empty() ? int64_t{4} : int64_t{2}, 7, 4}, 3);
      const auto drop = [region](const Inputs& in) {
        return ops::dropout(in[0], 0.4, 99, /*training=*/true, region).out;
      };
      for (const Placements& placements : {Placements{Shard(0)}, Placements{Shard(1)}}) {
        check_op(mesh, {"dropout in a region of " + placements_str(placements),
                        {{x, placements}},
                        drop,
                        placements});
      }
    }
  });
}

TEST(OpsNnTest, EmbeddingVocabularyAndFeatureParallel) {
  for (int world : {2, 3}) {
    run_on_ranks(world, [world](ProcessGroup& pg) {
      auto mesh = mesh_1d(pg);
      const int64_t vocab = 3 * world + 1, dim = 2 * world + 1;
      const Tensor table = integer_tensor({vocab, dim}, 1);
      std::vector<int64_t> ids;
      for (int64_t i = 0; i < 12; ++i) ids.push_back((i * 5 + 3) % vocab);  // every shard, repeats
      const Tensor indices = ops::from_vector_i64(ids, {3, 4});
      const auto lookup = [](const Inputs& in) { return embedding(in[0], in[1]); };
      // Vocabulary parallel: each rank looks up the rows it owns (zeros elsewhere) -> Partial(sum).
      check_op(mesh, {"embedding table S(0), indices R",
                      {{table, {Shard(0)}}, {indices, {Replicate()}}},
                      lookup,
                      Placements{Partial(ReduceOp::kSum)}});
      // Feature parallel: each rank holds some columns of every row -> sharded on the last dim.
      check_op(mesh, {"embedding table S(1), indices R",
                      {{table, {Shard(1)}}, {indices, {Replicate()}}},
                      lookup,
                      Placements{Shard(2)}});
      check_op(mesh, {"embedding table R, indices S(0)",
                      {{table, {Replicate()}}, {indices, {Shard(0)}}},
                      lookup,
                      Placements{Shard(0)},
                      {.backward = {.all_reduce = 1}}});
    });
  }
  run_on_ranks(4, [](ProcessGroup& pg) {
    const Tensor table = integer_tensor({9, 5}, 2);
    const Tensor indices = ops::from_vector_i64({0, 8, 4, 4, 7, 1}, {2, 3});
    check_op(mesh_2x2(pg), {"embedding table [R,S(0)], indices [S(0),R]",
                            {{table, {Replicate(), Shard(0)}}, {indices, {Shard(0), Replicate()}}},
                            [](const Inputs& in) { return embedding(in[0], in[1]); },
                            Placements{Shard(0), Partial()},
                            {.backward = {.all_reduce = 1}}});
  });
}

// A table that is a sum of parts (a matmul over a sharded inner dim: Partial(sum)) is looked up
// whole, its output Partial; its backward takes the gradient of the table's whole value, as for
// a Replicate table (before: no strategy took a Partial weight, so backward failed).
TEST(OpsNnTest, EmbeddingOfAPartialTableBackpropagates) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = mesh_1d(pg);
    const Tensor a = float_tensor({5, 4}, 3), b = float_tensor({4, 3}, 4);
    const Tensor indices = ops::from_vector_i64({0, 4, 2, 2, 1}, {5});
    const Tensor weights = float_tensor({5, 3}, 5);  // the loss's
    // One rank.
    Tensor ra = ops::clone(a), rb = ops::clone(b);
    ra.set_requires_grad(true);
    rb.set_requires_grad(true);
    const Tensor reference = embedding(matmul(ra, rb), indices);
    backward(sum(mul(reference, weights)));
    // Sharded: a by columns, b by rows, so a @ b is Partial(sum).
    Tensor da = distribute_tensor(a, mesh, {Shard(1)}), db = distribute_tensor(b, mesh, {Shard(0)});
    da.set_requires_grad(true);
    db.set_requires_grad(true);
    const Tensor table = matmul(da, db);
    ASSERT_EQ(dtensor_spec(table).placements, (Placements{Partial()}));
    const Tensor out = embedding(table, distribute_tensor(indices, mesh, {Replicate()}));
    backward(sum(mul(out, distribute_tensor(weights, mesh, {Replicate()}))));
    // The table's two halves of each inner product are summed apart, then added: f32 rounding
    // of the order (one ulp seen), not exact equality.
    const loom::testing::Tolerance order{.rtol = 1e-6, .atol = 1e-7};
    expect_close(
        {.actual = full_tensor(out), .expected = reference, .tol = order, .what = "output"});
    expect_close({.actual = full_tensor(da.grad()),
                  .expected = ra.grad(),
                  .tol = order,
                  .what = "a's gradient"});
    expect_close({.actual = full_tensor(db.grad()),
                  .expected = rb.grad(),
                  .tol = order,
                  .what = "b's gradient"});
  });
}

// Targets with ignored rows and every vocabulary shard hit.
Tensor ce_targets(int64_t rows, int64_t vocab) {
  std::vector<int64_t> t;
  for (int64_t i = 0; i < rows; ++i) t.push_back(i % 4 == 2 ? -100 : (i * 7 + 1) % vocab);
  return ops::from_vector_i64(t, {rows});
}

TEST(OpsNnTest, LossParallelCrossEntropyOnlyAllReducesAndMatchesSingleRank) {
  // 11 classes over 2 ranks (6 + 5), over 3 ranks (4 + 4 + 3).
  for (int world : {2, 3}) {
    run_on_ranks(world, [](ProcessGroup& pg) {
      auto mesh = mesh_1d(pg);
      const int64_t n = 7, vocab = 11;
      const Tensor logits_full = ops::mul(float_tensor({n, vocab}, 1), 4.0);
      const Tensor targets_full = ce_targets(n, vocab);
      for (Reduction reduction : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
        SCOPED_TRACE(static_cast<int>(reduction));
        Tensor ref_logits = ops::clone(logits_full);
        ref_logits.set_requires_grad(true);
        const Tensor ref_loss = cross_entropy(ref_logits, targets_full, -100, reduction);
        backward(sum(ref_loss));

        Tensor logits = distribute_tensor(logits_full, mesh, {Shard(1)}, std::nullopt);
        logits.set_requires_grad(true);
        const Tensor targets = distribute_tensor(targets_full, mesh, {Replicate()}, std::nullopt);
        Tensor loss;
        {
          CommDebugMode comm;
          loss = cross_entropy(logits, targets, -100, reduction);
          // The shards' logsumexps' max, their exponentials' sum, the target terms: three small
          // all-reduces of (N,).
          EXPECT_EQ(comm.count(CollectiveKind::kAllGather), 0) << comm.summary();
          EXPECT_EQ(comm.count(CollectiveKind::kAllToAll), 0) << comm.summary();
          EXPECT_EQ(comm.count(CollectiveKind::kAllReduce), 3) << comm.summary();
          EXPECT_EQ(comm.total_count(), 3) << comm.summary();
          EXPECT_EQ(comm.bytes(CollectiveKind::kAllReduce), 3 * n * 4) << comm.summary();
        }
        EXPECT_EQ(dtensor_spec(loss).placements, (Placements{Replicate()}));
        expect_close(
            {.actual = full_tensor(loss), .expected = ref_loss, .tol = kSplitSum, .what = "loss"});
        {
          // The gradient stays vocabulary-sharded: no communication at all.
          CommDebugMode comm;
          backward(sum(loss));
          EXPECT_EQ(comm.total_count(), 0) << comm.summary();
        }
        EXPECT_EQ(dtensor_spec(logits.grad()).placements, (Placements{Shard(1)}));
        expect_close({.actual = full_tensor(logits.grad()),
                      .expected = ref_logits.grad(),
                      .tol = kSplitSum,
                      .what = "grad logits"});
      }
    });
  }
}

// Loss parallel on bf16 logits (a mixed-precision model's): the shards' kernels read them as
// they are and the gradient comes back bf16, sharded, against one rank's bf16 cross entropy; a
// target beyond the vocabulary is named on every rank (each checks every target against all the
// classes), whichever shard it would fall on.
TEST(OpsNnTest, LossParallelCrossEntropyOnBf16LogitsAndABadTarget) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = mesh_1d(pg);
    const int64_t n = 7, vocab = 11;
    const Tensor logits_full = ops::to(ops::mul(float_tensor({n, vocab}, 4), 4.0), kBFloat16);
    const Tensor targets_full = ce_targets(n, vocab);
    Tensor ref_logits = ops::clone(logits_full);
    ref_logits.set_requires_grad(true);
    const Tensor ref_loss = cross_entropy(ref_logits, targets_full);
    backward(ref_loss);
    Tensor logits = distribute_tensor(logits_full, mesh, {Shard(1)}, std::nullopt);
    logits.set_requires_grad(true);
    const Tensor targets = distribute_tensor(targets_full, mesh, {Replicate()}, std::nullopt);
    const Tensor loss = cross_entropy(logits, targets);
    EXPECT_EQ(loss.dtype(), kFloat32);
    expect_close(
        {.actual = full_tensor(loss), .expected = ref_loss, .tol = kSplitSum, .what = "bf16 loss"});
    backward(loss);
    EXPECT_EQ(logits.grad().dtype(), kBFloat16);
    EXPECT_EQ(dtensor_spec(logits.grad()).placements, (Placements{Shard(1)}));
    // Each gradient element is the same f32 expression rounded once to bf16, but of the rows'
    // logsumexp combined from the shards' (within f32 rounding of one rank's): one bf16 ulp.
    expect_close({.actual = full_tensor(logits.grad()),
                  .expected = ref_logits.grad(),
                  .tol = {.rtol = 0x1.0p-8, .atol = 1e-6},
                  .what = "bf16 grad logits"});

    std::vector<int64_t> bad(n, 1);
    bad[5] = vocab;  // one past the last class: the second shard's range would hold it
    const Tensor bad_targets =
        distribute_tensor(ops::from_vector_i64(bad, {n}), mesh, {Replicate()}, std::nullopt);
    EXPECT_EQ(loom::testing::error_of([&] { cross_entropy(logits, bad_targets); }),
              "cross_entropy: target 11 at position 5 is out of range for 11 classes (logits "
              "shape (7, " +
                  std::to_string(pg.rank() == 0 ? 6 : 5) +
                  ")); expected 0..10 or ignore_index -100");
  });
}

TEST(OpsNnTest, CrossEntropyWithRowShardedLogitsAndOn2x2Mesh) {
  run_on_ranks(3, [](ProcessGroup& pg) {
    auto mesh = mesh_1d(pg);
    const Tensor logits = float_tensor({10, 6}, 2), targets = ce_targets(10, 6);
    const auto ce = [](Reduction r) {
      return [r](const Inputs& in) { return cross_entropy(in[0], in[1], -100, r); };
    };
    check_op(mesh, {"cross_entropy sum, rows S(0)",
                    {{logits, {Shard(0)}}, {targets, {Shard(0)}}},
                    ce(Reduction::kSum),
                    Placements{Partial()},
                    {},
                    kSplitSum,
                    kSplitSum});
    check_op(mesh, {"cross_entropy none, rows S(0)",
                    {{logits, {Shard(0)}}, {targets, {Shard(0)}}},
                    ce(Reduction::kNone),
                    Placements{Shard(0)},
                    {},
                    kExact,
                    kExact});
    // A mean has no row-sharded option (it divides by the count of every row's valid target):
    // the logits move to the vocabulary (an all-to-all) for loss parallel (its 3 all-reduces)
    // and the targets are gathered; the backward kernel moves both again, and its
    // vocabulary-sharded gradient moves back to rows.
    check_op(mesh, {"cross_entropy mean, rows S(0)",
                    {{logits, {Shard(0)}}, {targets, {Shard(0)}}},
                    ce(Reduction::kMean),
                    std::nullopt,
                    {.forward = {.all_reduce = 3, .all_gather = 1, .all_to_all = 1},
                     .backward = {.all_gather = 1, .all_to_all = 2}},
                    kSplitSum,
                    kSplitSum});
  });
  run_on_ranks(4, [](ProcessGroup& pg) {
    const Tensor logits = float_tensor({6, 11}, 3), targets = ce_targets(6, 11);
    // dp shards the rows, tp the vocabulary (loss parallel inside each tp group).
    for (Reduction r : {Reduction::kNone, Reduction::kMean}) {
      // kNone keeps the rows on dp; kMean cannot (above), so dp gathers the logits and the
      // targets, in forward and again for the backward kernel.
      const OpCollectives collectives =
          r == Reduction::kNone ? OpCollectives{.forward = {.all_reduce = 3}}
                                : OpCollectives{.forward = {.all_reduce = 3, .all_gather = 2},
                                                .backward = {.all_gather = 2}};
      const auto ce = [r](const Inputs& in) { return cross_entropy(in[0], in[1], -100, r); };
      check_op(mesh_2x2(pg),
               {"cross_entropy [S(0),S(1)] reduction " + std::to_string(static_cast<int>(r)),
                {{logits, {Shard(0), Shard(1)}}, {targets, {Shard(0), Replicate()}}},
                ce,
                std::nullopt,
                collectives,
                kSplitSum,
                kSplitSum});
    }
  });
}

TEST(OpsNnTest, CausalAttentionWithHeadsSharded) {
  const auto attention = [](const Inputs& in) {
    return scaled_dot_product_attention(in[0], in[1], in[2], true);
  };
  for (int world : {2, 3}) {
    run_on_ranks(world, [world, attention](ProcessGroup& pg) {
      auto mesh = mesh_1d(pg);
      const int64_t heads = 3 * world + 1;  // uneven
      const Tensor q = float_tensor({2, heads, 5, 4}, 1), k = float_tensor({2, heads, 5, 4}, 2),
                   v = float_tensor({2, heads, 5, 4}, 3);
      // Each (batch, head) is computed whole on one rank, exactly as on a single rank.
      check_op(mesh, {"attention q,k,v S(1)",
                      {{q, {Shard(1)}}, {k, {Shard(1)}}, {v, {Shard(1)}}},
                      attention,
                      Placements{Shard(1)}});
      check_op(mesh, {"attention q,k,v S(0)",
                      {{q, {Shard(0)}}, {k, {Shard(0)}}, {v, {Shard(0)}}},
                      attention,
                      Placements{Shard(0)}});
      // Sharded along the sequence: attention needs every key, so this gathers q, k and v (on 3
      // ranks: moves them to S(0)), and again for the backward kernel, which gets them as they
      // were; on 3 ranks their gradients move back.
      const OpCollectives attention_whole_sequence =
          world == 2 ? OpCollectives{.forward = {.all_gather = 3}, .backward = {.all_gather = 3}}
                     : OpCollectives{.forward = {.all_to_all = 3}, .backward = {.all_to_all = 6}};
      check_op(mesh, {"attention q,k,v S(2)",
                      {{q, {Shard(2)}}, {k, {Shard(2)}}, {v, {Shard(2)}}},
                      attention,
                      std::nullopt,
                      attention_whole_sequence});
    });
  }
  run_on_ranks(4, [attention](ProcessGroup& pg) {
    const Tensor q = float_tensor({2, 4, 3, 2}, 4), k = float_tensor({2, 4, 3, 2}, 5),
                 v = float_tensor({2, 4, 3, 2}, 6);
    const Placements dp_tp{Shard(0), Shard(1)};
    check_op(mesh_2x2(pg),
             {"attention [S(0),S(1)]", {{q, dp_tp}, {k, dp_tp}, {v, dp_tp}}, attention, dp_tp});
  });
}

// Attention dropout on shards: each local call is told where its heads and batch entries sit in
// the whole (B, H, T, T) mask (dtensor/sharding/nn.cc), so it drops exactly what one rank
// dropping the whole does, forward and backward, bit for bit (rows stay whole on a rank).
TEST(OpsNnTest, AttentionDropoutOnShardsDropsWhatOneRankDrops) {
  const auto attention = [](const Inputs& in) {
    return scaled_dot_product_attention(in[0], in[1], in[2], true, 0.0, 0,
                                        {.p = 0.3, .seed = 2024});
  };
  run_on_ranks(2, [attention](ProcessGroup& pg) {
    auto mesh = mesh_1d(pg);
    const Tensor q = float_tensor({2, 5, 6, 4}, 7), k = float_tensor({2, 5, 6, 4}, 8),
                 v = float_tensor({2, 5, 6, 4}, 9);
    for (int64_t dim : {0, 1}) {
      check_op(mesh, {fmt::format("dropout attention q,k,v S({})", dim),
                      {{q, {Shard(dim)}}, {k, {Shard(dim)}}, {v, {Shard(dim)}}},
                      attention,
                      Placements{Shard(dim)}});
    }
  });
  run_on_ranks(4, [attention](ProcessGroup& pg) {
    const Tensor q = float_tensor({2, 4, 3, 2}, 4), k = float_tensor({2, 4, 3, 2}, 5),
                 v = float_tensor({2, 4, 3, 2}, 6);
    const Placements dp_tp{Shard(0), Shard(1)};
    check_op(
        mesh_2x2(pg),
        {"dropout attention [S(0),S(1)]", {{q, dp_tp}, {k, dp_tp}, {v, dp_tp}}, attention, dp_tp});
  });
}

// Grouped-query attention with heads sharded: q's 4 heads and k's and v's 2 split together, so
// each rank keeps whole groups (query heads 2r, 2r + 1 with key/value head r), bit for bit.
TEST(OpsNnTest, GroupedQueryAttentionWithHeadsSharded) {
  const auto attention = [](const Inputs& in) {
    return scaled_dot_product_attention(in[0], in[1], in[2], true, 0.0, 0, {}, /*enable_gqa=*/true);
  };
  run_on_ranks(2, [attention](ProcessGroup& pg) {
    auto mesh = mesh_1d(pg);
    const Tensor q = float_tensor({2, 4, 6, 4}, 17), k = float_tensor({2, 2, 6, 4}, 18),
                 v = float_tensor({2, 2, 6, 4}, 19);
    for (int64_t dim : {0, 1}) {
      check_op(mesh, {fmt::format("grouped attention q,k,v S({})", dim),
                      {{q, {Shard(dim)}}, {k, {Shard(dim)}}, {v, {Shard(dim)}}},
                      attention,
                      Placements{Shard(dim)}});
    }
    // 12 query heads over 3 key/value heads (group 4) split 6/6 over 2/1: rank 0 would pair
    // query heads 4, 5 with key/value head 1. Named on both ranks instead.
    const Tensor q12 = float_tensor({1, 12, 3, 4}, 20), k3 = float_tensor({1, 3, 3, 4}, 21);
    const Tensor dq = distribute_tensor(q12, mesh, {Shard(1)}, std::nullopt);
    const Tensor dk = distribute_tensor(k3, mesh, {Shard(1)}, std::nullopt);
    EXPECT_THAT(loom::testing::error_of([&] {
                  attention({dq, dk, dk});
                }),
                ::testing::HasSubstr("grouped-query attention's 12 query heads over 3 key/value "
                                     "heads (group 4) split as 6 over 2 on mesh coordinate (0,)"));
  });
}

// RoPE of (B, T, H, D) by replicated tables: batch and heads shard with no communication, the
// sequence shards with the tables' rows (sliced locally), a Partial x stays Partial (rope is
// linear); each pair rotates whole on one rank, so the values are exact.
TEST(OpsNnTest, RopeShardsBatchHeadsAndSequenceWithoutCommunication) {
  const auto rotate = [](const Inputs& in) { return rope(in[0], in[1], in[2]); };
  for (int world : {2, 3}) {
    run_on_ranks(world, [world, rotate](ProcessGroup& pg) {
      auto mesh = mesh_1d(pg);
      const int64_t time = 2 * world + 1, heads = world + 1;  // uneven shards
      const Tensor x = float_tensor({world + 1, time, heads, 4}, 1);
      const Tensor cos = float_tensor({time, 2}, 2), sin = float_tensor({time, 2}, 3);
      for (int64_t dim : {0, 1, 2}) {
        check_op(mesh, {"rope x S(" + std::to_string(dim) + "), tables R",
                        {{x, {Shard(dim)}}, {cos, {Replicate()}}, {sin, {Replicate()}}},
                        rotate,
                        Placements{Shard(dim)}});
      }
      check_op(mesh, {"rope x P(sum), tables R",
                      {{x, {Partial()}}, {cos, {Replicate()}}, {sin, {Replicate()}}},
                      rotate,
                      Placements{Partial()}});
      // The rotated dim cannot split a pair: it is gathered first.
      check_op(mesh, {"rope x S(3)",
                      {{x, {Shard(3)}}, {cos, {Replicate()}}, {sin, {Replicate()}}},
                      rotate,
                      std::nullopt,
                      world == 2 ? OpCollectives{.forward = {.all_gather = 1}}
                                 : OpCollectives{.forward = {.all_to_all = 1},
                                                 .backward = {.all_to_all = 1}}});
    });
  }
  run_on_ranks(4, [rotate](ProcessGroup& pg) {
    const Tensor x = float_tensor({2, 5, 4, 4}, 4), cos = float_tensor({5, 2}, 5),
                 sin = float_tensor({5, 2}, 6);
    const Placements dp_tp{Shard(0), Shard(2)};
    const Placements r{Replicate(), Replicate()};
    check_op(mesh_2x2(pg), {"rope [S(0),S(2)]", {{x, dp_tp}, {cos, r}, {sin, r}}, rotate, dp_tp});
  });
}

TEST(OpsNnTest, AttentionBlockWithHeadsShardedFromColwiseProjections) {
  // The tensor-parallel attention block: colwise q/k/v projections (W S(0)) give (B, T, C) S(2);
  // the head split keeps the shard on H; attention, the merge back and the rowwise output
  // projection (W S(1)) end in Partial(sum), and nothing communicates before it.
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = mesh_1d(pg);
    const int64_t b = 2, t = 3, h = 4, d = 2, c = h * d;
    const Tensor x_full = float_tensor({b, t, c}, 1);
    const Tensor wq = float_tensor({c, c}, 2), wk = float_tensor({c, c}, 3),
                 wv = float_tensor({c, c}, 4), wo = float_tensor({c, c}, 5);
    const auto block = [&](const Inputs& in) {
      const auto heads = [&](const Tensor& w) {
        return transpose(reshape(matmul(in[0], transpose(w, 0, 1)), {b, t, h, d}), 1,
                         2);  // (B, H, T, D)
      };
      Tensor y = scaled_dot_product_attention(heads(in[1]), heads(in[2]), heads(in[3]), true);
      y = reshape(transpose(y, 1, 2), {b, t, c});
      return matmul(y, transpose(in[4], 0, 1));
    };
    Inputs reference{ops::clone(x_full), ops::clone(wq), ops::clone(wk), ops::clone(wv),
                     ops::clone(wo)};
    for (Tensor& r : reference) r.set_requires_grad(true);
    const Tensor expected = block(reference);
    backward(sum(expected));

    Inputs inputs{distribute_tensor(x_full, mesh, {Replicate()}, std::nullopt),
                  distribute_tensor(wq, mesh, {Shard(0)}, std::nullopt),
                  distribute_tensor(wk, mesh, {Shard(0)}, std::nullopt),
                  distribute_tensor(wv, mesh, {Shard(0)}, std::nullopt),
                  distribute_tensor(wo, mesh, {Shard(1)}, std::nullopt)};
    for (Tensor& in : inputs) in.set_requires_grad(true);
    Tensor y;
    {
      CommDebugMode comm;
      y = block(inputs);
      EXPECT_EQ(comm.total_count(), 0) << comm.summary();
    }
    EXPECT_EQ(dtensor_spec(y).placements, (Placements{Partial()}));
    // Products of non-integers summed over split features: kSplitSum.
    expect_close({.actual = full_tensor(y),
                  .expected = expected,
                  .tol = kSplitSum,
                  .what = "attention block"});
    backward(sum(full_tensor(y)));
    for (size_t i = 0; i < inputs.size(); ++i) {
      EXPECT_EQ(dtensor_spec(inputs[i].grad()).placements, dtensor_spec(inputs[i]).placements) << i;
      expect_close({.actual = full_tensor(inputs[i].grad()),
                    .expected = reference[i].grad(),
                    .tol = kSplitSum,
                    .what = "grad " + std::to_string(i)});
    }
  });
}

}  // namespace
}  // namespace loom
