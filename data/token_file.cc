#include "data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "base/error.h"

namespace loom::data {

namespace {

constexpr int32_t kGpt2Vocab = 50257;
constexpr int32_t kLlama3Vocab = 128256;

// A first int32 in 2024xxxx reads as an llm.c header: raw uint16 tokens make such a value only
// when the second token is 308 and the first >= 54,912 (uncommon enough to name as an error).
bool looks_like_llmc_magic(int32_t value) { return value / 10000 == 2024; }

// Whether a file's first bytes are text: no NUL or other control byte but tab, newline, carriage
// return and form feed. Raw uint16 tokens hold such bytes in nearly every token (a high byte 0 to
// 0x1f: every token below 8192), so 64 bytes of text are none.
bool looks_like_text(const unsigned char* bytes, size_t n) {
  if (n < 64) return false;
  return std::none_of(bytes, bytes + n, [](unsigned char c) {
    return (c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f') || c == 0x7f;
  });
}

long page_size() {
  static const long size = sysconf(_SC_PAGESIZE);
  return size;
}

}  // namespace

MappedTokenFile::~MappedTokenFile() {
  if (map_ != nullptr) munmap(const_cast<unsigned char*>(map_), map_bytes_);
  if (fd_ >= 0) ::close(fd_);
}

std::unique_ptr<MappedTokenFile> MappedTokenFile::open(const std::string& path) {
  std::unique_ptr<MappedTokenFile> file(new MappedTokenFile());
  file->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  LOOM_CHECK(fd >= 0, "token file '{}': cannot open it: {}", path, std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    ::close(fd);
    LOOM_FAIL("token file '{}': {}", path,
              S_ISDIR(st.st_mode) ? "is a folder" : std::strerror(errno));
  }
  const auto bytes = static_cast<size_t>(st.st_size);
  if (bytes == 0) {
    ::close(fd);
    LOOM_FAIL("token file '{}' is empty", path);
  }
  void* map = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  const int map_error = errno;
  file->fd_ = fd;  // kept for the whole-file scans (pread)
  LOOM_CHECK(map != MAP_FAILED, "token file '{}': cannot map its {} bytes: {}", path, bytes,
             std::strerror(map_error));
  file->map_ = static_cast<const unsigned char*>(map);
  file->map_bytes_ = bytes;
  // Batches read a few pages at random places: no read-around of the pages near each (the
  // kernel's default for a mapping would read and map up to 128 KiB for every sequence).
  madvise(map, bytes, MADV_RANDOM);

  int32_t header[256] = {};
  std::memcpy(header, file->map_, std::min(bytes, sizeof(header)));
  if (looks_like_llmc_magic(header[0])) {
    const bool gpt2 = header[0] == kLlmcGpt2Magic, llama3 = header[0] == kLlmcLlama3Magic;
    LOOM_CHECK(gpt2 || llama3,
               "token file '{}': unknown magic {} at byte 0; expected llm.c's {} (GPT-2, uint16 "
               "tokens) or {} (Llama 3, uint32 tokens)",
               path, header[0], kLlmcGpt2Magic, kLlmcLlama3Magic);
    const int32_t version = gpt2 ? 1 : 7;
    LOOM_CHECK(header[1] == version,
               "token file '{}': version {} at byte 4; llm.c's magic {} goes with version {}", path,
               header[1], header[0], version);
    file->format_ = gpt2 ? TokenFileFormat::kLlmcUint16 : TokenFileFormat::kLlmcUint32;
    file->width_ = gpt2 ? 2 : 4;
    file->data_offset_ = kLlmcHeaderBytes;
    LOOM_CHECK(bytes >= kLlmcHeaderBytes,
               "token file '{}' is truncated: {} bytes, shorter than llm.c's {}-byte header", path,
               bytes, kLlmcHeaderBytes);
    const int64_t declared = header[2];
    const int64_t held = static_cast<int64_t>(bytes - kLlmcHeaderBytes) / file->width_;
    LOOM_CHECK(declared > 0, "token file '{}': its header declares {} tokens (byte 8)", path,
               declared);
    LOOM_CHECK(held >= declared,
               "token file '{}' is truncated: its header declares {} tokens but it holds {} "
               "({} bytes after the header, {} per token)",
               path, declared, held, bytes - kLlmcHeaderBytes, file->width_);
    LOOM_CHECK(static_cast<int64_t>(bytes - kLlmcHeaderBytes) == declared * file->width_,
               "token file '{}': {} bytes follow its {} declared tokens; expected none", path,
               static_cast<int64_t>(bytes - kLlmcHeaderBytes) - declared * file->width_, declared);
    file->count_ = declared;
  } else {
    // An llm.c header whose magic is not llm.c's: a count at byte 8 that the rest of the file
    // holds exactly, in 2- or 4-byte tokens, or a small version followed by 1012 zero bytes.
    // Read as raw tokens, the header would be trained on.
    const int64_t declared = header[2];
    const bool count_fits =
        declared > 0 && (static_cast<int64_t>(bytes - kLlmcHeaderBytes) == declared * 2 ||
                         static_cast<int64_t>(bytes - kLlmcHeaderBytes) == declared * 4);
    const bool zeros_after =
        header[1] >= 1 && header[1] <= 255 &&
        std::all_of(header + 3, header + 256, [](int32_t v) { return v == 0; });
    LOOM_CHECK(bytes <= kLlmcHeaderBytes || !(count_fits || zeros_after),
               "token file '{}': unknown magic {} at byte 0 of what looks like an llm.c header "
               "(version {} at byte 4, {} tokens declared at byte 8{}); expected llm.c's {} "
               "(GPT-2, uint16 tokens) or {} (Llama 3, uint32 tokens)",
               path, header[0], header[1], declared,
               count_fits ? ", which the rest of the file holds" : ", zeros to byte 1024",
               kLlmcGpt2Magic, kLlmcLlama3Magic);
    const size_t sample = std::min<size_t>(bytes, 4096);
    LOOM_CHECK(!looks_like_text(file->map_, sample),
               "token file '{}': its first {} bytes are text, not tokens (no NUL or control byte, "
               "which raw uint16 tokens are full of); a .bin file is read as tokens: give text "
               "another name (.txt, or .jsonl for JSON lines)",
               path, sample);
    LOOM_CHECK(bytes % 2 == 0,
               "token file '{}': {} bytes is not a whole number of uint16 tokens (nanoGPT's raw "
               "format; llm.c's files start with magic {} or {})",
               path, bytes, kLlmcGpt2Magic, kLlmcLlama3Magic);
    file->format_ = TokenFileFormat::kRawUint16;
    file->width_ = 2;
    file->count_ = static_cast<int64_t>(bytes / 2);
  }
  return file;
}

int64_t MappedTokenFile::implied_vocab_size() const {
  return width_ == 2 ? kGpt2Vocab : kLlama3Vocab;
}

std::string MappedTokenFile::format_name() const {
  switch (format_) {
    case TokenFileFormat::kLlmcUint16:
      return "llm.c uint16";
    case TokenFileFormat::kLlmcUint32:
      return "llm.c uint32";
    case TokenFileFormat::kRawUint16:
      return "raw uint16";
  }
  return "?";
}

void MappedTokenFile::release(int64_t start, int64_t count) const {
  // A fault on a file mapping maps the neighbouring pages already in the page cache too (the
  // kernel's fault-around: 64 KiB, aligned, by default), so the whole aligned windows around the
  // range are released, not only the pages read: 1 MiB, well past any fault-around setting.
  constexpr uintptr_t kWindow = uintptr_t{1} << 20;
  const auto base = reinterpret_cast<uintptr_t>(map_);
  const auto first = reinterpret_cast<uintptr_t>(map_ + byte_offset(start));
  const auto last = reinterpret_cast<uintptr_t>(map_ + byte_offset(start + count));
  const auto page = static_cast<uintptr_t>(page_size());
  const uintptr_t map_end = (base + map_bytes_ + page - 1) / page * page;
  const uintptr_t begin = std::max(base, first / kWindow * kWindow);
  const uintptr_t end = std::min(map_end, (last + kWindow - 1) / kWindow * kWindow);
  // Pages of a read-only shared file mapping: dropping them loses nothing (they are read back
  // from the page cache on the next touch).
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

void MappedTokenFile::read(int64_t start, int64_t count, int64_t* out) const {
  LOOM_INTERNAL_ASSERT(start >= 0 && count >= 0 && start + count <= count_,
                       "MappedTokenFile::read out of range");
  const unsigned char* base = map_ + data_offset_;
  if (width_ == 2) {
    const auto* tokens = reinterpret_cast<const uint16_t*>(base) + start;
    for (int64_t i = 0; i < count; ++i) out[i] = tokens[i];
  } else {
    const auto* tokens = reinterpret_cast<const uint32_t*>(base) + start;
    for (int64_t i = 0; i < count; ++i) out[i] = tokens[i];
  }
  release(start, count);
}

namespace {

template <typename T>
MappedTokenFile::MaxToken max_of(const T* tokens, int64_t count) {
  // Vectorizes (a plain max reduction), then finds the first position only when asked.
  T best = 0;
  for (int64_t i = 0; i < count; ++i) best = std::max(best, tokens[i]);
  const int64_t at = std::find(tokens, tokens + count, best) - tokens;
  return {best, at};
}

}  // namespace

const unsigned char* MappedTokenFile::scan_read(int64_t start, int64_t count) const {
  // Whole-file passes read with pread into one buffer rather than through the mapping: no page
  // faults (a fault per 4 KiB page costs more than copying it) and nothing added to the
  // resident set.
  thread_local std::vector<unsigned char> buffer;
  const size_t bytes = static_cast<size_t>(count * width_);
  buffer.resize(bytes);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd_, buffer.data() + done, bytes - done,
                              static_cast<off_t>(byte_offset(start)) + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    LOOM_CHECK(n > 0, "token file '{}': reading bytes {} to {} failed: {}", path_,
               byte_offset(start) + static_cast<int64_t>(done), byte_offset(start + count),
               n < 0 ? std::strerror(errno) : "the file is shorter than when it was opened");
    done += static_cast<size_t>(n);
  }
  return buffer.data();
}

MappedTokenFile::MaxToken MappedTokenFile::max_token(int64_t start, int64_t count) const {
  LOOM_INTERNAL_ASSERT(start >= 0 && count > 0 && start + count <= count_,
                       "MappedTokenFile::max_token out of range");
  const unsigned char* base = scan_read(start, count);
  MaxToken result = width_ == 2 ? max_of(reinterpret_cast<const uint16_t*>(base), count)
                                : max_of(reinterpret_cast<const uint32_t*>(base), count);
  result.position += start;
  return result;
}

int token_bytes_for_vocab(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

TokenFileWriter::TokenFileWriter(const std::string& path, int token_bytes, std::string_view what)
    : file_(path, what), path_(path), width_(token_bytes) {
  LOOM_CHECK(token_bytes == 2 || token_bytes == 4,
             "{}: tokens are 2 or 4 bytes wide in llm.c's format, not {}", what, token_bytes);
  int32_t header[256] = {};
  file_.write(header, sizeof(header));  // the real header at commit(), when the count is known
}

void TokenFileWriter::append(std::span<const int32_t> tokens) {
  if (width_ == 4) {
    for (int32_t t : tokens) {
      LOOM_CHECK(t >= 0, "token shard '{}': token {} is negative", path_, t);
    }
    file_.write(tokens.data(), tokens.size_bytes());
  } else {
    std::vector<uint16_t> narrow(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      LOOM_CHECK(tokens[i] >= 0 && tokens[i] < 65536,
                 "token shard '{}': token {} does not fit uint16 (write 4-byte tokens)", path_,
                 tokens[i]);
      narrow[i] = static_cast<uint16_t>(tokens[i]);
    }
    file_.write(narrow.data(), narrow.size() * sizeof(uint16_t));
  }
  count_ += static_cast<int64_t>(tokens.size());
}

void TokenFileWriter::commit() {
  LOOM_CHECK(count_ > 0 && count_ < (int64_t{1} << 31),
             "token shard '{}': {} tokens; llm.c's header holds 1 to 2^31 - 1", path_, count_);
  int32_t header[256] = {};
  header[0] = width_ == 2 ? kLlmcGpt2Magic : kLlmcLlama3Magic;
  header[1] = width_ == 2 ? 1 : 7;
  header[2] = static_cast<int32_t>(count_);
  file_.write_at(0, header, sizeof(header));
  file_.commit();
}

}  // namespace loom::data
