// A Llama-family model (Llama 3's architecture, torchtitan's module names): token embeddings,
// pre-norm blocks of grouped-query attention with rotary position embeddings and a SwiGLU
// feed-forward, a final RMSNorm and an output head (untied, or tied to the embeddings).
//
//   models::Llama model(models::LlamaConfig::preset("llama-tiny"), /*seed=*/1);
//   Tensor loss = model.loss(ids, targets);   // ids, targets: (B, T) int64
//
// Names: tok_embeddings.weight, layers.{i}.attention.{wq,wk,wv,wo}.weight,
// layers.{i}.attention_norm.weight, layers.{i}.feed_forward.{w1,w2,w3}.weight,
// layers.{i}.ffn_norm.weight, norm.weight, output.weight (none when tied: the head reads
// tok_embeddings.weight). Every projection is bias-free. A MoE
// layer has layers.{i}.moe.{gate.weight, experts.w1, experts.w2, experts.w3,
// shared_experts.*.weight} and the buffer layers.{i}.moe.expert_bias in place of feed_forward.
//
// With config.mla, layers.{i}.attention holds MLA's wq (or wq_a, q_norm, wq_b), wkv_a, kv_norm,
// wkv_b and wo.
// RoPE follows Meta's convention: dims (2i, 2i+1) of each head rotate together by position x
// frequency i (Hugging Face's checkpoints permute wq and wk for their rotate-half convention;
// the import undoes it). Attention computes on -1 heads, so a tensor-parallel rank's local heads
// (and local kv heads) run the same code. RMSNorm and RoPE are the fused rms_norm and rope ops.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/llama/config.h"
#include "models/tied_head.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/moe/moe.h"
#include "parallel/pipeline/stage_range.h"

namespace loom::models {

using pipeline::StageRange;

// x * rsqrt(mean(x^2 over the last dim) + eps) * weight (weight ones at init): the fused
// rms_norm op.
class RMSNorm : public nn::Module {
 public:
  RMSNorm(int64_t dim, double eps);
  Tensor forward(const Tensor& x) override;
  const Tensor& weight() const { return weight_; }
  void reset_parameters() override;  // ones

 private:
  double eps_;
  const Tensor& weight_;
};

// The rotation angles' cosines and sines, (max_seq_len, head_dim / 2) each, with Llama 3's
// frequency scaling when the config has it (computed in double, stored f32).
struct RopeTables {
  Tensor cos, sin;  // (max_seq_len, rotary_dim / 2) f32, on the CPU
  // cos and sin on `device`: the CPU's own; another device's copy is made at its first use and
  // kept (a GPU step reads them in every layer: no host-to-device copy per call). A traced CPU
  // job's meta copy stands for the CPU tables themselves, so it is charged to no tracker: the
  // job copies nothing, and `loom plan`'s peak is the job's.
  std::pair<Tensor, Tensor> on(Device device) const;
  struct Copies;
  std::shared_ptr<Copies> copies = new_copies();  // shared by copies of these tables
  static std::shared_ptr<Copies> new_copies();
};
RopeTables rope_tables(const LlamaConfig& config);
// x: (B, T, H, D); rotates pairs (2i, 2i+1) of every head by position t (rows [0, T) of the
// tables).
Tensor apply_rope(const Tensor& x, const RopeTables& tables);

class LlamaAttention : public nn::Module {
 public:
  // `rope`: the model's tables, shared by every layer.
  LlamaAttention(const LlamaConfig& config, uint64_t seed, std::shared_ptr<const RopeTables> rope);
  Tensor forward(const Tensor& x) override;  // (B, T, dim) -> (B, T, dim)
  std::shared_ptr<nn::Linear> wq, wk, wv, wo;

 private:
  int64_t head_dim_, group_;  // query heads per kv head
  std::shared_ptr<const RopeTables> rope_;
  // config.attention_dropout > 0 only (p and its RNG state; checkpoints without it load as
  // before).
  std::shared_ptr<nn::Dropout> attn_dropout_;
};

// DeepSeek's multi-head latent attention (config.mla): queries through wq (or wq_a, q_norm,
// wq_b), keys and values from the latent wkv_a -> kv_norm -> wkv_b, each head's query and key
// [nope part, RoPE part] with the key's RoPE part (from wkv_a) shared by every head, softmax scale
// 1 / sqrt(nope + rope) (with YaRN, times its softmax_factor), values of v_head_dim, then wo.
// Computes on -1 heads (a tp rank's). q_norm and kv_norm divide by sqrt(mean square + 1e-6)
// whatever the model's norm_eps, as DeepSeek's reference and transformers' DeepseekV3Attention do
// (their RMSNorm's default).
class LatentAttention : public nn::Module {
 public:
  static constexpr double kLatentNormEps = 1e-6;
  LatentAttention(const LlamaConfig& config, uint64_t seed, std::shared_ptr<const RopeTables> rope);
  Tensor forward(const Tensor& x) override;  // (B, T, dim) -> (B, T, dim)
  // How the key's rotary part, computed whole on every rank, reaches this rank's heads: as is,
  // or (tensor parallelism: heads split over tp) through an identity whose backward sums the
  // heads' partial gradients over tp (tp::copy_to_tensor_parallel_region).
  void set_shared_key_region(std::function<Tensor(const Tensor&)> region) {
    shared_key_region_ = std::move(region);
  }
  std::shared_ptr<nn::Linear> wq, wq_a, wq_b, wkv_a, wkv_b, wo;  // wq, or wq_a and wq_b
  std::shared_ptr<RMSNorm> q_norm, kv_norm;                      // q_norm with wq_a only

 private:
  MLAOptions options_;
  double softmax_scale_;  // 1 / sqrt(nope + rope), times YaRN's softmax_factor
  std::shared_ptr<const RopeTables> rope_;
  std::function<Tensor(const Tensor&)> shared_key_region_;
  std::shared_ptr<nn::Dropout> attn_dropout_;  // as LlamaAttention's
};

class LlamaFeedForward : public nn::Module {
 public:
  LlamaFeedForward(const LlamaConfig& config, uint64_t seed);
  Tensor forward(const Tensor& x) override;  // w2(silu(w1 x) * w3 x)
  std::shared_ptr<nn::Linear> w1, w2, w3;
};

// Layer `layer`'s block: attention, then the SwiGLU feed-forward or (LlamaConfig::is_moe_layer)
// the mixture of experts, named "moe".
class LlamaBlock : public nn::Module {
 public:
  LlamaBlock(const LlamaConfig& config, uint64_t seed, std::shared_ptr<const RopeTables> rope,
             int64_t layer = 0);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<RMSNorm> attention_norm, ffn_norm;
  std::shared_ptr<LlamaAttention> attention;          // null with MLA
  std::shared_ptr<LatentAttention> latent_attention;  // config.mla: named "attention" too
  std::shared_ptr<LlamaFeedForward> feed_forward;     // null in a MoE layer
  std::shared_ptr<nn::MoE> moe;                       // null in a dense layer
};

// A Llama's stage for pipeline parallelism (and, holding everything, the Llama itself): the
// blocks of `range` (parallel/pipeline/stage_range.h), the token embeddings on the first stage, the
// final norm and the output head on the last. Names, values and seeds are the whole model's
// ("layers.5.attention.wq.weight" on the stage holding block 5, initialized as the whole model
// initializes it), so a pipelined Llama equals the whole one.
//
// forward: first stage: token ids (B, T) -> hidden (B, T, dim); middle: hidden -> hidden; last:
// -> logits (B, T, vocab); a single stage: ids -> logits.
class LlamaStage : public nn::Module {
 public:
  LlamaStage(const LlamaConfig& config, uint64_t seed, StageRange range,
             std::string type_name = "LlamaStage");
  Tensor forward(const Tensor& input) override;
  const LlamaConfig& config() const { return config_; }
  const StageRange& range() const { return range_; }

  // Null when the stage does not hold them. With tie_word_embeddings the last stage holds
  // tok_embeddings too (its own copy for the head when it is not the first: the copies' gradients
  // are summed after each step, models/tied_embedding_pipeline.h), and output is a TiedHead.
  std::shared_ptr<nn::Embedding> tok_embeddings;
  std::vector<std::shared_ptr<LlamaBlock>> layers;  // blocks [range.first_block, range.end_block)
  std::shared_ptr<RMSNorm> norm;
  std::shared_ptr<nn::Module> output;  // an nn::Linear, or a TiedHead

 private:
  LlamaConfig config_;
  StageRange range_;
  std::shared_ptr<const RopeTables> rope_;
};

class Llama : public LlamaStage {
 public:
  Llama(const LlamaConfig& config, uint64_t seed);
  // Mean cross entropy of the logits of ids (B, T) against targets (B, T): llama_loss.
  Tensor loss(const Tensor& ids, const Tensor& targets);
};

// The mean next-token cross entropy of logits (B, T, V) against targets (B, T), a plain scalar.
// Vocabulary-sharded logits (a DTensor: the TP plan's loss parallel) take the loss-parallel path,
// never gathering the full logits. The pipeline's last stage calls it on its logits.
Tensor llama_loss(const Tensor& logits, const Tensor& targets);

}  // namespace loom::models
