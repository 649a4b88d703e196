// Multi-head latent attention (models/llama: LatentAttention, DeepSeek-V2/V3's MLA) against the
// formula computed here in f64 from the module's own weights — low-rank queries and latent keys
// and values, RMSNorm on both ranks, RoPE on the rotary parts (the key's shared by every head),
// causal softmax at 1 / sqrt(nope + rope) — within 1e-5; and a Llama with MLA (and MoE) trained 4
// AdamW steps on tp2 (with and without SP, heads split over tp), dp_shard2 x tp2, dp_shard2 and
// cp2 (allgather and Ulysses) equal to one rank (expect_same), also with attention dropout (tp2,
// cp2 alltoall).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "comm/testing/multi_rank.h"
#include "dtensor/dtensor.h"
#include "models/llama/family.h"
#include "models/llama/llama.h"
#include "tensor/ops.h"
#include "tensor/rng.h"
#include "tests/models/gpt_training_run.h"
#include "tests/testing/tensor_checks.h"
#include "train/parallel_model.h"
#include "train/trainer.h"

namespace loom::models {
namespace {

LlamaConfig mla_config(bool q_lora) {
  LlamaConfig c = LlamaConfig::preset("llama-tiny");
  c.dim = 32;
  c.n_heads = 4;
  c.n_kv_heads = 4;
  c.max_seq_len = 64;
  c.rope_scaling = std::nullopt;
  c.mla = MLAOptions{.q_lora_rank = q_lora ? 16 : 0,
                     .kv_lora_rank = 8,
                     .qk_nope_head_dim = 6,
                     .qk_rope_head_dim = 4,
                     .v_head_dim = 5};
  return c;
}

// Row-major (rows, in) @ w^T (out, in), in f64.
std::vector<double> project(const std::vector<double>& x, int64_t rows, const Tensor& w) {
  const std::vector<double> wv = ops::to_vector(w);
  const int64_t out = w.size(0), in = w.size(1);
  std::vector<double> y(rows * out, 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t i = 0; i < in; ++i) y[r * out + o] += x[r * in + i] * wv[o * in + i];
    }
  }
  return y;
}

std::vector<double> rms_norm(std::vector<double> x, int64_t rows, const Tensor& weight,
                             double eps) {
  const std::vector<double> w = ops::to_vector(weight);
  const int64_t n = weight.size(0);
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t i = 0; i < n; ++i) ms += x[r * n + i] * x[r * n + i];
    const double scale = 1.0 / std::sqrt(ms / static_cast<double>(n) + eps);
    for (int64_t i = 0; i < n; ++i) x[r * n + i] *= scale * w[i];
  }
  return x;
}

// Meta's RoPE on dims (2i, 2i + 1) of a `width`-wide slice starting at `at` of every row of a
// (B * T, stride) matrix whose row r is at position r % T.
void rope(std::vector<double>& m, int64_t rows, int64_t time, int64_t stride, int64_t at,
          int64_t width, double theta) {
  for (int64_t r = 0; r < rows; ++r) {
    const double t = static_cast<double>(r % time);
    for (int64_t i = 0; i < width / 2; ++i) {
      const double angle = t / std::pow(theta, static_cast<double>(2 * i) / width);
      double& a = m[r * stride + at + 2 * i];
      double& b = m[r * stride + at + 2 * i + 1];
      const double a0 = a, b0 = b;
      a = a0 * std::cos(angle) - b0 * std::sin(angle);
      b = a0 * std::sin(angle) + b0 * std::cos(angle);
    }
  }
}

void check_against_formula(bool q_lora) {
  SCOPED_TRACE(q_lora ? "with q_lora_rank" : "queries straight from the input");
  const LlamaConfig c = mla_config(q_lora);
  const MLAOptions& m = *c.mla;
  auto tables = std::make_shared<const RopeTables>(rope_tables(c));
  LatentAttention attention(c, 3, tables);
  constexpr int64_t kB = 2, kT = 7;
  const Tensor x = ops::normal({kB, kT, c.dim}, 9);
  const Tensor got = attention(x);
  const int64_t rows = kB * kT, h = c.n_heads, qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
  const std::vector<double> xv = ops::to_vector(x);
  std::vector<double> q =
      q_lora ? project(rms_norm(project(xv, rows, attention.wq_a->weight()), rows,
                                attention.q_norm->weight(), LatentAttention::kLatentNormEps),
                       rows, attention.wq_b->weight())
             : project(xv, rows, attention.wq->weight());
  for (int64_t head = 0; head < h; ++head) {  // each head's rotary part, row stride h * qk
    rope(q, rows, kT, h * qk, head * qk + m.qk_nope_head_dim, m.qk_rope_head_dim, c.rope_theta);
  }
  std::vector<double> kv_a = project(xv, rows, attention.wkv_a->weight());
  const int64_t a_width = m.kv_lora_rank + m.qk_rope_head_dim;
  rope(kv_a, rows, kT, a_width, m.kv_lora_rank, m.qk_rope_head_dim, c.rope_theta);
  std::vector<double> latent(rows * m.kv_lora_rank);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < m.kv_lora_rank; ++i)
      latent[r * m.kv_lora_rank + i] = kv_a[r * a_width + i];
  }
  const std::vector<double> kv =
      project(rms_norm(latent, rows, attention.kv_norm->weight(), LatentAttention::kLatentNormEps),
              rows, attention.wkv_b->weight());
  const int64_t kv_width = m.qk_nope_head_dim + m.v_head_dim;
  std::vector<double> y(rows * h * m.v_head_dim, 0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(qk));
  for (int64_t b = 0; b < kB; ++b) {
    for (int64_t head = 0; head < h; ++head) {
      for (int64_t i = 0; i < kT; ++i) {
        const int64_t ri = b * kT + i;
        std::vector<double> s(i + 1);
        double top = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          const int64_t rj = b * kT + j;
          double dot = 0;
          for (int64_t d = 0; d < m.qk_nope_head_dim; ++d) {
            dot += q[ri * h * qk + head * qk + d] * kv[rj * h * kv_width + head * kv_width + d];
          }
          for (int64_t d = 0; d < m.qk_rope_head_dim; ++d) {
            dot += q[ri * h * qk + head * qk + m.qk_nope_head_dim + d] *
                   kv_a[rj * a_width + m.kv_lora_rank + d];
          }
          s[j] = dot * scale;
          top = std::max(top, s[j]);
        }
        for (int64_t j = 0; j <= i; ++j) sum += (s[j] = std::exp(s[j] - top));
        for (int64_t j = 0; j <= i; ++j) {
          const int64_t rj = b * kT + j;
          for (int64_t d = 0; d < m.v_head_dim; ++d) {
            y[ri * h * m.v_head_dim + head * m.v_head_dim + d] +=
                s[j] / sum * kv[rj * h * kv_width + head * kv_width + m.qk_nope_head_dim + d];
          }
        }
      }
    }
  }
  const std::vector<double> want = project(y, rows, attention.wo->weight());
  testing::expect_close({.actual = ops::reshape(got, {rows, c.dim}),
                         .expected = want,
                         .tol = {.rtol = 1e-5, .atol = 1e-6},
                         .what = "latent attention"});
}

TEST(LatentAttentionTest, EqualsTheFormula) {
  check_against_formula(true);
  check_against_formula(false);
}

TEST(LatentAttentionTest, ParameterCountIsTheModelsOwn) {
  for (bool q_lora : {true, false}) {
    const LlamaConfig c = mla_config(q_lora);
    const Llama model(c, 1);
    int64_t n = 0;
    for (const auto& [name, p] : model.named_parameters()) n += p.numel();
    EXPECT_EQ(n, c.parameter_count());
    EXPECT_EQ(c.parameter_count(), c.active_parameter_count());
  }
}

// A Llama with MLA and a MoE layer with a shared expert on layouts against one rank (under tp the
// experts' hidden width and the shared expert split over tp too).
constexpr int kSteps = 4;
constexpr int64_t kBatch = 4, kSeq = 32;

gpt_run::Result train_on(comm::ProcessGroup& pg, const train::ParallelDims& dims,
                         const std::string& attention = "allgather", bool sequence_parallel = true,
                         double attention_dropout = 0.0) {
  LlamaConfig c = mla_config(true);
  c.attention_dropout = attention_dropout;
  c.n_layers = 2;
  c.moe = nn::MoEOptions{.num_experts = 4, .top_k = 2, .hidden_dim = 16, .num_shared_experts = 1};
  c.moe_dense_layers = 1;
  const auto mesh = dims.build_mesh(pg.shared_from_this());
  const train::ParallelConfig parallel{.dims = dims,
                                       .tp_plan = {.sequence_parallel = sequence_parallel},
                                       .cp = {.attention = attention}};
  parallel.validate(pg.size(), kBatch, kSeq);
  auto model = train::build_parallel_model(*llama_args(c), 5, mesh, parallel);
  train::Trainer trainer(*model, mesh, {.lr = [](int) { return 3e-3; }, .clip = 0.5});
  const auto data = gpt_run::fox_corpus(257);
  gpt_run::Result run;
  for (int step = 0; step < kSteps; ++step) {
    const auto batch = train::local_batch(data, 11, step, *mesh, kBatch, kSeq, parallel.cp);
    models::gpt_run::record_step(run, trainer.step(batch.inputs, batch.targets), model.get());
  }
  models::gpt_run::record_final_state(run, *model);
  return run;
}

TEST(LatentAttentionTest, LayoutsEqualOneRank) {
  gpt_run::Result expected;
  comm::testing::run_on_ranks(1, [&](comm::ProcessGroup& pg) { expected = train_on(pg, {}); });
  const auto check = [&](const train::ParallelDims& dims, const std::string& attention,
                         const std::string& layout, bool sp = true) {
    SCOPED_TRACE(layout);
    comm::testing::run_on_ranks(static_cast<int>(dims.world_size()), [&](comm::ProcessGroup& pg) {
      gpt_run::expect_same(
          {.actual = train_on(pg, dims, attention, sp), .expected = expected, .layout = layout});
    });
  };
  // tp splits the heads: the shared rotary key's gradient summed over tp (without that sum the
  // low-rank weights train wrong; tried).
  check({.tp = 2}, "allgather", "tp2 (SP)");
  check({.tp = 2}, "allgather", "tp2 without SP", /*sp=*/false);
  check({.dp_shard = 2, .tp = 2}, "allgather", "dp_shard2 x tp2");
  check({.dp_shard = 2}, "allgather", "dp_shard2");
  check({.cp = 2}, "allgather", "cp2 allgather");
  check({.cp = 2}, "alltoall", "cp2 alltoall");
}

// Attention dropout 0.1: a tp rank's heads (wq_b's row shard) and a cp rank's queries drop their
// slice of one rank's masks.
TEST(LatentAttentionTest, AttentionDropoutOnLayoutsEqualsOneRank) {
  constexpr double kDropout = 0.1;
  gpt_run::Result expected;
  comm::testing::run_on_ranks(
      1, [&](comm::ProcessGroup& pg) { expected = train_on(pg, {}, "allgather", true, kDropout); });
  for (const auto& [dims, attention, layout] :
       std::vector<std::tuple<train::ParallelDims, std::string, std::string>>{
           {{.tp = 2}, "allgather", "tp2 (SP), attention dropout"},
           {{.cp = 2}, "alltoall", "cp2 alltoall, attention dropout"}}) {
    comm::testing::run_on_ranks(static_cast<int>(dims.world_size()), [&](comm::ProcessGroup& pg) {
      gpt_run::expect_same({.actual = train_on(pg, dims, attention, true, kDropout),
                            .expected = expected,
                            .layout = layout});
    });
  }
}

}  // namespace
}  // namespace loom::models
