#include "data/tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "base/error.h"
#include "data/added_tokens.h"
#include "data/bpe.h"
#include "data/byte_level.h"
#include "data/pretokenizer.h"

namespace loom::data {

namespace {

using Json = nlohmann::json;

// ByteLevel's own pattern (HF's pre_tokenizers/byte_level.rs), used when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A JSON value as an error message shows it (cut when long).
std::string shown(const Json& value) {
  std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > 120) text = text.substr(0, 117) + "...";
  return text;
}

// Reads one tokenizer.json, naming it and the key in every error.
class Reader {
 public:
  explicit Reader(const std::string& origin)
      : where_(fmt::format("tokenizer.json at {}", origin)) {}

  const std::string& where() const { return where_; }

  [[noreturn]] void unsupported(const std::string& key, const Json& found,
                                std::string_view supported) const {
    LOOM_FAIL("{}: {} is {}; {}", where_, key, shown(found), supported);
  }

  // The member `key` of `object`, or nullptr when it is absent or null.
  static const Json* member(const Json& object, const char* key) {
    const auto it = object.find(key);
    return it == object.end() || it->is_null() ? nullptr : &*it;
  }

  const Json& object(const Json& value, const std::string& key) const {
    if (!value.is_object()) unsupported(key, value, "expected an object");
    return value;
  }

  bool boolean(const Json& object, const char* key, const std::string& path, bool fallback) const {
    const Json* value = member(object, key);
    if (value == nullptr) return fallback;
    if (!value->is_boolean()) unsupported(path + "." + key, *value, "expected true or false");
    return value->get<bool>();
  }

  std::string string(const Json& value, const std::string& key) const {
    if (!value.is_string()) unsupported(key, value, "expected a string");
    return value.get<std::string>();
  }

  std::string type(const Json& object, const std::string& path) const {
    const Json* value = member(object, "type");
    if (value == nullptr) unsupported(path, object, "expected an object with a \"type\"");
    return string(*value, path + ".type");
  }

  int32_t id(const Json& value, const std::string& key) const {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() > kLargestTokenId) {
      unsupported(key, value,
                  fmt::format("expected a token id, an integer from 0 to {} (tokens are kept in "
                              "tables by id; the largest vocabularies hold about 260 000)",
                              kLargestTokenId));
    }
    return static_cast<int32_t>(value.get<int64_t>());
  }

 private:
  std::string where_;
};

constexpr std::string_view kPreTokenizers =
    "supported: ByteLevel, or a Sequence of Split steps (Regex or String pattern, behavior "
    "\"Isolated\", invert false) ending with ByteLevel";

void read_pre_tokenizer(const Reader& r, const Json& node, const std::string& path,
                        std::vector<std::unique_ptr<const SplitPattern>>& steps, bool& byte_level,
                        bool& add_prefix_space) {
  r.object(node, path);
  const std::string type = r.type(node, path);
  if (byte_level) {
    r.unsupported(path, node, "nothing may follow ByteLevel; " + std::string(kPreTokenizers));
  }
  if (type == "Sequence") {
    const Json* list = Reader::member(node, "pretokenizers");
    if (list == nullptr || !list->is_array()) {
      r.unsupported(path + ".pretokenizers", list ? *list : Json(), "expected an array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      read_pre_tokenizer(r, (*list)[i], fmt::format("{}.pretokenizers[{}]", path, i), steps,
                         byte_level, add_prefix_space);
    }
    return;
  }
  if (type == "Split") {
    const Json* pattern = Reader::member(node, "pattern");
    const Json* regex =
        pattern && pattern->is_object() ? Reader::member(*pattern, "Regex") : nullptr;
    const Json* literal =
        pattern && pattern->is_object() ? Reader::member(*pattern, "String") : nullptr;
    if (regex == nullptr && literal == nullptr) {
      r.unsupported(path + ".pattern", pattern ? *pattern : Json(),
                    "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    const Json* behavior = Reader::member(node, "behavior");
    if (behavior == nullptr || *behavior != "Isolated") {
      r.unsupported(path + ".behavior", behavior ? *behavior : Json(),
                    "only \"Isolated\" is supported");
    }
    if (r.boolean(node, "invert", path, false)) {
      r.unsupported(path + ".invert", true, "only false is supported");
    }
    const std::string what = fmt::format("{}: {}.pattern", r.where(), path);
    steps.push_back(std::make_unique<SplitPattern>(
        r.string(regex ? *regex : *literal, path + ".pattern"), regex == nullptr, what));
    return;
  }
  if (type == "ByteLevel") {
    byte_level = true;
    add_prefix_space = r.boolean(node, "add_prefix_space", path, true);
    if (add_prefix_space && !steps.empty()) {
      r.unsupported(path + ".add_prefix_space", true,
                    "only false is supported when Split steps come before ByteLevel");
    }
    if (r.boolean(node, "use_regex", path, true)) {
      steps.push_back(std::make_unique<SplitPattern>(
          kGpt2Pattern, false, fmt::format("{}: {} (use_regex)", r.where(), path)));
    }
    return;
  }
  r.unsupported(path + ".type", type, kPreTokenizers);
}

// The special token a post-processor puts before a single text (TemplateProcessing's "single"
// starting with a SpecialToken, alone or in a Sequence: Llama 3's <|begin_of_text|>), if any: its
// id as HF resolves it, through the processor's "special_tokens" map (the entry's "ids"), else the
// added token of that content. Only read for that: encode adds nothing (add_special_tokens=False).
struct LeadingToken {
  std::string name;               // the template's SpecialToken id
  std::optional<int32_t> mapped;  // special_tokens[name].ids[0], when present
};
std::optional<LeadingToken> leading_special_token(const Json& node) {
  if (!node.is_object()) return std::nullopt;
  const Json* type = Reader::member(node, "type");
  if (type == nullptr || !type->is_string()) return std::nullopt;
  if (*type == "Sequence") {
    const Json* list = Reader::member(node, "processors");
    if (list == nullptr || !list->is_array()) return std::nullopt;
    for (const Json& step : *list) {
      if (auto token = leading_special_token(step)) return token;
    }
    return std::nullopt;
  }
  if (*type != "TemplateProcessing") return std::nullopt;
  const Json* single = Reader::member(node, "single");
  if (single == nullptr || !single->is_array() || single->empty()) return std::nullopt;
  const Json* special = Reader::member((*single)[0], "SpecialToken");
  const Json* id = special != nullptr ? Reader::member(*special, "id") : nullptr;
  if (id == nullptr || !id->is_string()) return std::nullopt;
  LeadingToken out{id->get<std::string>(), std::nullopt};
  const Json* map = Reader::member(node, "special_tokens");
  const Json* entry =
      map != nullptr && map->is_object() ? Reader::member(*map, out.name.c_str()) : nullptr;
  const Json* ids =
      entry != nullptr && entry->is_object() ? Reader::member(*entry, "ids") : nullptr;
  if (ids != nullptr && ids->is_array() && ids->size() == 1 && (*ids)[0].is_number_integer()) {
    out.mapped = (*ids)[0].get<int32_t>();
  }
  return out;
}

}  // namespace

struct Tokenizer::Impl {
  std::string origin;
  // The post-processor's leading special token (Llama 3's <|begin_of_text|>), if any.
  std::optional<int32_t> begin_of_text;
  std::unique_ptr<const Bpe> bpe;
  std::unique_ptr<const PreTokenizer> pre_tokenizer;
  std::unique_ptr<const AddedTokens> added;
  std::vector<std::string> bytes_of;                   // by id: what decode writes
  std::vector<uint8_t> is_token;                       // by id
  std::unordered_map<std::string, int32_t> added_ids;  // content -> id
  // Vocabulary entries that are not byte-level strings (no pre-token can produce them).
  std::unordered_map<std::string, int32_t> other_tokens;
  int specials = 0;
  bool split_specials = false;  // TokenizerOptions::split_special_tokens

  // Pieces of text[from, to) (text between added tokens, or from a piece boundary), encoded and
  // appended; true and `where` when a piece ends at or past `stop`.
  bool encode_stretch(std::string_view text, size_t from, size_t to, bool prefix_space, size_t stop,
                      Bpe::Cache* cache, std::vector<int32_t>& out, size_t& where) const {
    const std::string_view stretch = text.substr(from, to - from);
    if (prefix_space && stretch[0] != ' ') {
      const std::string spaced = " " + std::string(stretch);
      return pre_tokenizer->for_each_piece(spaced, [&](size_t s, size_t e) {
        bpe->encode(std::string_view(spaced).substr(s, e - s), cache, out);
        where = from + e - 1;  // the space is not in the text
        return where >= stop;
      });
    }
    return pre_tokenizer->for_each_piece(stretch, [&](size_t s, size_t e) {
      bpe->encode(stretch.substr(s, e - s), cache, out);
      where = from + e;
      return where >= stop;
    });
  }
};

Tokenizer Tokenizer::from_file(const std::string& path, const TokenizerOptions& options) {
  std::error_code ec;
  LOOM_CHECK(std::filesystem::exists(path, ec), "tokenizer.json at {}: the file does not exist",
             path);
  LOOM_CHECK(!std::filesystem::is_directory(path, ec),
             "tokenizer.json at {}: is a folder; expected a Hugging Face tokenizer.json file",
             path);
  std::ifstream file(path, std::ios::binary);
  LOOM_CHECK(file.good(), "tokenizer.json at {}: cannot open it: {}", path, std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  LOOM_CHECK(!file.bad(), "tokenizer.json at {}: reading it failed: {}", path,
             std::strerror(errno));
  return from_json(text, path, options);
}

Tokenizer Tokenizer::from_json(const std::string& json_text, const std::string& origin,
                               const TokenizerOptions& tokenizer_options) {
  const Reader r(origin);
  Json root;
  try {
    root = Json::parse(json_text);
  } catch (const Json::exception& e) {
    LOOM_FAIL("{}: not valid JSON: {}", r.where(), e.what());
  }
  if (!root.is_object()) r.unsupported("the document", root, "expected a JSON object");
  auto impl = std::make_shared<Impl>();
  impl->origin = origin;

  if (const Json* normalizer = Reader::member(root, "normalizer")) {
    r.unsupported("normalizer", *normalizer, "only null (no normalizer) is supported");
  }

  // The model.
  const Json* model = Reader::member(root, "model");
  if (model == nullptr) r.unsupported("model", Json(), "expected a BPE model");
  r.object(*model, "model");
  if (const Json* type = Reader::member(*model, "type"); type != nullptr && *type != "BPE") {
    r.unsupported("model.type", *type,
                  "only \"BPE\" (byte-level, with a ByteLevel pre-tokenizer and decoder) is "
                  "supported");
  }
  if (const Json* dropout = Reader::member(*model, "dropout");
      dropout != nullptr && !(dropout->is_number() && dropout->get<double>() == 0)) {
    r.unsupported("model.dropout", *dropout, "only null or 0 is supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const Json* value = Reader::member(*model, key); value != nullptr && *value != "") {
      r.unsupported(fmt::format("model.{}", key), *value, "only null is supported");
    }
  }
  if (r.boolean(*model, "byte_fallback", "model", false)) {
    r.unsupported("model.byte_fallback", true, "only false is supported (byte-level BPE)");
  }
  const Json* vocab = Reader::member(*model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) {
    r.unsupported("model.vocab", vocab ? *vocab : Json(), "expected an object of token -> id");
  }
  std::unordered_map<std::string, int32_t> ids;  // as spelled in the file
  ids.reserve(vocab->size());
  std::vector<std::pair<std::string, int32_t>> tokens;  // as bytes
  tokens.reserve(vocab->size());
  int32_t largest = -1;
  for (const auto& [token, value] : vocab->items()) {
    const int32_t id = r.id(value, fmt::format("model.vocab[\"{}\"]", token));
    ids.emplace(token, id);
    largest = std::max(largest, id);
    if (auto bytes = byte_level::to_bytes(token)) {
      tokens.emplace_back(std::move(*bytes), id);
    } else {
      impl->other_tokens.emplace(token, id);
    }
  }
  impl->bytes_of.resize(static_cast<size_t>(largest) + 1);
  impl->is_token.resize(static_cast<size_t>(largest) + 1);
  for (const auto& [token, id] : ids) {
    LOOM_CHECK(!impl->is_token[id], "{}: model.vocab gives id {} to two tokens (one is \"{}\")",
               r.where(), id, token);
    impl->is_token[id] = 1;
    // HF's ByteLevel decoder: the bytes a byte-level string spells, else the string's own bytes.
    impl->bytes_of[id] = byte_level::to_bytes(token).value_or(token);
  }
  const Json* merges = Reader::member(*model, "merges");
  if (merges == nullptr || !merges->is_array()) {
    r.unsupported("model.merges", merges ? *merges : Json(),
                  "expected an array of \"a b\" strings or [a, b] pairs");
  }
  std::vector<Bpe::Merge> merge_list;
  merge_list.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& entry = (*merges)[i];
    const std::string key = fmt::format("model.merges[{}]", i);
    std::string left;
    std::string right;
    if (entry.is_string()) {
      const std::string line = entry.get<std::string>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        r.unsupported(key, entry, "expected two tokens separated by one space");
      }
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() &&
               entry[1].is_string()) {
      left = entry[0].get<std::string>();
      right = entry[1].get<std::string>();
    } else {
      r.unsupported(key, entry, "expected an \"a b\" string or an [a, b] pair of strings");
    }
    const auto l = ids.find(left);
    const auto rt = ids.find(right);
    const auto m = ids.find(left + right);
    if (l == ids.end() || rt == ids.end() || m == ids.end()) {
      LOOM_FAIL("{}: {} merges \"{}\" and \"{}\", but \"{}\" is not in model.vocab", r.where(), key,
                left, right,
                l == ids.end()    ? left
                : rt == ids.end() ? right
                                  : left + right);
    }
    merge_list.push_back({l->second, rt->second, m->second});
  }
  Bpe::Options options;
  options.ignore_merges = r.boolean(*model, "ignore_merges", "model", false);
  options.fuse_unk = r.boolean(*model, "fuse_unk", "model", false);
  if (const Json* unk = Reader::member(*model, "unk_token")) {
    const std::string token = r.string(*unk, "model.unk_token");
    const auto it = ids.find(token);
    LOOM_CHECK(it != ids.end(), "{}: model.unk_token \"{}\" is not in model.vocab", r.where(),
               token);
    options.unk_id = it->second;
  }
  impl->bpe = std::make_unique<Bpe>(tokens, merge_list, options);

  // The pre-tokenizer and the decoder.
  const Json* pre = Reader::member(root, "pre_tokenizer");
  if (pre == nullptr) r.unsupported("pre_tokenizer", Json(), std::string(kPreTokenizers));
  std::vector<std::unique_ptr<const SplitPattern>> steps;
  bool byte_level = false;
  bool add_prefix_space = false;
  read_pre_tokenizer(r, *pre, "pre_tokenizer", steps, byte_level, add_prefix_space);
  if (!byte_level) {
    r.unsupported("pre_tokenizer", *pre, "ByteLevel must end it; " + std::string(kPreTokenizers));
  }
  impl->pre_tokenizer = std::make_unique<PreTokenizer>(std::move(steps), add_prefix_space);
  const Json* decoder = Reader::member(root, "decoder");
  if (decoder == nullptr || !decoder->is_object() || Reader::member(*decoder, "type") == nullptr ||
      (*decoder)["type"] != "ByteLevel") {
    r.unsupported("decoder", decoder ? *decoder : Json(), "only ByteLevel is supported");
  }

  // Added tokens. As in HF, a content that is a vocabulary token keeps the vocabulary's id.
  std::vector<AddedToken> added;
  if (const Json* list = Reader::member(root, "added_tokens")) {
    if (!list->is_array()) r.unsupported("added_tokens", *list, "expected an array");
    std::unordered_map<std::string, size_t> index;
    for (size_t i = 0; i < list->size(); ++i) {
      const Json& entry = (*list)[i];
      const std::string path = fmt::format("added_tokens[{}]", i);
      r.object(entry, path);
      const Json* content = Reader::member(entry, "content");
      const Json* id = Reader::member(entry, "id");
      if (content == nullptr || id == nullptr) {
        r.unsupported(path, entry, "expected \"id\" and \"content\"");
      }
      AddedToken token;
      token.content = r.string(*content, path + ".content");
      token.id = r.id(*id, path + ".id");
      if (const auto it = ids.find(token.content); it != ids.end()) token.id = it->second;
      token.special = r.boolean(entry, "special", path, false);
      token.lstrip = r.boolean(entry, "lstrip", path, false);
      token.rstrip = r.boolean(entry, "rstrip", path, false);
      token.normalized = r.boolean(entry, "normalized", path, true);
      if (r.boolean(entry, "single_word", path, false)) {
        LOOM_FAIL("{}: {}.single_word is true for the added token \"{}\"; only false is supported",
                  r.where(), path, token.content);
      }
      if (const auto it = index.find(token.content); it != index.end()) {
        added[it->second] = token;  // a later entry for the same content replaces it
      } else {
        index.emplace(token.content, added.size());
        added.push_back(token);
      }
    }
  }
  for (const AddedToken& token : added) {
    if (static_cast<size_t>(token.id) >= impl->bytes_of.size()) {
      impl->bytes_of.resize(static_cast<size_t>(token.id) + 1);
      impl->is_token.resize(static_cast<size_t>(token.id) + 1);
    }
    impl->bytes_of[token.id] = token.content;
    impl->is_token[token.id] = 1;
    impl->added_ids[token.content] = token.id;
    impl->specials += token.special ? 1 : 0;
  }
  // Split special tokens are not matched: the text they spell is encoded as any other.
  impl->split_specials = tokenizer_options.split_special_tokens;
  if (tokenizer_options.split_special_tokens) {
    std::erase_if(added, [](const AddedToken& token) { return token.special; });
  }
  impl->added = std::make_unique<AddedTokens>(std::move(added));
  if (const Json* post = Reader::member(root, "post_processor")) {
    if (const auto leading = leading_special_token(*post)) {
      const auto added = impl->added_ids.find(leading->name);
      impl->begin_of_text = leading->mapped                  ? leading->mapped
                            : added != impl->added_ids.end() ? std::optional(added->second)
                                                             : std::nullopt;
      // One that is no token leaves documents to the end-of-text (document_start()).
      if (impl->begin_of_text &&
          (*impl->begin_of_text < 0 ||
           static_cast<size_t>(*impl->begin_of_text) >= impl->is_token.size() ||
           !impl->is_token[*impl->begin_of_text])) {
        impl->begin_of_text.reset();
      }
    }
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  encode_range(text, 0, text.size(), out);
  return out;
}

size_t Tokenizer::encode_range(std::string_view text, size_t begin, size_t stop,
                               std::vector<int32_t>& out) const {
  const Impl& m = *impl_;
  LOOM_CHECK(begin <= text.size(), "encode_range: begin {} is past the end of the text ({} bytes)",
             begin, text.size());
  if (begin == text.size()) return begin;
  Bpe::Cache* cache = m.bpe->thread_cache();
  AddedTokens::Scanner scanner(*m.added, text, begin);
  const bool prefix = m.pre_tokenizer->add_prefix_space();
  bool stretch_start = prefix && (begin == 0 || m.added->ends_with_token(text, begin));
  size_t pos = begin;
  AddedTokens::Match match;
  while (true) {
    const bool found = scanner.next(match);
    const size_t end = found ? std::max(match.start, pos) : text.size();
    size_t where = 0;
    if (end > pos && m.encode_stretch(text, pos, end, stretch_start, stop, cache, out, where)) {
      return where;
    }
    if (!found) return text.size();
    out.push_back(match.id);
    pos = std::max(pos, match.end);
    stretch_start = prefix;
    if (pos >= stop) return pos;
  }
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  const Impl& m = *impl_;
  std::string out;
  for (const int32_t id : ids) {
    // HF's decode skips an id that is no token (a gap in the ids, or padding past them).
    if (id >= 0 && static_cast<size_t>(id) < m.is_token.size() && m.is_token[id]) {
      out += m.bytes_of[id];
    }
  }
  return out;
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->is_token.size()); }

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  const Impl& m = *impl_;
  const std::string key(token);
  if (const auto it = m.added_ids.find(key); it != m.added_ids.end()) return it->second;
  if (const auto bytes = byte_level::to_bytes(token)) {
    if (const auto id = m.bpe->find(*bytes)) return id;
  }
  if (const auto it = m.other_tokens.find(key); it != m.other_tokens.end()) return it->second;
  return std::nullopt;
}

std::string Tokenizer::description() const {
  return fmt::format("tokenizer.json at {} (byte-level BPE, {} tokens, {} special{})",
                     impl_->origin, vocab_size(), impl_->specials,
                     impl_->split_specials && impl_->specials > 0 ? ", split in text" : "");
}

std::optional<int32_t> Tokenizer::end_of_text() const {
  if (auto id = token_id("<|endoftext|>")) return id;
  return token_id("<|end_of_text|>");
}

std::optional<int32_t> Tokenizer::document_start() const {
  if (impl_->begin_of_text) return impl_->begin_of_text;
  return end_of_text();
}

}  // namespace loom::data
