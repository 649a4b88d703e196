// GroupState: what a Gloo process group's threads share — the mesh, the progress board and the
// poison state — and the one place operations run and failures are described (private to
// comm/gloo).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "comm/gloo/progress.h"
#include "comm/gloo/transfers.h"
#include "comm/store.h"
#include "comm/types.h"
#include "comm/work.h"

namespace loom::comm::gloo_detail {

// What an algorithm needs while it runs.
// Receive space kept across a group's collectives (its one worker thread runs them, one at a
// time), grown to the largest asked for and never shrunk. A fresh buffer per call made glibc map,
// fault in and unmap it every time: 234 K page faults for a 64 MiB all-reduce, half its
// bandwidth. Holds at most the largest collective's receive size per group.
class ScratchBuffer {
 public:
  // At least `bytes` of uninitialized memory, valid until the next call.
  char* get(size_t bytes);
  size_t capacity() const { return size_; }

 private:
  std::unique_ptr<char[]> data_;
  size_t size_ = 0;
};

struct OpEnv {
  Mesh& mesh;
  Clock::time_point deadline;
  // Collectives: how many collectives this group issued before this one (the same on every
  // rank, so it numbers the op's slots). Point to point: unused.
  uint64_t index;
  CollectiveKind kind;
  ScratchBuffer& scratch;  // collectives' receive space (the group's)
};

// One operation, as the group tracks it.
struct OpSpec {
  std::string description;  // OpInfo::description
  CollectiveKind kind;
  bool collective;  // false for send/recv
  uint64_t index;   // see OpEnv::index
  Duration timeout;
  int peer = -1;  // send/recv: the other rank
};

class GroupState {
 public:
  GroupState(std::shared_ptr<Store> store, std::shared_ptr<::gloo::Context> context,
             std::unique_ptr<ShmChannel> shared_memory, std::string name,
             std::vector<int> global_ranks);
  ~GroupState();

  // Runs one operation: fails `work` at once if the group is poisoned; otherwise records
  // progress (collectives), runs `body` and completes `work`. On an error, describes it (op,
  // cause, ranks that did not arrive), poisons the group and fails `work` with a loom::Error: a
  // PeerFailure when a peer caused it (its connection broke, it did not arrive before the
  // timeout, or the group was poisoned by such a failure first).
  // `body` (and the tensors it holds) is destroyed before `work` completes or fails: once a
  // caller's wait returns, dropping its own handles frees the buffers.
  void run(const OpSpec& op, Work& work, std::function<void(const OpEnv&)> body);

  void abort(const std::string& reason);
  // Records (asynchronously) that this rank's group is being destroyed, unless it failed: peers
  // that wait on it later name it as gone. Call after the last operation ended.
  // If the group failed, instead waits until every peer this rank did not blame has recorded
  // how it left (at most the failed op's timeout, capped at 5 s; 1 s after an abort): this
  // process may serve the store (rank 0 serves init_process_group's TcpStore), and peers that
  // fail a moment later read it to name the missing ranks.
  void mark_destroyed();
  std::optional<std::string> failure() const;
  const std::string& name() const { return name_; }
  bool uses_shared_memory() const { return mesh_.shared_memory() != nullptr; }

 private:
  // `by_peer`: set to whether a peer caused the failure (see run()).
  std::string describe(const OpSpec& op, std::exception_ptr error, bool& by_peer);
  std::string arrival_report(const OpSpec& op, bool connection_failure, int failed_peer);
  // The records behind failed_peer's: each "connection to rank N" followed to the rank that started
  // the failure (see the .cc); ranks in `reported` are not repeated.
  std::string blame_chain(const std::vector<ProgressBoard::Peer>& peers, int failed_peer,
                          const std::vector<int>& reported) const;
  std::string rank_list(const std::vector<int>& ranks) const;
  void poison(const std::string& message, const std::string& state, const std::string& close_reason,
              bool by_peer);
  bool failed_by_peer() const;
  void wait_for_peer_records();

  std::string name_;
  std::vector<int> global_ranks_;
  Mesh mesh_;
  ProgressBoard board_;
  mutable std::mutex mutex_;
  std::optional<std::string> failure_;
  bool failed_by_peer_ = false;   // whether failure_ was a peer's doing (a PeerFailure)
  std::shared_ptr<Store> store_;  // the board's store (mark_destroyed reads peers' states)
  std::set<int> blamed_;          // peers this rank's failure reports named as gone or missing
  Duration linger_;               // mark_destroyed's bound after a failure
  ScratchBuffer scratch_;         // OpEnv::scratch
};

}  // namespace loom::comm::gloo_detail
