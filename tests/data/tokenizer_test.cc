// The tokenizer.json reader against Hugging Face tokenizers: token-for-token over a mixed text
// (fixtures/tokenizer/, made by tools/data/make_tokenizer_fixtures.py) for a GPT-2-style and a
// Llama-3-style tokenizer trained by `tokenizers` and GPT-2's real one, short tricky cases (with
// variants: add_prefix_space; added tokens with lstrip, rstrip and normalized), round trips,
// chunked encoding with encode_range, long runs, and the errors.
#include "data/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/error.h"
#include "data/pretokenizer.h"

namespace loom::data {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

const std::string kFixtures = "tests/data/fixtures/tokenizer/";
const std::vector<std::string> kTokenizers = {"gpt2_style", "llama3_style", "gpt2"};

std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  EXPECT_TRUE(file.good()) << "cannot open " << path;
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

// llm.c's token file: int32[256] header (magic, version, count), then uint16 or uint32 ids.
std::vector<int32_t> read_ids(const std::string& path) {
  const std::string bytes = read_file(path);
  int32_t header[256];
  EXPECT_GE(bytes.size(), sizeof(header));
  std::memcpy(header, bytes.data(), sizeof(header));
  const bool wide = header[0] == 20240801;
  EXPECT_TRUE(wide || header[0] == 20240520) << path;
  const size_t width = wide ? 4 : 2;
  EXPECT_EQ(bytes.size(), sizeof(header) + header[2] * width) << path;
  std::vector<int32_t> ids(header[2]);
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t id = 0;
    std::memcpy(&id, bytes.data() + sizeof(header) + i * width, width);
    ids[i] = static_cast<int32_t>(id);
  }
  return ids;
}

const std::string& text() {
  static const std::string instance = read_file(kFixtures + "text.txt");
  return instance;
}

const Tokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, Tokenizer>* cache = new std::map<std::string, Tokenizer>();
  auto it = cache->find(name);
  if (it == cache->end()) {
    it = cache->emplace(name, Tokenizer::from_file(kFixtures + name + ".json")).first;
  }
  return it->second;
}

// The first difference of two id sequences, with the text around it, for failure messages.
std::string first_difference(const Tokenizer& t, const std::vector<int32_t>& got,
                             const std::vector<int32_t>& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  if (i == got.size() && i == want.size()) return "equal";
  const size_t from = i >= 3 ? i - 3 : 0;
  const auto around = [&](const std::vector<int32_t>& ids) {
    std::string out;
    for (size_t k = from; k < std::min(ids.size(), i + 4); ++k) {
      out += fmt::format("{}{}={:?} ", k == i ? "*" : "", ids[k], t.decode({&ids[k], 1}));
    }
    return out;
  };
  return fmt::format("{} vs {} ids; first difference at {}: got [{}] want [{}]", got.size(),
                     want.size(), i, around(got), around(want));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(TokenizerTest, MatchesHuggingFaceOnTheFixtureText) {
  for (const std::string& name : kTokenizers) {
    const Tokenizer& t = tokenizer(name);
    const std::vector<int32_t> want = read_ids(kFixtures + name + ".ids.bin");
    const std::vector<int32_t> got = t.encode(text());
    EXPECT_TRUE(got == want) << name << ": " << first_difference(t, got, want);
  }
}

TEST(TokenizerTest, DecodeOfEncodeIsTheText) {
  // Bytes that are not UTF-8 too: each becomes a piece of its own and comes back.
  const std::string odd = std::string("caf\xC3") + "\xA9 \xFF\xFEx\xE2\x82 \xF0\x9F\x98" + "end";
  for (const std::string& name : kTokenizers) {
    const Tokenizer& t = tokenizer(name);
    EXPECT_TRUE(t.decode(t.encode(text())) == text()) << name;
    EXPECT_EQ(t.decode(t.encode(odd)), odd) << name;
    EXPECT_EQ(t.decode(t.encode("")), "");
  }
}

// Encodes `text` in chunks that stop at `stops` in turn, each chunk starting where the one
// before stopped; returns the concatenation and checks each stop.
std::vector<int32_t> encode_in_chunks(const Tokenizer& t, std::string_view s,
                                      const std::vector<size_t>& stops) {
  std::vector<int32_t> out;
  size_t begin = 0;
  for (size_t stop : stops) {
    if (stop <= begin) continue;
    const size_t end = t.encode_range(s, begin, stop, out);
    EXPECT_TRUE(end >= stop || end == s.size()) << stop << " " << end;
    begin = end;
  }
  if (begin < s.size()) {
    EXPECT_EQ(t.encode_range(s, begin, s.size(), out), s.size());
  }
  return out;
}

TEST(TokenizerTest, EncodeRangeChunksConcatenateToTheWhole) {
  const std::string& s = text();
  const size_t run = s.find("tail" + std::string(10000, ' ') + "word");
  ASSERT_NE(run, std::string::npos);
  const size_t special = s.find("<|endoftext|>");
  ASSERT_NE(special, std::string::npos);
  std::vector<size_t> stops;
  for (size_t k = 1; k < 16; ++k) stops.push_back(s.size() * k / 16);
  stops.push_back(run + 4 + 5000);  // inside the space run
  stops.push_back(special + 3);     // inside an added token
  stops.push_back(special);         // right at it
  std::sort(stops.begin(), stops.end());
  for (const std::string& name : kTokenizers) {
    const Tokenizer& t = tokenizer(name);
    const std::vector<int32_t> whole = t.encode(s);
    const std::vector<int32_t> chunked = encode_in_chunks(t, s, stops);
    EXPECT_TRUE(chunked == whole) << name << ": " << first_difference(t, chunked, whole);
    // A stop inside the run: the piece that crosses it is the whole run but its last space
    // (which goes with "word"), so the chunk overshoots the stop.
    std::vector<int32_t> out;
    const size_t after_tail = t.encode_range(s, run, run + 1, out);
    EXPECT_EQ(after_tail, run + 4) << name;
    out.clear();
    EXPECT_EQ(t.encode_range(s, after_tail, run + 4 + 5000, out), run + 4 + 9999) << name;
    EXPECT_THAT(t.decode(out), std::string(9999, ' ')) << name;
    // A chunk that starts at that boundary encodes the rest exactly.
    std::vector<int32_t> head;
    t.encode_range(s, 0, run + 4 + 5000, head);
    std::vector<int32_t> tail;
    EXPECT_EQ(t.encode_range(s, run + 4 + 9999, s.size(), tail), s.size());
    head.insert(head.end(), tail.begin(), tail.end());
    EXPECT_TRUE(head == whole) << name << ": " << first_difference(t, head, whole);
  }
}

TEST(TokenizerTest, EncodeRangeStopsAfterAnAddedToken) {
  const Tokenizer& t = tokenizer("llama3_style");
  const std::string s = "hi<|eot_id|>there";
  std::vector<int32_t> out;
  EXPECT_EQ(t.encode_range(s, 0, 3, out), 12u);
  EXPECT_EQ(out.back(), *t.token_id("<|eot_id|>"));
  EXPECT_EQ(t.encode_range(s, 12, 13, out), s.size());
  EXPECT_EQ(out, t.encode(s));
  EXPECT_EQ(t.encode_range(s, s.size(), s.size(), out), s.size());
  EXPECT_THAT(error_of([&] { t.encode_range(s, s.size() + 1, 0, out); }),
              HasSubstr("past the end"));
}

TEST(TokenizerTest, ThreadsEncodeTheSame) {
  const Tokenizer& t = tokenizer("llama3_style");
  const std::vector<int32_t> want = t.encode(text());
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] { got[i] = t.encode(text()); });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& ids : got) EXPECT_TRUE(ids == want);
}

// Short texts HF encoded, for each tokenizer and for variants of gpt2_style built here the way
// the generator built them.
TEST(TokenizerTest, CasesMatchHuggingFace) {
  const Json cases = Json::parse(read_file(kFixtures + "cases.json"));
  std::map<std::string, Tokenizer> all;
  for (const std::string& name : kTokenizers) all.emplace(name, tokenizer(name));
  for (const auto& [name, patch] : cases["variants"].items()) {
    Json data = Json::parse(read_file(kFixtures + patch["base"].get<std::string>() + ".json"));
    if (patch.contains("pre_tokenizer")) data["pre_tokenizer"] = patch["pre_tokenizer"];
    if (patch.contains("added_tokens")) {
      for (const Json& token : patch["added_tokens"]) data["added_tokens"].push_back(token);
    }
    all.emplace(name, Tokenizer::from_json(data.dump(), name));
  }
  ASSERT_EQ(all.size(), 5u);
  int checked = 0;
  for (const Json& c : cases["cases"]) {
    std::string s;
    if (c.contains("text")) {
      s = c["text"].get<std::string>();
    } else {
      for (const Json& part : c["text_parts"]) {
        for (int k = 0; k < part[1].get<int>(); ++k) s += part[0].get<std::string>();
      }
    }
    for (const auto& [name, t] : all) {
      std::vector<int32_t> want;
      if (c.contains("ids")) {
        want = c["ids"][name].get<std::vector<int32_t>>();
      } else {
        for (const Json& run : c["ids_rle"][name]) {
          want.insert(want.end(), run[1].get<size_t>(), run[0].get<int32_t>());
        }
      }
      const std::vector<int32_t> got = t.encode(s);
      EXPECT_TRUE(got == want) << name << " on " << Json(s.substr(0, 60)).dump() << ": "
                               << first_difference(t, got, want);
      // (Not the variants: add_prefix_space adds a space, lstrip and rstrip take whitespace.)
      if (!name.starts_with("gpt2_style_")) {
        EXPECT_TRUE(t.decode(got) == s) << name;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 300);
}

// GPT-2's and Llama 3's patterns through PCRE2 cut the cases as Oniguruma does in HF (U+180E is
// not whitespace, (?i:'s) folds the long s, lookahead at the end of the text).
TEST(TokenizerTest, PiecesMatchHuggingFacePatterns) {
  const std::map<std::string, std::string> patterns = {
      {"gpt2", R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"},
      {"llama3",
       R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}};
  const Json cases = Json::parse(read_file(kFixtures + "cases.json"));
  int checked = 0;
  for (const auto& [name, pattern] : patterns) {
    std::vector<std::unique_ptr<const SplitPattern>> steps;
    steps.push_back(std::make_unique<SplitPattern>(pattern, false, name));
    const PreTokenizer pre(std::move(steps), false);
    for (const Json& c : cases["cases"]) {
      if (!c.contains("pieces")) continue;
      const std::string s = c["text"].get<std::string>();
      std::vector<std::string> got;
      pre.for_each_piece(s, [&](size_t start, size_t end) {
        got.push_back(s.substr(start, end - start));
        return false;
      });
      EXPECT_EQ(got, c["pieces"][name].get<std::vector<std::string>>())
          << name << " on " << Json(s.substr(0, 60)).dump();
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
  EXPECT_EQ(
      pcre2_pattern(R"(\s[^\s]\S\w{,3}\u00e9)", "test"),
      R"([\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F})"
      R"(\x{205F}\x{3000}][^\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028})"
      R"(\x{2029}\x{202F}\x{205F}\x{3000}][^\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680})"
      R"(\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}][\p{L}\p{M}\p{Nd}\p{Pc}]{0,3})"
      R"(\x{00e9})");
  EXPECT_THAT(error_of([] { pcre2_pattern(R"(a\hb)", "test"); }), HasSubstr("hex digit"));
}

TEST(TokenizerTest, SpecialTokens) {
  const Tokenizer& gpt2 = tokenizer("gpt2");
  EXPECT_EQ(gpt2.end_of_text(), 50256);
  EXPECT_EQ(gpt2.vocab_size(), 50257);
  EXPECT_EQ(gpt2.description(),
            "tokenizer.json at tests/data/fixtures/tokenizer/gpt2.json (byte-level BPE, 50257 "
            "tokens, 1 special)");
  EXPECT_EQ(gpt2.encode("Hello<|endoftext|> world"), (std::vector<int32_t>{15496, 50256, 995}));
  EXPECT_EQ(gpt2.decode(std::vector<int32_t>{50256, 50256}), "<|endoftext|><|endoftext|>");
  EXPECT_EQ(gpt2.token_id("Ġthe"), 262);
  EXPECT_EQ(gpt2.token_id("the"), 1169);
  EXPECT_EQ(gpt2.token_id(" the"), std::nullopt);
  // GPT-2's post-processor adds no token: documents start at its end-of-text (llm.c's shards).
  EXPECT_EQ(gpt2.document_start(), 50256);

  const Tokenizer& llama = tokenizer("llama3_style");
  ASSERT_TRUE(llama.end_of_text().has_value());
  EXPECT_EQ(llama.end_of_text(), llama.token_id("<|end_of_text|>"));
  EXPECT_EQ(llama.vocab_size(), 3010);
  // Llama 3's post-processor puts <|begin_of_text|> before a text: llm.c's shards start each
  // document with it (`tokenizer.encode('')[0]`).
  EXPECT_EQ(llama.document_start(), llama.token_id("<|begin_of_text|>"));
  EXPECT_EQ(llama.document_start(), 3000);
  EXPECT_THAT(llama.description(), HasSubstr("3010 tokens, 10 special"));
  const std::vector<int32_t> ids =
      llama.encode("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>");
  ASSERT_GE(ids.size(), 5u);
  EXPECT_EQ(ids[0], *llama.token_id("<|begin_of_text|>"));
  EXPECT_EQ(ids[1], *llama.token_id("<|start_header_id|>"));
  EXPECT_EQ(ids.back(), *llama.token_id("<|eot_id|>"));
  // Text that only looks like a special token stays text.
  const std::vector<int32_t> partial = llama.encode("<|eot_id|");
  EXPECT_EQ(std::count(partial.begin(), partial.end(), *llama.token_id("<|eot_id|>")), 0);
}

// The post-processor's leading token is resolved as HF resolves it: through its special_tokens
// map's ids when the template names it by another name; one that is no token leaves documents to
// the end-of-text.
TEST(TokenizerTest, DocumentStartFollowsThePostProcessorsIds) {
  Json json = Json::parse(read_file(kFixtures + "llama3_style.json"));
  Json& post = json["post_processor"];
  post["single"][0]["SpecialToken"]["id"] = "bos";
  post["special_tokens"] = {{"bos", {{"id", "bos"}, {"ids", {3004}}, {"tokens", {"x"}}}}};
  EXPECT_EQ(Tokenizer::from_json(json.dump(), "mapped").document_start(), 3004);
  post["special_tokens"] = Json::object();  // "bos" is no added token either
  EXPECT_EQ(Tokenizer::from_json(json.dump(), "unknown").document_start(), 3001);  // end-of-text
}

// split_special_tokens (HF's, llm.c's for documents): a special token spelled in the text is
// encoded as the text it spells; decoding gives the text back, and the id is still known.
TEST(TokenizerTest, SplitSpecialTokensAreEncodedAsText) {
  const std::string path = kFixtures + "gpt2.json";
  const Tokenizer split = Tokenizer::from_file(path, {.split_special_tokens = true});
  const std::string text = "Hello<|endoftext|> world";
  const std::vector<int32_t> ids = split.encode(text);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 50256), 0);
  EXPECT_EQ(split.decode(ids), text);
  EXPECT_EQ(split.end_of_text(), 50256);
  EXPECT_EQ(split.document_start(), 50256);
  EXPECT_THAT(split.description(), HasSubstr("1 special, split in text"));
  // The ids HF tokenizers 0.23 gives with encode_special_tokens = True (tiktoken's
  // encode_ordinary for GPT-2).
  EXPECT_EQ(ids, (std::vector<int32_t>{15496, 27, 91, 437, 1659, 5239, 91, 29, 995}));
  const Tokenizer llama =
      Tokenizer::from_file(kFixtures + "llama3_style.json", {.split_special_tokens = true});
  EXPECT_EQ(llama.encode("a<|begin_of_text|>b<|eot_id|>"),
            (std::vector<int32_t>{64, 320, 862, 600, 622, 332, 65, 320, 682, 441, 332}));
}

TEST(TokenizerTest, LongRunsEncode) {
  // One 999,999-letter piece through the heap merge, and a 1,000,000-space run.
  for (const char* name : {"llama3_style", "gpt2_style"}) {
    const Tokenizer& t = tokenizer(name);
    std::string letters;
    for (int i = 0; i < 333333; ++i) letters += "the";
    const std::vector<int32_t> ids = t.encode(letters);
    EXPECT_LT(ids.size(), letters.size() / 2) << name;
    EXPECT_EQ(t.decode(ids), letters);
    const std::string spaces = "x" + std::string(1000000, ' ') + "y";
    EXPECT_EQ(t.decode(t.encode(spaces)), spaces);
  }
}

std::string gpt2_style_with(const std::function<void(Json&)>& change) {
  Json data = Json::parse(read_file(kFixtures + "gpt2_style.json"));
  change(data);
  return data.dump();
}

TEST(TokenizerTest, Errors) {
  EXPECT_THAT(error_of([] { Tokenizer::from_file("/nonexistent/tokenizer.json"); }),
              HasSubstr("/nonexistent/tokenizer.json: the file does not exist"));
  EXPECT_THAT(error_of([] { Tokenizer::from_json("{\"model\": [1, 2", "broken.json"); }),
              HasSubstr("tokenizer.json at broken.json: not valid JSON"));
  EXPECT_THAT(error_of([] { Tokenizer::from_json("[]", "list.json"); }),
              HasSubstr("list.json: the document is []; expected a JSON object"));
  const auto load = [](const std::function<void(Json&)>& change) {
    return error_of([&] { Tokenizer::from_json(gpt2_style_with(change), "x.json"); });
  };
  EXPECT_THAT(load([](Json& j) { j["model"]["type"] = "WordPiece"; }),
              HasSubstr("x.json: model.type is \"WordPiece\"; only \"BPE\""));
  EXPECT_THAT(load([](Json& j) {
                j["normalizer"] = {{"type", "NFC"}};
              }),
              HasSubstr("normalizer is {\"type\":\"NFC\"}; only null"));
  EXPECT_THAT(load([](Json& j) {
                j["pre_tokenizer"] = {{"type", "Whitespace"}};
              }),
              HasSubstr("pre_tokenizer.type is \"Whitespace\"; supported: ByteLevel"));
  EXPECT_THAT(load([](Json& j) {
                j["pre_tokenizer"] = Json::parse(
                    R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"a"},
                        "behavior":"Removed","invert":false},{"type":"ByteLevel",
                        "add_prefix_space":false,"use_regex":false}]})");
              }),
              HasSubstr("pre_tokenizer.pretokenizers[0].behavior is \"Removed\""));
  EXPECT_THAT(
      load([](Json& j) {
        j["pre_tokenizer"] = Json::parse(
            R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"(?<=a)b"},
                        "behavior":"Isolated","invert":false},{"type":"ByteLevel",
                        "add_prefix_space":false,"use_regex":false}]})");
      }),
      HasSubstr("look-behind"));
  EXPECT_THAT(load([](Json& j) { j["decoder"] = nullptr; }),
              HasSubstr("decoder is null; only ByteLevel"));
  EXPECT_THAT(load([](Json& j) { j["model"]["byte_fallback"] = true; }),
              HasSubstr("model.byte_fallback is true"));
  EXPECT_THAT(load([](Json& j) { j["model"]["continuing_subword_prefix"] = "##"; }),
              HasSubstr("model.continuing_subword_prefix is \"##\""));
  EXPECT_THAT(load([](Json& j) { j["model"]["merges"].push_back("Ġ zzzz"); }),
              HasSubstr("\"zzzz\" is not in model.vocab"));
  EXPECT_THAT(load([](Json& j) { j["added_tokens"][0]["single_word"] = true; }),
              HasSubstr("single_word is true for the added token \"<|endoftext|>\""));
  const Tokenizer& t = tokenizer("gpt2_style");
  // An id that is no token decodes to nothing, as HF's decode skips it.
  EXPECT_EQ(t.decode(std::vector<int32_t>{5, 3001, -1, 5}), t.decode(std::vector<int32_t>{5, 5}));
  // Ids are kept in tables by id: one far past any vocabulary is refused by key, not allocated.
  EXPECT_THAT(load([](Json& j) { j["model"]["vocab"]["zzz"] = 2147483647; }),
              HasSubstr("model.vocab[\"zzz\"] is 2147483647; expected a token id, an integer "
                        "from 0 to 4194303"));
  EXPECT_THAT(load([](Json& j) { j["added_tokens"][0]["id"] = 100000000; }),
              HasSubstr("is 100000000; expected a token id"));
}

}  // namespace
}  // namespace loom::data
