// ProcessGroup: collectives among a fixed set of ranks (torch.distributed's ProcessGroup).
//
// Collective contract: every rank of the group calls the same collectives in the same order
// with matching dtypes and sizes. Calls return at once with a Work; the group runs its
// operations one at a time in issue order on its own thread (Gloo) or stream (NCCL), so they
// overlap with the caller's compute. Tensors passed in must stay alive and untouched until the
// Work completes.
//
// The public methods are non-virtual: they validate arguments (errors name the group, the op and
// the shapes), count calls and bytes, assign the sequence number, and in LOOM_DEBUG=collectives
// mode compare each collective's fingerprint across ranks before running it. Backends implement
// the protected run_* methods.
//
// Every operation has a timeout (default 5 minutes, set per group). A peer that is gone or never
// arrives makes the others fail with a loom::Error naming the group, the op, its sequence number
// and, where knowable, the ranks that did not arrive.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/flight_recorder.h"
#include "comm/store.h"
#include "comm/types.h"
#include "comm/work.h"
#include "tensor/tensor.h"

namespace loom::comm {

struct ProcessGroupOptions {
  // Shown in every error and log line ("default", "tp", "mesh/dp", ...).
  std::string name = "default";
  Duration timeout = std::chrono::minutes(5);
};

// Calls and bytes (this rank's input bytes) per collective kind.
struct CollectiveCounters {
  std::array<int64_t, kNumCollectiveKinds> calls{};
  std::array<int64_t, kNumCollectiveKinds> bytes{};
  int64_t calls_of(CollectiveKind kind) const { return calls[static_cast<int>(kind)]; }
  int64_t bytes_of(CollectiveKind kind) const { return bytes[static_cast<int>(kind)]; }
  int64_t total_calls() const;
};

// A listener told of every operation a group issues (after validation, before it runs); what a
// DTensor CommDebugMode scope hooks into. Called on the issuing thread.
using CollectiveObserver =
    std::function<void(CollectiveKind kind, int64_t bytes, const std::string& group)>;

class ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  // `store` is this group's own key space (a PrefixStore); `global_ranks[i]` is the global rank
  // of group rank i.
  ProcessGroup(std::shared_ptr<Store> store, int rank, int size, std::vector<int> global_ranks,
               ProcessGroupOptions options);
  virtual ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return options_.name; }
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  Duration timeout() const { return options_.timeout; }
  void set_timeout(Duration timeout) { options_.timeout = timeout; }
  virtual std::string backend_name() const = 0;
  // Where this group's tensors live: the CPU for Gloo, this rank's GPU for NCCL. Every tensor
  // given to an operation must be on it (checked, naming both devices). Layers above allocate
  // their communication buffers here (DDP buckets, pipeline receive buffers, DTensor factories).
  virtual Device device() const = 0;
  const std::shared_ptr<Store>& store() const { return store_; }

  // ---- collectives (contiguous tensors on this group's device) ----
  // In place. kAvg divides the sum by size() (integer dtypes: truncating division).
  std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  // In place: every rank gets root's tensor.
  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root);
  // outputs[i] receives rank i's input. Sizes may differ by rank (uneven); outputs[i] must have
  // rank i's input's shape.
  std::shared_ptr<Work> all_gather(const std::vector<Tensor>& outputs, const Tensor& input);
  // Equal sizes: `output` is size() inputs concatenated along dim 0.
  std::shared_ptr<Work> all_gather_into_tensor(const Tensor& output, const Tensor& input);
  // inputs[i] is this rank's contribution to rank i's `output` (uneven sizes allowed:
  // inputs[i] must have rank i's output's shape); output = reduce over ranks of inputs[rank].
  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                                       ReduceOp op = ReduceOp::kSum);
  // Equal sizes: `input` is size() chunks along dim 0; rank i gets the reduced chunk i.
  std::shared_ptr<Work> reduce_scatter_tensor(const Tensor& output, const Tensor& input,
                                              ReduceOp op = ReduceOp::kSum);
  // outputs[i] receives rank i's inputs[rank()]; sizes may differ per pair (uneven).
  std::shared_ptr<Work> all_to_all(const std::vector<Tensor>& outputs,
                                   const std::vector<Tensor>& inputs);
  // Root's outputs[i] receives rank i's input; other ranks pass an empty list.
  std::shared_ptr<Work> gather(const std::vector<Tensor>& outputs, const Tensor& input, int root);
  // Rank i's output receives root's inputs[i]; other ranks pass an empty list.
  std::shared_ptr<Work> scatter(const Tensor& output, const std::vector<Tensor>& inputs, int root);
  // Point to point; a send matches the recv on `dst` with the same tag, in order.
  std::shared_ptr<Work> send(const Tensor& tensor, int dst, int tag = 0);
  std::shared_ptr<Work> recv(const Tensor& tensor, int src, int tag = 0);
  std::shared_ptr<Work> barrier();

  // A group of the given ranks of this group (group ranks, ascending order defines the new
  // ranks). Collective: every rank of this group calls it with the same list, in the same order
  // relative to other new_group calls. Ranks not in the list get nullptr.
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                          ProcessGroupOptions options);

  const CollectiveCounters& counters() const { return counters_; }
  void reset_counters() { counters_ = {}; }
  // Operations issued so far (the next one gets this number).
  uint64_t sequence_number() const { return sequence_; }
  // Adds an observer; returns an id for remove_observer. Observers are process-wide.
  static int add_observer(CollectiveObserver observer);
  static void remove_observer(int id);

 protected:
  // Everything the backend needs about one operation, for running it and for errors.
  struct OpInfo {
    CollectiveKind kind;
    uint64_t sequence;
    std::string description;  // "all_reduce #12 (sum, f32, 1024 elements) on group 'tp'"
    uint64_t record = 0;      // its flight recorder entry
  };

  virtual std::shared_ptr<Work> run_all_reduce(const OpInfo& info, const Tensor& tensor,
                                               ReduceOp op) = 0;
  virtual std::shared_ptr<Work> run_broadcast(const OpInfo& info, const Tensor& tensor,
                                              int root) = 0;
  virtual std::shared_ptr<Work> run_all_gather(const OpInfo& info,
                                               const std::vector<Tensor>& outputs,
                                               const Tensor& input) = 0;
  virtual std::shared_ptr<Work> run_reduce_scatter(const OpInfo& info, const Tensor& output,
                                                   const std::vector<Tensor>& inputs,
                                                   ReduceOp op) = 0;
  virtual std::shared_ptr<Work> run_all_to_all(const OpInfo& info,
                                               const std::vector<Tensor>& outputs,
                                               const std::vector<Tensor>& inputs) = 0;
  virtual std::shared_ptr<Work> run_gather(const OpInfo& info, const std::vector<Tensor>& outputs,
                                           const Tensor& input, int root) = 0;
  virtual std::shared_ptr<Work> run_scatter(const OpInfo& info, const Tensor& output,
                                            const std::vector<Tensor>& inputs, int root) = 0;
  virtual std::shared_ptr<Work> run_send(const OpInfo& info, const Tensor& tensor, int dst,
                                         int tag) = 0;
  virtual std::shared_ptr<Work> run_recv(const OpInfo& info, const Tensor& tensor, int src,
                                         int tag) = 0;
  virtual std::shared_ptr<Work> run_barrier(const OpInfo& info) = 0;
  // Builds the backend's group for `ranks` (already validated) over `store`.
  virtual std::shared_ptr<ProcessGroup> make_group(std::shared_ptr<Store> store, int rank,
                                                   std::vector<int> group_ranks_global,
                                                   ProcessGroupOptions options) = 0;

 private:
  OpInfo begin(CollectiveKind kind, int64_t bytes, std::string detail);
  // The backend's Work, its completion noted in the flight recorder.
  std::shared_ptr<Work> recorded(const OpInfo& info, std::shared_ptr<Work> work);
  void check_fingerprint(const OpInfo& info, CollectiveKind kind, const std::string& detail);

  std::shared_ptr<Store> store_;
  int rank_;
  int size_;
  std::vector<int> global_ranks_;
  ProcessGroupOptions options_;
  CollectiveCounters counters_;
  uint64_t sequence_ = 0;
  uint64_t new_group_calls_ = 0;
  bool debug_collectives_;
  uint64_t debug_collectives_checked_ = 0;  // collectives (not send/recv) fingerprinted so far
  int64_t collectives_issued_ = 0;          // collectives (not send/recv) issued so far
  // The ring of this group's last operations (comm/flight_recorder.h); null when off.
  std::shared_ptr<FlightRecorder> recorder_;

 public:
  // This group's flight recorder (null when LOOM_FLIGHT_RECORDER_ENTRIES=0).
  const std::shared_ptr<FlightRecorder>& flight_recorder() const { return recorder_; }
};

}  // namespace loom::comm
