// The added tokens of a tokenizer.json (special tokens such as <|endoftext|>, and tokens added
// after training) found in a text as Hugging Face's AddedVocabulary finds them: first the tokens
// with `normalized: false` over the whole text, then those with `normalized: true` in each
// stretch between the first ones (without a normalizer the two see the same bytes, but the
// order of the passes decides overlaps); in each pass leftmost first, longest first at one
// position; `lstrip` takes the whitespace before the token into it (not past the previous
// match), `rstrip` the whitespace after it (Unicode White_Space both). `single_word` is refused
// by the loader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

class AddedTokens {
 public:
  explicit AddedTokens(std::vector<AddedToken> tokens);
  ~AddedTokens();
  AddedTokens(const AddedTokens&) = delete;
  AddedTokens& operator=(const AddedTokens&) = delete;

  const std::vector<AddedToken>& tokens() const { return tokens_; }

  // Whether text[0, at) ends with the content of an added token.
  bool ends_with_token(std::string_view text, size_t at) const;

  struct Match {
    size_t start;  // with the whitespace lstrip took
    size_t end;    // with the whitespace rstrip took
    int32_t id;
  };

  // The added tokens of text[begin, size) in order; `begin` is where HF's matching would be
  // after a match (or 0).
  class Scanner {
   public:
    Scanner(const AddedTokens& tokens, std::string_view text, size_t begin);
    // The next match: true and `match`, or false when there is none.
    bool next(Match& match);

   private:
    const AddedTokens& tokens_;
    std::string_view text_;
    // First pass (normalized: false) over the whole text.
    size_t raw_search_;  // where its next search starts (the previous match's end before rstrip)
    size_t raw_offset_;  // where its previous match ended (after rstrip)
    bool done_ = false;
    bool have_gap_ = false;
    bool have_pending_ = false;
    Match pending_{};  // the first pass's match that ends the current gap
    // Second pass (normalized: true) inside the gap between the first pass's matches, which ends
    // at gap_end_.
    size_t gap_end_ = 0;
    size_t search_ = 0;
    size_t offset_ = 0;
  };

 private:
  class Trie;

  std::vector<AddedToken> tokens_;
  std::unique_ptr<Trie> raw_;
  std::unique_ptr<Trie> normalized_;
};

}  // namespace loom::data
