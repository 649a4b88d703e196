// `./loom tokenize`: text files (or folders of them; .jsonl: one document per line) in, llm.c
// token shards out, with a Hugging Face tokenizer.json, in parallel over the cores
// (data/tokenize_files.h). The shards are what `./loom train --data` reads:
//
//   ./loom tokenize --tokenizer tokenizer.json --out shards/ corpus/ --val-tokens 1000000
//   ./loom train --data 'shards/train_*.bin' --val-data 'shards/val_*.bin' --tokenizer ...
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <thread>

#include "base/bazel_run.h"
#include "base/error.h"
#include "data/tokenize_files.h"
#include "data/tokenizer.h"

namespace {

constexpr const char* kProgram = "loom_tokenize";

int run(int argc, char** argv) {
  loom::data::TokenizeOptions options;
  std::string tokenizer_path;
  int64_t separator = -1;
  bool progress = isatty(STDERR_FILENO) != 0;
  CLI::App app{
      "Tokenize text files into llm.c token shards (uint16 tokens for vocabularies up to 65536, "
      "else uint32) with a Hugging Face tokenizer.json; each document (a text file, or a line of "
      "a .jsonl file) follows the token llm.c puts there (GPT-2's <|endoftext|>, Llama 3's "
      "<|begin_of_text|>).",
      kProgram};
  app.add_option("inputs", options.inputs, "text or .jsonl files, or folders of them")->required();
  app.add_option("--tokenizer", tokenizer_path, "the tokenizer.json (byte-level BPE)")->required();
  app.add_option("--out", options.output, "the folder the shards go to (created)")->required();
  app.add_option("--prefix", options.prefix, "training shards' names: PREFIX_NNNNNN.bin")
      ->capture_default_str();
  app.add_option("--shard-tokens", options.shard_tokens, "tokens per shard")->capture_default_str();
  app.add_option("--val-tokens", options.val_tokens,
                 "the first N tokens go to val_NNNNNN.bin (0: none)")
      ->capture_default_str();
  app.add_option("--threads", options.threads, "worker threads (0: every core)")
      ->capture_default_str();
  app.add_option("--chunk-bytes", options.chunk_bytes,
                 "bytes of text per parallel piece (the tokens never depend on it)")
      ->capture_default_str();
  app.add_option("--text-field", options.text_field, "a .jsonl line's text field")
      ->capture_default_str();
  app.add_option("--document-token", separator,
                 "the token before each document (-1: the tokenizer's: the token its "
                 "post-processor puts first, e.g. <|begin_of_text|>, else its end-of-text)")
      ->capture_default_str();
  app.add_flag("--no-document-token", options.no_separator, "put nothing between documents");
  bool split_special_tokens = true;
  app.add_flag(
         "--split-special-tokens{true},!--no-split-special-tokens", split_special_tokens,
         "encode special tokens spelled in a document's text as text, as llm.c's fineweb.py "
         "does (a document quoting <|endoftext|> is not cut by it); --no-split-special-tokens "
         "matches them, as Hugging Face's default encode does")
      ->capture_default_str();
  app.add_flag("--progress,!--no-progress", progress,
               "progress on stderr (default: on a terminal)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ConversionError& e) {
    // CLI11 says "Could not convert: --shard-tokens = abc"; say what a value must be.
    std::fprintf(stderr,
                 "%s: %s: expected a whole number (--shard-tokens, --val-tokens, --threads, "
                 "--chunk-bytes, --document-token); run '%s --help' for the flags\n",
                 kProgram, e.what(), kProgram);
    return 2;
  } catch (const CLI::ParseError& e) {
    // --help exits 0; a bad flag exits 2 (bad input), as every Loom program does, not CLI11's own
    // codes (106 for a missing argument, ...).
    return app.exit(e) == 0 ? 0 : 2;
  }
  LOOM_CHECK(separator >= -1, "--document-token {}: expected a token id, or -1 for the tokenizer's",
             separator);
  LOOM_CHECK(separator == -1 || !options.no_separator,
             "--document-token {} and --no-document-token: give one (a token before each "
             "document, or none)",
             separator);
  if (separator >= 0) options.document_separator = static_cast<int32_t>(separator);
  const auto tokenizer = loom::data::Tokenizer::from_file(
      tokenizer_path, {.split_special_tokens = split_special_tokens});
  LOOM_CHECK(separator < tokenizer.vocab_size(),
             "--document-token {} is outside the tokenizer's {} tokens", separator,
             tokenizer.vocab_size());
  if (progress) {
    options.progress = [](const loom::data::TokenizeProgress& p) {
      std::fprintf(stderr, "\r%s: %.0f / %.0f MB, %.1f MB/s, %lld tokens, %lld documents   ",
                   kProgram, p.bytes_done / 1e6, p.bytes_total / 1e6,
                   p.seconds > 0 ? p.bytes_done / 1e6 / p.seconds : 0.0,
                   static_cast<long long>(p.tokens), static_cast<long long>(p.documents));
      std::fflush(stderr);
    };
  }
  options.warn = [](const std::string& line) { fmt::print(stderr, "{}: {}\n", kProgram, line); };
  const loom::data::TokenizeResult result = loom::data::tokenize_files(tokenizer, options);
  if (progress) std::fprintf(stderr, "\n");
  const auto& t = result.totals;
  fmt::print(
      "{}: {} documents, {:.1f} MB of text -> {} tokens ({:.2f} bytes per token) in {} shards "
      "of uint{} tokens in {}; {:.2f} s, {:.1f} MB/s on {} threads ({})\n",
      kProgram, t.documents, t.bytes_total / 1e6, t.tokens,
      t.tokens > 0 ? static_cast<double>(t.bytes_total) / static_cast<double>(t.tokens) : 0.0,
      result.shards.size(), result.token_bytes * 8, options.output, t.seconds,
      t.seconds > 0 ? t.bytes_total / 1e6 / t.seconds : 0.0,
      options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency()),
      tokenizer.description());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    loom::enter_bazel_working_directory();
    return run(argc, argv);
  } catch (const std::exception& e) {
    // The library's errors name the command already ("loom tokenize: ..."): one prefix.
    std::string_view message = e.what();
    if (constexpr std::string_view kCommand = "loom tokenize: "; message.starts_with(kCommand)) {
      message.remove_prefix(kCommand.size());
    }
    std::fprintf(stderr, "%s: %.*s\n", kProgram, static_cast<int>(message.size()), message.data());
    return 2;
  }
}
