#include "parallel/ft/replica_group.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "base/error.h"
#include "base/logging.h"
#include "comm/gloo/process_group_gloo.h"
#include "comm/prefix_store.h"
#include "tensor/ops.h"

namespace loom::parallel::ft {

namespace {

// The items of a job's settings (ReplicaGroupOptions::job: "; "-separated) that `other`'s lack,
// joined again: what a refusal names of two jobs' settings. All of them when none differ alone.
std::string items_not_in(const std::string& settings, const std::string& other) {
  const auto split = [](const std::string& text) {
    std::vector<std::string> items;
    size_t begin = 0;
    while (begin <= text.size()) {
      size_t end = text.find("; ", begin);
      if (end == std::string::npos) end = text.size();
      items.push_back(text.substr(begin, end - begin));
      begin = end + 2;
    }
    return items;
  };
  const std::vector<std::string> mine = split(settings), theirs = split(other);
  std::vector<std::string> out;
  for (const std::string& item : mine) {
    if (std::find(theirs.begin(), theirs.end(), item) == theirs.end()) out.push_back(item);
  }
  if (out.empty()) return settings;
  return fmt::format("{}", fmt::join(out, "; "));
}

std::string round_prefix(int64_t round, int attempt) {
  return fmt::format("ft/round{}/attempt{}/", round, attempt);
}

// A round's decision as its last attempt made it.
std::string final_key(int64_t round) { return fmt::format("ft/round{}/final", round); }

constexpr const char* kLatestRound = "ft/latest";

// What a replica writes when it joins a round.
struct JoinEntry {
  int replica = 0;
  int64_t state = 0;         // the steps its state holds
  int64_t state_round = -1;  // the round whose step made that state (-1: none since it started)
  std::string instance;      // hex
  bool veteran = false;      // it was a member of an earlier round
  std::string job;
  std::string description;
};

nlohmann::json to_json(const JoinEntry& e) {
  return {{"replica", e.replica},        {"state", e.state},     {"state_round", e.state_round},
          {"instance", e.instance},      {"veteran", e.veteran}, {"job", e.job},
          {"description", e.description}};
}

JoinEntry join_entry_of(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  return {.replica = j.at("replica").get<int>(),
          .state = j.at("state").get<int64_t>(),
          .state_round = j.at("state_round").get<int64_t>(),
          .instance = j.at("instance").get<std::string>(),
          .veteran = j.at("veteran").get<bool>(),
          .job = j.at("job").get<std::string>(),
          .description = j.at("description").get<std::string>()};
}

// The decision on the entries that joined (every rank of a replica writes one; a second job
// running the same id writes others): one process per replica id — one that took part before,
// else the first to join — whose settings are the running replicas' (the veterans', else the
// lowest id's). The others are refused, each with the reason its job will print.
// `previous`: the process each replica id had in the round before (a running replica keeps its
// id against a newcomer: the newcomer is left out).
nlohmann::json decide(const std::vector<JoinEntry>& joined, int max_replicas,
                      const std::map<int, std::string>& previous, int attempt) {
  const auto was_member = [&](const JoinEntry& e) {
    const auto it = previous.find(e.replica);
    return it != previous.end() && it->second == e.instance;
  };
  const JoinEntry* reference = nullptr;
  for (const JoinEntry& e : joined) {
    if ((e.veteran || was_member(e)) && (reference == nullptr || e.replica < reference->replica)) {
      reference = &e;
    }
  }
  if (reference == nullptr) {
    for (const JoinEntry& e : joined) {
      if (reference == nullptr || e.replica < reference->replica) reference = &e;
    }
  }
  nlohmann::json members = nlohmann::json::array(), refused = nlohmann::json::array();
  for (int r = 0; r < max_replicas; ++r) {
    const JoinEntry* chosen = nullptr;
    for (const JoinEntry& e : joined) {
      if (e.replica != r || e.job != reference->job) continue;
      // The id's process in the round before, else one that took part before, else the first.
      const auto rank = [&](const JoinEntry& x) { return was_member(x) ? 2 : x.veteran ? 1 : 0; };
      if (chosen == nullptr || rank(e) > rank(*chosen)) chosen = &e;
    }
    std::vector<std::string> seen;
    for (const JoinEntry& e : joined) {
      if (e.replica != r || (chosen != nullptr && e.instance == chosen->instance)) continue;
      if (std::find(seen.begin(), seen.end(), e.instance) != seen.end()) continue;
      seen.push_back(e.instance);
      const bool duplicate = e.job == reference->job;
      std::string reason =
          !duplicate
              ? fmt::format(
                    "--replica {}: this job's settings differ from the running replicas' (this "
                    "job: {}; replica {}'s: {}): replicas of one job need the same model, data, "
                    "seed, batch, sequence length, layout and training settings",
                    r, items_not_in(e.job, reference->job), reference->replica,
                    items_not_in(reference->job, e.job))
              : fmt::format(
                    "--replica {}: another job already runs replica {} against this replica store "
                    "({}; this job is {}): give each replica job its own --replica in [0, {}), "
                    "or stop the other first",
                    r, r, chosen->description, e.description, max_replicas);
      refused.push_back(
          {{"instance", e.instance}, {"duplicate", duplicate}, {"reason", std::move(reason)}});
    }
    if (chosen != nullptr) {
      members.push_back({{"replica", r},
                         {"state", chosen->state},
                         {"state_round", chosen->state_round},
                         {"instance", chosen->instance}});
    }
  }
  return {{"members", members}, {"refused", refused}, {"attempt", attempt}};
}

// What every failure to reach the replicas' store says of it.
constexpr const char* kStoreMustOutlive =
    " (the replicas' shared store — a lighthouse — must outlive every replica; without it no "
    "replica can go on)";

// Whether a process of the round before has not joined: `same_process`, that very process (a
// newcomer of its id does not count); else anyone of its id.
bool previous_missing(const std::map<int, std::string>& previous,
                      const std::vector<JoinEntry>& entries, bool same_process) {
  return std::any_of(previous.begin(), previous.end(), [&](const auto& id_instance) {
    return std::none_of(entries.begin(), entries.end(), [&](const JoinEntry& e) {
      return e.replica == id_instance.first && (!same_process || e.instance == id_instance.second);
    });
  });
}

}  // namespace

uint64_t random_instance() {
  std::random_device device;
  return ((static_cast<uint64_t>(device()) << 32) ^ device()) | 1;  // never 0
}

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
  if (options_.instance == 0) options_.instance = random_instance();
  if (options_.description.empty()) {
    options_.description = fmt::format("instance {:016x}", options_.instance);
  }
}

int64_t ReplicaGroup::next_round() {
  try {
    const int64_t latest = store_->check({kLatestRound}) ? store_->add(kLatestRound, 0) : -1;
    return std::max(last_round_, latest) + 1;
  } catch (const Error& e) {
    LOOM_FAIL("ReplicaGroup '{}': replica {}: reading the latest round failed: {}{}",
              options_.local_key, replica_, e.what(), kStoreMustOutlive);
  }
}

StepQuorum ReplicaGroup::start_round(int64_t round, int attempt, int64_t state_step) {
  // A member that dies makes one attempt fail, and the next goes on without it: attempts beyond
  // every member's failure mean the members cannot work together at all (say, two layouts).
  const int max_attempts = std::max(8, 2 * max_replicas_);
  LOOM_CHECK(attempt < max_attempts,
             "ReplicaGroup '{}': replica {}: round {} failed {} attempts with members {}; the last "
             "failure: {}",
             options_.local_key, replica_, round, attempt, quorum_.members,
             last_failure_.empty() ? "none on this rank (another rank of this replica failed)"
                                   : last_failure_);
  try {
    return quorum_for(round, attempt, state_step);
  } catch (const InputError&) {
    throw;  // refused by the decision: the job's own mistake, named there
  } catch (const Error& e) {
    LOOM_FAIL("ReplicaGroup '{}': replica {}: the quorum of round {} (attempt {}) failed: {}{}",
              options_.local_key, replica_, round, attempt, e.what(), kStoreMustOutlive);
  }
}

StepQuorum ReplicaGroup::quorum_for(int64_t round, int attempt, int64_t state_step) {
  const std::string prefix = round_prefix(round, attempt);
  const std::string instance = fmt::format("{:016x}", options_.instance);
  {
    // A slot per entry: every rank of a replica writes one, and so does a second job given the
    // same id (a single key per replica would keep only the last writer's).
    const int64_t slot = store_->add(fmt::format("{}slots/{}", prefix, replica_), 1);
    const JoinEntry mine{.replica = replica_,
                         .state = state_step,
                         .state_round = state_round_,
                         .instance = instance,
                         .veteran = last_round_ >= 0,
                         .job = options_.job,
                         .description = options_.description};
    store_->set(fmt::format("{}join/{}/{}", prefix, replica_, slot), to_json(mine).dump());
  }
  // The processes of the round before (its last attempt's decision): a first attempt waits
  // longer for them (see member_wait), and they keep their ids against newcomers.
  std::map<int, std::string> previous;
  int previous_attempt = -1;  // the attempt of the round before that decided it (so far)
  const auto read_previous = [&] {
    if (round == 0 || !store_->check({final_key(round - 1)})) return;
    const nlohmann::json before = nlohmann::json::parse(store_->get_string(final_key(round - 1)));
    previous.clear();
    for (const nlohmann::json& member : before.at("members")) {
      previous[member.at("replica").get<int>()] = member.at("instance").get<std::string>();
    }
    previous_attempt = before.value("attempt", 0);
  };
  read_previous();
  // Whether the round before is still being retried (a member of it failed, and the others are
  // forming its next attempt): they are alive, only late for this round.
  const auto previous_retrying = [&] {
    return previous_attempt >= 0 &&
           store_->check({round_prefix(round - 1, previous_attempt + 1) + "decider"});
  };
  const std::string decided = prefix + "members";
  // The entries so far, and which replica ids they cover.
  const auto joined = [&](std::vector<bool>* ids) {
    std::vector<JoinEntry> entries;
    ids->assign(static_cast<size_t>(max_replicas_), false);
    for (int r = 0; r < max_replicas_; ++r) {
      const std::string slots = fmt::format("{}slots/{}", prefix, r);
      if (!store_->check({slots})) continue;
      bool any = false;
      for (int64_t k = 1, n = store_->add(slots, 0); k <= n; ++k) {
        const std::string key = fmt::format("{}join/{}/{}", prefix, r, k);
        if (!store_->check({key})) continue;  // a slot taken, its entry not written yet
        entries.push_back(join_entry_of(store_->get_string(key)));
        any = true;
      }
      if (any) (*ids)[static_cast<size_t>(r)] = true;
    }
    return entries;
  };
  // The decision is written once: the first published wins (compare_set on the absent key), and
  // every replica reads that one back, so a slow decider and one that took over never leave two,
  // whoever stalls or dies between deciding and writing.
  const auto publish = [&](const std::vector<JoinEntry>& entries) {
    const std::string mine = decide(entries, max_replicas_, previous, attempt).dump();
    store_->compare_set(decided, {}, comm::Bytes(mine.begin(), mine.end()));
    // For replicas joining later: the latest decided round, raised to `round` unless a later
    // one is there (a compare-and-swap loop: every publisher of a round runs it).
    const std::string text = std::to_string(round);
    const comm::Bytes ours(text.begin(), text.end());
    comm::Bytes seen = store_->compare_set(kLatestRound, {}, ours);
    while (std::stoll(std::string(seen.begin(), seen.end())) < round) {
      seen = store_->compare_set(kLatestRound, seen, ours);
    }
  };
  const comm::Duration longest =
      attempt == 0 ? std::max(options_.join_window, options_.member_wait) : options_.join_window;
  std::vector<bool> ids;
  if (store_->add(prefix + "decider", 1) == 1) {
    // The decider: everyone, or whoever came within the join window, and the replicas it met
    // last if they come within member_wait.
    const auto start = std::chrono::steady_clock::now();
    auto wait_from = start;
    std::vector<JoinEntry> entries = joined(&ids);
    const auto waiting = [&] {
      const auto now = std::chrono::steady_clock::now();
      const bool missing = previous_missing(previous, entries, /*same_process=*/true);
      const bool every_id = std::all_of(ids.begin(), ids.end(), [](bool in) { return in; });
      if (every_id && !missing) return false;
      if (now < start + options_.join_window) return true;
      if (!missing || attempt > 0) return false;
      if (now < wait_from + longest) return true;
      // Past member_wait: still waiting while the round before is being retried (its members
      // are alive: a retry's connect timeout can outlast member_wait), and member_wait again
      // for the members of a retry that decided meanwhile; up to the timeout.
      if (now >= start + options_.timeout) return false;
      const int seen = previous_attempt;
      read_previous();
      if (previous_attempt != seen) {
        wait_from = now;
        return true;
      }
      // Only for ids nobody else joined for (one a newcomer took is its dead predecessor's, or
      // settled as a duplicate).
      return previous_missing(previous, entries, /*same_process=*/false) && previous_retrying();
    };
    while (waiting()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      entries = joined(&ids);
    }
    publish(entries);
  } else {
    // A decider killed during its join window would leave the others waiting out the timeout
    // and failing: past the window and a grace, they publish who joined themselves (the dead
    // one among them: its group fails to form and the next attempt goes on without it).
    try {
      store_->wait({decided}, longest + options_.decider_grace);
    } catch (const Error&) {
      publish(joined(&ids));
    }
  }
  const std::string decision_text = store_->get_string(decided);
  // The round's decision as its last attempt made it, for the next round's decider: written by
  // every replica that read it (the publisher among them), so none reaches the next round first.
  store_->set(final_key(round), decision_text);
  const nlohmann::json decision = nlohmann::json::parse(decision_text);
  StepQuorum q{.round = round, .attempt = attempt};
  for (const nlohmann::json& refused : decision.at("refused")) {
    if (refused.at("instance").get<std::string>() != instance) continue;
    // Another process of this id took part: a dead predecessor's entry, gone by the next round,
    // or a running replica, met again round after round.
    if (refused.at("duplicate").get<bool>() && ++duplicate_rounds_ < kDuplicateRounds) {
      quorum_ = q;  // not a member: the next round
      return q;
    }
    throw InputError(refused.at("reason").get<std::string>());
  }
  std::vector<std::string> instances;  // the members' processes
  std::vector<int64_t> state_rounds;
  for (const nlohmann::json& member : decision.at("members")) {
    instances.push_back(member.at("instance").get<std::string>());
    const int replica = member.at("replica").get<int>();
    if (replica == replica_ && instances.back() == instance) {
      q.index = static_cast<int>(q.members.size());
    }
    q.members.push_back(replica);
    q.state_at.push_back(member.at("state").get<int64_t>());
    state_rounds.push_back(member.at("state_round").get<int64_t>());
  }
  // The source: the newest state, and of two made apart (replicas that ran the same step in
  // different rounds, each without the other) the one of the later round. Every member whose
  // state is not the source's — an older one, or one made apart — gets it.
  for (size_t i = 0; i < q.members.size(); ++i) {
    if (q.source < 0 || q.state_at[i] > q.state_at[q.source] ||
        (q.state_at[i] == q.state_at[q.source] && state_rounds[i] > state_rounds[q.source])) {
      q.source = static_cast<int>(i);
    }
  }
  if (q.source >= 0) {
    q.step = q.state_at[q.source];
    source_round_ = state_rounds[q.source];
    for (size_t i = 0; i < q.members.size(); ++i) {
      if (q.state_at[i] != q.step || state_rounds[i] != source_round_) q.needs_state_sync = true;
    }
  }
  quorum_ = q;
  group_failed_ = false;
  if (q.member()) {
    last_round_ = std::max(last_round_, round);
    duplicate_rounds_ = 0;
    try {
      group_for(q, instances);
    } catch (const Error& e) {
      // A member that died after joining never connects: this attempt fails (average and
      // sync_state say so), and the next one goes on without it.
      group_.reset();
      group_instances_.clear();
      group_failed_ = true;
      last_failure_ = e.what();
      LOOM_LOG(warn, "ReplicaGroup '{}': replica {}: round {} attempt {}: {}", options_.local_key,
               replica_, round, attempt, e.what());
    }
  }
  return q;
}

void ReplicaGroup::group_for(const StepQuorum& q, const std::vector<std::string>& instances) {
  // A new group when the members changed (a replica id now run by another process included),
  // one of them is behind (a fresh process has no group yet) or an attempt failed (the old group
  // is poisoned); every member decides alike.
  const bool reuse =
      group_ && group_instances_ == instances && !q.needs_state_sync && q.attempt == 0;
  if (reuse) return;
  group_.reset();
  group_instances_ = instances;
  if (q.members.size() == 1) return;  // alone: nothing to average with
  const std::string prefix =
      round_prefix(q.round, q.attempt) + fmt::format("group/{}/", options_.local_key);
  // Every member's process is rank job_rank of its own job (the replicas' rank k meet).
  group_ = comm::ProcessGroupGloo::create(
      std::make_shared<comm::PrefixStore>(prefix, store_), q.index,
      static_cast<int>(q.members.size()), std::vector<int>(q.members.size(), options_.job_rank),
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
    } catch (const Error& e) {
      last_failure_ = e.what();
      ok = false;
    }
  }
  if (agree) ok = agree(ok);
  if (ok) state_round_ = source_round_;  // the source's state now, made by its round
  return ok;
}

bool ReplicaGroup::average(const std::vector<Tensor>& grads, const Agreement& agree) {
  LOOM_CHECK(quorum_.member(), "ReplicaGroup: replica {} is not a member of step {}'s quorum",
             replica_, quorum_.step);
  if (!group_) return agree ? agree(!group_failed_) : !group_failed_;
  return average_over_members(*group_, grads, static_cast<int>(quorum_.members.size()), agree,
                              last_failure_);
}

void ReplicaGroup::commit() {
  participants_[quorum_.step] = quorum_.members;
  state_round_ = quorum_.round;
}

}  // namespace loom::parallel::ft
