#include "comm/gloo/transfers.h"

#include <fmt/format.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <string_view>
#include <thread>

#include "comm/gloo/shm_channel.h"

namespace loom::comm::gloo_detail {

namespace {

// Gloo prefixes messages with "[file:line] "; the rest is the useful part.
std::string gloo_message(const std::exception& e) {
  std::string_view text = e.what();
  if (!text.empty() && text.front() == '[') {
    const size_t end = text.find("] ");
    if (end != std::string_view::npos) text.remove_prefix(end + 2);
  }
  return std::string(text);
}

}  // namespace

uint64_t make_slot(uint8_t prefix, uint32_t a, uint32_t b) {
  return (static_cast<uint64_t>(prefix) << 56) | (static_cast<uint64_t>(a) << 24) |
         static_cast<uint64_t>(b & 0xFFFFFFu);
}

Mesh::Mesh(std::shared_ptr<::gloo::Context> context, std::unique_ptr<ShmChannel> shared_memory)
    : context_(std::move(context)),
      shm_(std::move(shared_memory)),
      rank_(context_->rank),
      size_(context_->size) {}

// No close() here: destroying the context closes each connection gracefully (FIN after the
// data), so a peer still reading this rank's last message gets it. close() resets connections.
Mesh::~Mesh() = default;

void Mesh::close(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return;
  closed_ = true;
  reason_ = first_failure_.empty() ? reason : fmt::format("{}: {}", reason, first_failure_);
  // Close first: afterwards no data can arrive, so waiters can be woken and their buffers freed.
  context_->closeConnections();
  if (shm_) shm_->close(reason_);
  for (Transfers* transfers : active_) {
    for (auto& pending : transfers->pending_) {
      if (pending.is_send) {
        pending.buffer->abortWaitSend();
      } else {
        pending.buffer->abortWaitRecv();
      }
    }
  }
}

bool Mesh::peer_failed() const {
  return peer_failed_.load() || (shm_ != nullptr && shm_->peer_failed());
}

bool Mesh::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return closed_;
}

std::string Mesh::close_reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reason_;
}

Transfers::Transfers(Mesh& mesh, Clock::time_point deadline) : mesh_(mesh), deadline_(deadline) {
  std::lock_guard<std::mutex> lock(mesh_.mutex_);
  mesh_.active_.insert(this);
}

Transfers::~Transfers() {
  if (waited_ < pending_.size()) mesh_.close("an operation failed with transfers in flight");
  std::lock_guard<std::mutex> lock(mesh_.mutex_);
  mesh_.active_.erase(this);
  pending_.clear();
}

void Transfers::throw_closed(int peer, const std::string& reason) {
  throw TransferError(TransferFailure::kAborted, peer,
                      fmt::format("this rank closed the group's connections ({})", reason));
}

void Transfers::throw_by_peer(TransferFailure kind, int peer, const std::string& message) {
  std::lock_guard<std::mutex> lock(mesh_.mutex_);  // released as the error unwinds
  throw_by_peer_locked(kind, peer, message);
}

void Transfers::throw_by_peer_locked(TransferFailure kind, int peer, const std::string& message) {
  if (mesh_.first_failure_.empty()) mesh_.first_failure_ = message;
  mesh_.peer_failed_.store(true);
  throw TransferError(kind, peer, message);
}

void Transfers::send(int peer, uint64_t slot, const void* data, size_t nbytes) {
  post(peer, slot, const_cast<void*>(data), nbytes, /*is_send=*/true);
}

void Transfers::recv(int peer, uint64_t slot, void* data, size_t nbytes) {
  post(peer, slot, data, nbytes, /*is_send=*/false);
}

// The slot a transfer of `nbytes` really uses: the size's fingerprint in bits 8..23 of the
// slot's low field (phases use the bits below). A receive of another size than its send then
// never matches it, and both sides fail by their deadline with a named error, instead of Gloo's
// I/O thread meeting a message longer than the receive buffer and aborting the process
// ("op.preamble.length <= op.nbytes" thrown where nothing can catch it).
uint64_t sized_slot(uint64_t slot, size_t nbytes) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the size's bytes
  for (int i = 0; i < 8; ++i) h = (h ^ ((nbytes >> (8 * i)) & 0xFF)) * 1099511628211ull;
  return slot ^ (((h ^ (h >> 16) ^ (h >> 32) ^ (h >> 48)) & 0xFFFFull) << 8);
}

void Transfers::post(int peer, uint64_t slot, void* data, size_t nbytes, bool is_send) {
  if (nbytes == 0) return;
  slot = sized_slot(slot, nbytes);
  std::lock_guard<std::mutex> lock(mesh_.mutex_);
  if (mesh_.closed_) throw_closed(peer, mesh_.reason_);
  Pending pending{mesh_.context_->createUnboundBuffer(data, nbytes), peer, is_send, nbytes};
  try {
    if (is_send) {
      pending.buffer->send(peer, slot);
    } else {
      pending.buffer->recv(peer, slot);
    }
  } catch (const ::gloo::IoException& e) {  // mesh_.mutex_ is held here
    throw_by_peer_locked(
        TransferFailure::kConnection, peer,
        fmt::format("the connection to rank {} is broken ({})", peer, gloo_message(e)));
  } catch (const ::gloo::EnforceNotMet& e) {
    throw_by_peer_locked(TransferFailure::kConnection, peer,
                         fmt::format("gloo refused a {} with rank {} ({})",
                                     is_send ? "send" : "recv", peer, gloo_message(e)));
  }
  pending_.push_back(std::move(pending));
}

void Transfers::wait() {
  while (waited_ < pending_.size()) {
    ::gloo::transport::UnboundBuffer* buffer;
    int peer;
    bool is_send;
    {
      std::lock_guard<std::mutex> lock(mesh_.mutex_);
      if (mesh_.closed_) throw_closed(pending_[waited_].peer, mesh_.reason_);
      buffer = pending_[waited_].buffer.get();
      peer = pending_[waited_].peer;
      is_send = pending_[waited_].is_send;
    }
    const auto now = Clock::now();
    // Gloo treats a timeout <= 0 specially; an expired deadline still gets 1 ms.
    const auto left =
        std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - now),
                 std::chrono::milliseconds(1));
    bool completed = false;
    try {
      completed = is_send ? buffer->waitSend(nullptr, left) : buffer->waitRecv(nullptr, left);
    } catch (const ::gloo::IoException& e) {
      const std::string text = gloo_message(e);
      if (text.find("Timed out") != std::string::npos) {
        throw_by_peer(
            TransferFailure::kTimeout, peer,
            fmt::format("no {} rank {} before the deadline (a transfer of {} bytes, {}: rank {} "
                        "is stalled or gone, or posted another size, as shapes that differ "
                        "between ranks do)",
                        is_send ? "receive by" : "data from", peer, pending_[waited_].nbytes,
                        is_send ? "sending" : "receiving", peer));
      }
      if (mesh_.closed()) throw_closed(peer, mesh_.close_reason());
      // Gloo closes every connection of its context when one wait times out: this transfer was
      // ended by another one's timeout, not by its own peer's connection.
      if (text.find("Application timeout") != std::string::npos) {
        // The transfer that timed out records its failure as it unwinds, maybe just after Gloo
        // woke this one: give it a moment, to name it.
        std::string first;
        for (int tries = 0; tries < 200 && first.empty(); ++tries) {
          if (tries > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          std::lock_guard<std::mutex> lock(mesh_.mutex_);
          first = mesh_.first_failure_;
        }
        throw_by_peer(TransferFailure::kConnection, peer,
                      fmt::format("another transfer of this rank timed out, and gloo closed its "
                                  "connections ({}){}",
                                  text, first.empty() ? "" : ": " + first));
      }
      throw_by_peer(TransferFailure::kConnection, peer,
                    fmt::format("the connection to rank {} broke ({})", peer, text));
    } catch (const ::gloo::EnforceNotMet& e) {
      throw_by_peer(TransferFailure::kConnection, peer,
                    fmt::format("gloo failed waiting on rank {} ({})", peer, gloo_message(e)));
    }
    if (!completed) throw_closed(peer, mesh_.close_reason());  // woken by Mesh::close
    ++waited_;
  }
}

}  // namespace loom::comm::gloo_detail
