// Pre-tokenization of a tokenizer.json: the text between added tokens cut into the pieces the BPE
// model encodes one by one, as Hugging Face tokenizers cuts it.
//
// Supported: a `Split` (a Regex or String pattern, behavior "Isolated", invert false: every match
// and every non-empty stretch between matches is a piece) any number of times, then `ByteLevel`
// (its GPT-2 pattern when `use_regex`, then the bytes as they are; `add_prefix_space` puts a
// space before each stretch of text that does not start with one). Each step cuts the pieces of
// the step before it, seeing only the piece.
//
// Patterns are written for Oniguruma (HF's regex engine); SplitPattern compiles them with PCRE2
// (UTF, Unicode properties, JIT) after rewriting what the two read differently: `\s` and `\S`
// (PCRE2's Unicode `\s` also matches U+180E, which is not White_Space), `\w` and `\W` (Oniguruma's
// word characters: letters, marks, decimal digits, connector punctuation), `\uHHHH`, `{,n}`.
// Escapes whose meaning differs and that no byte-level tokenizer uses (`\h`, `\H`, `\b`, `\B`,
// `\G`) and look-behinds are refused. Text that is not valid UTF-8 never throws: an invalid byte
// matches no pattern item (PCRE2_MATCH_INVALID_UTF), so it ends up in a piece of its own.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

struct pcre2_real_code_8;

namespace loom::data {

// `pattern` in Oniguruma syntax rewritten for PCRE2 (see above). Throws loom::Error naming `what`
// and the construct it refuses.
std::string pcre2_pattern(std::string_view pattern, const std::string& what);

class SplitPattern {
 public:
  // `literal`: the pattern is plain text (Split's {"String": ...}). Throws loom::Error naming
  // `what`, the pattern and PCRE2's message when it does not compile.
  SplitPattern(std::string_view pattern, bool literal, const std::string& what);
  ~SplitPattern();
  SplitPattern(const SplitPattern&) = delete;
  SplitPattern& operator=(const SplitPattern&) = delete;

  // The first match in `subject` that starts at or after `from`: true and its [start, end).
  // Thread-safe (each thread matches with its own match data).
  bool find(std::string_view subject, size_t from, size_t& start, size_t& end) const;

  const std::string& source() const { return source_; }

 private:
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
  std::string source_;
};

class PreTokenizer {
 public:
  PreTokenizer(std::vector<std::unique_ptr<const SplitPattern>> steps, bool add_prefix_space)
      : steps_(std::move(steps)), add_prefix_space_(add_prefix_space) {}

  bool add_prefix_space() const { return add_prefix_space_; }

  // Calls emit(start, end) for each piece of `text` (offsets into it, end > start) in order,
  // until emit returns true; returns whether it did.
  template <class Emit>
  bool for_each_piece(std::string_view text, Emit&& emit) const {
    return split(0, text, 0, emit);
  }

 private:
  template <class Emit>
  bool split(size_t step, std::string_view subject, size_t base, Emit& emit) const {
    if (subject.empty()) return false;
    if (step == steps_.size()) return emit(base, base + subject.size());
    const SplitPattern& pattern = *steps_[step];
    size_t gap = 0;  // start of the stretch not matched yet
    size_t from = 0;
    size_t start;
    size_t end;
    while (from <= subject.size() && pattern.find(subject, from, start, end)) {
      if (start > gap && split(step + 1, subject.substr(gap, start - gap), base + gap, emit)) {
        return true;
      }
      if (end == start) {  // An empty match only cuts the stretch; search on past a character.
        gap = start;
        from = start + utf8_length(subject, start);
        continue;
      }
      if (split(step + 1, subject.substr(start, end - start), base + start, emit)) return true;
      gap = from = end;
    }
    return gap < subject.size() && split(step + 1, subject.substr(gap), base + gap, emit);
  }

  static size_t utf8_length(std::string_view s, size_t at);

  std::vector<std::unique_ptr<const SplitPattern>> steps_;
  bool add_prefix_space_;
};

}  // namespace loom::data
