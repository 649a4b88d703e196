#include "train/job_paths.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <tuple>

#include "base/durable_file.h"
#include "base/error.h"
#include "base/logging.h"
#include "checkpoint/distributed_checkpoint.h"
#include "data/token_corpus.h"
#include "models/hf/checkpoint.h"
#include "train/loss_plot.h"

namespace loom::train {

namespace fs = std::filesystem;

namespace {

// Every file the job writes, each with the flag that makes it: two of them at one path would
// overwrite each other (a PNG over the metrics, over the saved config.json).
std::vector<JobFile> files_written(const JobConfig& job) {
  std::vector<JobFile> out;
  if (!job.metrics_out.empty()) {
    out.push_back({job.metrics_out, "--metrics-out"});
    out.push_back(
        {effective_config_path(job.metrics_out), "--metrics-out (the effective config beside it)"});
  }
  if (!job.plot_out.empty()) {
    const LossPlotFiles plot = loss_plot_files(job.plot_out);
    out.push_back({plot.png, "--plot-out"});
    out.push_back({plot.points, "--plot-out (its points beside it)"});
    out.push_back({plot.validation_points, "--plot-out (its validation points beside it)"});
    out.push_back({plot.script, "--plot-out (its gnuplot script beside it)"});
  }
  if (!job.save.empty()) {
    out.push_back({job.save, "--save"});
    for (const std::string& beside : models::hf::files_beside(job.save)) {
      out.push_back(
          {beside, fmt::format("--save (the {} beside it)", fs::path(beside).filename().string())});
    }
  }
  return out;
}

// Every file the job reads that an output could overwrite, each with its flag: the data's files
// (folders and patterns expanded), --tokenizer, --config, --replica-replay, and --init-from's
// model file with the config.json, tokenizer.json and generation_config.json read beside it.
std::vector<JobFile> files_read(const JobConfig& job) {
  std::vector<JobFile> out;
  for (const auto& [spec, what, split] :
       {std::tuple{job.data, "--data", data::DataSplit::kTraining},
        {job.val_data, "--val-data", data::DataSplit::kValidation}}) {
    if (spec.empty()) continue;
    try {
      for (std::string& file : data::data_files(spec, what, split)) {
        out.emplace_back(std::move(file), what);
      }
    } catch (const Error&) {
      // Named when the data is opened (check_job's open_job_data), with what it lacks.
    }
  }
  for (const auto& [path, what] : {std::pair{job.tokenizer, "--tokenizer"},
                                   {job.config_file, "--config"},
                                   {job.replica_replay, "--replica-replay"}}) {
    if (!path.empty()) out.emplace_back(path, what);
  }
  if (!job.init_from.empty()) {
    std::string model_file = job.init_from;
    std::error_code ec;
    if (fs::is_directory(job.init_from, ec)) {
      try {
        model_file = models::hf::resolve_checkpoint_path(job.init_from);
      } catch (const Error&) {
        model_file = (fs::path(job.init_from) / "model.safetensors").string();  // named later
      }
    }
    out.push_back({model_file, "--init-from"});
    for (const std::string& beside : models::hf::files_beside(model_file)) {
      out.push_back({beside, "--init-from (beside its model file)"});
    }
  }
  return out;
}

// Throws naming both flags when two files the job writes are one file, or when one it writes is
// one it reads, which the run would overwrite; and for an output path with a control character
// (a newline in a name gnuplot reads would end its line and start a command).
void check_outputs_apart(const JobConfig& job, const std::vector<JobFile>& read) {
  const std::vector<JobFile> written = files_written(job);
  const std::optional<FileIdentity> checkpoints =
      job.checkpoint_dir.empty() ? std::nullopt : std::optional(FileIdentity(job.checkpoint_dir));
  for (size_t i = 0; i < written.size(); ++i) {
    const JobFile& file = written[i];
    const auto control = [](unsigned char c) { return c < 0x20 || c == 0x7f; };
    if (std::any_of(file.path.begin(), file.path.end(), control)) {
      std::string shown;  // the path on one line, each control character as \xNN
      for (const unsigned char c : file.path) {
        shown += control(c) ? fmt::format("\\x{:02x}", c) : std::string(1, static_cast<char>(c));
      }
      LOOM_FAIL(
          "{}: '{}' holds a control character (a newline, a tab, ...); give a path "
          "without one",
          file.what, shown);
    }
    for (size_t j = 0; j < i; ++j) {
      LOOM_CHECK(written[j].identity != file.identity,
                 "{} and {} both write '{}': each would overwrite the other's file; give them "
                 "different paths",
                 written[j].what, file.what, file.path);
    }
    LOOM_CHECK(!checkpoints || *checkpoints != file.identity,
               "{} writes '{}', the folder --checkpoint-dir saves in; give {} another path",
               file.what, file.path, file.what);
  }
  const std::string effective =
      job.metrics_out.empty() ? "" : effective_config_path(job.metrics_out);
  for (const JobFile& input : read) {
    for (size_t i = 0; i < written.size(); ++i) {
      // The README's replay, `--config loom_train_metrics.config.toml`, writes the effective
      // config back over the file it read: this run's settings, the file's with any flags given.
      if (input.what == std::string_view("--config") && written[i].path == effective) continue;
      LOOM_CHECK(input.identity != written[i].identity,
                 "{} writes '{}', the file {} reads: the run would overwrite its own input; give "
                 "{} another path",
                 written[i].what, written[i].path, input.what, written[i].what);
    }
  }
}

// Throws when a --val-data file is one --data names too (`read`: files_read's): its tokens would
// be trained on, and the validation loss would not be held out.
void check_validation_held_out(const std::vector<JobFile>& read) {
  for (const JobFile& held_out : read) {
    if (held_out.what != "--val-data") continue;
    for (const JobFile& trained : read) {
      LOOM_CHECK(trained.what != "--data" || trained.identity != held_out.identity,
                 "--val-data: '{}' is also training data (--data names '{}'): its tokens would be "
                 "trained on, and the validation loss would not be held out; give --val-data files "
                 "--data does not name (the held-out shards loom tokenize writes as val_*.bin)",
                 held_out.path, trained.path);
    }
  }
}

}  // namespace

void check_readable_file(const std::string& path, std::string_view flag) {
  std::error_code ec;
  LOOM_CHECK(fs::exists(path, ec), "{}: '{}' does not exist", flag, path);
  LOOM_CHECK(fs::is_regular_file(path, ec), "{}: '{}' is not a file", flag, path);
  LOOM_CHECK(::access(path.c_str(), R_OK) == 0, "{}: cannot read '{}': {}", flag, path,
             std::strerror(errno));
}

// The paths a job reads and writes; returns the files it reads (files_read).
std::vector<JobFile> check_paths(const JobConfig& job) {
  std::vector<JobFile> read = files_read(job);
  check_outputs_apart(job, read);
  check_validation_held_out(read);
  // --data and --val-data: data::TokenCorpus::open names what they lack.
  if (!job.tokenizer.empty()) check_readable_file(job.tokenizer, "--tokenizer");
  LOOM_CHECK(!job.resume || !job.checkpoint_dir.empty(),
             "--resume: needs --checkpoint-dir (the directory whose latest committed step to "
             "continue from)");
  LOOM_CHECK(!job.checkpoint_dir.empty() ||
                 (job.checkpoint_every == 0 && job.keep_last == 0 && !job.async_checkpoint),
             "--checkpoint-every, --keep-last and --async-checkpoint: need --checkpoint-dir "
             "(where the checkpoints go)");
  if (!job.checkpoint_dir.empty()) {
    check_directory_writable(job.checkpoint_dir, "--checkpoint-dir");
    // The folder of the steps, not one step's (which the tools take): steps saved inside a
    // committed step would be found by no one.
    LOOM_CHECK(!checkpoint::is_step_directory(job.checkpoint_dir),
               "--checkpoint-dir: '{}' is one saved step's folder (it holds metadata.json); give "
               "the folder that holds the step_* folders, '{}'",
               job.checkpoint_dir,
               fs::path(job.checkpoint_dir).lexically_normal().parent_path().string());
  }
  if (!job.init_from.empty()) {
    std::error_code ec;
    if (fs::is_directory(job.init_from, ec)) {
      try {
        models::hf::resolve_checkpoint_path(job.init_from);  // throws naming what it lacks
      } catch (const Error& e) {
        throw Error(fmt::format("--init-from: {}", e.what()));
      }
    } else {
      check_readable_file(job.init_from, "--init-from");
    }
  }
  if (!job.metrics_out.empty()) {
    check_writable(job.metrics_out, "--metrics-out");
    check_writable(effective_config_path(job.metrics_out), "--metrics-out");
  }
  if (!job.plot_out.empty()) check_writable(job.plot_out, "--plot-out");
  if (!job.save.empty()) {
    models::hf::check_save_path(job.save, "--save");
    check_writable(models::hf::config_json_path(job.save), "--save (config.json beside it)");
  }
  return read;
}

std::vector<std::string> repeated_data_warnings(const std::vector<JobFile>& read) {
  std::vector<const JobFile*> data;
  std::vector<FileIdentity> identities;
  for (const JobFile& file : read) {
    if (file.what != "--data") continue;
    data.push_back(&file);
    identities.push_back(file.identity);
  }
  std::vector<std::string> out;
  for (const auto& [again, first] : repeated_files(identities)) {
    out.push_back(fmt::format(
        "WARNING: --data names '{}' twice (also as '{}'): its tokens are read twice and weigh "
        "double in the batches",
        data[again]->path, data[first]->path));
  }
  return out;
}

FileLock lock_checkpoint_dir(const JobConfig& job, bool create) {
  FileLock lock;
  if (job.checkpoint_dir.empty()) return lock;
  std::error_code ec;
  if (!create && !fs::exists(job.checkpoint_dir, ec)) return lock;  // no folder: nobody holds it
  fs::create_directories(job.checkpoint_dir, ec);
  LOOM_CHECK(!ec, "--checkpoint-dir: cannot create '{}': {}", job.checkpoint_dir, ec.message());
  char host[256] = "?";
  ::gethostname(host, sizeof(host) - 1);
  const std::string path = (fs::path(job.checkpoint_dir) / ".loom-lock").string();
  std::string detail;
  switch (lock.try_lock(path, "--checkpoint-dir", fmt::format("pid {} on {}", ::getpid(), host),
                        &detail)) {
    case FileLock::Result::kLocked:
      break;
    case FileLock::Result::kHeld:
      // The same command would meet it again: exit 2, not restarted by a launcher.
      throw InputError(fmt::format(
          "--checkpoint-dir: '{}' is in use by another job ({}, holding '{}'): two jobs saving "
          "into one folder delete each other's steps; wait for that job to end, or give this one "
          "another folder (each --replicas job its own)",
          job.checkpoint_dir,
          detail.empty() ? "a process that could not write its pid there" : detail, path));
    case FileLock::Result::kUnsupported:
      if (!create) break;  // the check before the ranks start: rank 0's lock says it, once
      LOOM_LOG(warn,
               "--checkpoint-dir: cannot lock '{}' ({}: the filesystem takes no flock); a second "
               "job saving into '{}' at once would not be refused",
               path, detail, job.checkpoint_dir);
      break;
  }
  return lock;
}

}  // namespace loom::train
