#include "parallel/ft/replica_group.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "base/logging.h"
#include "comm/gloo/process_group_gloo.h"
#include "comm/prefix_store.h"
#include "tensor/ops.h"

namespace loom::parallel::ft {

namespace {

std::string step_prefix(int64_t step, int attempt) {
  return fmt::format("ft/step{}/attempt{}/", step, attempt);
}

// "replica:state_step" pairs, ascending by replica: the decided members.
std::string encode_members(const std::vector<std::pair<int, int64_t>>& members) {
  std::string out;
  for (const auto& [replica, state] : members) {
    out += fmt::format("{}{}:{}", out.empty() ? "" : ",", replica, state);
  }
  return out;
}

std::vector<std::pair<int, int64_t>> decode_members(const std::string& text) {
  std::vector<std::pair<int, int64_t>> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t colon = item.find(':');
    out.emplace_back(std::stoi(item.substr(0, colon)), std::stoll(item.substr(colon + 1)));
  }
  return out;
}

// What every failure to reach the replicas' store says of it.
constexpr const char* kStoreMustOutlive =
    " (the replicas' shared store — a lighthouse — must outlive every replica; without it no "
    "replica can go on)";

}  // namespace

ReplicaGroup::ReplicaGroup(std::shared_ptr<comm::Store> store, int replica, int max_replicas,
                           ReplicaGroupOptions options)
    : store_(std::move(store)),
      replica_(replica),
      max_replicas_(max_replicas),
      options_(std::move(options)) {
  LOOM_CHECK(store_ != nullptr, "ReplicaGroup: the store is null");
  LOOM_CHECK(max_replicas_ >= 1 && replica_ >= 0 && replica_ < max_replicas_,
             "ReplicaGroup: replica {} is not in [0, {}) (max_replicas {})", replica_,
             max_replicas_, max_replicas_);
}

int64_t ReplicaGroup::first_step(int64_t state_step) {
  try {
    const std::string key = "ft/latest";
    if (!store_->check({key})) return state_step;
    return std::max(state_step, store_->add(key, 0) + 1);
  } catch (const Error& e) {
    LOOM_FAIL("ReplicaGroup '{}': replica {}: reading the running job's step failed: {}{}",
              options_.local_key, replica_, e.what(), kStoreMustOutlive);
  }
}

StepQuorum ReplicaGroup::start_step(int64_t step, int attempt, int64_t state_step) {
  try {
    return quorum_for(step, attempt, state_step);
  } catch (const Error& e) {
    LOOM_FAIL("ReplicaGroup '{}': replica {}: the quorum for step {} (attempt {}) failed: {}{}",
              options_.local_key, replica_, step, attempt, e.what(), kStoreMustOutlive);
  }
}

StepQuorum ReplicaGroup::quorum_for(int64_t step, int attempt, int64_t state_step) {
  const std::string prefix = step_prefix(step, attempt);
  store_->set(prefix + "join/" + std::to_string(replica_), std::to_string(state_step));
  const std::string decided = prefix + "members";
  // Who joined so far, ascending.
  const auto joined = [&] {
    std::vector<std::pair<int, int64_t>> members;
    for (int r = 0; r < max_replicas_; ++r) {
      const std::string join = prefix + "join/" + std::to_string(r);
      if (store_->check({join})) members.emplace_back(r, std::stoll(store_->get_string(join)));
    }
    return members;
  };
  // The members are written once: the first list published wins (compare_set on the absent
  // key), and every replica reads that one back, so a slow decider and one that took over never
  // leave two lists, whoever stalls or dies between deciding and writing.
  const auto publish = [&](const std::vector<std::pair<int, int64_t>>& members) {
    const std::string mine = encode_members(members);
    store_->compare_set(decided, {}, comm::Bytes(mine.begin(), mine.end()));
    // For replicas joining later: the latest decided step, raised to `step` unless a later one
    // is there (a compare-and-swap loop: every publisher of a step runs it).
    const std::string latest = "ft/latest";
    const std::string text = std::to_string(step);
    const comm::Bytes ours(text.begin(), text.end());
    comm::Bytes seen = store_->compare_set(latest, {}, ours);
    while (std::stoll(std::string(seen.begin(), seen.end())) < step) {
      seen = store_->compare_set(latest, seen, ours);
    }
  };
  if (store_->add(prefix + "decider", 1) == 1) {
    // The decider: everyone, or whoever came within the join window.
    const auto deadline = std::chrono::steady_clock::now() + options_.join_window;
    std::vector<std::pair<int, int64_t>> members = joined();
    while (static_cast<int>(members.size()) < max_replicas_ &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      members = joined();
    }
    publish(members);
  } else {
    // A decider killed during its join window would leave the others waiting out the timeout
    // and failing: past the window and a grace, they publish who joined themselves (the dead
    // one among them: its group fails to form and the next attempt goes on without it).
    try {
      store_->wait({decided}, options_.join_window + options_.decider_grace);
    } catch (const Error&) {
      publish(joined());
    }
  }
  StepQuorum q{.step = step, .attempt = attempt};
  int64_t newest = -1;
  for (const auto& [replica, state] : decode_members(store_->get_string(decided))) {
    if (replica == replica_) q.index = static_cast<int>(q.members.size());
    q.members.push_back(replica);
    q.state_at.push_back(state);
    newest = std::max(newest, state);
  }
  for (size_t i = 0; i < q.members.size(); ++i) {
    if (q.state_at[i] < newest) q.needs_state_sync = true;
    if (q.source < 0 && q.state_at[i] == newest) q.source = static_cast<int>(i);
  }
  quorum_ = q;
  group_failed_ = false;
  if (q.member()) {
    try {
      group_for(q);
    } catch (const Error& e) {
      // A member that died after joining never connects: this attempt fails (average and
      // sync_state say so), and the next one goes on without it.
      group_.reset();
      group_members_.clear();
      group_failed_ = true;
      LOOM_LOG(warn, "ReplicaGroup '{}': replica {}: step {} attempt {}: {}", options_.local_key,
               replica_, step, attempt, e.what());
    }
  }
  return q;
}

void ReplicaGroup::group_for(const StepQuorum& q) {
  // A new group when the members changed, one of them is behind (a fresh process has no group
  // yet) or an attempt failed (the old group is poisoned); every member decides alike.
  const bool reuse = group_ && group_members_ == q.members && !q.needs_state_sync && q.attempt == 0;
  if (reuse) return;
  group_.reset();
  group_members_ = q.members;
  if (q.members.size() == 1) return;  // alone: nothing to average with
  const std::string prefix =
      step_prefix(q.step, q.attempt) + fmt::format("group/{}/", options_.local_key);
  group_ = comm::ProcessGroupGloo::create(
      std::make_shared<comm::PrefixStore>(prefix, store_), q.index,
      static_cast<int>(q.members.size()),
      comm::ProcessGroupOptions{.name = fmt::format("ft/{}/step{}", options_.local_key, q.step),
                                .timeout = options_.connect_timeout},
      comm::GlooOptions::loopback());
}

bool ReplicaGroup::sync_state(const std::vector<Tensor>& state, const Agreement& agree) {
  LOOM_CHECK(quorum_.member(), "ReplicaGroup: replica {} is not a member of step {}'s quorum",
             replica_, quorum_.step);
  bool ok = !group_failed_;
  if (group_ && ok) {
    try {
      for (const Tensor& t : state) group_->broadcast(t, quorum_.source)->wait();
    } catch (const Error&) {
      ok = false;
    }
  }
  return agree ? agree(ok) : ok;
}

bool ReplicaGroup::average(const std::vector<Tensor>& grads, const Agreement& agree) {
  LOOM_CHECK(quorum_.member(), "ReplicaGroup: replica {} is not a member of step {}'s quorum",
             replica_, quorum_.step);
  if (!group_) return agree ? agree(!group_failed_) : !group_failed_;
  // One flat buffer: one all_reduce; `grads` change only once every rank of this replica
  // succeeded (`agree`), so a retry starts from the same gradients everywhere.
  std::vector<Tensor> flat;
  for (const Tensor& g : grads) flat.push_back(ops::reshape(ops::contiguous(g), {g.numel()}));
  Tensor buffer = ops::contiguous(ops::cat(flat, 0));
  bool ok = true;
  try {
    group_->all_reduce(buffer, comm::ReduceOp::kSum)->wait();
  } catch (const Error&) {
    ok = false;
  }
  if (agree) ok = agree(ok);
  if (!ok) return false;
  buffer = ops::div(buffer, static_cast<double>(quorum_.members.size()));
  int64_t offset = 0;
  for (const Tensor& g : grads) {
    ops::copy_(g, ops::reshape(ops::narrow(buffer, 0, offset, g.numel()), g.shape()));
    offset += g.numel();
  }
  return true;
}

void ReplicaGroup::commit() { participants_[quorum_.step] = quorum_.members; }

}  // namespace loom::parallel::ft
