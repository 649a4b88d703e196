#include "data/added_tokens.h"

#include <algorithm>
#include <cstring>

#include "data/utf8.h"

namespace loom::data {

namespace {

// Unicode White_Space (Rust's char::is_whitespace, what HF's lstrip and rstrip take).
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// The code point of the UTF-8 character at text[at, limit) and its length, or 0 for an invalid
// or truncated sequence.
size_t decode(std::string_view text, size_t at, size_t limit, char32_t& c) {
  const Utf8Char read = decode_utf8(text.substr(0, limit), at);
  c = read.code_point;
  return read.valid ? read.length : 0;
}

// The end of the whitespace that starts at `at` (not past `limit`).
size_t spaces_after(std::string_view text, size_t at, size_t limit) {
  char32_t c;
  while (at < limit) {
    const size_t n = decode(text, at, limit, c);
    if (n == 0 || !is_white_space(c)) break;
    at += n;
  }
  return at;
}

// The start of the whitespace that ends at `at` (not before `floor`).
size_t spaces_before(std::string_view text, size_t at, size_t floor) {
  char32_t c;
  while (at > floor) {
    size_t start = at - 1;
    while (start > floor && at - start < 4 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) {
      --start;
    }
    if (decode(text, start, at, c) != at - start || !is_white_space(c)) break;
    at = start;
  }
  return at;
}

}  // namespace

// Leftmost-longest matching of a set of byte strings (what HF's Aho-Corasick automaton with
// MatchKind::LeftmostLongest finds): skip to a byte that starts some string, then walk a trie.
class AddedTokens::Trie {
 public:
  bool empty() const { return nodes_.size() == 1; }

  void add(std::string_view content, int32_t index) {
    if (content.empty()) return;  // HF never matches an empty token
    int32_t node = 0;
    for (char c : content) {
      const int32_t child = child_of(node, static_cast<uint8_t>(c));
      if (child >= 0) {
        node = child;
        continue;
      }
      nodes_.emplace_back();
      nodes_[node].children.emplace_back(static_cast<uint8_t>(c),
                                         static_cast<int32_t>(nodes_.size() - 1));
      node = static_cast<int32_t>(nodes_.size() - 1);
    }
    nodes_[node].index = index;
    const auto first = static_cast<uint8_t>(content[0]);
    if (!starts_[first]) {
      starts_[first] = true;
      ++distinct_starts_;
      only_start_ = first;
    }
  }

  // The leftmost-longest match inside text[from, limit).
  bool find(std::string_view text, size_t from, size_t limit, size_t& start, size_t& end,
            int32_t& index) const {
    if (empty()) return false;
    const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
    for (size_t s = from; s < limit; ++s) {
      if (distinct_starts_ == 1) {
        const void* hit = std::memchr(bytes + s, only_start_, limit - s);
        if (hit == nullptr) return false;
        s = static_cast<const uint8_t*>(hit) - bytes;
      } else {
        while (s < limit && !starts_[bytes[s]]) ++s;
        if (s == limit) return false;
      }
      int32_t node = 0;
      int32_t best = -1;
      for (size_t k = s; k < limit; ++k) {
        node = child_of(node, bytes[k]);
        if (node < 0) break;
        if (nodes_[node].index >= 0) {
          best = nodes_[node].index;
          end = k + 1;
        }
      }
      if (best >= 0) {
        start = s;
        index = best;
        return true;
      }
    }
    return false;
  }

 private:
  struct Node {
    int32_t index = -1;  // the token that ends here
    std::vector<std::pair<uint8_t, int32_t>> children;
  };

  int32_t child_of(int32_t node, uint8_t byte) const {
    for (const auto& [b, child] : nodes_[node].children) {
      if (b == byte) return child;
    }
    return -1;
  }

  std::vector<Node> nodes_ = std::vector<Node>(1);
  bool starts_[256] = {};
  int distinct_starts_ = 0;
  uint8_t only_start_ = 0;
};

AddedTokens::AddedTokens(std::vector<AddedToken> tokens)
    : tokens_(std::move(tokens)),
      raw_(std::make_unique<Trie>()),
      normalized_(std::make_unique<Trie>()) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    (tokens_[i].normalized ? normalized_ : raw_)->add(tokens_[i].content, static_cast<int32_t>(i));
  }
}

AddedTokens::~AddedTokens() = default;

bool AddedTokens::ends_with_token(std::string_view text, size_t at) const {
  const std::string_view before = text.substr(0, at);
  return std::any_of(tokens_.begin(), tokens_.end(), [&](const AddedToken& t) {
    return !t.content.empty() && before.size() >= t.content.size() &&
           before.substr(before.size() - t.content.size()) == t.content;
  });
}

AddedTokens::Scanner::Scanner(const AddedTokens& tokens, std::string_view text, size_t begin)
    : tokens_(tokens), text_(text), raw_search_(begin), raw_offset_(begin) {}

bool AddedTokens::Scanner::next(Match& match) {
  size_t s;
  size_t e;
  int32_t index;
  if (done_) return false;
  if (!have_gap_) {
    if (tokens_.raw_->find(text_, raw_search_, text_.size(), s, e, index)) {
      const AddedToken& t = tokens_.tokens_[index];
      // lstrip never reaches before the previous match (nor past this one's start).
      pending_ = {t.lstrip ? spaces_before(text_, s, std::min(s, raw_offset_)) : s,
                  t.rstrip ? spaces_after(text_, e, text_.size()) : e, t.id};
      have_pending_ = true;
      raw_search_ = e;
      gap_end_ = std::max(pending_.start, raw_offset_);
    } else {
      have_pending_ = false;
      gap_end_ = text_.size();
    }
    search_ = offset_ = raw_offset_;
    have_gap_ = true;
  }
  if (search_ < gap_end_ && tokens_.normalized_->find(text_, search_, gap_end_, s, e, index)) {
    const AddedToken& t = tokens_.tokens_[index];
    match = {t.lstrip ? spaces_before(text_, s, std::min(s, offset_)) : s,
             t.rstrip ? spaces_after(text_, e, gap_end_) : e, t.id};
    search_ = e;
    offset_ = match.end;
    return true;
  }
  have_gap_ = false;
  if (!have_pending_) {
    done_ = true;
    return false;
  }
  raw_offset_ = pending_.end;
  match = pending_;
  return true;
}

}  // namespace loom::data
