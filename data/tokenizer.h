// A byte-level BPE tokenizer read from a Hugging Face tokenizer.json (GPT-2's, Llama 3's, and
// any other with the same pipeline), giving the ids Hugging Face tokenizers gives.
//
// Supported (anything else throws naming the file, the key, what it holds and what is
// supported):
//   normalizer     null
//   pre_tokenizer  ByteLevel (use_regex: GPT-2's pattern; add_prefix_space), or a Sequence of
//                  Split (Regex or String pattern, behavior "Isolated", invert false) steps
//                  followed by ByteLevel (data/pretokenizer.h)
//   model          BPE on the ByteLevel alphabet: vocab, merges ("a b" strings or [a, b] pairs),
//                  ignore_merges, unk_token and fuse_unk; dropout null or 0, byte_fallback
//                  false, continuing_subword_prefix and end_of_word_suffix null (data/bpe.h)
//   decoder        ByteLevel
//   added_tokens   any, with lstrip, rstrip and normalized; single_word false (added_tokens.h)
// post_processor (but for its leading special token: document_start), truncation and padding
// are not read: encode gives what HF's
// `encode(text, add_special_tokens=False)` gives without truncation or padding, and no
// post-processor adds anything then.
//
// Encoding works on bytes: text need not be valid UTF-8 (HF only takes valid UTF-8; here a byte
// that is not part of a valid character matches no pattern item and is encoded on its own), and
// decode(encode(text)) == text for any bytes when the vocabulary holds every byte's token
// (GPT-2's and Llama 3's do); a byte without one and no unknown token is dropped, as HF drops it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

// The largest token id a tokenizer.json may hold (tokens are kept in tables by id).
inline constexpr int64_t kLargestTokenId = (int64_t{1} << 22) - 1;

struct TokenizerOptions {
  // Hugging Face's split_special_tokens: special added tokens ("special": true, such as
  // <|endoftext|>) in a text are encoded as the text they spell instead of matched, as llm.c's
  // fineweb.py encodes documents (a document that quotes "<|endoftext|>" is not cut by it).
  // Added tokens that are not special are matched either way. false: HF's default encode.
  bool split_special_tokens = false;
};

class Tokenizer {
 public:
  // Reads a Hugging Face tokenizer.json. Throws loom::Error naming the path and, for anything
  // unsupported, the key and the value found and what is supported (e.g. model.type
  // "WordPiece": only "BPE" with a ByteLevel pre-tokenizer/decoder is supported; a normalizer
  // other than null).
  static Tokenizer from_file(const std::string& path, const TokenizerOptions& options = {});
  // The same from the file's text; `origin` names it in errors and in description().
  static Tokenizer from_json(const std::string& json_text, const std::string& origin,
                             const TokenizerOptions& options = {});

  // Token ids of `text`, exactly as HF `tokenizer.encode(text, add_special_tokens=False).ids`
  // (added/special tokens in the text are matched as HF does, unless split_special_tokens; no
  // BOS/EOS added). Thread-safe.
  std::vector<int32_t> encode(std::string_view text) const;

  // Encodes `text` from byte `begin` (which must be a pre-token boundary of the whole text,
  // e.g. 0) piece by piece, appending ids to `out`, and stops after the first piece (or added
  // token) that ends at or past byte `stop`; returns the byte where it stopped (>= stop, or
  // text.size()). Matching sees the whole `text` (lookahead past `stop` is honoured). This lets
  // a caller encode one big text in parallel chunks: chunk k from s_k to s_{k+1} is exact
  // whenever chunk k-1 stopped exactly at s_k. Thread-safe.
  //
  // `begin` starts a stretch of text between added tokens as far as patterns see (they never
  // look behind), and with ByteLevel's add_prefix_space it gets the prefix space when it is 0
  // or text before it ends with an added token's content.
  size_t encode_range(std::string_view text, size_t begin, size_t stop,
                      std::vector<int32_t>& out) const;

  // The bytes of `ids` (an added token gives its content). An id that is no token (a gap in the
  // ids, or a padded vocabulary's) gives nothing, as HF's decode skips it.
  std::string decode(std::span<const int32_t> ids) const;

  // Largest id + 1, added tokens included.
  int64_t vocab_size() const;

  // The id of a vocabulary token as tokenizer.json spells it (byte-level: " the" is "Ġthe") or
  // of an added token (its content).
  std::optional<int32_t> token_id(std::string_view token) const;

  // E.g. "tokenizer.json at PATH (byte-level BPE, 50257 tokens, 1 special)".
  std::string description() const;

  // The end-of-text token if the tokenizer has one of "<|endoftext|>" (GPT-2) or
  // "<|end_of_text|>" (Llama 3).
  std::optional<int32_t> end_of_text() const;

  // The token each document starts with in llm.c's shards (its fineweb.py puts
  // `tokenizer.encode('')[0]` first): the special token the post-processor puts before a text
  // (Llama 3's <|begin_of_text|>), else the end-of-text (GPT-2's <|endoftext|>).
  std::optional<int32_t> document_start() const;

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace loom::data
