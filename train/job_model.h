// The job's model from its settings, for every registered family (models/family.h): the family
// of --model, its preset with the size flags, or with --init-from the sizes of the checkpoint's
// config.json (which the size flags given must not contradict); then the vocabulary against the
// data. What training builds and what `loom plan` traces.
#pragma once

#include <memory>
#include <string>

#include "data/token_data.h"
#include "models/family.h"
#include "train/job_config.h"

namespace loom::train {

struct JobModel {
  const models::ModelFamily* family = nullptr;
  std::unique_ptr<models::ModelArgs> args;
  // Who fixed the vocabulary ("--vocab-size", "the checkpoint's config.json", "the preset
  // llama3-8b"); empty: the data's (the preset's stands in until fit_to_data).
  std::string vocab_from;
};

// The model of `job` (reading the checkpoint's config.json when --init-from has one). Throws
// loom::Error naming the flag or the file and key: an unknown model (listing the registered
// ones), sizes that contradict the checkpoint, a sequence longer than the context, heads tp does
// not divide.
JobModel resolve_job_model(const JobConfig& job);

// The --model a job without one takes: with an --init-from whose config.json names a
// "model_type", the default preset of the family reading it (as transformers' AutoModel picks the
// class), else `fallback`. Throws naming the file and the registered types for a model_type no
// family reads.
std::string model_of_init_from(const std::string& init_from, const std::string& fallback);

// Sets the vocabulary: the data's unless fixed; every token of the data must be below it (throws
// naming the flag, the shard, the token and where it sits, and who fixed the vocabulary).
void fit_to_data(JobModel& model, const data::TokenCorpus& data, std::string_view flag);

}  // namespace loom::train
