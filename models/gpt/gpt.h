// GPT-2 (the layout and tensor names of Hugging Face's GPT2LMHeadModel / nanoGPT):
//
//   wte (V, C), wpe (block_size, C)
//   h.{i}.ln_1, h.{i}.attn.c_attn (C -> 3C), h.{i}.attn.c_proj (C -> C),
//   h.{i}.ln_2, h.{i}.mlp.c_fc (C -> 4C), h.{i}.mlp.c_proj (4C -> C)
//   ln_f; lm_head tied to wte (logits = x @ wte^T; no separate parameter)
//
// Linear weights are stored (out, in) as torch.nn.Linear; HF's Conv1D checkpoints store them
// transposed, which the safetensors loader handles. c_attn's 3C output features are stored
// head-major — [head 0: q k v][head 1: q k v]... — rather than GPT-2's [all q][all k][all v], so
// that sharding c_attn's rows over tensor-parallel ranks gives each rank whole heads with their
// q, k and v (the import/export of Hugging Face checkpoints permutes between the two). GELU is the
// tanh approximation; attention is causal. init_weights() follows GPT-2: N(0, 0.02), residual
// projections (c_proj) scaled by 1/sqrt(2 n_layer), biases zero, LayerNorm weight one.
#pragma once

#include <memory>
#include <vector>

#include "models/gpt/config.h"
#include "models/tied_head.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "parallel/pipeline/stage_range.h"

namespace loom::models {

using pipeline::StageRange;

class CausalSelfAttention : public nn::Module {
 public:
  CausalSelfAttention(const GPTConfig& config, uint64_t seed);
  // (B, T, C) -> (B, T, C)
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<nn::Linear> c_attn, c_proj;

 private:
  int64_t head_dim_;
  // HF's attn_dropout (null when the config's attn_dropout is 0): its p and RNG state; the
  // attention kernels draw the mask.
  std::shared_ptr<nn::Dropout> attn_dropout_;
  std::shared_ptr<nn::Dropout> resid_dropout_;
};

class MLP : public nn::Module {
 public:
  MLP(const GPTConfig& config, uint64_t seed);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<nn::Linear> c_fc, c_proj;

 private:
  std::shared_ptr<nn::Dropout> dropout_;
};

class Block : public nn::Module {
 public:
  Block(const GPTConfig& config, uint64_t seed);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<MLP> mlp;
};

// GPT-2 initialization of every parameter of `module` (a GPT or a pipeline stage of one), by
// name: each value depends only on (seed, the parameter's name), so a stage holding "h.5..."
// initializes it exactly as the whole model does.
void init_gpt_weights(nn::Module& module, int64_t n_layer, uint64_t seed);

// Which part of a GPT a module holds (parallel/pipeline/stage_range.h: blocks h.[first_block,
// end_block), wte and wpe on the first stage, ln_f and the tied head on the last).
using GPTStageRange = StageRange;

// A GPT's stage for pipeline parallelism (and, holding everything, the GPT itself): parameter
// names are the whole model's ("h.5.attn.c_attn.weight" on the stage holding block 5), values
// and dropout seeds too, so a pipelined model equals the whole one. The last stage holds its own
// copy of wte for the tied head (Megatron's approach: the copies start equal and the two
// stages sum their gradients, models/gpt/pipeline.h).
//
// forward: first stage: token ids (B, T) -> hidden (B, T, C); middle: hidden -> hidden; last:
// -> logits (B, T, V); a single stage: ids -> logits.
class GPTStage : public nn::Module {
 public:
  GPTStage(GPTConfig config, uint64_t seed, GPTStageRange range,
           std::string type_name = "GPTStage");
  Tensor forward(const Tensor& input) override;
  // GPT-2 initialization from the stage's seed (init_gpt_weights): each parameter's values depend
  // only on (seed, its name), whatever its submodules' own initialization.
  void init_weights() override;

  const GPTConfig& config() const { return config_; }
  const GPTStageRange& range() const { return range_; }
  // Null when the stage does not hold them (wte: held by the first and the last stage).
  std::shared_ptr<nn::Embedding> wte, wpe;
  std::vector<std::shared_ptr<Block>> h;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<TiedHead> lm_head;  // tied to wte (models/tied_head.h)

 private:
  GPTConfig config_;
  GPTStageRange range_;
  uint64_t seed_;
  std::shared_ptr<nn::Dropout> drop_;
};

class GPT : public GPTStage {
 public:
  explicit GPT(GPTConfig config, uint64_t seed = 0);
  // Mean next-token cross entropy of logits(idx) against targets (B, T) (ignore_index -100), a
  // plain scalar. Logits that are a DTensor (a plan sharded the vocabulary) take the loss parallel
  // path: the targets are replicated on their mesh and the full logits are never gathered.
  Tensor loss(const Tensor& idx, const Tensor& targets);
};

// The loss of logits (B, T, V) against targets (B, T), as GPT::loss (the pipeline's last stage
// calls it on its logits).
Tensor gpt_loss(const Tensor& logits, const Tensor& targets);

}  // namespace loom::models
