// Per-step fault tolerance across data-parallel replicas (torchft's Manager, first part): the
// replicas of a job agree each step on who takes part (a quorum in a shared store), average their
// gradients over those only, and bring a replica that joins (or rejoins) up to date by sending it
// the current state from one that took part before — no restart, no checkpoint.
//
//   ReplicaGroup group(store, replica, max_replicas, {.local_key = "tp0", .job = settings});
//   while (state_step < steps) {
//     const int64_t round = group.next_round();
//     for (int attempt = 0;; ++attempt) {
//       const StepQuorum q = group.start_round(round, attempt, state_step);
//       if (!q.member()) break;                                     // decided without it: next
//       round if (q.needs_state_sync) group.sync_state(state_tensors);   // a joiner gets the state
//       grads = ...;                                                // step q.step's batch
//       if (group.average(grads)) { apply(grads); state_step = q.step + 1; group.commit(); break; }
//     }                                                             // false: a member failed:
//     again
//   }
//
// Rounds: the replicas meet once per step in a round, numbered by the store (a round is never
// reused: every round's keys are new). A replica joins the round after the latest decided one.
// The step a round's members run is the newest state among them (torchft's max_step): a replica
// behind it (one that joins, rejoins or missed a round) first gets the state from a member that
// holds it; one that runs alone runs from its own state. So replicas that (re)start together
// against a lighthouse that served an earlier job start from their own state (step 0, or their
// checkpoint's), never at that job's step, and a replica never runs a step whose state it does
// not hold.
//
// Quorum (start_round): every replica that reaches a round (attempt) writes its join entry — its
// state step, the job's settings and which process it is — and the first to arrive decides: it
// waits until every replica joined or Options::join_window passed (a first attempt: and the
// processes of the round before came, or Options::member_wait passed), then publishes the
// members (ascending) — and everyone reads the same list. A replica that is gone costs the
// others member_wait once and one join window per step after; a decider that dies before
// publishing costs them that wait and Options::decider_grace, after which they publish who
// joined themselves. The list is written
// once (Store::compare_set on the absent key): whoever publishes first wins and everyone reads
// that list back, so a decider that stalls rather than dies, publishing late, never leaves two
// lists. A member that fails during the step's average makes the others' average fail: they start
// the round again (attempt + 1) from the gradients they kept, in a quorum without it.
//
// Who may take part: the decision admits one process per replica id (`Options::instance`, drawn
// anew by every launch): the id's process in the round before is kept (else one that took part
// earlier), and the other is left out of the round — a replica restarted while its dead
// predecessor's entry is still in the round gets in at the next — and refused when it meets a
// running one in kDuplicateRounds rounds in a row (a second job given the same --replica). A
// replica whose settings (`Options::job`) differ from the running replicas' (those that took part
// before, else the lowest id's) is refused at once. The refused one's start_round throws
// loom::InputError naming both sides (a job exits 2 on it and is not restarted); the others go on
// without it.
//
// Groups: the members' replica-dim process group (one per `local_key`: the ranks with the same
// coordinate on the other dims, e.g. tp) is built anew when the members change, a member joins or
// an attempt failed, and reused otherwise. Every rank of a replica joins the same quorum (its
// join entry is the replica's), and settles each exchange with the others through `Agreement`, so
// the replica's ranks never disagree on a round's members or on whether it must be retried.
//
// Learning rate and data: each replica's gradient is its own batch's; the step's gradient is the
// mean over the members, so a missing replica's batch is simply not in that step (torchft's
// choice); the learning rate does not change. participants() records the members per step.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "comm/store.h"
#include "parallel/ft/replicas.h"
#include "tensor/tensor.h"

namespace loom::parallel::ft {

// Rounds in a row a replica id's newcomer meets a running process of that id before it is
// refused as a second job.
inline constexpr int kDuplicateRounds = 3;

struct ReplicaGroupOptions {
  // Which replica-dim group this is: the rank's coordinate within its replica (ranks with the same
  // key across replicas average together). The quorum itself is one per replica and step.
  std::string local_key = "0";
  comm::Duration join_window =
      std::chrono::milliseconds(500);                 // how long a quorum waits for replicas
  comm::Duration timeout = std::chrono::seconds(30);  // every wait and operation
  // How long past the join window the others wait for the decider before one of them publishes
  // the members itself (a decider that died before publishing).
  comm::Duration decider_grace = std::chrono::seconds(2);
  // How long a round's first attempt waits for the processes that took part in the round before
  // (alive, presumably, and slower this step: a step's time varies), beyond join_window: without
  // it, replicas whose steps outlast the window would each decide rounds alone and train apart,
  // and a newcomer deciding a round alone could take a running replica's id. A member that died
  // costs the others this once. Past it, a decider still waits (up to `timeout`) while the round
  // before is being retried — its members are alive, a retry's connect timeout outlasting this —
  // for the ids nobody else joined for, and member_wait again once that retry decided.
  comm::Duration member_wait = std::chrono::seconds(10);
  // How long a new members' group waits for them all to connect: a member that died after
  // joining the quorum fails the attempt after it (the next attempt goes on without it).
  comm::Duration connect_timeout = std::chrono::seconds(10);
  // Which process this replica is: the same on every rank of one launch, another for each launch
  // (0: drawn at random). Two jobs running one replica id are told apart by it.
  uint64_t instance = 0;
  // Named to a job refused in its favour ("pid 4242 on node-3").
  std::string description;
  // The job's settings, as text: replicas that differ in them are refused by name.
  std::string job;
  // This rank's rank in its own job (its flight recorder files the replica groups' operations
  // under it).
  int job_rank = 0;
};

// A random instance id, never 0 (ReplicaGroupOptions::instance's default draws one).
uint64_t random_instance();

class ReplicaGroup final : public Replicas {
 public:
  // `store`: shared by every replica (the quorum service); `replica` in [0, max_replicas).
  ReplicaGroup(std::shared_ptr<comm::Store> store, int replica, int max_replicas,
               ReplicaGroupOptions options = {});

  // The round to join next: the one after the latest decided (or after this replica's last).
  int64_t next_round() override;

  // A round's quorum (collective over the replicas that reach it): see above; a decision always
  // comes while the store lives (a dead decider is replaced). `state_step`: the steps this
  // replica's state holds. Throws loom::InputError when the decision refuses this replica (another
  // job runs its replica id, or its settings differ), and loom::Error naming the round when the
  // shared store fails (every replica then ends with that error: the quorum service is the one
  // part that must not fail).
  StepQuorum start_round(int64_t round, int attempt, int64_t state_step) override;

  // Makes every member's `state` the source's (in place; same shapes on every member): a
  // broadcast over the members' group. Returns false when a member failed meanwhile (then start
  // the step again: the broadcast is repeated).
  bool sync_state(const std::vector<Tensor>& state, const Agreement& agree = nullptr) override;

  // Replaces `grads` (in place) by their mean over the step's members; false (and `grads`
  // untouched) when a member failed, on any rank of this replica: start the step again.
  bool average(const std::vector<Tensor>& grads, const Agreement& agree = nullptr) override;

  // The members of every step this replica completed (what a reference replays).
  const std::map<int64_t, std::vector<int>>& participants() const { return participants_; }
  // Notes that the step completed with the current quorum.
  void commit() override;
  // The last quorum start_step returned.
  const StepQuorum& quorum() const override { return quorum_; }
  // This replica's id and how many there may be: its share of every step's global batch is
  // share `replica()` of `max_replicas()` (train::local_batch's ReplicaShare).
  int replica() const override { return replica_; }
  int max_replicas() const override { return max_replicas_; }

 private:
  // Builds (or keeps) the members' group for `quorum`.
  void group_for(const StepQuorum& quorum, const std::vector<std::string>& instances);
  StepQuorum quorum_for(int64_t round, int attempt, int64_t state_step);

  std::shared_ptr<comm::Store> store_;
  int replica_;
  int max_replicas_;
  ReplicaGroupOptions options_;
  StepQuorum quorum_;
  std::vector<std::string> group_instances_;  // whose group group_ is (the members' processes)
  std::shared_ptr<comm::ProcessGroup> group_;
  bool group_failed_ = false;  // this attempt's group could not be built
  std::map<int64_t, std::vector<int>> participants_;
  int64_t last_round_ = -1;   // the last round this replica was a member of
  int duplicate_rounds_ = 0;  // rounds in a row left out for another process of its id
  // Which round's step made this replica's state (-1: none since it started; a sync makes it the
  // source's): two replicas at one step hold the same state only when one round made both.
  int64_t state_round_ = -1;
  int64_t source_round_ = -1;  // the last quorum's source's state_round_
  std::string last_failure_;   // why the last attempt failed, on this rank
};

}  // namespace loom::parallel::ft
