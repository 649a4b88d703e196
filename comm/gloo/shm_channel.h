// ShmChannel: a same-host group's shared-memory segment and the barrier its collectives step
// through (private to comm/gloo). The algorithms over it are in shm_algorithms.h; the rendezvous
// that decides whether a group gets one is shm_connect.h.
//
// Layout: a header (each rank's arrival counter, op stamps and pid; who closed the channel),
// then two sets of `world` slots of slot_bytes() each. A collective is a sequence of rounds:
// every rank writes its part of the round into its own slot of set (round % 2), calls
// arrive_and_wait(), then reads any rank's slot. Two sets let round r+1 be written while slow
// peers still read round r; round r+2 reuses r's set, and nobody writes it before every rank has
// arrived at r+1, i.e. finished reading r. all_reduce reads after a second barrier in the same
// round (see shm_algorithms.cc).
//
// Failures are named as the TCP transport names them (TransferError, same kinds and wording):
// a peer that has not arrived by the deadline is a timeout; a peer that closed the channel
// (its group failed or was aborted), destroyed its group, or whose process exited is a broken
// connection; close() on this rank (Mesh::close) ends every wait of this process at once.
// Ranks stamp each barrier with the op they run (kind, sequence number, size); a rank whose
// peers stamped another op fails with an error naming both, instead of exchanging wrong data.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "comm/gloo/transfers.h"

namespace loom::comm::gloo_detail {

// What a rank says it is doing at a barrier; every rank of the group must say the same.
struct ShmStamp {
  uint32_t kind = 0;   // CollectiveKind
  uint32_t aux = 0;    // dtype, reduce op, root: whatever must agree
  uint64_t index = 0;  // the collective's sequence number in the group
  uint64_t bytes = 0;  // the collective's size as this rank sees it
  bool operator==(const ShmStamp&) const = default;
};

class ShmChannel {
 public:
  // Maps the POSIX shared-memory object `name` (already sized by its creator to
  // segment_bytes(world, slot_bytes)); `create`: this rank initializes the header. Throws
  // loom::Error naming the object and the system error.
  ShmChannel(const std::string& name, int rank, int world, size_t slot_bytes, bool create);
  // Records that this rank left (peers waiting on it fail naming it) and unmaps.
  ~ShmChannel();
  ShmChannel(const ShmChannel&) = delete;
  ShmChannel& operator=(const ShmChannel&) = delete;

  static size_t segment_bytes(int world, size_t slot_bytes);

  int rank() const { return rank_; }
  int world() const { return world_; }
  size_t slot_bytes() const { return slot_bytes_; }

  // Rank `r`'s slot in the set the next round writes (round() % 2).
  char* slot(int r) const;
  // Rounds so far: every rank counts the same rounds in the same order.
  uint64_t round() const { return round_; }
  void next_round() { ++round_; }

  // Publishes `stamp` and this rank's arrival, then waits until every rank has arrived at the
  // same barrier and checks their stamps. Throws TransferError (timeout, broken connection,
  // closed) or loom::Error (another op's stamp) as described above.
  void arrive_and_wait(const ShmStamp& stamp, Clock::time_point deadline);

  // Closes the channel for every rank: waits in all processes end (this rank's with kAborted,
  // peers' naming this rank as a broken connection). Idempotent; thread-safe.
  void close(const std::string& reason);
  // Whether a wait failed because of a peer (its connection broke, or it did not arrive before
  // the deadline), as that failure is thrown, before anything unwinds.
  bool peer_failed() const { return peer_failed_.load(); }

  // The segment's layout (defined in the .cc).
  struct Header;
  struct RankCell;

 private:
  RankCell& cell(int r) const;
  void wake_all();
  [[noreturn]] void fail_waiting(int missing, Clock::time_point deadline);
  void check_stamps(uint64_t barrier, const ShmStamp& mine) const;

  std::string name_;
  int rank_;
  int world_;
  size_t slot_bytes_;
  size_t mapped_bytes_;
  char* base_ = nullptr;
  Header* header_ = nullptr;
  char* data_ = nullptr;
  uint64_t barriers_ = 0;  // barriers this rank has arrived at
  uint64_t round_ = 0;
  std::atomic<bool> closed_here_{false};
  std::atomic<bool> peer_failed_{false};
  mutable std::mutex close_mutex_;
  std::string close_reason_;  // the first close()'s, guarded by close_mutex_
};

}  // namespace loom::comm::gloo_detail
