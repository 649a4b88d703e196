#include "train/job_data.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "base/durable_file.h"
#include "base/error.h"
#include "data/token_data.h"
#include "models/hf/checkpoint.h"

namespace loom::train {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kGpt2EndOfText = 50256;
constexpr int64_t kDefaultValBatches = 20;  // llm.c's val_max_steps

// The token before each document that a tokenizer gives: --document-token, else its
// document_start() (what `loom tokenize` and llm.c put there); none without either.
std::optional<int32_t> tokenizer_document_token(const JobConfig& job,
                                                const data::Tokenizer* tokenizer) {
  if (job.document_token >= 0) return static_cast<int32_t>(job.document_token);
  return tokenizer ? tokenizer->document_start() : std::nullopt;
}

// Text tokenized as the job starts: each document after the token --document-boundaries looks
// for, as `loom tokenize` writes it.
data::TextTokenization text_tokenization(const JobConfig& job,
                                         const std::shared_ptr<const data::Tokenizer>& tokenizer) {
  if (!tokenizer) return {};
  return {.encode = [tokenizer](std::string_view text) { return tokenizer->encode(text); },
          .vocab_size = tokenizer->vocab_size(),
          .document_separator = tokenizer_document_token(job, tokenizer.get()),
          .name = "tokens by " + tokenizer->description()};
}

// The token documents start with: the tokenizer's (above), or GPT-2's end-of-text.
int32_t document_token(const JobConfig& job, const data::Tokenizer* tokenizer,
                       const data::TokenCorpus& corpus, int64_t vocab_size) {
  int64_t token = tokenizer_document_token(job, tokenizer).value_or(-1);
  if (token < 0 && corpus.vocab_size() == 50257) token = kGpt2EndOfText;
  LOOM_CHECK(token >= 0,
             "--document-boundaries: which token starts a document? {} {}, and is not GPT-2's "
             "uint16 tokens; pass --document-token",
             corpus.description(),
             tokenizer ? "was tokenized by a tokenizer without an end-of-text token "
                         "(<|endoftext|>, <|end_of_text|>) or a token it puts first"
                       : "has no tokenizer (--tokenizer) to name its end-of-text token");
  LOOM_CHECK(token < vocab_size,
             "--document-token: {} is outside the model's vocabulary of {} tokens", token,
             vocab_size);
  return static_cast<int32_t>(token);
}

}  // namespace

std::string job_tokenizer_path(const JobConfig& job) {
  if (!job.tokenizer.empty()) return job.tokenizer;
  std::error_code ec;
  if (!job.init_from.empty() && fs::is_directory(job.init_from, ec)) {
    const fs::path beside = models::hf::tokenizer_json_path(job.init_from);
    if (fs::is_regular_file(beside, ec)) return beside.string();
  }
  return "";
}

JobData open_job_data(const JobConfig& job, JobModel& model) {
  JobData out;
  out.tokenizer_path = job_tokenizer_path(job);
  if (!out.tokenizer_path.empty()) {
    out.tokenizer = std::make_shared<const data::Tokenizer>(data::Tokenizer::from_file(
        out.tokenizer_path, {.split_special_tokens = job.split_special_tokens}));
  }
  const data::TextTokenization text = text_tokenization(job, out.tokenizer);
  out.train = data::TokenCorpus::open(job.data, text, "--data");
  if (out.tokenizer && model.vocab_from.empty()) {
    // Shards do not record their tokenizer; the one given is the data's vocabulary.
    model.args->set_vocab_size(out.tokenizer->vocab_size());
    model.vocab_from = fmt::format("the tokenizer {}", out.tokenizer_path);
  }
  fit_to_data(model, out.train, "--data");
  const int64_t vocab_size = model.args->vocab_size();
  if (job.document_boundaries) {
    const int32_t separator = document_token(job, out.tokenizer.get(), out.train, vocab_size);
    out.train.index_documents(separator, job.seq_len);
    // A separator that never occurs is the wrong token (shards from another tokenizer than the
    // one assumed): no boundary would be respected, silently.
    LOOM_CHECK(out.train.documents()->separators() > 0,
               "--document-boundaries: the document token {} never occurs in {}; give the token "
               "your data starts each document with (--document-token) or its tokenizer "
               "(--tokenizer)",
               separator, out.train.description());
  } else {
    LOOM_CHECK(job.document_token < 0,
               "--document-token: only used with --document-boundaries (pass both)");
  }
  data::check_sequences_fit(out.train, job.seq_len);

  LOOM_CHECK(!job.val_data.empty() || (job.val_every == 0 && job.val_steps == 0),
             "--val-every and --val-steps: need --val-data (the held-out tokens)");
  if (!job.val_data.empty()) {
    out.val =
        data::TokenCorpus::open(job.val_data, text, "--val-data", data::DataSplit::kValidation);
    out.val->check_tokens_below(vocab_size, "--val-data");
    const int64_t available = data::validation_batches(*out.val, job.batch_size, job.seq_len);
    LOOM_CHECK(available > 0,
               "--val-data: {} holds {} tokens, too few for one batch of {} sequences of {} "
               "tokens (+1); give more held-out data or a smaller --batch-size or --seq-len",
               out.val->description(), out.val->size(), job.batch_size, job.seq_len);
    LOOM_CHECK(job.val_steps <= available,
               "--val-steps: {} batches of {} sequences of {} tokens, but {} holds {} batches",
               job.val_steps, job.batch_size, job.seq_len, out.val->description(), available);
    out.val_batches = job.val_steps > 0 ? job.val_steps : std::min(available, kDefaultValBatches);
  }
  return out;
}

}  // namespace loom::train
