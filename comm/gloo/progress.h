// ProgressBoard: each rank's record, in the group's store, of how many collectives it has
// started and how it left the group (private to comm/gloo). A rank whose collective fails reads
// the others' records to name the ranks that never arrived.
//
// Cost: started() takes an uncontended mutex (~30 ns); a board thread writes the latest count
// to the store at most once per 2 ms window (one write in flight at a time, updates in between
// coalesced; the worker wakes the board only when it is idle), so the worker never waits on the
// store and a burst of small collectives costs one store write. Peers reading the records after
// a failure see counts at most one window plus one store write old.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/store.h"

namespace loom::comm::gloo_detail {

class ProgressBoard {
 public:
  ProgressBoard(std::shared_ptr<Store> store, int rank, int size);
  // Writes what is still pending, then joins the board thread.
  ~ProgressBoard();
  ProgressBoard(const ProgressBoard&) = delete;
  ProgressBoard& operator=(const ProgressBoard&) = delete;

  // This rank has started `count` collectives on the group (non-blocking).
  void started(uint64_t count);
  // Publishes how this rank left the group ("aborted: ...", "failed: ..."); waits up to `wait`
  // for the write so peers that fail next can read it.
  void publish_state(const std::string& state, Duration wait);

  struct Peer {
    int rank;
    uint64_t started;   // collectives started (0 if never written)
    std::string state;  // empty while the rank is healthy
  };
  // Every other rank's record (blocking store reads; for the failure path). On a store error
  // returns what it read so far and sets *error.
  std::vector<Peer> read_peers(std::string* error) const;

  static std::string progress_key(int rank);
  static std::string state_key(int rank);

 private:
  void loop();

  std::shared_ptr<Store> store_;
  int rank_;
  int size_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable written_;
  uint64_t started_ = 0;
  uint64_t published_ = 0;
  std::string state_;
  bool state_pending_ = false;
  bool state_written_ = false;
  bool stop_ = false;
  bool idle_ = false;  // the board thread waits for work (started() must wake it)
  bool store_broken_ = false;
  std::thread thread_;
};

}  // namespace loom::comm::gloo_detail
