#include "data/pretokenizer.h"

#include <pcre2.h>

#include <cstdint>

#include "base/error.h"

namespace loom::data {

namespace {

// Unicode White_Space: what `\s` matches in Oniguruma and Rust's regex. PCRE2's Unicode `\s` is
// \p{Z}, \h and \v, which adds U+180E MONGOLIAN VOWEL SEPARATOR.
constexpr std::string_view kSpace =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";
// Oniguruma's Unicode `\w`: letters, marks, decimal digits, connector punctuation.
constexpr std::string_view kWord = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";

bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  return n < 0 ? fmt::format("PCRE2 error {}", code) : std::string(reinterpret_cast<char*>(buffer));
}

// One thread's match data, match context and JIT stack (none of them may be shared by threads
// matching at the same time).
struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;

  MatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 << 10, 64 << 20, nullptr);
    LOOM_CHECK(data != nullptr && context != nullptr, "PCRE2: out of memory for match data");
    if (stack != nullptr) pcre2_jit_stack_assign(context, nullptr, stack);
    // Whitespace runs can be long (a 100,000-space run is one piece); linear, but over the
    // default limits.
    pcre2_set_match_limit(context, UINT32_MAX);
    pcre2_set_depth_limit(context, UINT32_MAX);
    pcre2_set_heap_limit(context, UINT32_MAX);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

thread_local MatchState match_state;

}  // namespace

std::string pcre2_pattern(std::string_view p, const std::string& what) {
  std::string out;
  out.reserve(p.size() * 2);
  bool in_class = false;
  size_t class_body = 0;  // where the class's members start (a ']' there is a member)
  const auto refuse = [&](std::string_view construct, std::string_view why) {
    LOOM_FAIL("{}: the pattern '{}' uses {}, which {}", what, p, construct, why);
  };
  for (size_t i = 0; i < p.size();) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size()) refuse("a trailing backslash", "does not compile");
      const char d = p[i + 1];
      switch (d) {
        case 's':
          out += in_class ? std::string(kSpace) : fmt::format("[{}]", kSpace);
          i += 2;
          continue;
        case 'w':
          out += in_class ? std::string(kWord) : fmt::format("[{}]", kWord);
          i += 2;
          continue;
        case 'S':
        case 'W':
          if (in_class) {
            refuse(fmt::format("\\{} inside a character class", d), "is not supported");
          }
          out += fmt::format("[^{}]", d == 'S' ? kSpace : kWord);
          i += 2;
          continue;
        case 'u':
          if (i + 5 < p.size() && is_hex(p[i + 2]) && is_hex(p[i + 3]) && is_hex(p[i + 4]) &&
              is_hex(p[i + 5])) {
            out += fmt::format("\\x{{{}}}", p.substr(i + 2, 4));
            i += 6;
            continue;
          }
          refuse("\\u without four hex digits", "is not supported");
          break;
        case 'b':
        case 'B':
          if (in_class && d == 'b') break;  // a backspace in both
          refuse(fmt::format("\\{}", d), "is not supported (word boundaries look behind)");
          break;
        case 'h':
        case 'H':
          refuse(fmt::format("\\{}", d), "means a hex digit in Oniguruma, whitespace in PCRE2");
          break;
        case 'G':
        case 'K':
          refuse(fmt::format("\\{}", d), "is not supported");
          break;
        default:
          break;
      }
      out += c;
      out += d;
      i += 2;
      continue;
    }
    if (in_class) {
      if (c == '[') {
        if (i + 1 < p.size() && p[i + 1] == ':') {
          const size_t close = p.find(":]", i + 2);
          if (close == std::string_view::npos) refuse("an unclosed [:class:]", "does not compile");
          out += p.substr(i, close + 2 - i);
          i = close + 2;
          continue;
        }
        refuse("a nested character class", "is not supported");
      }
      if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') {
        refuse("a class intersection (&&)", "is not supported");
      }
      if (c == ']' && i > class_body) in_class = false;
      out += c;
      ++i;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += c;
      ++i;
      if (i < p.size() && p[i] == '^') out += p[i++];
      class_body = i + 1;  // a ']' right at the start is a member
      continue;
    }
    if (c == '{' && i + 1 < p.size() && p[i + 1] == ',') {
      out += "{0,";  // Oniguruma's {,n} is {0,n}; PCRE2 10.42 reads it literally
      i += 2;
      continue;
    }
    if (c == '(' && (p.substr(i, 4) == "(?<=" || p.substr(i, 4) == "(?<!")) {
      refuse("a look-behind", "is not supported (pieces are matched one stretch at a time)");
    }
    out += c;
    ++i;
  }
  if (in_class) refuse("an unclosed character class", "does not compile");
  return out;
}

SplitPattern::SplitPattern(std::string_view pattern, bool literal, const std::string& what)
    : source_(pattern) {
  const std::string translated = literal ? std::string(pattern) : pcre2_pattern(pattern, what);
  // Oniguruma (Ruby syntax) reads ^ and $ at line starts and ends.
  const uint32_t options =
      PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE);
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), options,
                        &error, &offset, nullptr);
  LOOM_CHECK(code_ != nullptr, "{}: the pattern '{}' does not compile: {} (at offset {}{})", what,
             pattern, pcre2_message(error), offset,
             literal ? "" : fmt::format(" of its PCRE2 form '{}'", translated));
  uint32_t lookbehind = 0;
  pcre2_pattern_info(code_, PCRE2_INFO_MAXLOOKBEHIND, &lookbehind);
  if (lookbehind > 0) {
    pcre2_code_free(code_);
    LOOM_FAIL("{}: the pattern '{}' looks behind, which is not supported", what, pattern);
  }
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

SplitPattern::~SplitPattern() { pcre2_code_free(code_); }

bool SplitPattern::find(std::string_view subject, size_t from, size_t& start, size_t& end) const {
  MatchState& state = match_state;
  const auto* text = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc = jit_ ? pcre2_jit_match(code_, text, subject.size(), from, 0, state.data, state.context)
                : pcre2_match(code_, text, subject.size(), from, 0, state.data, state.context);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
    rc = pcre2_match(code_, text, subject.size(), from, PCRE2_NO_JIT, state.data, state.context);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  LOOM_CHECK(rc >= 0, "pre-tokenizer pattern '{}' failed on a text of {} bytes at byte {}: {}",
             source_, subject.size(), from, pcre2_message(rc));
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
  start = ovector[0];
  end = ovector[1];
  return true;
}

size_t PreTokenizer::utf8_length(std::string_view s, size_t at) {
  if (at >= s.size()) return 1;
  const auto c = static_cast<uint8_t>(s[at]);
  size_t n = c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  // Stop at the first byte that does not continue the character (invalid UTF-8).
  for (size_t k = 1; k < n; ++k) {
    if (at + k >= s.size() || (static_cast<uint8_t>(s[at + k]) & 0xC0) != 0x80) return k;
  }
  return n;
}

}  // namespace loom::data
