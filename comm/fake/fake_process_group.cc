#include "comm/fake/fake_process_group.h"

#include <fmt/format.h>

#include "base/error.h"
#include "comm/fake/fake_world.h"
#include "comm/in_memory_store.h"

namespace loom::comm {

namespace {

std::shared_ptr<Work> completed() {
  auto work = std::make_shared<Work>();
  work->mark_completed();
  return work;
}

}  // namespace

std::vector<std::shared_ptr<ProcessGroup>> FakeProcessGroup::create_world(
    int world_size, const std::vector<int>& traced, ProcessGroupOptions options) {
  LOOM_CHECK(world_size >= 1, "FakeProcessGroup: the world size must be at least 1, got {}",
             world_size);
  std::set<int> ranks;
  for (int r : traced) {
    LOOM_CHECK(r >= 0 && r < world_size,
               "FakeProcessGroup: traced rank {} is not in a world of {} ranks", r, world_size);
    LOOM_CHECK(ranks.insert(r).second, "FakeProcessGroup: rank {} is traced twice", r);
  }
  auto world = std::make_shared<FakeWorld>(world_size, ranks);
  std::vector<int> global(world_size);
  for (int r = 0; r < world_size; ++r) global[r] = r;
  std::vector<std::shared_ptr<ProcessGroup>> groups;
  for (int r : traced) {
    // Each rank its own store: nothing rendezvouses through it (new_group needs one).
    groups.push_back(std::make_shared<FakeProcessGroup>(world, std::make_shared<InMemoryStore>(), r,
                                                        world_size, global, options));
  }
  return groups;
}

FakeProcessGroup::FakeProcessGroup(std::shared_ptr<FakeWorld> world, std::shared_ptr<Store> store,
                                   int rank, int size, std::vector<int> global_ranks,
                                   ProcessGroupOptions options)
    : ProcessGroup(std::move(store), rank, size, std::move(global_ranks), std::move(options)),
      world_(std::move(world)) {}

void FakeProcessGroup::abort(const std::string& reason) { world_->abort(reason); }

std::vector<std::string> FakeProcessGroup::unmatched_messages() const {
  return world_->unmatched();
}

std::shared_ptr<Work> FakeProcessGroup::run_all_reduce(const OpInfo&, const Tensor&, ReduceOp) {
  return completed();
}

std::shared_ptr<Work> FakeProcessGroup::run_broadcast(const OpInfo&, const Tensor&, int) {
  return completed();
}

std::shared_ptr<Work> FakeProcessGroup::run_all_gather(const OpInfo&,
                                                       const std::vector<Tensor>& outputs,
                                                       const Tensor& input) {
  // Peers like this rank: its input in every output of its shape.
  for (const Tensor& out : outputs) copy_values(out, input);
  return completed();
}

std::shared_ptr<Work> FakeProcessGroup::run_reduce_scatter(const OpInfo&, const Tensor&,
                                                           const std::vector<Tensor>&, ReduceOp) {
  return completed();
}

std::shared_ptr<Work> FakeProcessGroup::run_all_to_all(const OpInfo&, const std::vector<Tensor>&,
                                                       const std::vector<Tensor>&) {
  return completed();
}

std::shared_ptr<Work> FakeProcessGroup::run_gather(const OpInfo&, const std::vector<Tensor>&,
                                                   const Tensor&, int) {
  return completed();
}

std::shared_ptr<Work> FakeProcessGroup::run_scatter(const OpInfo&, const Tensor&,
                                                    const std::vector<Tensor>&, int) {
  return completed();
}

std::shared_ptr<Work> FakeProcessGroup::run_send(const OpInfo&, const Tensor& tensor, int dst,
                                                 int tag) {
  const int to = global_ranks()[dst];
  if (world_->traced(to)) world_->send(name(), global_ranks()[rank()], to, tag, tensor);
  return completed();
}

std::shared_ptr<Work> FakeProcessGroup::run_recv(const OpInfo& info, const Tensor& tensor, int src,
                                                 int tag) {
  const int from = global_ranks()[src];
  if (!world_->traced(from)) return completed();
  auto work = std::make_shared<FakeRecvWork>(
      timeout(), fmt::format("{} (from rank {}, tag {})", info.description, from, tag));
  world_->recv(name(), from, global_ranks()[rank()], tag, tensor, work);
  return work;
}

std::shared_ptr<Work> FakeProcessGroup::run_barrier(const OpInfo&) { return completed(); }

std::shared_ptr<ProcessGroup> FakeProcessGroup::make_group(std::shared_ptr<Store> store, int rank,
                                                           std::vector<int> group_ranks_global,
                                                           ProcessGroupOptions options) {
  const int size = static_cast<int>(group_ranks_global.size());
  return std::make_shared<FakeProcessGroup>(world_, std::move(store), rank, size,
                                            std::move(group_ranks_global), std::move(options));
}

}  // namespace loom::comm
