// Everything a job checks before its first step, with no rank started: `./loom train` runs it
// before it starts its ranks (a failure exits 2 naming the flag or file), every rank's runner
// runs it again as it sets up, and `loom plan` runs it before its trace, so any check the job
// makes fails the plan with the job's own message.
//
//   - the paths it reads and writes: --data, --init-from, the outputs, --checkpoint-dir (a folder
//     it can create or write into), and --save's family format;
//   - the model: its family, sizes, the checkpoint's config.json, the context, heads over tp
//     (train/job_model.h); the data: its vocabulary fits the model, it holds a sequence;
//   - the layout against the world and the batch (ParallelConfig::validate);
//   - --init-from: the checkpoint's tensor names, shapes and dtypes against the model, from the
//     file's headers (no weights read);
//   - --resume: the latest committed checkpoint's model and run (its metadata: data, seed, batch),
//     and a warning for step folders no save committed (the next save deletes them).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/distributed_checkpoint.h"
#include "train/job_config.h"
#include "train/job_data.h"
#include "train/job_model.h"
#include "train/metrics_history.h"
#include "train/parallel_config.h"

namespace loom::train {

struct CheckedJob {
  JobModel model;  // the vocabulary fitted to the data
  JobData data;    // training and validation corpora, the tokenizer
  ParallelConfig parallel;
  nlohmann::json run;                      // run_fields: what the checkpoints record of the run
  std::optional<std::string> resume_from;  // the step directory --resume continues from
  std::optional<SavedLoss> saved_loss;     // its last step's logged loss, when it records it
  // The Hugging Face token ids and generation config the job keeps (models/hf/token_settings.h):
  // --init-from's, else those of the checkpoint it resumes; its checkpoints record them.
  nlohmann::json hf_token_settings = nlohmann::json::object();
  std::map<int, std::vector<int>> replay_members;  // --replica-replay's members per step
  std::vector<std::string> warnings;               // to print before training
};

// `job`'s degrees resolved (train/job_command_line.h: no dp_shard -1). Throws loom::Error naming
// the flag, file or key.
CheckedJob check_job(const JobConfig& job);

// What a Loom job's checkpoint holds beyond its checksums (verify_checkpoint; --resume checks
// the same against the job's model): the parameters, AdamW state and module state of the model
// its fields record (extra.model), by name, shape and dtype, and a trainer step that is its
// step. Throws naming `what` (a flag; empty for a tool that names itself), the step folder and
// what does not fit; returns warnings.
std::vector<std::string> check_checkpoint_contents(const checkpoint::Metadata& metadata,
                                                   const std::string& dir, std::string_view what);

// What a run (not a plan) reads of the environment besides the job's settings: where the ranks'
// Gloo endpoints listen (LOOM_GLOO_IFNAME, LOOM_GLOO_HOSTNAME) and the flight recorder's folder.
// Throws naming the variable, before any rank starts.
void check_run_environment();

// The job's parallel layout from its settings (the data-parallel degrees resolved as
// resolve_parallel_degrees does).
ParallelConfig parallel_config(const JobConfig& job);

// "host:port" (--replica-store): throws naming `flag` and the text unless the port is a number
// in [1, 65535] after a non-empty host.
struct HostPort {
  std::string host;
  int port = 0;
};
HostPort parse_host_port(const std::string& text, std::string_view flag);

}  // namespace loom::train
