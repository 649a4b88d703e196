// The flight recorder (c10d's): every process group keeps a bounded ring of its last operations
// — sequence number, kind, sizes and dtypes, state, times — cheap enough to be always on. When a
// job fails or hangs, each rank's rings are dumped (one JSON file per rank) and merged into one
// report that names the first operation where the ranks diverged (flight_report.h).
//
// Dumps go to LOOM_FLIGHT_RECORDER_DIR (loomrun sets it for its ranks) as DIR/rank-<R>.json, R the
// global rank, one file per rank this process runs (several under comm/testing's threads):
//   - on the first failed operation in the process (a timeout, a peer gone, a mismatch);
//   - on SIGTERM (what loomrun sends the other ranks when one fails; the process then ends as the
//     signal would have ended it), on SIGUSR1 (on request; the process goes on) and at exit (a
//     rank that left while its peers waited), once install_signal_dumps() ran
//     (init_process_group calls it when the folder is set).
// LOOM_FLIGHT_RECORDER_ENTRIES sets the ring's size (default 2000 per group; 0: off).
//
// States: an operation is pending from its issue until its Work completes or fails. Gloo and
// NCCL groups run their operations one at a time in issue order, so a group's first pending
// operation is the one running; the ones after it are queued.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/types.h"

namespace loom::comm {

enum class RecordState { kPending, kCompleted, kFailed };
std::string_view record_state_name(RecordState state);  // "pending", "completed", "failed"

struct FlightRecord {
  uint64_t sequence = 0;  // the group's operation number (send and recv included)
  // The group's count of collectives before this one (what every rank agrees on); -1 for send and
  // recv, whose numbers differ by rank.
  int64_t collective = -1;
  CollectiveKind kind = CollectiveKind::kAllReduce;
  std::string detail;  // "sum, f32, 1024 elements"
  RecordState state = RecordState::kPending;
  double issued_s = 0;  // seconds since the process's first recorded operation
  double ended_s = -1;  // when it completed or failed; -1 while pending
  std::string error;    // a failure's message
};

// One group's ring as one of its ranks holds it, oldest first.
struct GroupRecords {
  std::string name;
  int rank = 0;  // in the group
  int size = 0;
  std::vector<int> global_ranks;  // global rank of each group rank
  std::vector<FlightRecord> records;
  // How many recorders this process made before this group's (-1: a dump that does not say).
  // Ranks make their groups in the same order, so among one rank's groups of the same name and
  // ranks (two meshes over the same ranks) it tells which is which, however a dump lists them.
  int64_t created = -1;
};

class FlightRecorder {
 public:
  FlightRecorder(std::string name, int rank, int size, std::vector<int> global_ranks,
                 size_t capacity);

  // Appends an operation (pending), evicting the oldest beyond the capacity; returns its handle.
  uint64_t record(uint64_t sequence, int64_t collective, CollectiveKind kind, std::string detail);
  // Its Work completed (no error) or failed; a handle already evicted is ignored.
  void finish(uint64_t handle, const std::exception_ptr& error);
  GroupRecords snapshot() const;
  int global_rank() const { return global_ranks_[rank_]; }

  // LOOM_FLIGHT_RECORDER_ENTRIES, default 2000; 0 turns recording off.
  static size_t capacity_from_env();

 private:
  const std::string name_;
  const int rank_, size_;
  const std::vector<int> global_ranks_;
  const size_t capacity_;
  const int64_t created_;  // GroupRecords::created
  mutable std::mutex mutex_;
  std::vector<FlightRecord> ring_;  // ring_[handle % capacity_]
  uint64_t next_handle_ = 0;
};

namespace flight_recorder {

// Every group's recorder registers here (ProcessGroup does); a destroyed group's last snapshot is
// kept (the latest 64), so a rank that left is still in the dump.
void add(const std::shared_ptr<FlightRecorder>& recorder);
void retire(const FlightRecorder& recorder);

// Every registered group's rings, by global rank.
std::vector<std::pair<int, std::vector<GroupRecords>>> collect();

// Writes DIR/rank-<R>.json for every global rank this process runs, with `reason` (what caused
// the dump); returns the files written. Throws naming the path when it cannot write.
std::vector<std::string> dump(const std::string& dir, const std::string& reason);

// LOOM_FLIGHT_RECORDER_DIR, or set_dump_dir's; "" when dumps are off.
std::string dump_dir();
void set_dump_dir(const std::string& dir);  // for tests and programs ("" turns dumps off)

// A failed operation: the first in the process dumps (when dump_dir() is set).
void on_failure(const std::exception_ptr& error);

// SIGTERM and SIGUSR1 dump (when dump_dir() is set): a watcher thread writes the files, then
// SIGTERM goes on to what it did before (the process ends as it would have); so does a normal
// exit (unless a failure already dumped). Idempotent.
void install_signal_dumps();

}  // namespace flight_recorder
}  // namespace loom::comm
