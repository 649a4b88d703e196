// Which part of a layered model (a GPT, a Llama) one pipeline stage holds: blocks
// [first_block, end_block), plus the input embeddings when it is the first stage and the final
// norm and output head when it is the last. The whole model is one stage that is both.
#pragma once

#include <cstdint>

namespace loom::models {

struct StageRange {
  int64_t first_block = 0;
  int64_t end_block = 0;
  bool first = true;
  bool last = true;

  bool has_blocks() const { return end_block > first_block; }
};

}  // namespace loom::models
