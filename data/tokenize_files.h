// Text files in, llm.c token shards out (`./loom tokenize`): what llm.c's and nanoGPT's prepare
// scripts do, in C++, in parallel over the cores.
//
// Documents: a text file is one document; a .jsonl file holds one per line (its `text_field`
// string, as Hugging Face datasets export them: data/text_documents.h, which also refuses
// compressed and binary files). Each document's tokens follow the document separator, as llm.c's
// fineweb.py puts `tokenizer.encode('')[0]` before each document (Tokenizer::document_start:
// GPT-2's <|endoftext|>, Llama 3's <|begin_of_text|>), so --document-boundaries finds them again.
//
// Parallelism: the input is cut into chunks of about `chunk_bytes` (a text file at a line start;
// a .jsonl file between lines) encoded on `threads` threads. A text chunk is encoded from its
// start to the first pre-token boundary at or past its end (Tokenizer::encode_range); the next
// chunk's tokens are taken only when that boundary is exactly where the next chunk starts, and
// re-encoded from the boundary otherwise. So the shards hold exactly the tokens of encoding each
// document whole, whatever the chunking and thread count (the tests check it).
//
// Output: `{output}/{prefix}_{NNNNNN}.bin`, shards of `shard_tokens` tokens (the last shorter),
// uint16 tokens when the vocabulary fits, else uint32; each written to a .tmp file and renamed
// into place when whole (data/token_file.h). With val_tokens > 0 the first val_tokens tokens go
// to `{output}/val_{NNNNNN}.bin` instead (llm.c keeps its first shard for validation); taking
// every token for it is an error. A run that fails (a bad line, a full disk) removes the shards
// it wrote: none is left for a glob to read as if it were the whole corpus.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace loom::data {

struct TokenizeProgress {
  int64_t bytes_done = 0, bytes_total = 0, tokens = 0, documents = 0;
  double seconds = 0;
};

struct TokenizeOptions {
  std::vector<std::string> inputs;  // files and folders (a folder's files in name order)
  std::string output;               // folder, created if missing
  std::string prefix = "train";
  int64_t shard_tokens = 100'000'000;  // llm.c's
  int64_t val_tokens = 0;
  int threads = 0;  // 0: every core
  int64_t chunk_bytes = int64_t{1} << 22;
  std::string text_field = "text";  // of a .jsonl line
  // Before each document; nullopt: the tokenizer's document_start() (none when it has none).
  std::optional<int32_t> document_separator;
  bool no_separator = false;                              // put nothing between documents
  std::function<void(const TokenizeProgress&)> progress;  // after each batch of chunks
  // Before any file is read: what the inputs hold that is not read (a folder's subfolders) or is
  // read twice (a file named twice, by any spelling or link): one line each.
  std::function<void(const std::string&)> warn;
};

struct TokenizeResult {
  TokenizeProgress totals;
  std::vector<std::string> shards;  // written, in order (val shards first)
  int token_bytes = 2;
};

// Throws loom::Error naming the file (and line, for .jsonl) that cannot be read or parsed.
TokenizeResult tokenize_files(const Tokenizer& tokenizer, const TokenizeOptions& options);

}  // namespace loom::data
