// The job's data, checked before its first step:
//   - the tokenizer: --tokenizer, else the tokenizer.json beside an --init-from checkpoint (the
//     model's own travels with it); none: text is one token per byte;
//   - the training corpus (--data), its tokens checked against the model's vocabulary (which it
//     sets when nothing else fixed it), its document index with --document-boundaries;
//   - the validation corpus (--val-data), checked alike, and how many batches a validation reads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "data/token_corpus.h"
#include "data/tokenizer.h"
#include "train/job_config.h"
#include "train/job_model.h"

namespace loom::train {

struct JobData {
  data::TokenCorpus train;
  std::optional<data::TokenCorpus> val;
  int64_t val_batches = 0;  // per validation
  std::shared_ptr<const data::Tokenizer> tokenizer;
  std::string tokenizer_path;  // where it came from; empty: none
};

// Throws naming the flag, the file and what is wrong (train/job_checks.h's contract).
JobData open_job_data(const JobConfig& job, JobModel& model);

// The tokenizer file the job uses: --tokenizer, else --init-from's folder's tokenizer.json when
// it has one; empty: none.
std::string job_tokenizer_path(const JobConfig& job);

}  // namespace loom::train
