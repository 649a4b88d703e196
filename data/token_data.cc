#include "data/token_data.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "base/error.h"
#include "tensor/ops.h"
#include "tensor/rng.h"

namespace loom::data {

namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

constexpr int32_t kLlmcMagic = 20240520;
constexpr uint16_t kGpt2Vocab = 50257;

}  // namespace

TokenData load_tokens(const std::string& path) {
  std::error_code ec;
  LOOM_CHECK(std::filesystem::exists(path, ec), "load_tokens: '{}' does not exist", path);
  LOOM_CHECK(!std::filesystem::is_directory(path, ec),
             "load_tokens: '{}' is a folder; expected a text file or a GPT-2 token .bin file",
             path);
  std::ifstream file(path, std::ios::binary);
  LOOM_CHECK(file.good(), "load_tokens: cannot open '{}': {}", path, std::strerror(errno));
  std::vector<char> bytes;
  try {
    bytes.assign(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
  } catch (const std::ios_base::failure& e) {
    LOOM_FAIL("load_tokens: reading '{}' failed: {}", path, e.what());
  }
  LOOM_CHECK(!file.bad(), "load_tokens: reading '{}' failed: {}", path, std::strerror(errno));
  LOOM_CHECK(!bytes.empty(), "load_tokens: '{}' is empty", path);
  TokenData data;
  if (ends_with(path, ".bin")) {
    size_t offset = 0;
    int32_t header[256] = {};
    if (bytes.size() >= sizeof(header)) std::memcpy(header, bytes.data(), sizeof(header));
    if (header[0] == kLlmcMagic) {
      offset = sizeof(header);
      const int64_t count = header[2];
      LOOM_CHECK(static_cast<int64_t>((bytes.size() - offset) / 2) >= count,
                 "load_tokens: '{}' declares {} tokens but holds {}", path, count,
                 (bytes.size() - offset) / 2);
    }
    LOOM_CHECK((bytes.size() - offset) % 2 == 0,
               "load_tokens: '{}' is not a whole number of uint16 tokens", path);
    for (size_t i = offset; i + 1 < bytes.size(); i += 2) {
      uint16_t token;
      std::memcpy(&token, bytes.data() + i, 2);
      LOOM_CHECK(
          token < kGpt2Vocab,
          "load_tokens: '{}' holds token {} at position {}, outside GPT-2's vocabulary of {}", path,
          token, (i - offset) / 2, kGpt2Vocab);
      data.tokens.push_back(token);
    }
    data.vocab_size = kGpt2Vocab;
    data.description = fmt::format("{} ({} GPT-2 tokens)", path, data.tokens.size());
  } else {
    for (char c : bytes) data.tokens.push_back(static_cast<unsigned char>(c));
    data.vocab_size = 256;
    data.description = fmt::format("{} ({} bytes, byte-level tokens)", path, data.tokens.size());
  }
  return data;
}

void check_sequences_fit(const TokenData& data, int64_t seq_len) {
  LOOM_CHECK(static_cast<int64_t>(data.tokens.size()) > seq_len,
             "--data: {} holds {} tokens, too few for sequences of {} (+1): give more data or a "
             "shorter --seq-len",
             data.description, data.tokens.size(), seq_len);
}

Batch batch_slice(const TokenData& data, uint64_t seed, int64_t step, int64_t first, int64_t count,
                  int64_t seq_len) {
  // Start positions 0 .. tokens - seq_len - 1: a window of seq_len inputs and the target after
  // each, so a file of exactly seq_len + 1 tokens holds one sequence.
  check_sequences_fit(data, seq_len);
  const int64_t span = static_cast<int64_t>(data.tokens.size()) - seq_len;
  std::vector<int64_t> inputs, targets;
  for (int64_t s = first; s < first + count; ++s) {
    // Start of sequence s of this step: a counter-based draw keyed by (seed, step, s).
    const auto words =
        philox4x32({static_cast<uint32_t>(s), static_cast<uint32_t>(step), 0x5eed, 0},
                   {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
    const int64_t start =
        static_cast<int64_t>((static_cast<uint64_t>(words[0]) << 32 | words[1]) % span);
    for (int64_t t = 0; t < seq_len; ++t) {
      inputs.push_back(data.tokens[start + t]);
      targets.push_back(data.tokens[start + t + 1]);
    }
  }
  return {ops::from_vector_i64(inputs, {count, seq_len}),
          ops::from_vector_i64(targets, {count, seq_len})};
}

double unigram_entropy(const TokenData& data) {
  std::map<int32_t, int64_t> counts;
  for (int32_t t : data.tokens) ++counts[t];
  double entropy = 0;
  const double n = static_cast<double>(data.tokens.size());
  for (const auto& [token, c] : counts) entropy -= c / n * std::log(c / n);
  return entropy;
}

}  // namespace loom::data
