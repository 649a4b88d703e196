#include "data/token_corpus.h"

#include <glob.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <system_error>
#include <thread>

#include "base/error.h"
#include "data/parallel_for_each.h"
#include "data/text_documents.h"

namespace loom::data {

namespace {

namespace fs = std::filesystem;

// Tokens per range-check step: the pages one step maps (2 or 4 MiB) are released after it, so a
// scan of any corpus adds at most that much to the resident set.
constexpr int64_t kScanChunk = int64_t{1} << 20;

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

// Whether a shard's name has the word "val" (between _, -, . or its ends): a held-out split.
bool is_validation_shard(const std::string& path) {
  const std::string stem = fs::path(path).stem().string();
  size_t begin = 0;
  while (begin <= stem.size()) {
    const size_t end = std::min(stem.find_first_of("_-.", begin), stem.size());
    if (stem.compare(begin, end - begin, "val") == 0) return true;
    begin = end + 1;
  }
  return false;
}

// A folder's files (data_files says which).
std::vector<std::string> folder_files(const std::string& folder, std::string_view flag,
                                      DataSplit split) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name[0] == '.' || ends_with(name, ".tmp")) continue;
    if (!entry.is_regular_file(ec)) continue;
    // An empty text file holds no document (`loom tokenize` skips it too); an empty shard is a
    // damaged one, refused when it is opened.
    std::error_code size_error;  // unreadable size: kept, and named when it is opened
    if (!ends_with(name, ".bin") && entry.file_size(size_error) == 0 && !size_error) continue;
    files.push_back(entry.path().string());
  }
  LOOM_CHECK(!ec, "{}: cannot list the folder '{}': {}", flag, folder, ec.message());
  LOOM_CHECK(!files.empty(), "{}: the folder '{}' holds no files", flag, folder);
  std::sort(files.begin(), files.end());
  // A folder of shards: its shards (not a tokenizer.json or README beside them), and of both
  // splits the one asked for, so a folder given to --data and --val-data holds nothing out twice.
  const auto is_shard = [](const std::string& f) { return ends_with(f, ".bin"); };
  if (std::any_of(files.begin(), files.end(), is_shard)) {
    std::erase_if(files, [&](const std::string& f) { return !is_shard(f); });
    const bool both = std::any_of(files.begin(), files.end(), is_validation_shard) &&
                      !std::all_of(files.begin(), files.end(), is_validation_shard);
    if (both) {
      const bool held_out = split == DataSplit::kValidation;
      std::erase_if(files,
                    [&](const std::string& f) { return is_validation_shard(f) != held_out; });
    }
  }
  return files;
}

std::vector<std::string> glob_files(const std::string& pattern, std::string_view flag) {
  glob_t matches{};
  const int rc = glob(pattern.c_str(), GLOB_ERR, nullptr, &matches);
  std::vector<std::string> files;
  for (size_t i = 0; rc == 0 && i < matches.gl_pathc; ++i) {
    std::error_code ec;
    if (fs::is_regular_file(matches.gl_pathv[i], ec)) files.emplace_back(matches.gl_pathv[i]);
  }
  globfree(&matches);
  LOOM_CHECK(!files.empty(), "{}: no file matches the pattern '{}'", flag, pattern);
  return files;  // glob sorts
}

std::string read_text(const std::string& path, std::string_view flag) {
  std::ifstream file(path, std::ios::binary);
  LOOM_CHECK(file.good(), "{}: cannot open '{}': {}", flag, path, std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  LOOM_CHECK(!file.bad(), "{}: reading '{}' failed: {}", flag, path, std::strerror(errno));
  LOOM_CHECK(!text.empty(), "{}: '{}' is empty", flag, path);
  return text;
}

}  // namespace

std::vector<std::string> data_files(const std::string& spec, std::string_view flag,
                                    DataSplit split) {
  std::vector<std::string> files;
  size_t begin = 0;
  while (begin <= spec.size()) {
    size_t end = spec.find(',', begin);
    if (end == std::string::npos) end = spec.size();
    const std::string part = spec.substr(begin, end - begin);
    begin = end + 1;
    if (part.empty()) continue;
    std::vector<std::string> more;
    std::error_code ec;
    if (part.find_first_of("*?[") != std::string::npos) {
      more = glob_files(part, flag);
    } else if (fs::is_directory(part, ec)) {
      more = folder_files(part, flag, split);
    } else {
      LOOM_CHECK(fs::exists(part, ec), "{}: '{}' does not exist", flag, part);
      more = {part};
    }
    files.insert(files.end(), more.begin(), more.end());
  }
  LOOM_CHECK(!files.empty(), "{}: '{}' names no file", flag, spec);
  return files;
}

DocumentIndex::DocumentIndex(std::vector<int64_t> starts, int64_t corpus_size, int64_t seq_len)
    : starts_(std::move(starts)), corpus_size_(corpus_size), seq_len_(seq_len) {
  separators_ = static_cast<int64_t>(starts_.size());
  if (starts_.empty() || starts_.front() != 0) starts_.insert(starts_.begin(), 0);
  windows_before_.reserve(starts_.size());
  for (size_t d = 0; d < starts_.size(); ++d) {
    const int64_t end = d + 1 < starts_.size() ? starts_[d + 1] : corpus_size_;
    const int64_t length = end - starts_[d];
    windows_before_.push_back(total_windows_);
    // A window is seq_len inputs and the target after the last: seq_len + 1 tokens.
    if (length > seq_len_) {
      total_windows_ += length - seq_len_;
    } else {
      skipped_tokens_ += length;
    }
  }
}

int64_t DocumentIndex::window_start(int64_t index) const {
  LOOM_INTERNAL_ASSERT(index >= 0 && index < total_windows_, "window index out of range");
  // The last document whose first window is at or before `index`, skipping documents with none.
  const auto it = std::upper_bound(windows_before_.begin(), windows_before_.end(), index);
  const size_t d = static_cast<size_t>(it - windows_before_.begin()) - 1;
  return starts_[d] + (index - windows_before_[d]);
}

TokenCorpus TokenCorpus::open(const std::string& spec, const TextTokenization& text,
                              std::string_view flag, DataSplit split) {
  TokenCorpus corpus;
  int64_t text_bytes = 0;
  for (const std::string& path : data_files(spec, flag, split)) {
    Source source{.name = path};
    if (ends_with(path, ".bin")) {
      std::shared_ptr<const MappedTokenFile> file = MappedTokenFile::open(path);
      source.size = file->size();
      corpus.vocab_size_ = std::max(corpus.vocab_size_, file->implied_vocab_size());
      source.file = std::move(file);
    } else {
      const std::string bytes = read_text(path, flag);
      check_is_text(bytes, path, flag);
      text_bytes += static_cast<int64_t>(bytes.size());
      auto tokens = std::make_shared<std::vector<int32_t>>();
      // One document: its separator, then its tokens (or bytes), as `loom tokenize` writes it.
      auto add_document = [&](std::string_view document) {
        if (text.document_separator) tokens->push_back(*text.document_separator);
        if (text.encode) {
          const std::vector<int32_t> ids = text.encode(document);
          tokens->insert(tokens->end(), ids.begin(), ids.end());
        } else {
          for (char c : document) tokens->push_back(static_cast<unsigned char>(c));
        }
      };
      if (is_jsonl(path)) {
        for_each_jsonl_document(bytes, 0, bytes.size(), path, "text", flag, add_document);
        LOOM_CHECK(!tokens->empty(), "{}: '{}' holds no document (only blank lines)", flag, path);
      } else {
        add_document(bytes);
      }
      source.size = static_cast<int64_t>(tokens->size());
      source.tokenized_by = text.name;
      source.tokenizer_vocab = text.vocab_size;
      corpus.vocab_size_ = std::max(corpus.vocab_size_, text.vocab_size);
      source.tokens = std::move(tokens);
    }
    corpus.add(std::move(source));
  }
  const Source& first = corpus.sources_.front();
  if (corpus.sources_.size() == 1 && first.file) {
    corpus.description_ =
        fmt::format("{} ({} tokens, {})", first.name, corpus.size_, first.file->format_name());
  } else if (corpus.sources_.size() == 1 && !text.encode) {
    corpus.description_ = fmt::format("{} ({} bytes, byte-level tokens)", first.name, text_bytes);
  } else if (corpus.sources_.size() == 1) {
    corpus.description_ = fmt::format("{} ({} bytes, {} tokens, {})", first.name, text_bytes,
                                      corpus.size_, text.name);
  } else {
    corpus.description_ =
        fmt::format("{} ({} files, {} tokens)", spec, corpus.sources_.size(), corpus.size_);
  }
  return corpus;
}

TokenCorpus TokenCorpus::from_tokens(std::vector<int32_t> tokens, int64_t vocab_size,
                                     std::string description) {
  TokenCorpus corpus;
  corpus.vocab_size_ = vocab_size;
  corpus.description_ = std::move(description);
  Source source{.name = corpus.description_,
                .tokens = std::make_shared<const std::vector<int32_t>>(std::move(tokens))};
  source.size = static_cast<int64_t>(source.tokens->size());
  corpus.add(std::move(source));
  return corpus;
}

void TokenCorpus::add(Source source) {
  source.begin = size_;
  size_ += source.size;
  sources_.push_back(std::move(source));
}

size_t TokenCorpus::source_of(int64_t position) const {
  const auto it = std::upper_bound(sources_.begin(), sources_.end(), position,
                                   [](int64_t p, const Source& s) { return p < s.begin; });
  return static_cast<size_t>(it - sources_.begin()) - 1;
}

void TokenCorpus::read(int64_t start, int64_t count, int64_t* out) const {
  LOOM_CHECK(start >= 0 && count >= 0 && start + count <= size_,
             "TokenCorpus::read: tokens [{}, {}) are outside {} ({} tokens)", start, start + count,
             description_, size_);
  for (size_t s = count > 0 ? source_of(start) : sources_.size(); count > 0; ++s) {
    const Source& source = sources_[s];
    const int64_t offset = start - source.begin;
    const int64_t n = std::min(count, source.size - offset);
    if (source.file) {
      source.file->read(offset, n, out);
    } else {
      std::copy_n(source.tokens->data() + offset, n, out);
    }
    out += n;
    start += n;
    count -= n;
  }
}

std::vector<TokenCorpus::Chunk> TokenCorpus::chunks() const {
  std::vector<Chunk> out;
  for (const Source& source : sources_) {
    for (int64_t begin = 0; begin < source.size; begin += kScanChunk) {
      out.push_back({&source, begin, std::min(kScanChunk, source.size - begin)});
    }
  }
  return out;
}

void TokenCorpus::check_tokens_below(int64_t vocab_size, std::string_view what) const {
  // The chunks holding a token out of range (every core reads its share); the first is named.
  const std::vector<Chunk> all = chunks();
  std::mutex bad_mutex;
  std::vector<size_t> bad;
  parallel_for_each(all.size(), 0, [&](size_t index) {
    const Chunk& chunk = all[index];
    const Source& source = *chunk.source;
    bool out_of_range = false;
    if (source.file) {
      out_of_range = source.file->max_token(chunk.begin, chunk.count).value >= vocab_size;
    } else {
      const int32_t* tokens = source.tokens->data() + chunk.begin;
      out_of_range = std::any_of(tokens, tokens + chunk.count,
                                 [&](int32_t t) { return t < 0 || t >= vocab_size; });
    }
    if (out_of_range) {
      std::lock_guard<std::mutex> lock(bad_mutex);
      bad.push_back(index);
    }
  });
  if (bad.empty()) return;
  const Chunk& chunk = all[*std::min_element(bad.begin(), bad.end())];
  const Source& source = *chunk.source;
  // The first token out of range in that chunk, to name it.
  std::vector<int64_t> tokens(static_cast<size_t>(chunk.count));
  read(source.begin + chunk.begin, chunk.count, tokens.data());
  const auto first = std::find_if(tokens.begin(), tokens.end(),
                                  [&](int64_t t) { return t < 0 || t >= vocab_size; });
  const int64_t at = chunk.begin + (first - tokens.begin());
  if (source.file) {
    LOOM_FAIL(
        "{}: '{}' holds token {} at index {} (byte {}), outside the model's vocabulary of {} "
        "(tokens 0 to {}); was it tokenized for another model? (a larger --vocab-size pads the "
        "model's)",
        what, source.name, *first, at, source.file->byte_offset(at), vocab_size, vocab_size - 1);
  }
  // Text: its tokenizer made the token, so it is the tokenizer that does not fit the model.
  LOOM_CHECK(source.tokenized_by.empty(),
             "{}: '{}' gives token {} at index {} once tokenized ({}, a vocabulary of {}), outside "
             "the model's vocabulary of {} (tokens 0 to {}): the tokenizer is not the model's; "
             "give the model's tokenizer (--tokenizer)",
             what, source.name, *first, at, source.tokenized_by, source.tokenizer_vocab, vocab_size,
             vocab_size - 1);
  LOOM_FAIL(
      "{}: {} holds token {} at index {}, outside the model's vocabulary of {} (tokens 0 to "
      "{})",
      what, source.name, *first, at, vocab_size, vocab_size - 1);
}

void TokenCorpus::index_documents(int32_t separator, int64_t seq_len) {
  // Each chunk's separators (every core reads its share), then all of them in stream order.
  const std::vector<Chunk> all = chunks();
  std::vector<std::vector<int64_t>> found(all.size());
  parallel_for_each(all.size(), 0, [&](size_t index) {
    const Chunk& chunk = all[index];
    const Source& source = *chunk.source;
    std::vector<int64_t>& out = found[index];
    if (source.file) {
      source.file->for_each_equal(chunk.begin, chunk.count, static_cast<uint32_t>(separator),
                                  [&](int64_t i) { out.push_back(source.begin + i); });
    } else {
      for (int64_t i = chunk.begin; i < chunk.begin + chunk.count; ++i) {
        if ((*source.tokens)[static_cast<size_t>(i)] == separator) out.push_back(source.begin + i);
      }
    }
  });
  std::vector<int64_t> starts;
  for (const auto& chunk_starts : found)
    starts.insert(starts.end(), chunk_starts.begin(), chunk_starts.end());
  documents_ = std::make_shared<const DocumentIndex>(std::move(starts), size_, seq_len);
}

}  // namespace loom::data
