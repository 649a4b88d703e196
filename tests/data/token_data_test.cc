// Token files: text as bytes, GPT-2 token files with and without llm.c's header, the errors a
// bad file gets; batches as a pure function of (seed, step) that dp ranks slice.
#include "data/token_data.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>

#include "base/error.h"
#include "tensor/ops.h"

namespace loom::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string write_file(const std::string& name, const std::string& bytes) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string uint16s(std::initializer_list<uint16_t> values) {
  std::string out;
  for (uint16_t v : values) out += {static_cast<char>(v & 0xff), static_cast<char>(v >> 8)};
  return out;
}

std::string llmc_header(int32_t count) {
  int32_t header[256] = {20240520, 1, count};
  return std::string(reinterpret_cast<const char*>(header), sizeof(header));
}

std::string error_of(const std::string& path) {
  try {
    load_tokens(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "accepted";
}

TEST(TokenDataTest, TextIsBytes) {
  const TokenData data = load_tokens(write_file("a.txt", "hi\xff"));
  EXPECT_THAT(data.tokens, ElementsAre('h', 'i', 255));
  EXPECT_EQ(data.vocab_size, 256);
}

TEST(TokenDataTest, Gpt2TokenFilesWithAndWithoutHeader) {
  const TokenData raw = load_tokens(write_file("raw.bin", uint16s({50256, 7, 300})));
  EXPECT_THAT(raw.tokens, ElementsAre(50256, 7, 300));
  EXPECT_EQ(raw.vocab_size, 50257);
  const TokenData llmc = load_tokens(write_file("llmc.bin", llmc_header(2) + uint16s({1, 2})));
  EXPECT_THAT(llmc.tokens, ElementsAre(1, 2));
}

TEST(TokenDataTest, BadFilesAreNamed) {
  EXPECT_THAT(error_of("/nonexistent/x.txt"), HasSubstr("'/nonexistent/x.txt' does not exist"));
  // A folder once escaped as std::ios_base::failure and aborted every rank.
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string folder = tmp ? tmp : "/tmp";
  EXPECT_EQ(error_of(folder), "load_tokens: '" + folder +
                                  "' is a folder; expected a text file or a GPT-2 token .bin file");
  EXPECT_THAT(error_of(write_file("empty.txt", "")), HasSubstr("is empty"));
  EXPECT_THAT(error_of(write_file("odd.bin", "abc")),
              HasSubstr("not a whole number of uint16 tokens"));
  EXPECT_THAT(error_of(write_file("short.bin", llmc_header(5) + uint16s({1, 2}))),
              HasSubstr("declares 5 tokens but holds 2"));
  EXPECT_THAT(error_of(write_file("vocab.bin", uint16s({1, 50257}))),
              HasSubstr("holds token 50257 at position 1, outside GPT-2's vocabulary of 50257"));
}

TEST(TokenDataTest, BatchesArePureFunctionsOfSeedAndStepAndRanksSliceThem) {
  std::string text;
  for (int i = 0; i < 500; ++i) text += static_cast<char>('a' + i % 26);
  const TokenData data = load_tokens(write_file("abc.txt", text));
  const Batch whole = batch_slice(data, 1, 3, 0, 4, 8);
  EXPECT_EQ(ops::to_vector(batch_slice(data, 1, 3, 0, 4, 8).inputs), ops::to_vector(whole.inputs));
  EXPECT_NE(ops::to_vector(batch_slice(data, 1, 4, 0, 4, 8).inputs), ops::to_vector(whole.inputs));
  // dp rank 1 of 2 reads sequences 2 and 3 of the same global batch.
  EXPECT_EQ(ops::to_vector(batch_slice(data, 1, 3, 2, 2, 8).inputs),
            ops::to_vector(ops::narrow(whole.inputs, 0, 2, 2)));
  // Targets are the inputs shifted by one token.
  const auto in = ops::to_vector(whole.inputs), target = ops::to_vector(whole.targets);
  for (int b = 0; b < 4; ++b) {
    for (int t = 0; t + 1 < 8; ++t) EXPECT_EQ(target[b * 8 + t], in[b * 8 + t + 1]);
  }
}

// seq_len + 1 tokens hold exactly one sequence (its inputs and the target after each), and the
// last window of a longer file is one the sampler can draw.
TEST(TokenDataTest, TheLastWindowIsReachable) {
  const TokenData exact = load_tokens(write_file("exact.txt", "abcdefghi"));  // 9 tokens
  const Batch one = batch_slice(exact, 7, 0, 0, 3, 8);
  for (int b = 0; b < 3; ++b) {
    EXPECT_EQ(ops::to_vector(ops::narrow(one.inputs, 0, b, 1)),
              (std::vector<double>{'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'}));
    EXPECT_EQ(ops::to_vector(ops::narrow(one.targets, 0, b, 1)),
              (std::vector<double>{'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i'}));
  }
  EXPECT_THAT(error_of(write_file("short.txt", "abcdefgh")), HasSubstr("accepted"));
  EXPECT_THAT(
      [&] {
        try {
          batch_slice(load_tokens(write_file("eight.txt", "abcdefgh")), 7, 0, 0, 1, 8);
        } catch (const Error& e) {
          return std::string(e.what());
        }
        return std::string("accepted");
      }(),
      HasSubstr("holds 8 tokens, too few for sequences of 8 (+1)"));
  // 10 tokens, windows of 8 (+1 target): starts 0 and 1, the last one included, both drawn.
  const TokenData ten = load_tokens(write_file("ten.txt", "abcdefghij"));
  std::set<double> firsts;
  for (int step = 0; step < 64; ++step) {
    firsts.insert(ops::to_vector(batch_slice(ten, 3, step, 0, 1, 8).inputs)[0]);
  }
  EXPECT_EQ(firsts, (std::set<double>{'a', 'b'}));
}

TEST(TokenDataTest, UnigramEntropy) {
  EXPECT_NEAR(unigram_entropy(load_tokens(write_file("ab.txt", "abab"))), std::log(2.0), 1e-12);
  EXPECT_NEAR(unigram_entropy(load_tokens(write_file("aa.txt", "aaaa"))), 0.0, 1e-12);
}

}  // namespace
}  // namespace loom::data
