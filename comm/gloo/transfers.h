// Point-to-point transfers over a group's Gloo context, with deadlines and abort (private to
// comm/gloo). Every Loom algorithm (algorithms.cc) is a few rounds of Transfers.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace loom::comm::gloo_detail {

using Clock = std::chrono::steady_clock;

// A Gloo slot: `prefix` (8 bits; Gloo's own collectives use 0x01..0x08, Loom uses 0x40 and up)
// | `a` (32 bits) | `b` (24 bits). Sends match receives with the same slot, in order.
uint64_t make_slot(uint8_t prefix, uint32_t a, uint32_t b);

enum class TransferFailure {
  kTimeout,     // the peer did not send/receive before the op's deadline
  kConnection,  // the connection to the peer broke (peer gone or closed its group)
  kAborted,     // this rank closed the group (abort() or an earlier failure)
};

// Thrown by Transfers; `peer` is the group rank the failed transfer was with.
class TransferError : public std::runtime_error {
 public:
  TransferError(TransferFailure kind, int peer, const std::string& message)
      : std::runtime_error(message), kind(kind), peer(peer) {}
  TransferFailure kind;
  int peer;
};

class Transfers;
class ShmChannel;

// A group's Gloo context (full mesh of TCP pairs), its shared-memory channel when every rank is
// on one host (shm_connect.h), and what lets any thread close them.
class Mesh {
 public:
  Mesh(std::shared_ptr<::gloo::Context> context, std::unique_ptr<ShmChannel> shared_memory);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The shared-memory channel, or nullptr (ranks on several hosts, or turned off).
  ShmChannel* shared_memory() const { return shm_.get(); }

  // Closes every connection (and the shared-memory channel) (peers waiting on this rank fail at
  // once) and wakes every transfer of this process that is waiting on the mesh; later transfers
  // fail at once. Idempotent (the first reason is kept); thread-safe.
  void close(const std::string& reason);
  bool closed() const;
  // Whether a transfer on the mesh failed because of a peer (kConnection or kTimeout), recorded
  // as it is thrown: before its unwinding closes the mesh and aborts concurrent transfers, whose
  // kAborted failures are then the peer's doing too (comm::PeerFailure).
  bool peer_failed() const;
  // The reason given to the first close() (empty while open), with the first peer failure
  // recorded before it ("an operation failed with transfers in flight: no data from rank 1 ..."),
  // so that a transfer the close ended names what ended it.
  std::string close_reason() const;

 private:
  friend class Transfers;
  std::shared_ptr<::gloo::Context> context_;
  std::unique_ptr<ShmChannel> shm_;
  int rank_;
  int size_;
  mutable std::mutex mutex_;
  std::atomic<bool> peer_failed_{false};
  std::string first_failure_;  // the first peer failure's message (guarded by mutex_)
  bool closed_ = false;
  std::string reason_;
  std::set<Transfers*> active_;
};

// One round of sends and receives: post them all, then wait() for all of them. Zero-byte
// transfers are skipped (both sides know the size). The memory must stay valid until wait()
// returns or the Transfers is destroyed. If a Transfers is destroyed with transfers still
// pending (an error), it closes the mesh first, so Gloo never writes into freed memory.
class Transfers {
 public:
  Transfers(Mesh& mesh, Clock::time_point deadline);
  ~Transfers();
  Transfers(const Transfers&) = delete;
  Transfers& operator=(const Transfers&) = delete;

  void send(int peer, uint64_t slot, const void* data, size_t nbytes);
  void recv(int peer, uint64_t slot, void* data, size_t nbytes);
  // Waits for every posted transfer; throws TransferError (naming the peer) on the first
  // timeout, broken connection or abort.
  void wait();

 private:
  friend class Mesh;
  struct Pending {
    std::unique_ptr<::gloo::transport::UnboundBuffer> buffer;
    int peer;
    bool is_send;
    size_t nbytes;
  };
  void post(int peer, uint64_t slot, void* data, size_t nbytes, bool is_send);
  [[noreturn]] static void throw_closed(int peer, const std::string& reason);
  // Throws a peer's failure (kConnection, kTimeout), recording it on the mesh first; the
  // _locked form for a caller that holds mesh_.mutex_ (post: a std::mutex taken twice hangs).
  [[noreturn]] void throw_by_peer(TransferFailure kind, int peer, const std::string& message);
  [[noreturn]] void throw_by_peer_locked(TransferFailure kind, int peer,
                                         const std::string& message);

  Mesh& mesh_;
  Clock::time_point deadline_;
  std::vector<Pending> pending_;  // guarded by mesh_.mutex_ (abort walks it)
  size_t waited_ = 0;
};

}  // namespace loom::comm::gloo_detail
