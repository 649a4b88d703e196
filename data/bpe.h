// The BPE model of a byte-level tokenizer.json on raw bytes: one pre-token in, its token ids out,
// exactly as Hugging Face tokenizers' BPE model gives them (merges applied lowest rank first,
// leftmost first among equal ranks; `ignore_merges` emits a pre-token found whole in the
// vocabulary as is; a byte missing from the vocabulary becomes the unknown token, fused with its
// neighbours under `fuse_unk`, or is dropped when there is none).
//
// Merging is O(n log n) in the pre-token's length (a heap over a linked list of symbols, as HF
// does, for long pre-tokens; a flat scan for short ones), and each thread keeps a bounded cache
// of short pre-tokens' ids per model, so encoding is lock-free and the common case is one
// lookup.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

class Bpe {
 public:
  struct Merge {
    int32_t left;
    int32_t right;
    int32_t merged;  // the id of left's bytes followed by right's
  };
  struct Options {
    bool ignore_merges = false;
    std::optional<int32_t> unk_id;  // the unknown token, when the model has one
    bool fuse_unk = false;
  };
  // The per-thread cache of one model (see thread_cache).
  class Cache;

  // `tokens`: the vocabulary as (bytes, id); ids and byte strings are unique. `merges` in rank
  // order; a pair listed twice takes its later rank, as in HF.
  Bpe(const std::vector<std::pair<std::string, int32_t>>& tokens, const std::vector<Merge>& merges,
      Options options);
  ~Bpe();
  Bpe(const Bpe&) = delete;
  Bpe& operator=(const Bpe&) = delete;

  // This thread's cache for this model (created on first use; a thread keeps the caches of the
  // few models it used last). Fetch it once per batch of pieces, on the thread that encodes them.
  Cache* thread_cache() const;

  // Appends the ids of one pre-token (raw bytes, not empty).
  void encode(std::string_view piece, Cache* cache, std::vector<int32_t>& out) const;

  // The id of a vocabulary token given as raw bytes.
  std::optional<int32_t> find(std::string_view bytes) const;

 private:
  struct Table;
  struct MergeTable;

  void merge(int32_t* ids, size_t count, std::vector<int32_t>& out) const;
  void merge_long(const int32_t* ids, size_t count, std::vector<int32_t>& out) const;
  // The merge of (left, right): sets rank and merged and returns true, or returns false.
  bool lookup(int32_t left, int32_t right, uint32_t& rank, int32_t& merged) const;

  std::unique_ptr<Table> vocab_;
  std::unique_ptr<MergeTable> merges_;
  int32_t byte_ids_[256];
  Options options_;
  uint64_t uid_;  // distinguishes this model's per-thread caches from every other model's
};

}  // namespace loom::data
