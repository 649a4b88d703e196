#include "comm/gloo/progress.h"

#include <fmt/format.h>

#include <atomic>
#include <charconv>

#include "base/logging.h"

namespace loom::comm::gloo_detail {

namespace {
constexpr auto kCoalesceWindow = std::chrono::milliseconds(2);
}  // namespace

ProgressBoard::ProgressBoard(std::shared_ptr<Store> store, int rank, int size)
    : store_(std::move(store)), rank_(rank), size_(size), thread_([this] { loop(); }) {}

ProgressBoard::~ProgressBoard() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::string ProgressBoard::progress_key(int rank) { return fmt::format("gloo/progress/{}", rank); }
std::string ProgressBoard::state_key(int rank) { return fmt::format("gloo/state/{}", rank); }

void ProgressBoard::started(uint64_t count) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (count <= started_) return;
    started_ = count;
    wake = idle_;
  }
  if (wake) wake_.notify_one();  // at most one wake-up per coalescing window
}

void ProgressBoard::publish_state(const std::string& state, Duration wait) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!state_.empty()) return;  // the first state wins
  state_ = state;
  state_pending_ = true;
  wake_.notify_one();
  written_.wait_for(lock, wait, [&] { return state_written_ || store_broken_; });
}

void ProgressBoard::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    idle_ = true;
    wake_.wait(lock, [&] { return stop_ || started_ != published_ || state_pending_; });
    idle_ = false;
    // Stopping: the group is being destroyed, so counts nobody will read are dropped (at exit
    // the store's server, rank 0, may already be gone, and each write would wait on it); a
    // pending failure state is still written.
    if (stop_ && !state_pending_) break;
    const uint64_t count = started_;
    const bool write_state = state_pending_;
    const std::string state = state_;
    state_pending_ = false;
    const bool skip = store_broken_;
    lock.unlock();
    bool failed = false;
    if (!skip) {
      try {
        // The count first: a peer that reads the state also sees where this rank stopped.
        store_->set(progress_key(rank_), std::to_string(count));
        if (write_state) store_->set(state_key(rank_), state);
      } catch (const std::exception& e) {
        // Once per process: every group's board meets the same store's failure.
        static std::atomic<bool> warned{false};
        if (!warned.exchange(true)) {
          LOOM_LOG(warn,
                   "gloo progress boards: the store failed ({}); failure reports will not name "
                   "missing ranks",
                   e.what());
        }
        failed = true;
      }
    }
    lock.lock();
    if (failed) store_broken_ = true;
    published_ = count;
    if (write_state) state_written_ = true;
    written_.notify_all();
    // Let updates accumulate: ops that start within the window cost no wake-up and one write.
    wake_.wait_for(lock, kCoalesceWindow, [&] { return stop_ || state_pending_; });
  }
}

std::vector<ProgressBoard::Peer> ProgressBoard::read_peers(std::string* error) const {
  std::vector<Peer> peers;
  try {
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      Peer peer{r, 0, ""};
      const std::string pkey = progress_key(r);
      if (store_->check({pkey})) {
        const std::string text = store_->get_string(pkey);
        std::from_chars(text.data(), text.data() + text.size(), peer.started);
      }
      const std::string skey = state_key(r);
      if (store_->check({skey})) peer.state = store_->get_string(skey);
      peers.push_back(std::move(peer));
    }
  } catch (const std::exception& e) {
    if (error) *error = e.what();
  }
  return peers;
}

}  // namespace loom::comm::gloo_detail
