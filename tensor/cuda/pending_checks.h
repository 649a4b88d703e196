// PendingChecks: the bookkeeping of checks a kernel makes on the device and the host reports
// later (device_checks.h), independent of CUDA so that it is tested on CPU.
//
// Why: an embedding's indices and a loss's targets live on the GPU. Checking them on the host
// means copying them back, which synchronizes the host with the device in every step and empties
// the queue of work the host had issued ahead. Instead the kernel that reads them checks each one
// and writes the first failing position into a slot (an int64 the kernel lowers with atomicMin);
// the host reads the slots the next time it waits for the device anyway (item(), a copy to the
// host, synchronize()) and throws the failed check's message then.
//
// A check owns one slot of `capacity` from begin() until the slots are read (take_failure());
// its slot starts at kNoFailure. When every slot is taken, begin() returns nullopt and the
// caller synchronizes, which reads and frees them all.
//
// Not thread-safe: device_checks.cc holds a mutex per device around it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace loom::cuda {

class PendingChecks {
 public:
  // What a slot holds while no element failed: every byte 0x7f (one cudaMemsetAsync), above any
  // position.
  static constexpr int64_t kNoFailure = 0x7f7f7f7f7f7f7f7fLL;

  // Builds the check's error message from the first failing position (the failing value can be
  // read from the data then: this runs only on failure, after the device has finished).
  using Describe = std::function<std::string(int64_t position)>;

  explicit PendingChecks(int capacity);

  // Takes a free slot for a check described by `describe`; nullopt when all are taken.
  std::optional<int> begin(Describe describe);

  // Number of checks begun and not yet taken.
  int pending() const { return static_cast<int>(checks_.size()); }
  int capacity() const { return capacity_; }

  // The first failed check: its message is describe(position), built by the caller once it
  // holds no lock (describing may read the data from the device).
  struct Failure {
    Describe describe;
    int64_t position;
  };

  // Reads the pending checks' slots (`slots[i]` is slot i's value, for every slot) in the order
  // the checks began, frees every slot, and returns the first failed check; nullopt when none
  // failed. Later failures are dropped: they are usually the same bad input seen again by the
  // next op that reads it.
  std::optional<Failure> take_failure(const int64_t* slots);

 private:
  struct Check {
    int slot;
    Describe describe;
  };
  int capacity_;
  std::vector<int> free_slots_;
  std::vector<Check> checks_;
};

}  // namespace loom::cuda
