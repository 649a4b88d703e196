#include "comm/gloo/group_state.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <regex>
#include <set>
#include <thread>

#include "base/error.h"
#include "comm/gloo/shm_channel.h"
#include "comm/launch_env.h"
#include "comm/peer_failure.h"

namespace loom::comm::gloo_detail {

namespace {

// How long a failing rank waits for its state to reach the store before closing connections
// (so peers that fail next can read why), and how long peers re-read records that look stale.
constexpr Duration kStateFlush = std::chrono::seconds(1);
constexpr int kSettleReads = 10;
constexpr Duration kSettlePause = std::chrono::milliseconds(20);
// How long a failed rank's destructor waits at most for its peers' records (mark_destroyed).
constexpr Duration kLingerCap = std::chrono::seconds(5);
// A launcher waits this long for a failed rank to exit after its peers did (comm/launch_env.h).
static_assert(kStateFlush + kLingerCap < kPeerFailureWait,
              "a rank lingering after its failure must exit within the launcher's wait");

std::string short_text(const std::string& text, size_t limit = 400) {
  if (text.size() <= limit) return text;
  return text.substr(0, limit) + "...";
}

}  // namespace

GroupState::GroupState(std::shared_ptr<Store> store, std::shared_ptr<::gloo::Context> context,
                       std::unique_ptr<ShmChannel> shared_memory, std::string name,
                       std::vector<int> global_ranks)
    : name_(std::move(name)),
      global_ranks_(std::move(global_ranks)),
      mesh_(std::move(context), std::move(shared_memory)),
      board_(store, mesh_.rank(), mesh_.size()),
      store_(std::move(store)),
      linger_(kStateFlush) {}

GroupState::~GroupState() = default;

char* ScratchBuffer::get(size_t bytes) {
  if (bytes > size_) {
    data_.reset(new char[bytes]);  // uninitialized: every byte is received before it is read
    size_ = bytes;
  }
  return data_.get();
}

std::optional<std::string> GroupState::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void GroupState::run(const OpSpec& op, Work& work, std::function<void(const OpEnv&)> body) {
  if (auto first = failure()) {
    body = nullptr;
    const std::string message = fmt::format(
        "{}: group '{}' is unusable after an earlier failure: {}", op.description, name_, *first);
    work.mark_failed(failed_by_peer() ? std::make_exception_ptr(PeerFailure(message))
                                      : std::make_exception_ptr(Error(message)));
    return;
  }
  if (op.collective) board_.started(op.index + 1);
  const OpEnv env{mesh_, Clock::now() + op.timeout, op.index, op.kind, scratch_};
  try {
    body(env);
    body = nullptr;
  } catch (...) {
    body = nullptr;
    bool by_peer = false;
    const std::string message = describe(op, std::current_exception(), by_peer);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failure_) linger_ = std::min(op.timeout, kLingerCap);
    }
    poison(message, "failed: " + message, fmt::format("{} failed", op.description), by_peer);
    work.mark_failed(by_peer ? std::make_exception_ptr(PeerFailure(message))
                             : std::make_exception_ptr(Error(message)));
    return;
  }
  work.mark_completed();
}

void GroupState::abort(const std::string& reason) {
  poison(fmt::format("aborted: {}", reason), fmt::format("aborted: {}", reason),
         fmt::format("aborted: {}", reason), /*by_peer=*/false);
}

void GroupState::mark_destroyed() {
  if (failure()) {
    wait_for_peer_records();
    return;
  }
  board_.publish_state("its ProcessGroup was destroyed",
                       Duration(0));  // written before the board stops
}

// Without this, rank 0 failing and exiting at once takes the TcpStore down while the other ranks
// are still reading it for their own failure reports, which then cannot name the missing rank.
// A peer's record is written (poison) after its report has read the board.
void GroupState::wait_for_peer_records() {
  std::vector<int> waiting;
  Duration bound;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int r = 0; r < mesh_.size(); ++r) {
      if (r != mesh_.rank() && blamed_.count(r) == 0) waiting.push_back(r);
    }
    bound = linger_;
  }
  const auto deadline = Clock::now() + bound;
  try {
    while (!waiting.empty() && Clock::now() < deadline) {
      std::erase_if(waiting, [&](int r) { return store_->check({ProgressBoard::state_key(r)}); });
      if (!waiting.empty()) std::this_thread::sleep_for(kSettlePause);
    }
  } catch (const std::exception&) {
    // The store is gone: there is nothing left to keep up.
  }
}

bool GroupState::failed_by_peer() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_by_peer_;
}

void GroupState::poison(const std::string& message, const std::string& state,
                        const std::string& close_reason, bool by_peer) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_) return;
    failure_ = message;
    failed_by_peer_ = by_peer;
  }
  board_.publish_state(state, kStateFlush);
  mesh_.close(close_reason);
}

std::string GroupState::rank_list(const std::vector<int>& ranks) const {
  std::string text = fmt::format("[{}]", fmt::join(ranks, ", "));
  bool identity = true;
  for (size_t i = 0; i < global_ranks_.size(); ++i)
    identity = identity && global_ranks_[i] == static_cast<int>(i);
  if (!identity) {
    std::vector<int> global;
    for (int r : ranks) global.push_back(global_ranks_[r]);
    text += fmt::format(" (global [{}])", fmt::join(global, ", "));
  }
  return text;
}

std::string GroupState::describe(const OpSpec& op, std::exception_ptr error, bool& by_peer) {
  std::string cause;
  bool transport_failure = false;
  bool connection_failure = false;
  int peer = op.peer;
  try {
    std::rethrow_exception(error);
  } catch (const TransferError& e) {
    peer = e.peer;
    if (e.kind != TransferFailure::kAborted) {
      std::lock_guard<std::mutex> lock(mutex_);
      blamed_.insert(peer);
    }
    switch (e.kind) {
      case TransferFailure::kTimeout:
        cause = fmt::format("timed out after {} ms ({})", op.timeout.count(), e.what());
        transport_failure = true;
        break;
      case TransferFailure::kConnection:
        cause = e.what();
        transport_failure = connection_failure = true;
        break;
      case TransferFailure::kAborted:
        cause = e.what();
        break;
    }
    // The transport names the peer by its rank in this group; say which rank of the job it is.
    if (peer >= 0 && peer < static_cast<int>(global_ranks_.size()) && global_ranks_[peer] != peer) {
      cause += fmt::format("; rank {} of this group is global rank {}", peer, global_ranks_[peer]);
    }
    // A transfer this rank's own close ended was ended by whatever closed it: a peer's failure
    // on another of this group's transfers (recorded on the mesh as it was thrown, before its
    // unwinding closed the mesh: it may not have poisoned the group yet), or this rank.
    by_peer = transport_failure ||
              (e.kind == TransferFailure::kAborted && (failed_by_peer() || mesh_.peer_failed()));
  } catch (const std::exception& e) {
    cause = e.what();
  } catch (...) {
    cause = "an unknown exception";
  }
  std::string message = fmt::format("{} failed: {}", op.description, cause);
  if (transport_failure) {
    // Peers may already see this rank's connections closed (a Transfers destroyed with transfers
    // in flight closes the mesh while the error unwinds), and the report below can take a while
    // (it waits for the records of ranks that may be dead): record the cause first, so the peers'
    // reports can name it. The first state wins; poison() keeps this one.
    if (!failure()) board_.publish_state("failed: " + message, kStateFlush);
    message += arrival_report(op, connection_failure, peer);
  }
  return message;
}

// "; ranks [2] did not arrive at this all_reduce; rank 2 left the group: aborted: ..."
std::string GroupState::arrival_report(const OpSpec& op, bool connection_failure, int failed_peer) {
  std::string store_error;
  std::vector<ProgressBoard::Peer> peers;
  std::vector<int> behind;
  auto stale = [&] {
    // After a broken connection the peer's record may still be on its way.
    if (!connection_failure) return false;
    for (const auto& p : peers) {
      const bool is_behind = op.collective && p.started < op.index + 1;
      if ((is_behind || p.rank == failed_peer) && p.state.empty()) return true;
    }
    return false;
  };
  for (int attempt = 0; attempt < kSettleReads; ++attempt) {
    store_error.clear();
    peers = board_.read_peers(&store_error);
    if (!store_error.empty() || !stale()) break;
    std::this_thread::sleep_for(kSettlePause);
  }
  if (!store_error.empty())
    return fmt::format("; could not read the other ranks' progress ({})", store_error);

  std::string report;
  const std::string op_name(collective_name(op.kind));
  if (op.collective) {
    for (const auto& p : peers) {
      if (p.started < op.index + 1) behind.push_back(p.rank);
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      blamed_.insert(behind.begin(), behind.end());
    }
    if (behind.empty()) {
      report += fmt::format("; every rank had started this {}", op_name);
    } else {
      report += fmt::format("; ranks {} did not arrive at this {}", rank_list(behind), op_name);
    }
  }
  for (const auto& p : peers) {
    const bool relevant =
        p.rank == failed_peer || std::find(behind.begin(), behind.end(), p.rank) != behind.end();
    if (relevant && !p.state.empty()) {
      report += fmt::format("; rank {} left the group: {}", p.rank, short_text(p.state));
    }
  }
  return report + blame_chain(peers, failed_peer, behind);
}

// A failure spreads: a killed rank breaks its neighbours' connections, they fail and leave,
// which breaks their other connections. The rank this one lost may only be a link of that chain,
// so follow each record's "connection to rank N" back towards the rank that started it.
std::string GroupState::blame_chain(const std::vector<ProgressBoard::Peer>& peers, int failed_peer,
                                    const std::vector<int>& reported) const {
  static const std::regex kLostPeer("connection to rank ([0-9]+)");
  auto state_of = [&](int rank) -> const std::string* {
    for (const auto& p : peers) {
      if (p.rank == rank) return &p.state;
    }
    return nullptr;
  };
  std::string chain;
  std::set<int> seen{mesh_.rank(), failed_peer};
  int current = failed_peer;
  for (;;) {
    const std::string* state = state_of(current);
    std::smatch match;
    if (state == nullptr || !std::regex_search(*state, match, kLostPeer)) break;
    const int next = std::stoi(match[1].str());
    if (!seen.insert(next).second) break;
    const std::string* next_state = state_of(next);
    if (next_state == nullptr) break;
    if (next_state->empty()) {
      // Killed or stopped, or a survivor whose record is still on its way: say only what is known.
      chain += fmt::format("; rank {}, whose connection rank {} lost, has written no record", next,
                           current);
      break;
    }
    if (std::find(reported.begin(), reported.end(), next) == reported.end()) {
      chain += fmt::format("; rank {} left the group: {}", next, short_text(*next_state));
    }
    current = next;
  }
  return chain;
}

}  // namespace loom::comm::gloo_detail
