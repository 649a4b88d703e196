// The GPT both GPT-2 import/export suites use (one rank and tensor parallel).
#pragma once

#include "models/gpt/gpt.h"

namespace loom::models {

// Several heads, so head-major and q|k|v-major orders really differ; a vocabulary (37) that no
// mesh size divides.
inline GPTConfig gpt2_hf_test_config() {
  return GPTConfig{
      .n_layer = 2, .n_head = 4, .n_embd = 16, .block_size = 8, .vocab_size = 37, .dropout = 0.0};
}

}  // namespace loom::models
