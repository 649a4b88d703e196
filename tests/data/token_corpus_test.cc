// Token corpora: text as bytes; llm.c's uint16 and uint32 shards and nanoGPT's raw uint16; many
// shards (a folder, a glob, a list) read as one stream equal to one file; the errors a bad shard
// gets, naming the shard and where; batches as a pure function of (seed, step) that dp ranks
// slice; windows inside one document; fixed validation windows.
#include "data/token_corpus.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "base/error.h"
#include "data/token_data.h"
#include "data/token_file.h"
#include "tensor/ops.h"

namespace loom::data {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::string temp_dir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp ? tmp : "/tmp";
}

std::string write_file(const std::string& name, const std::string& bytes) {
  const std::string path = temp_dir() + "/" + name;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string uint16s(std::initializer_list<uint16_t> values) {
  std::string out;
  for (uint16_t v : values) out += {static_cast<char>(v & 0xff), static_cast<char>(v >> 8)};
  return out;
}

std::string header(int32_t magic, int32_t version, int32_t count) {
  int32_t h[256] = {magic, version, count};
  return std::string(reinterpret_cast<const char*>(h), sizeof(h));
}

std::vector<int64_t> all_tokens(const TokenCorpus& corpus) {
  std::vector<int64_t> out(static_cast<size_t>(corpus.size()));
  corpus.read(0, corpus.size(), out.data());
  return out;
}

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "accepted";
}

std::string open_error(const std::string& spec) {
  return error_of([&] { TokenCorpus::open(spec); });
}

// Writes `tokens` as llm.c shards of at most `per_shard` tokens each into `folder`.
std::vector<std::string> write_shards(const std::string& folder, const std::vector<int32_t>& tokens,
                                      int64_t per_shard, int width) {
  std::filesystem::create_directories(folder);
  std::vector<std::string> paths;
  for (int64_t begin = 0; begin < static_cast<int64_t>(tokens.size()); begin += per_shard) {
    const std::string path = fmt::format("{}/shard_{:03d}.bin", folder, paths.size());
    TokenFileWriter writer(path, width, "test");
    const int64_t n = std::min<int64_t>(per_shard, static_cast<int64_t>(tokens.size()) - begin);
    writer.append(std::span<const int32_t>(tokens.data() + begin, static_cast<size_t>(n)));
    writer.commit();
    paths.push_back(path);
  }
  return paths;
}

TEST(TokenCorpusTest, TextIsBytes) {
  const TokenCorpus data = TokenCorpus::open(write_file("a.txt", "hi\xff"));
  EXPECT_THAT(all_tokens(data), ElementsAre('h', 'i', 255));
  EXPECT_EQ(data.vocab_size(), 256);
}

TEST(TokenCorpusTest, LlmcAndNanoGptFormats) {
  const TokenCorpus raw = TokenCorpus::open(write_file("raw.bin", uint16s({50256, 7, 300})));
  EXPECT_THAT(all_tokens(raw), ElementsAre(50256, 7, 300));
  EXPECT_EQ(raw.vocab_size(), 50257);
  const TokenCorpus gpt2 =
      TokenCorpus::open(write_file("gpt2.bin", header(20240520, 1, 2) + uint16s({1, 2})));
  EXPECT_THAT(all_tokens(gpt2), ElementsAre(1, 2));
  EXPECT_EQ(gpt2.vocab_size(), 50257);
  // Llama 3's: uint32 tokens past uint16's range.
  const std::vector<int32_t> big = {128000, 70000, 5, 128255};
  const auto paths = write_shards(temp_dir() + "/llama3", big, 100, 4);
  const TokenCorpus llama3 = TokenCorpus::open(paths[0]);
  EXPECT_THAT(all_tokens(llama3), ElementsAre(128000, 70000, 5, 128255));
  EXPECT_EQ(llama3.vocab_size(), 128256);
  EXPECT_THAT(llama3.description(), HasSubstr("4 tokens, llm.c uint32"));
  EXPECT_EQ(token_bytes_for_vocab(50257), 2);
  EXPECT_EQ(token_bytes_for_vocab(128256), 4);
}

TEST(TokenCorpusTest, BadShardsAreNamedWithWhere) {
  EXPECT_THAT(open_error("/nonexistent/x.txt"),
              HasSubstr("--data: '/nonexistent/x.txt' does not exist"));
  EXPECT_THAT(open_error(write_file("empty.txt", "")), HasSubstr("is empty"));
  EXPECT_THAT(open_error(write_file("odd.bin", "abc")),
              HasSubstr("3 bytes is not a whole number of uint16 tokens"));
  const std::string magic = write_file("magic.bin", header(20240521, 1, 2) + uint16s({1, 2}));
  EXPECT_THAT(open_error(magic), HasSubstr("'" + magic +
                                           "': unknown magic 20240521 at byte 0; "
                                           "expected llm.c's 20240520 (GPT-2, uint16 tokens) or "
                                           "20240801 (Llama 3, uint32 tokens)"));
  EXPECT_THAT(open_error(write_file("version.bin", header(20240801, 1, 1) + "abcd")),
              HasSubstr("version 1 at byte 4; llm.c's magic 20240801 goes with version 7"));
  const std::string truncated = write_file("short.bin", header(20240520, 1, 5) + uint16s({1, 2}));
  EXPECT_THAT(open_error(truncated),
              HasSubstr("'" + truncated +
                        "' is truncated: its header declares 5 tokens but it "
                        "holds 2"));
  EXPECT_THAT(open_error(write_file("long.bin", header(20240520, 1, 1) + uint16s({1, 2}))),
              HasSubstr("2 bytes follow its 1 declared tokens"));
  EXPECT_THAT(open_error(temp_dir() + "/nothing_*.bin"), HasSubstr("no file matches the pattern"));
  std::filesystem::create_directories(temp_dir() + "/empty_folder");
  EXPECT_THAT(open_error(temp_dir() + "/empty_folder"), HasSubstr("holds no files"));
  // A token past the vocabulary: the shard, the token, its index and byte offset.
  const auto paths = write_shards(temp_dir() + "/range", {1, 2, 3, 4, 5, 60000, 7}, 4, 2);
  const TokenCorpus range = TokenCorpus::open(temp_dir() + "/range");
  EXPECT_EQ(error_of([&] { range.check_tokens_below(50304, "--data"); }),
            "--data: '" + paths[1] +
                "' holds token 60000 at index 1 (byte 1026), outside the model's vocabulary of "
                "50304 (tokens 0 to 50303); was it tokenized for another model? (a larger "
                "--vocab-size pads the model's)");
  EXPECT_EQ(error_of([&] { range.check_tokens_below(60001, "--data"); }), "accepted");
  // Text a tokenizer of a larger vocabulary tokenized: the tokenizer is named, not the text.
  const std::string text = write_file("words.txt", "ab");
  const TokenCorpus tokenized = TokenCorpus::open(text, {.encode =
                                                             [](std::string_view) {
                                                               return std::vector<int32_t>{7, 354};
                                                             },
                                                         .vocab_size = 400,
                                                         .name = "tokens by tok400.json"});
  EXPECT_EQ(error_of([&] { tokenized.check_tokens_below(256, "--data"); }),
            "--data: '" + text +
                "' gives token 354 at index 1 once tokenized (tokens by tok400.json, a vocabulary "
                "of 400), outside the model's vocabulary of 256 (tokens 0 to 255): the tokenizer "
                "is not the model's; give the model's tokenizer (--tokenizer)");
}

TEST(TokenCorpusTest, NeitherAForeignHeaderNorTextIsReadAsRawTokens) {
  // An llm.c-shaped header (its count fits the file) under a magic llm.c does not write.
  const std::string foreign = write_file("foreign.bin", header(12345, 1, 3) + uint16s({1, 2, 3}));
  EXPECT_EQ(open_error(foreign),
            "token file '" + foreign +
                "': unknown magic 12345 at byte 0 of what looks like an llm.c header (version 1 at "
                "byte 4, 3 tokens declared at byte 8, which the rest of the file holds); expected "
                "llm.c's 20240520 (GPT-2, uint16 tokens) or 20240801 (Llama 3, uint32 tokens)");
  // The same header with a count the file does not hold: its zeros still tell it.
  EXPECT_THAT(open_error(write_file("foreign_count.bin", header(12345, 1, 77) + uint16s({1, 2}))),
              HasSubstr("(version 1 at byte 4, 77 tokens declared at byte 8, zeros to byte 1024)"));
  // Raw tokens of more than 1024 bytes are raw tokens.
  std::string many;
  for (int i = 0; i < 3000; ++i) many += uint16s({static_cast<uint16_t>((i * 7919) % 50257)});
  EXPECT_EQ(TokenCorpus::open(write_file("raw_long.bin", many)).size(), 3000);
  // Text named .bin: no NUL or control byte, which raw uint16 tokens are full of.
  const std::string text =
      write_file("text.bin",
                 "It was the best of times, it was the worst of times, it was the age of\n"
                 "wisdom, it was the age of foolishness.\n");
  EXPECT_THAT(open_error(text), HasSubstr("': its first 110 bytes are text, not tokens"));
  // Raw tokens whose bytes happen to be printable are read as tokens when the file is short.
  EXPECT_THAT(all_tokens(TokenCorpus::open(write_file("printable.bin", uint16s({0x4142, 0x4344})))),
              ElementsAre(0x4142, 0x4344));
}

TEST(TokenCorpusTest, AFolderOfShardsGivesItsShardsAndTheSplitItsFlagAsks) {
  const std::string folder = temp_dir() + "/tokenized";
  write_shards(folder, {1, 2, 3}, 100, 2);  // shard_000.bin
  write_file("tokenized/val_000000.bin", header(20240520, 1, 2) + uint16s({4, 5}));
  write_file("tokenized/tokenizer.json", "{}");
  write_file("tokenized/README", "not data");
  EXPECT_THAT(data_files(folder, "--data"), ElementsAre(folder + "/shard_000.bin"));
  EXPECT_THAT(data_files(folder, "--val-data", DataSplit::kValidation),
              ElementsAre(folder + "/val_000000.bin"));
  // nanoGPT's train.bin and val.bin, llm.c's fineweb_val_000000.bin: a "val" word, not "interval".
  const std::string nano = temp_dir() + "/nano";
  for (const char* name : {"train.bin", "val.bin", "fineweb_val_000000.bin", "interval_1.bin"}) {
    write_file(std::string("nano/") + name, header(20240520, 1, 2) + uint16s({4, 5}));
  }
  EXPECT_THAT(data_files(nano, "--data"),
              ElementsAre(nano + "/interval_1.bin", nano + "/train.bin"));
  EXPECT_THAT(data_files(nano, "--val-data", DataSplit::kValidation),
              ElementsAre(nano + "/fineweb_val_000000.bin", nano + "/val.bin"));
  // A folder of validation shards alone gives them to either flag.
  write_file("held_out/val_000000.bin", header(20240520, 1, 2) + uint16s({4, 5}));
  EXPECT_THAT(data_files(temp_dir() + "/held_out", "--data"),
              ElementsAre(temp_dir() + "/held_out/val_000000.bin"));
  // A folder of text gives every file, as before.
  write_file("texts/a.txt", "a");
  write_file("texts/b.md", "b");
  EXPECT_THAT(data_files(temp_dir() + "/texts", "--data"),
              ElementsAre(temp_dir() + "/texts/a.txt", temp_dir() + "/texts/b.md"));
}

TEST(TokenCorpusTest, JsonLinesAreReadAsSuchUnderAnyOfTheirNames) {
  for (const char* name : {"upper.JSONL", "datasets.json", "lines.ndjson"}) {
    const TokenCorpus corpus = TokenCorpus::open(write_file(name, "{\"text\": \"hi\"}\n"));
    EXPECT_THAT(all_tokens(corpus), ElementsAre('h', 'i')) << name;
  }
  // A line that is not JSON is named by its number in the file; the parser's position is within it.
  const std::string bad =
      write_file("bad.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\"}\n{\"text\": \"c\"\n");
  const std::string error = open_error(bad);
  EXPECT_THAT(error, HasSubstr("'" + bad + "': line 3 (at byte 28) is not JSON"));
  EXPECT_THAT(error, HasSubstr("at line 1, column 13"));
}

TEST(TokenCorpusTest, ShardsReadAsOneStreamEqualToOneFile) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 5000; ++i) tokens.push_back((i * 7919 + i / 3) % 50257);
  const auto one = write_shards(temp_dir() + "/one", tokens, 100000, 2);
  const auto many = write_shards(temp_dir() + "/many", tokens, 777, 2);
  write_shards(temp_dir() + "/wide", tokens, 1500, 4);  // uint32 shards of the same tokens
  ASSERT_EQ(many.size(), 7u);
  const TokenCorpus whole = TokenCorpus::open(one[0]);
  for (const std::string& spec :
       {temp_dir() + "/many", temp_dir() + "/many/shard_*.bin",
        fmt::format("{},{}/shard_00[1-6].bin", many[0], temp_dir() + "/many"),
        temp_dir() + "/wide"}) {
    SCOPED_TRACE(spec);
    const TokenCorpus sharded = TokenCorpus::open(spec);
    EXPECT_EQ(sharded.size(), 5000);
    EXPECT_THAT(all_tokens(sharded), ElementsAreArray(all_tokens(whole)));
    // A read across a shard boundary, and batches drawn over the stream, equal one file's.
    std::vector<int64_t> across(10), expected(10);
    sharded.read(772, 10, across.data());
    whole.read(772, 10, expected.data());
    EXPECT_EQ(across, expected);
    for (int step = 0; step < 5; ++step) {
      EXPECT_EQ(ops::to_vector(batch_slice(sharded, 9, step, 0, 6, 64).inputs),
                ops::to_vector(batch_slice(whole, 9, step, 0, 6, 64).inputs));
    }
  }
  // In-flight writes (*.tmp) and hidden files in the folder are not shards.
  write_file("many/shard_007.bin.tmp", "partial");
  write_file("many/.hidden", "x");
  EXPECT_EQ(TokenCorpus::open(temp_dir() + "/many").size(), 5000);
}

TEST(TokenCorpusTest, BatchesArePureFunctionsOfSeedAndStepAndRanksSliceThem) {
  std::string text;
  for (int i = 0; i < 500; ++i) text += static_cast<char>('a' + i % 26);
  const TokenCorpus data = TokenCorpus::open(write_file("abc.txt", text));
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
TEST(TokenCorpusTest, TheLastWindowIsReachable) {
  const TokenCorpus exact = TokenCorpus::open(write_file("exact.txt", "abcdefghi"));  // 9 tokens
  const Batch one = batch_slice(exact, 7, 0, 0, 3, 8);
  for (int b = 0; b < 3; ++b) {
    EXPECT_EQ(ops::to_vector(ops::narrow(one.inputs, 0, b, 1)),
              (std::vector<double>{'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'}));
    EXPECT_EQ(ops::to_vector(ops::narrow(one.targets, 0, b, 1)),
              (std::vector<double>{'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i'}));
  }
  const TokenCorpus eight = TokenCorpus::open(write_file("eight.txt", "abcdefgh"));
  EXPECT_THAT(error_of([&] { batch_slice(eight, 7, 0, 0, 1, 8); }),
              HasSubstr("holds 8 tokens, too few for sequences of 8 (+1)"));
  // 10 tokens, windows of 8 (+1 target): starts 0 and 1, the last one included, both drawn.
  const TokenCorpus ten = TokenCorpus::open(write_file("ten.txt", "abcdefghij"));
  std::set<double> firsts;
  for (int step = 0; step < 64; ++step) {
    firsts.insert(ops::to_vector(batch_slice(ten, 3, step, 0, 1, 8).inputs)[0]);
  }
  EXPECT_EQ(firsts, (std::set<double>{'a', 'b'}));
}

// With a document index no window spans two documents; every window inside one is drawn; short
// documents are skipped and counted.
TEST(TokenCorpusTest, DocumentBoundariesKeepEachSequenceInsideOneDocument) {
  // Separator 0; documents: [1 1 1] (before the first separator), [0 2 2 2 2 2 2], [0 3],
  // [0 4 4 4 4 4].
  std::vector<int32_t> tokens = {1, 1, 1, 0, 2, 2, 2, 2, 2, 2, 0, 3, 0, 4, 4, 4, 4, 4};
  TokenCorpus data = TokenCorpus::from_tokens(tokens, 5, "documents");
  data.index_documents(0, 4);
  const DocumentIndex& index = *data.documents();
  EXPECT_EQ(index.documents(), 4);
  // Windows of 5 tokens: document 2 (7 tokens) has 3, document 4 (6 tokens) has 2.
  EXPECT_EQ(index.windows(), 5);
  EXPECT_EQ(index.skipped_tokens(), 3 + 2);
  std::vector<int64_t> starts;
  for (int64_t w = 0; w < index.windows(); ++w) starts.push_back(index.window_start(w));
  EXPECT_THAT(starts, ElementsAre(3, 4, 5, 12, 13));
  std::set<double> drawn;
  for (int step = 0; step < 200; ++step) {
    const Batch batch = batch_slice(data, 5, step, 0, 2, 4);
    const auto in = ops::to_vector(batch.inputs), out = ops::to_vector(batch.targets);
    for (int s = 0; s < 2; ++s) {
      drawn.insert(in[s * 4]);
      // Past its first token (a separator or the document's own) a window holds one document.
      std::set<double> kinds(in.begin() + s * 4 + 1, in.begin() + s * 4 + 4);
      kinds.insert(out[s * 4 + 3]);
      EXPECT_EQ(kinds.size(), 1u) << "a window spans two documents at step " << step;
      EXPECT_EQ(kinds.count(0), 0u);
    }
  }
  EXPECT_EQ(drawn, (std::set<double>{0, 2, 4}));
  data.index_documents(0, 7);
  EXPECT_THAT(error_of([&] { check_sequences_fit(data, 7); }),
              HasSubstr("none of the 4 documents of documents holds 8 tokens"));
}

TEST(TokenCorpusTest, ValidationWindowsAreFixedAndConsecutive) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 41; ++i) tokens.push_back(i);
  const TokenCorpus data = TokenCorpus::from_tokens(tokens, 64, "val");
  // 40 windows of 4 (+1): 5 batches of 8.
  EXPECT_EQ(validation_batches(data, 8, 4), 1);
  EXPECT_EQ(validation_batches(data, 2, 4), 5);
  const Batch second = validation_slice(data, 1, 2, 0, 2, 4);
  EXPECT_EQ(ops::to_vector(second.inputs), (std::vector<double>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(ops::to_vector(second.targets), (std::vector<double>{9, 10, 11, 12, 13, 14, 15, 16}));
  // dp rank 1 of 2 takes the batch's second sequence.
  EXPECT_EQ(ops::to_vector(validation_slice(data, 1, 2, 1, 1, 4).inputs),
            (std::vector<double>{12, 13, 14, 15}));
  EXPECT_THAT(
      error_of([&] { validation_slice(data, 5, 2, 0, 2, 4); }),
      HasSubstr("validation batch 5 of val: it holds 5 batches of 2 sequences of 4 tokens"));
}

TEST(TokenCorpusTest, UnigramEntropy) {
  EXPECT_NEAR(unigram_entropy(TokenCorpus::open(write_file("ab.txt", "abab"))), std::log(2.0),
              1e-12);
  EXPECT_NEAR(unigram_entropy(TokenCorpus::open(write_file("aa.txt", "aaaa"))), 0.0, 1e-12);
}

}  // namespace
}  // namespace loom::data
