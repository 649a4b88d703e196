#include "data/token_data.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.h"
#include "tensor/ops.h"
#include "tensor/rng.h"

namespace loom::data {

namespace {

// Reads `count` windows of seq_len + 1 tokens at `starts` into a batch.
Batch windows(const TokenCorpus& data, const std::vector<int64_t>& starts, int64_t seq_len) {
  const auto count = static_cast<int64_t>(starts.size());
  std::vector<int64_t> inputs(static_cast<size_t>(count * seq_len)),
      targets(static_cast<size_t>(count * seq_len)), window(static_cast<size_t>(seq_len + 1));
  for (int64_t s = 0; s < count; ++s) {
    data.read(starts[static_cast<size_t>(s)], seq_len + 1, window.data());
    std::copy_n(window.begin(), seq_len, inputs.begin() + s * seq_len);
    std::copy_n(window.begin() + 1, seq_len, targets.begin() + s * seq_len);
  }
  return {ops::from_vector_i64(inputs, {count, seq_len}),
          ops::from_vector_i64(targets, {count, seq_len})};
}

}  // namespace

void check_sequences_fit(const TokenCorpus& data, int64_t seq_len) {
  LOOM_CHECK(data.size() > seq_len,
             "--data: {} holds {} tokens, too few for sequences of {} (+1): give more data or a "
             "shorter --seq-len",
             data.description(), data.size(), seq_len);
  if (const DocumentIndex* documents = data.documents()) {
    LOOM_CHECK(documents->seq_len() == seq_len,
               "--data: the document index of {} was built for sequences of {}, not {}",
               data.description(), documents->seq_len(), seq_len);
    LOOM_CHECK(documents->windows() > 0,
               "--document-boundaries: none of the {} documents of {} holds {} tokens (a "
               "sequence of --seq-len {} and its target); give longer documents, a shorter "
               "--seq-len, or no --document-boundaries",
               documents->documents(), data.description(), seq_len + 1, seq_len);
  }
}

Batch batch_slice(const TokenCorpus& data, uint64_t seed, int64_t step, int64_t first,
                  int64_t count, int64_t seq_len) {
  check_sequences_fit(data, seq_len);
  const DocumentIndex* documents = data.documents();
  // Start positions 0 .. tokens - seq_len - 1: a window of seq_len inputs and the target after
  // each, so data of exactly seq_len + 1 tokens holds one sequence.
  const int64_t span = documents ? documents->windows() : data.size() - seq_len;
  std::vector<int64_t> starts;
  for (int64_t s = first; s < first + count; ++s) {
    // Start of sequence s of this step: a counter-based draw keyed by (seed, step, s).
    const auto words =
        philox4x32({static_cast<uint32_t>(s), static_cast<uint32_t>(step), 0x5eed, 0},
                   {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
    const auto draw = static_cast<int64_t>((static_cast<uint64_t>(words[0]) << 32 | words[1]) %
                                           static_cast<uint64_t>(span));
    starts.push_back(documents ? documents->window_start(draw) : draw);
  }
  return windows(data, starts, seq_len);
}

int64_t validation_batches(const TokenCorpus& data, int64_t global_batch, int64_t seq_len) {
  // Window w covers tokens [w * seq_len, (w + 1) * seq_len]: consecutive windows share one token
  // (the last target is the next input), as llm.c's loader reads them.
  const int64_t windows = (data.size() - 1) / seq_len;
  return windows / global_batch;
}

Batch validation_slice(const TokenCorpus& data, int64_t index, int64_t global_batch, int64_t first,
                       int64_t count, int64_t seq_len) {
  const int64_t batches = validation_batches(data, global_batch, seq_len);
  LOOM_CHECK(index >= 0 && index < batches,
             "validation batch {} of {}: it holds {} batches of {} sequences of {} tokens", index,
             data.description(), batches, global_batch, seq_len);
  std::vector<int64_t> starts;
  for (int64_t s = first; s < first + count; ++s)
    starts.push_back((index * global_batch + s) * seq_len);
  return windows(data, starts, seq_len);
}

double unigram_entropy(const TokenCorpus& data) {
  const int64_t n = std::min<int64_t>(data.size(), int64_t{1} << 24);
  std::vector<int64_t> counts(static_cast<size_t>(data.vocab_size()) + 1);
  std::vector<int64_t> tokens;
  constexpr int64_t kChunk = int64_t{1} << 16;  // a chunk at a time: memory stays flat
  for (int64_t at = 0; at < n; at += kChunk) {
    tokens.resize(static_cast<size_t>(std::min(kChunk, n - at)));
    data.read(at, static_cast<int64_t>(tokens.size()), tokens.data());
    for (int64_t t : tokens) {
      ++counts[static_cast<size_t>(std::clamp<int64_t>(t, 0, data.vocab_size()))];
    }
  }
  double entropy = 0;
  for (int64_t c : counts) {
    if (c > 0) entropy -= c / static_cast<double>(n) * std::log(c / static_cast<double>(n));
  }
  return entropy;
}

}  // namespace loom::data
