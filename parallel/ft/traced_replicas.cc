#include "parallel/ft/traced_replicas.h"

#include <numeric>
#include <utility>

#include "base/error.h"

namespace loom::parallel::ft {

TracedReplicas::TracedReplicas(std::shared_ptr<comm::ProcessGroup> group)
    : group_(std::move(group)) {
  LOOM_CHECK(group_ != nullptr, "TracedReplicas: the replicas' group is null");
}

StepQuorum TracedReplicas::start_round(int64_t round, int attempt, int64_t state_step) {
  quorum_ = StepQuorum{.round = round, .attempt = attempt, .step = state_step};
  quorum_.members.resize(static_cast<size_t>(group_->size()));
  std::iota(quorum_.members.begin(), quorum_.members.end(), 0);
  quorum_.state_at.assign(quorum_.members.size(), state_step);
  quorum_.index = group_->rank();
  return quorum_;
}

bool TracedReplicas::sync_state(const std::vector<Tensor>&, const Agreement& agree) {
  return agree ? agree(true) : true;  // never behind: start_round asks for no sync
}

bool TracedReplicas::average(const std::vector<Tensor>& grads, const Agreement& agree) {
  return average_over_members(*group_, grads, group_->size(), agree, failure_);
}

}  // namespace loom::parallel::ft
