// The files a job reads and writes, checked before its first step: each readable or writable,
// no output over another output or over an input (the data's files, --config, --init-from's
// files; one spelling or one inode), validation files not among the training ones, and the
// checkpoint folder usable (train/job_checks.h runs these first).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/file_identity.h"
#include "base/file_lock.h"
#include "train/job_config.h"

namespace loom::train {

// A file a job writes or reads, the flag that names it, and its identity (computed once).
struct JobFile {
  std::string path;
  std::string what;
  FileIdentity identity;
  JobFile(std::string path_, std::string what_)
      : path(std::move(path_)), what(std::move(what_)), identity(path) {}
};

// Throws naming `flag` unless `path` exists, is a file and is readable.
void check_readable_file(const std::string& path, std::string_view flag);

// Every path check of `job` (above); returns the files it reads, each with its flag, its data
// files expanded (folders and patterns).
std::vector<JobFile> check_paths(const JobConfig& job);

// A --data file named twice (a list repeating it, a folder and a pattern both holding it): read
// twice, its tokens weigh double. A warning each, since repeating data may be meant (upsampling).
// By spelling and by inode, as FileIdentity compares: one lookup per shard of thousands.
std::vector<std::string> repeated_data_warnings(const std::vector<JobFile>& read);

// The lock of the job's --checkpoint-dir (its file ".loom-lock"), held by this process until the
// lock is dropped or the process ends: two jobs saving into one folder would delete each other's
// unmarked steps. Throws loom::InputError (exit 2) naming the folder and the job holding it (its
// pid and host) when another process holds it; a filesystem without flock is warned about and
// not locked. Not locked without a --checkpoint-dir; a missing folder is made when `create`, else
// (a check before the ranks start) nothing is locked. Between two attempts of a restarted job
// nothing holds it.
FileLock lock_checkpoint_dir(const JobConfig& job, bool create);

}  // namespace loom::train
