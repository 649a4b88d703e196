// The batches each data-parallel rank reads from a corpus (data/token_corpus.h).
//
// Training batches are a pure function of (seed, step): the global batch of B sequences starts
// at positions drawn from the counter-based RNG over the whole stream (or, with a document
// index, over the windows inside one document), and dp rank r takes sequences
// [r*B/dp, (r+1)*B/dp). Changing only the parallel layout, resuming, or splitting the same
// tokens into other shards never changes which tokens a step trains on.
//
// Validation batches are fixed: batch i of a global batch of B takes the corpus's windows
// i*B .. (i+1)*B - 1, consecutive and non-overlapping (llm.c's), so every evaluation of a run
// sees the same tokens.
#pragma once

#include <cstdint>
#include <string>

#include "data/token_corpus.h"
#include "tensor/tensor.h"

namespace loom::data {

struct Batch {
  Tensor inputs;   // (b, T) i64
  Tensor targets;  // (b, T) i64, inputs shifted by one
};

// Throws naming the data unless it holds one sequence of `seq_len` tokens and its target (at
// least seq_len + 1 tokens; with a document index, one document that long): what batch_slice
// needs, checked before a job starts.
void check_sequences_fit(const TokenCorpus& data, int64_t seq_len);

// Sequences [first, first + count) of step `step`'s global batch.
Batch batch_slice(const TokenCorpus& data, uint64_t seed, int64_t step, int64_t first,
                  int64_t count, int64_t seq_len);

// How many validation batches of `global_batch` sequences the corpus holds (whole,
// non-overlapping windows of seq_len + 1 tokens).
int64_t validation_batches(const TokenCorpus& data, int64_t global_batch, int64_t seq_len);
// Sequences [first, first + count) of validation batch `index` (< validation_batches).
Batch validation_slice(const TokenCorpus& data, int64_t index, int64_t global_batch, int64_t first,
                       int64_t count, int64_t seq_len);

// Entropy (nats per token) of the unigram distribution of the data's first 16M tokens: the loss
// a model that ignores context can reach, so a trained model's loss should fall well below it.
double unigram_entropy(const TokenCorpus& data);

}  // namespace loom::data
