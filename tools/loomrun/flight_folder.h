// The folder where a job's ranks dump their flight recorders (comm/flight_recorder.h), and the
// merged report loomrun prints when the job fails (comm/flight_report.h): which collective the
// ranks diverged at, which ranks never entered it and what they were doing instead.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace loom::loomrun {

class FlightRecorderFolder {
 public:
  // `requested`: --flight-recorder-dir; "" takes LOOM_FLIGHT_RECORDER_DIR, else makes a fresh
  // folder under $TMPDIR (or /tmp) that is removed when the job succeeds.
  explicit FlightRecorderFolder(const std::string& requested);
  // Removes a folder loomrun made, unless it holds dumps (a failed job's, reported by report()).
  ~FlightRecorderFolder();
  FlightRecorderFolder(const FlightRecorderFolder&) = delete;
  FlightRecorderFolder& operator=(const FlightRecorderFolder&) = delete;
  // Sets LOOM_FLIGHT_RECORDER_DIR and LOOM_PROGRESS_FILE in the ranks' environment ("NAME=value"
  // entries).
  void export_to(std::vector<std::string>& environment) const;
  // After an attempt: on failure, prints the merged report of the dumps there (the ranks of this
  // node; a multi-node job's other nodes keep theirs) and where they are; on success removes a
  // folder loomrun made.
  void report(int exit_code, int world_size) const;
  const std::string& path() const { return path_; }
  // Removes the dumps (before a restart: the next attempt's are its own).
  void clear_dumps() const;
  // The last step the job completed, as its rank 0 writes it to LOOM_PROGRESS_FILE (this
  // folder's "progress" unless loomrun's environment chose one); none before any step or for a
  // program that does not write it.
  std::optional<long> completed_step() const;

 private:
  std::string path_;
  std::string progress_path_;  // LOOM_PROGRESS_FILE: the environment's, else this folder's
  bool made_here_ = false;
};

}  // namespace loom::loomrun
