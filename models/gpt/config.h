// GPT configuration (GPT-2's hyperparameter names) and presets.
#pragma once

#include <cstdint>
#include <string>

namespace loom::models {

struct GPTConfig {
  int64_t n_layer = 2;
  int64_t n_head = 2;
  int64_t n_embd = 64;
  int64_t block_size = 64;    // maximum sequence length
  int64_t vocab_size = 256;   // byte-level by default
  double dropout = 0.0;       // embeddings and residual branches (HF: embd_pdrop, resid_pdrop)
  double attn_dropout = 0.0;  // attention probabilities (HF: attn_pdrop), inside the kernels

  // "tiny": a few-minute CPU model; "small": GPT-2 124M (vocab 50257, 12 layers, 768 wide).
  static GPTConfig preset(const std::string& name);
  // Throws naming the field when a value is invalid (n_embd % n_head, non-positive sizes).
  void validate() const;
  int64_t head_dim() const { return n_embd / n_head; }
  // Parameters of the whole model, the tied head counted once (GPT-2 small: 124,439,808).
  int64_t parameter_count() const;
};

}  // namespace loom::models
