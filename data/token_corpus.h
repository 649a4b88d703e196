// A training corpus: one stream of tokens read from many sources, in order.
//
// Sources: token shards (memory-mapped, data/token_file.h: llm.c's uint16 and uint32 formats,
// nanoGPT's raw uint16), and text files tokenized into memory as the corpus opens (bytes, or a
// tokenizer's ids: small jobs; a .jsonl file is one document per line, as `loom tokenize` reads
// it, and compressed or binary files are refused). `--data` names a file, a folder (its files in
// name order; hidden files, in-flight `*.tmp` and empty text files skipped), a glob pattern, or
// several of these separated by commas.
// Shards are read as one stream: a sequence may span the end of one shard and the start of the
// next, exactly as if the shards were one file.
//
// Memory: a shard costs its mapping's address space, not resident memory (the pages a read
// touches are released after it); only text sources and the document index (8 bytes per
// document, with --document-boundaries) are held.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/token_file.h"

namespace loom::data {

// How text sources become tokens.
struct TextTokenization {
  // A tokenizer's encode (data/tokenizer.h); empty: one token per byte (vocabulary 256).
  std::function<std::vector<int32_t>(std::string_view)> encode;
  int64_t vocab_size = 256;
  // Put before every document's tokens (a text file, or a .jsonl line's "text": as `loom tokenize`
  // writes them, data/text_documents.h).
  std::optional<int32_t> document_separator;
  std::string name = "byte-level tokens";  // for the corpus's description
};

// Where each document starts, for sampling windows that stay inside one document: a document
// runs from a separator token (included) to the next (excluded); tokens before the first
// separator are a document too. Windows of seq_len + 1 tokens that fit in a document are the
// only ones drawn; shorter documents are never sampled (reported by skipped_tokens()).
class DocumentIndex {
 public:
  DocumentIndex(std::vector<int64_t> starts, int64_t corpus_size, int64_t seq_len);
  int64_t windows() const { return total_windows_; }  // the start positions a window can take
  // The start of window `index` in [0, windows()).
  int64_t window_start(int64_t index) const;
  int64_t documents() const { return static_cast<int64_t>(starts_.size()); }
  int64_t separators() const { return separators_; }          // separator tokens found
  int64_t skipped_tokens() const { return skipped_tokens_; }  // in documents of <= seq_len tokens
  int64_t seq_len() const { return seq_len_; }

 private:
  std::vector<int64_t> starts_;          // each document's first position
  std::vector<int64_t> windows_before_;  // windows in documents before this one
  int64_t corpus_size_, seq_len_, total_windows_ = 0, skipped_tokens_ = 0, separators_ = 0;
};

// Which split of a folder of shards a spec takes: its training shards (--data) or its held-out
// ones (--val-data), told apart by a "val" word in their names (loom tokenize's val_000000.bin,
// llm.c's fineweb_val_000000.bin, nanoGPT's val.bin).
enum class DataSplit { kTraining, kValidation };

// The files a --data spec names: paths, folders and glob patterns, separated by commas. A folder
// gives its files in name order (hidden ones and in-flight writes left out); a folder holding
// shards gives only its .bin files, and when it holds both splits, `split`'s. Throws naming `flag`
// when a part names nothing.
std::vector<std::string> data_files(const std::string& spec, std::string_view flag,
                                    DataSplit split = DataSplit::kTraining);

class TokenCorpus {
 public:
  // Throws loom::Error naming `flag`, the path and the problem (nothing matches, a bad shard).
  static TokenCorpus open(const std::string& spec, const TextTokenization& text = {},
                          std::string_view flag = "--data", DataSplit split = DataSplit::kTraining);
  // Tokens held in memory (tests, small jobs).
  static TokenCorpus from_tokens(std::vector<int32_t> tokens, int64_t vocab_size,
                                 std::string description);

  int64_t size() const { return size_; }
  // The vocabulary the sources imply: 256 for bytes, a tokenizer's, GPT-2's 50257 for uint16
  // shards, Llama 3's 128256 for uint32 shards (the largest over the sources).
  int64_t vocab_size() const { return vocab_size_; }
  const std::string& description() const { return description_; }
  int64_t shards() const { return static_cast<int64_t>(sources_.size()); }

  // Tokens [start, start + count) of the stream, across shards.
  void read(int64_t start, int64_t count, int64_t* out) const;
  // Every token below `vocab_size`, else throws naming `what`, the shard, the token, its index
  // in the shard and its byte offset (the first such token in the stream). Reads the whole
  // corpus once, in chunks on every core (data/token_file.h: pread, nothing kept resident).
  void check_tokens_below(int64_t vocab_size, std::string_view what) const;
  // Finds every `separator` and from then on samples only windows inside one document.
  void index_documents(int32_t separator, int64_t seq_len);
  const DocumentIndex* documents() const { return documents_.get(); }

 private:
  struct Source {
    std::string name;
    std::shared_ptr<const MappedTokenFile> file;         // a shard, or
    std::shared_ptr<const std::vector<int32_t>> tokens;  // tokens in memory, of text
    std::string tokenized_by;                            // the text's TextTokenization::name
    int64_t tokenizer_vocab = 0;                         // and its vocab_size
    int64_t begin = 0, size = 0;                         // its place in the stream
  };
  // The corpus in chunks of a few MiB, for whole-corpus passes on every core.
  struct Chunk {
    const Source* source;
    int64_t begin, count;  // within the source
  };
  std::vector<Chunk> chunks() const;
  void add(Source source);
  size_t source_of(int64_t position) const;  // the source holding stream position `position`

  std::vector<Source> sources_;
  int64_t size_ = 0, vocab_size_ = 0;
  std::string description_;
  std::shared_ptr<const DocumentIndex> documents_;
};

}  // namespace loom::data
