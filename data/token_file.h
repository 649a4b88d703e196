// One file of training tokens, memory-mapped: what a token shard is on disk.
//
// Formats (read by open_token_file; the first three written by TokenFileWriter):
//   llm.c GPT-2   int32[256] header {20240520, version 1, token count, 0...}, then uint16 tokens
//   llm.c Llama 3 int32[256] header {20240801, version 7, token count, 0...}, then uint32 tokens
//   nanoGPT       raw uint16 tokens, no header (a .bin file whose first int32 is no llm.c magic)
// A header whose first int32 looks like an llm.c magic (2024xxxx) but is neither known one is an
// error, not raw tokens; so is a version other than the magic's, a count the file does not hold
// (a truncated shard) and bytes after the declared tokens.
//
// Resident memory: batches read through the read-only mapping (MADV_RANDOM: no read-around), and
// every read releases the pages it touched (madvise MADV_DONTNEED: they stay in the page cache,
// shared, but leave this process's resident set); whole-file passes (the range check, the
// document index) pread chunk by chunk into one buffer. A rank's resident memory does not grow
// with the corpus or with the steps trained.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "base/durable_file.h"

namespace loom::data {

inline constexpr int32_t kLlmcGpt2Magic = 20240520;    // uint16 tokens, version 1
inline constexpr int32_t kLlmcLlama3Magic = 20240801;  // uint32 tokens, version 7
inline constexpr size_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

enum class TokenFileFormat { kLlmcUint16, kLlmcUint32, kRawUint16 };

// A read-only mapping of one token file. Moves, never copies; unmaps on destruction.
class MappedTokenFile {
 public:
  MappedTokenFile(const MappedTokenFile&) = delete;
  MappedTokenFile& operator=(const MappedTokenFile&) = delete;
  ~MappedTokenFile();

  // Throws loom::Error naming the path and what is wrong with it (missing, a folder, empty, an
  // unknown magic, a version, a truncated shard, trailing bytes).
  static std::unique_ptr<MappedTokenFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  TokenFileFormat format() const { return format_; }
  int64_t size() const { return count_; }     // tokens
  int token_bytes() const { return width_; }  // 2 or 4
  // The vocabulary the format implies: GPT-2's 50257 for uint16 files, Llama 3's 128256 for
  // uint32 ones (what a model without a stated vocabulary is given).
  int64_t implied_vocab_size() const;
  std::string format_name() const;

  // Tokens [start, start + count) into out (widened to int64), then releases the pages read.
  void read(int64_t start, int64_t count, int64_t* out) const;
  // The largest token in [start, start + count) and the first position holding it, read with
  // pread (not through the mapping). For the range check of a whole shard, chunk by chunk.
  struct MaxToken {
    uint32_t value = 0;
    int64_t position = 0;
  };
  MaxToken max_token(int64_t start, int64_t count) const;
  // Calls fn(position) for each token equal to `token` in [start, start + count).
  template <typename Fn>
  void for_each_equal(int64_t start, int64_t count, uint32_t token, Fn&& fn) const;
  // Byte offset of token `index` in the file (for errors that name where a token sits).
  int64_t byte_offset(int64_t index) const { return data_offset_ + index * width_; }

 private:
  MappedTokenFile() = default;
  void release(int64_t start, int64_t count) const;
  // Tokens [start, start + count) read into a thread-local buffer (whole-file passes).
  const unsigned char* scan_read(int64_t start, int64_t count) const;

  std::string path_;
  TokenFileFormat format_ = TokenFileFormat::kRawUint16;
  const unsigned char* map_ = nullptr;
  int fd_ = -1;
  size_t map_bytes_ = 0;
  int64_t data_offset_ = 0;
  int64_t count_ = 0;
  int width_ = 2;
};

template <typename Fn>
void MappedTokenFile::for_each_equal(int64_t start, int64_t count, uint32_t token, Fn&& fn) const {
  const unsigned char* base = scan_read(start, count);
  if (width_ == 2) {
    const auto* tokens = reinterpret_cast<const uint16_t*>(base);
    for (int64_t i = 0; i < count; ++i) {
      if (tokens[i] == token) fn(start + i);
    }
  } else {
    const auto* tokens = reinterpret_cast<const uint32_t*>(base);
    for (int64_t i = 0; i < count; ++i) {
      if (tokens[i] == token) fn(start + i);
    }
  }
}

// Writes one token shard in llm.c's format (uint16 with GPT-2's magic when every token fits,
// else uint32 with Llama 3's: the caller picks by the vocabulary), atomically: PATH.tmp is
// streamed, then renamed over PATH (base/durable_file.h). The header's count is written at
// commit().
class TokenFileWriter {
 public:
  TokenFileWriter(const std::string& path, int token_bytes, std::string_view what);
  void append(std::span<const int32_t> tokens);
  int64_t size() const { return count_; }
  void commit();

 private:
  AtomicFileWriter file_;
  std::string path_;
  int width_;
  int64_t count_ = 0;
};

// The token width a vocabulary needs: 2 bytes below 65536 tokens, else 4.
int token_bytes_for_vocab(int64_t vocab_size);

}  // namespace loom::data
