// Training tokens and the batches each data-parallel rank reads.
//
// Files: any text file (byte-level tokens, vocabulary 256), or a GPT-2-tokenized token file as
// llm.c writes (.bin with its 256-int32 header, magic 20240520, uint16 tokens) or nanoGPT writes
// (.bin, raw uint16 tokens).
//
// Batches are a pure function of (seed, step): the global batch of B sequences starts at
// positions drawn from the counter-based RNG, and dp rank r takes sequences
// [r*B/dp, (r+1)*B/dp). Changing only the parallel layout never changes which tokens a step
// trains on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace loom::data {

struct TokenData {
  std::vector<int32_t> tokens;
  int64_t vocab_size;  // 256 for bytes, 50257 for GPT-2 token files
  std::string description;
};

// Throws naming the path and the problem (missing, empty, too short, bad header).
TokenData load_tokens(const std::string& path);

struct Batch {
  Tensor inputs;   // (b, T) i64
  Tensor targets;  // (b, T) i64, inputs shifted by one
};

// Throws naming the data unless it holds one sequence of `seq_len` tokens and its target (at
// least seq_len + 1 tokens): what batch_slice needs, checked before a job starts.
void check_sequences_fit(const TokenData& data, int64_t seq_len);

// Sequences [first, first + count) of step `step`'s global batch.
Batch batch_slice(const TokenData& data, uint64_t seed, int64_t step, int64_t first, int64_t count,
                  int64_t seq_len);

// Entropy (nats per token) of the data's unigram distribution: the loss a model that ignores
// context can reach, so a trained model's loss should fall well below it.
double unigram_entropy(const TokenData& data);

}  // namespace loom::data
