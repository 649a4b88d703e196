// What a training step needs of fault-tolerant replicas (parallel/ft/replica_group.h has the
// protocol): the round's quorum, the state sent to members behind, the gradients averaged over
// the members. Two implementations: ReplicaGroup (the replicas of a job over a shared store) and
// TracedReplicas (parallel/ft/traced_replicas.h: every replica always a member, for `loom plan`,
// which traces the Trainer's own replica path on the meta device).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "tensor/tensor.h"

namespace loom::parallel::ft {

struct StepQuorum {
  int64_t round = 0;
  int attempt = 0;
  int64_t step = 0;               // the step the members run: the newest state among them
  std::vector<int> members;       // replica ids, ascending
  std::vector<int64_t> state_at;  // each member's state step, in members' order
  int index = -1;                 // this replica's place in members (-1: not a member)
  bool needs_state_sync = false;  // some member's state is behind: sync_state() before the step
  int source = -1;                // the member whose state is sent (the first up-to-date one)
  bool member() const { return index >= 0; }
};

class Replicas {
 public:
  virtual ~Replicas() = default;

  // A replica of several ranks (say tp) has one Replicas per rank, all in the same quorum
  // (decided once per replica and step); `agree` makes its ranks settle each exchange alike:
  // given this rank's success, it returns whether every rank of the replica succeeded (an
  // all_reduce of the flag over the replica's own group). None: a replica of one rank.
  using Agreement = std::function<bool(bool ok)>;

  // The round to join next, and its quorum (ReplicaGroup: collective over the replicas).
  virtual int64_t next_round() = 0;
  virtual StepQuorum start_round(int64_t round, int attempt, int64_t state_step) = 0;
  // Makes every member's `state` the source's (in place); false when a member failed meanwhile.
  virtual bool sync_state(const std::vector<Tensor>& state, const Agreement& agree = nullptr) = 0;
  // Replaces `grads` (in place) by their mean over the step's members; false (and `grads`
  // untouched) when a member failed, on any rank of this replica: start the step again.
  virtual bool average(const std::vector<Tensor>& grads, const Agreement& agree = nullptr) = 0;
  // Notes that the step completed with the current quorum.
  virtual void commit() = 0;
  // The last quorum start_round returned.
  virtual const StepQuorum& quorum() const = 0;
  // This replica's id and how many there may be: its share of every step's global batch is
  // share `replica()` of `max_replicas()` (train::local_batch's ReplicaShare).
  virtual int replica() const = 0;
  virtual int max_replicas() const = 0;
};

// The members' mean of `grads` over `group` (one all_reduce of one flat buffer, then / members),
// written back only when every rank of the replica succeeded (`agree`); on failure `failure`
// gets the reason and `grads` are untouched. What every Replicas averages with.
bool average_over_members(comm::ProcessGroup& group, const std::vector<Tensor>& grads, int members,
                          const Replicas::Agreement& agree, std::string& failure);

}  // namespace loom::parallel::ft
