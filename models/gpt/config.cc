#include "models/gpt/config.h"

#include "base/error.h"

namespace loom::models {

GPTConfig GPTConfig::preset(const std::string& name) {
  if (name == "tiny")
    return GPTConfig{.n_layer = 2, .n_head = 4, .n_embd = 64, .block_size = 64, .vocab_size = 256};
  if (name == "small") {
    return GPTConfig{
        .n_layer = 12, .n_head = 12, .n_embd = 768, .block_size = 1024, .vocab_size = 50257};
  }
  if (name == "gpt3-175b") {  // Brown et al. 2020, Table 2.1 (for planning: loom plan)
    return GPTConfig{
        .n_layer = 96, .n_head = 96, .n_embd = 12288, .block_size = 2048, .vocab_size = 50257};
  }
  LOOM_FAIL("GPTConfig: unknown preset '{}' (expected tiny, small or gpt3-175b)", name);
}

void GPTConfig::validate() const {
  LOOM_CHECK(n_layer > 0 && n_head > 0 && n_embd > 0 && block_size > 0 && vocab_size > 0,
             "GPTConfig: sizes must be positive, got n_layer={} n_head={} n_embd={} block_size={} "
             "vocab_size={}",
             n_layer, n_head, n_embd, block_size, vocab_size);
  LOOM_CHECK(n_embd % n_head == 0, "GPTConfig: n_embd={} is not divisible by n_head={}", n_embd,
             n_head);
  LOOM_CHECK(dropout >= 0.0 && dropout < 1.0, "GPTConfig: dropout must be in [0, 1), got {}",
             dropout);
  LOOM_CHECK(attn_dropout >= 0.0 && attn_dropout < 1.0,
             "GPTConfig: attn_dropout must be in [0, 1), got {}", attn_dropout);
}

int64_t GPTConfig::parameter_count() const {
  const int64_t c = n_embd;
  // Per block: 2 norms (4C), c_attn (3C^2 + 3C), c_proj (C^2 + C), c_fc (4C^2 + 4C), c_proj (4C^2 +
  // C).
  return vocab_size * c + block_size * c + n_layer * (12 * c * c + 13 * c) + 2 * c;
}

}  // namespace loom::models
