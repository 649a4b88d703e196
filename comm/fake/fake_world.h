// The rendezvous of the ranks traced together by FakeProcessGroup (private to comm/fake): which
// global ranks are traced, and the messages in flight between them.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "comm/store.h"
#include "comm/types.h"
#include "comm/work.h"
#include "tensor/memory_stats.h"
#include "tensor/tensor.h"

namespace loom::comm {

// `message`'s values into `into` when both have one shape and dtype (only small meta storage holds
// values, tensor/device.h): what a delivered message and an all_gather's outputs receive.
void copy_values(const Tensor& into, const Tensor& message);

// A Work that a later send completes; wait() gives up after the group's timeout.
class FakeRecvWork : public Work {
 public:
  FakeRecvWork(Duration timeout, std::string description)
      : timeout_(timeout), description_(std::move(description)) {}
  void wait() override;

 private:
  Duration timeout_;
  std::string description_;
};

class FakeWorld {
 public:
  FakeWorld(int size, std::set<int> traced) : size_(size), traced_(std::move(traced)) {}

  int size() const { return size_; }
  bool traced(int global_rank) const { return traced_.count(global_rank) > 0; }

  // `tensor` from global rank `src` to `dst` on group `group` with `tag`: handed to the first
  // pending recv that matches, else queued for the next one.
  void send(const std::string& group, int src, int dst, int tag, const Tensor& tensor);
  // Completes `work` (copying the values into `into`) with the first queued matching send, or
  // when one comes.
  void recv(const std::string& group, int src, int dst, int tag, const Tensor& into,
            std::shared_ptr<Work> work);
  // Fails every pending and later recv with `reason` (a traced rank failed: its peers must not
  // wait out the timeout).
  void abort(const std::string& reason);
  // Sends no recv took and recvs no send matched, one line each ("group 'mesh/pp': 2 sends from
  // rank 0 to rank 1 (tag 0) never received"); empty when every message paired.
  std::vector<std::string> unmatched() const;

 private:
  using Key = std::tuple<std::string, int, int, int>;  // group, src, dst, tag
  struct PendingRecv {
    Tensor into;
    std::shared_ptr<Work> work;
  };

  const int size_;
  const std::set<int> traced_;
  mutable std::mutex mutex_;
  MemoryTracker in_flight_;  // queued messages' copies (before sent_: it outlives them)
  std::map<Key, std::deque<Tensor>> sent_;
  std::map<Key, std::deque<PendingRecv>> waiting_;
  std::string aborted_;  // the reason, once aborted
};

}  // namespace loom::comm
