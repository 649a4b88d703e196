// Replicas as `loom plan` traces them: every replica a member of every round, no state ever
// behind, the gradients averaged over a group of max_replicas ranks of which this process is one
// (a FakeProcessGroup on the meta device: its operations are counted, and move nothing). So the
// Trainer's own replica path runs in the trace — its agreements over the job's world and the
// gradients' all_reduce over the replicas — and the plan lists what a step of a replica job
// issues when all replicas take part.
#pragma once

#include <memory>
#include <string>

#include "comm/process_group.h"
#include "parallel/ft/replicas.h"

namespace loom::parallel::ft {

// The name of the replicas' group in a plan's collectives (a real job's groups are named
// "ft/<local key>/step<N>" after the round's first step).
inline constexpr char kTracedReplicasGroup[] = "ft/replicas";

class TracedReplicas final : public Replicas {
 public:
  // `group`: this rank's group among the replicas (size max_replicas, rank replica).
  explicit TracedReplicas(std::shared_ptr<comm::ProcessGroup> group);

  int64_t next_round() override { return next_round_; }
  StepQuorum start_round(int64_t round, int attempt, int64_t state_step) override;
  bool sync_state(const std::vector<Tensor>& state, const Agreement& agree = nullptr) override;
  bool average(const std::vector<Tensor>& grads, const Agreement& agree = nullptr) override;
  void commit() override { ++next_round_; }
  const StepQuorum& quorum() const override { return quorum_; }
  int replica() const override { return group_->rank(); }
  int max_replicas() const override { return group_->size(); }

 private:
  std::shared_ptr<comm::ProcessGroup> group_;
  StepQuorum quorum_;
  int64_t next_round_ = 0;
  std::string failure_;
};

}  // namespace loom::parallel::ft
