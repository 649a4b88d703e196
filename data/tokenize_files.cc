#include "data/tokenize_files.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string_view>
#include <thread>

#include "base/error.h"
#include "base/file_identity.h"
#include "data/parallel_for_each.h"
#include "data/text_documents.h"
#include "data/token_file.h"

namespace loom::data {

namespace {

namespace fs = std::filesystem;

constexpr std::string_view kWhat = "loom tokenize";

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

// A text file mapped read-only (the input may be far larger than memory).
class MappedText {
 public:
  explicit MappedText(std::string path) : path_(std::move(path)) {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    LOOM_CHECK(fd >= 0, "{}: cannot open '{}': {}", kWhat, path_, std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0) {
      const int error = errno;
      ::close(fd);
      LOOM_FAIL("{}: cannot read '{}': {}", kWhat, path_, std::strerror(error));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      LOOM_FAIL(
          "{}: '{}' is not a regular file; give text files (a pipe or device cannot be mapped: "
          "write it to a file first)",
          kWhat, path_);
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      void* map = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      const int error = errno;
      ::close(fd);
      LOOM_CHECK(map != MAP_FAILED, "{}: cannot map '{}': {}", kWhat, path_, std::strerror(error));
      madvise(map, size_, MADV_SEQUENTIAL);
      data_ = static_cast<const char*>(map);
      check_is_text(text(), path_, kWhat);
    } else {
      ::close(fd);
    }
  }
  ~MappedText() {
    if (data_ != nullptr) munmap(const_cast<char*>(data_), size_);
  }
  MappedText(const MappedText&) = delete;
  MappedText& operator=(const MappedText&) = delete;

  std::string_view text() const { return {data_, size_}; }
  const std::string& path() const { return path_; }
  bool jsonl() const { return is_jsonl(path_); }

 private:
  std::string path_;
  const char* data_ = nullptr;
  size_t size_ = 0;
};

// A piece of one file to encode on a worker thread.
struct Chunk {
  const MappedText* file = nullptr;
  size_t begin = 0, stop = 0;
  // Results.
  std::vector<int32_t> tokens;
  size_t end = 0;  // text: where encoding stopped (a pre-token boundary at or past stop)
  int64_t documents = 0;
};

// The files `inputs` name (a folder's files in name order, not its subfolders), with a warning
// for each subfolder left unread and each file named twice (read twice, its documents weigh
// double: maybe meant, as upsampling, so not an error).
std::vector<std::string> input_files(const std::vector<std::string>& inputs,
                                     const std::function<void(const std::string&)>& warn) {
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    std::error_code ec;
    LOOM_CHECK(fs::exists(input, ec), "{}: '{}' does not exist", kWhat, input);
    if (!fs::is_directory(input, ec)) {
      files.push_back(input);
      continue;
    }
    std::vector<std::string> more, subfolders;
    for (const auto& entry : fs::directory_iterator(input, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.empty() || name[0] == '.') continue;
      if (entry.is_regular_file(ec)) {
        more.push_back(entry.path().string());
      } else if (entry.is_directory(ec)) {
        subfolders.push_back(name);
      }
    }
    LOOM_CHECK(!more.empty(), "{}: the folder '{}' holds no files", kWhat, input);
    if (!subfolders.empty() && warn) {
      std::sort(subfolders.begin(), subfolders.end());
      warn(fmt::format(
          "WARNING: the folder '{}' holds {} subfolder(s) ({}) whose files are not read (a "
          "folder's own files only); give them as inputs too",
          input, subfolders.size(), fmt::join(subfolders, ", ")));
    }
    std::sort(more.begin(), more.end());
    files.insert(files.end(), more.begin(), more.end());
  }
  LOOM_CHECK(!files.empty(), "{}: no input files (give text or .jsonl files or folders)", kWhat);
  if (warn) {
    std::vector<FileIdentity> identities(files.begin(), files.end());
    for (const auto& [again, first] : repeated_files(identities)) {
      warn(
          fmt::format("WARNING: '{}' is read twice (also as '{}'): its documents are in the "
                      "shards twice",
                      files[again], files[first]));
    }
  }
  return files;
}

// Chunks of about `bytes`: a text file cut at line starts that begin a non-space (a likely
// pre-token boundary: exactness never depends on it), a .jsonl file between lines.
void cut(const MappedText& file, int64_t bytes, std::vector<Chunk>& out) {
  const std::string_view text = file.text();
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t target = std::min(text.size(), begin + static_cast<size_t>(bytes));
    // Past the target, look this far for a good cut before taking any character boundary.
    const size_t give_up = std::min(text.size(), target + static_cast<size_t>(bytes));
    size_t stop = target;
    while (stop < text.size()) {
      const size_t newline = text.find('\n', stop);
      if (newline == std::string_view::npos || newline + 1 >= give_up) {
        if (file.jsonl()) {  // a .jsonl chunk ends between lines, however long the line
          stop = newline == std::string_view::npos ? text.size() : newline + 1;
          break;
        }
        // No line start in reach (one huge line, or every line indented): any character
        // boundary will do, since a chunk's tokens are kept only when the previous chunk
        // stopped exactly there (never inside a UTF-8 character: patterns start on one).
        stop = target;
        while (stop < text.size() && (static_cast<unsigned char>(text[stop]) & 0xC0) == 0x80) {
          ++stop;
        }
        break;
      }
      stop = newline + 1;
      if (file.jsonl() || stop == text.size()) break;
      const char next = text[stop];
      if (next != ' ' && next != '\t' && next != '\n' && next != '\r') break;
    }
    out.push_back({.file = &file, .begin = begin, .stop = stop});
    begin = stop;
  }
}

class Encoder {
 public:
  Encoder(const Tokenizer& tokenizer, const TokenizeOptions& options) : tokenizer_(tokenizer) {
    separator_ = options.document_separator;
    if (!separator_ && !options.no_separator) separator_ = tokenizer.document_start();
    if (options.no_separator) separator_.reset();
    text_field_ = options.text_field;
  }

  // A chunk on a worker thread.
  void encode(Chunk& chunk) const {
    const std::string_view text = chunk.file->text();
    if (chunk.file->jsonl()) {
      encode_lines(chunk);
      return;
    }
    if (chunk.begin == 0) {
      if (separator_) chunk.tokens.push_back(*separator_);
      chunk.documents = 1;
    }
    chunk.end = tokenizer_.encode_range(text, chunk.begin, chunk.stop, chunk.tokens);
  }

  // On the writer thread: the chunk after one that stopped at `previous_end` past this chunk's
  // start is encoded again from there (rare: the cut was not a pre-token boundary).
  void reencode_from(Chunk& chunk, size_t previous_end) const {
    chunk.tokens.clear();
    chunk.end = previous_end;
    if (previous_end >= chunk.stop) return;  // the previous chunk's last piece covers this one
    chunk.end = tokenizer_.encode_range(chunk.file->text(), previous_end, chunk.stop, chunk.tokens);
  }

 private:
  void encode_lines(Chunk& chunk) const {
    for_each_jsonl_document(chunk.file->text(), chunk.begin, chunk.stop, chunk.file->path(),
                            text_field_, kWhat, [&](std::string_view document) {
                              if (separator_) chunk.tokens.push_back(*separator_);
                              tokenizer_.encode_range(document, 0, document.size(), chunk.tokens);
                              ++chunk.documents;
                            });
    chunk.end = chunk.stop;
  }

  const Tokenizer& tokenizer_;
  std::optional<int32_t> separator_;
  std::string text_field_;
};

// Shards in order: val first (val_tokens of them), then training shards of shard_tokens. Each
// finished shard waits under a hidden name (.NAME.bin.pending, which a job's --data, a folder
// or a glob never reads) until the whole run succeeded: keep() renames them all into place. So
// a run that fails, or that a signal or a kill ends, leaves no shard that looks like the whole
// corpus; the next run into the folder removes what an interrupted one left.
class ShardSink {
 public:
  ShardSink(const TokenizeOptions& options, int token_bytes)
      : options_(options), token_bytes_(token_bytes), val_left_(options.val_tokens) {}

  void write(std::span<const int32_t> tokens) {
    while (!tokens.empty()) {
      const bool val = val_left_ > 0;
      if (!writer_ || writer_val_ != val) open(val);
      const int64_t room = val ? val_left_ : options_.shard_tokens - writer_->size();
      const auto n =
          static_cast<size_t>(std::min<int64_t>(room, static_cast<int64_t>(tokens.size())));
      writer_->append(tokens.first(n));
      tokens = tokens.subspan(n);
      if (val) val_left_ -= static_cast<int64_t>(n);
      if (val ? val_left_ == 0 : writer_->size() == options_.shard_tokens) close();
    }
  }
  // Unless the run kept its shards (keep()), removes every shard it wrote, pending or renamed
  // (the one being written is a .tmp file its writer drops).
  ~ShardSink() {
    if (kept_) return;
    writer_.reset();
    for (const std::string& shard : shards_) {
      std::error_code ec;
      fs::remove(pending_name(shard), ec);
      fs::remove(shard, ec);
    }
  }
  ShardSink(const ShardSink&) = delete;
  ShardSink& operator=(const ShardSink&) = delete;

  // Commits the last shard; throws as a write does.
  void finish() { close(); }
  const std::vector<std::string>& shards() const { return shards_; }
  int64_t train_shards() const { return train_index_; }
  // The run succeeded: every shard takes its name (durably), and stays.
  std::vector<std::string> keep() {
    for (const std::string& shard : shards_) {
      std::error_code ec;
      fs::rename(pending_name(shard), shard, ec);
      LOOM_CHECK(!ec, "{}: cannot rename '{}' to '{}': {}", kWhat, pending_name(shard), shard,
                 ec.message());
    }
    sync_directory(options_.output, kWhat);
    kept_ = true;
    return shards_;
  }
  // Where a finished shard waits for the run's end: hidden beside its name.
  static std::string pending_name(const std::string& shard) {
    const fs::path path(shard);
    return (path.parent_path() / ("." + path.filename().string() + kPendingSuffix)).string();
  }
  static constexpr const char* kPendingSuffix = ".pending";

 private:
  void open(bool val) {
    close();
    int& index = val ? val_index_ : train_index_;
    path_ =
        fmt::format("{}/{}_{:06d}.bin", options_.output, val ? "val" : options_.prefix, index++);
    writer_ = std::make_unique<TokenFileWriter>(pending_name(path_), token_bytes_, kWhat);
    writer_val_ = val;
  }
  void close() {
    if (!writer_) return;
    if (writer_->size() > 0) {
      writer_->commit();
      shards_.push_back(path_);
    }
    writer_.reset();
  }

  const TokenizeOptions& options_;
  int token_bytes_;
  int64_t val_left_;
  std::unique_ptr<TokenFileWriter> writer_;
  bool writer_val_ = false;
  std::string path_;
  int val_index_ = 0, train_index_ = 0;
  std::vector<std::string> shards_;
  bool kept_ = false;
};

void encode_all(const std::vector<std::unique_ptr<MappedText>>& mapped,
                const TokenizeOptions& options, int threads, const Encoder& encoder,
                ShardSink& sink, TokenizeResult& result,
                std::chrono::steady_clock::time_point start) {
  // A few chunks per thread at a time: the threads stay busy and memory stays bounded.
  const size_t window = static_cast<size_t>(threads) * 4;
  for (const auto& file : mapped) {
    std::vector<Chunk> chunks;
    cut(*file, options.chunk_bytes, chunks);
    size_t previous_end = 0;
    for (size_t first = 0; first < chunks.size(); first += window) {
      std::vector<Chunk> batch(
          std::make_move_iterator(chunks.begin() + static_cast<std::ptrdiff_t>(first)),
          std::make_move_iterator(chunks.begin() + static_cast<std::ptrdiff_t>(
                                                       std::min(chunks.size(), first + window))));
      parallel_for_each(batch.size(), static_cast<size_t>(threads),
                        [&](size_t i) { encoder.encode(batch[i]); });
      for (Chunk& chunk : batch) {
        if (!file->jsonl() && chunk.begin > 0 && previous_end != chunk.begin) {
          encoder.reencode_from(chunk, previous_end);
        }
        previous_end = chunk.end;
        sink.write(chunk.tokens);
        result.totals.tokens += static_cast<int64_t>(chunk.tokens.size());
        result.totals.documents += chunk.documents;
        result.totals.bytes_done += static_cast<int64_t>(chunk.stop - chunk.begin);
      }
      result.totals.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (options.progress) options.progress(result.totals);
    }
  }
}

}  // namespace

TokenizeResult tokenize_files(const Tokenizer& tokenizer, const TokenizeOptions& options) {
  LOOM_CHECK(!options.output.empty(), "{}: no output folder (--out)", kWhat);
  // The shards are PREFIX_NNNNNN.bin in --out: an empty prefix would write "_000000.bin", a
  // slash another folder's files.
  LOOM_CHECK(!options.prefix.empty() && options.prefix.find('/') == std::string::npos &&
                 !options.prefix.starts_with('.') && options.prefix != "val",
             "{}: --prefix '{}': expected a file name prefix without '/' and not starting with '.' "
             "(the shards are PREFIX_NNNNNN.bin in --out, where a job's --data finds no hidden "
             "file; 'val' is the validation shards')",
             kWhat, options.prefix);
  LOOM_CHECK(options.shard_tokens > 0 && options.shard_tokens < (int64_t{1} << 31),
             "{}: --shard-tokens {}: llm.c's header holds 1 to 2^31 - 1 tokens", kWhat,
             options.shard_tokens);
  LOOM_CHECK(options.val_tokens >= 0 && options.val_tokens < (int64_t{1} << 31),
             "{}: --val-tokens {}: 0 to 2^31 - 1", kWhat, options.val_tokens);
  LOOM_CHECK(options.chunk_bytes >= 1 && options.chunk_bytes <= (int64_t{1} << 40),
             "{}: --chunk-bytes {}: expected 1 to 2^40 bytes of text per parallel piece", kWhat,
             options.chunk_bytes);
  LOOM_CHECK(options.threads >= 0 && options.threads <= 1024,
             "{}: --threads {}: expected 0 (every core) to 1024", kWhat, options.threads);
  LOOM_CHECK(options.val_tokens == 0 || options.prefix != "val",
             "{}: --prefix val would write the training shards over the validation shards "
             "(val_NNNNNN.bin); choose another prefix",
             kWhat);
  const std::vector<std::string> files = input_files(options.inputs, options.warn);
  std::error_code ec;
  // Shards of an earlier run in the folder would be read with these by a glob: refused.
  for (const auto& entry : fs::directory_iterator(options.output, ec)) {
    const std::string name = entry.path().filename().string();
    if (name[0] == '.' && ends_with(name, ShardSink::kPendingSuffix)) {
      std::error_code removed;
      fs::remove(entry.path(), removed);  // an interrupted run's unfinished corpus
      continue;
    }
    const bool ours = ends_with(name, ".bin") &&
                      (name.rfind(options.prefix + "_", 0) == 0 || name.rfind("val_", 0) == 0);
    LOOM_CHECK(!ours,
               "{}: '{}' already holds shards ('{}'); a glob over the folder would mix them with "
               "this run's: give an empty or new --out folder",
               kWhat, options.output, name);
  }
  ec.clear();
  fs::create_directories(options.output, ec);
  LOOM_CHECK(!ec && fs::is_directory(options.output, ec), "{}: cannot create the folder '{}': {}",
             kWhat, options.output, ec.message());

  const int threads = options.threads > 0
                          ? options.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const Encoder encoder(tokenizer, options);
  TokenizeResult result;
  result.token_bytes = token_bytes_for_vocab(tokenizer.vocab_size());
  ShardSink sink(options, result.token_bytes);
  std::vector<std::unique_ptr<MappedText>> mapped;
  for (const std::string& file : files) {
    mapped.push_back(std::make_unique<MappedText>(file));
    result.totals.bytes_total += static_cast<int64_t>(mapped.back()->text().size());
  }
  const auto start = std::chrono::steady_clock::now();
  // From here a throw leaves no shard behind (~ShardSink).
  encode_all(mapped, options, threads, encoder, sink, result, start);
  sink.finish();
  LOOM_CHECK(!sink.shards().empty(), "{}: the inputs hold no text", kWhat);
  // Nothing would train: the validation shard goes too, so the folder can be used again.
  LOOM_CHECK(options.val_tokens == 0 || sink.train_shards() > 0,
             "{}: --val-tokens {} takes every one of the inputs' {} tokens: no training shard is "
             "left; give fewer validation tokens",
             kWhat, options.val_tokens, result.totals.tokens);
  result.shards = sink.keep();
  return result;
}

}  // namespace loom::data
