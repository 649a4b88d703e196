// One FSDP unit at run time: its sharded parameters, the flat all-gather that makes them whole
// for a forward (or a backward), and the flat reduce-scatter of their gradients. fully_shard.h
// states the collective contract; this is how the unit keeps it.
//
// Overlap. Units of one model share a UnitGroup, which records the order their forwards began
// in (the root's forward starts a new pass). Then:
//   - forward prefetch: when unit i's forward starts, it issues unit i+1's all-gather (async)
//     before computing, so the gather runs while unit i computes;
//   - backward prefetch: when unit i's backward is about to start (a hook on its output's
//     gradient), it issues the all-gather unit i-1 will need, in reverse forward order;
//   - reduce-scatters are asynchronous: issued as soon as a unit has every gradient, and
//     finished (waited, HSDP's all-reduce, added into the sharded .grad) when the next unit's is
//     issued or backward ends — one in flight, as FSDP2 bounds it, since each holds a whole
//     unit's gradients.
// A gather issued ahead holds the current shards' values, so any of the unit's next forward or
// backward calls of this step may consume it; one still unconsumed when a new forward pass
// begins is waited and dropped (never used after the optimizer changed the shards).
//
// Collectives complete with Work::block_current_stream(): on NCCL the compute stream waits on
// the communication stream's event and the host goes on (the DDP reducer's ordering); on Gloo it
// blocks, and the group's worker thread ran the collective meanwhile.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/work.h"
#include "dtensor/spec.h"
#include "mesh/device_mesh.h"
#include "nn/module.h"
#include "parallel/fsdp/flat_layout.h"
#include "parallel/fsdp/fully_shard.h"

namespace loom::fsdp {

class Unit;

// One parameter of a unit: the module slots that hold it and its shard.
struct HeldParam {
  std::string fqn;  // the name under the unit ("h.0.attn.c_attn.weight")
  std::vector<std::pair<nn::Module*, std::string>> slots;  // (owner, name in owner)
  Tensor sharded;  // DTensor Shard(0) on the unit's mesh: the leaf the optimizer sees
  // With tensor parallelism: the parameter's own DTensor layout (on the tp mesh). FSDP then
  // shards its local (TP) shard, and the whole parameter a unit computes with is that local
  // shard gathered, wrapped in this spec again.
  std::optional<DTensorSpec> tp_spec;
  Shape unit_shape;  // what the flat buffers hold whole: the shape, or the TP-local shape
};

// The units of one model (a root and the units inside it), for prefetching in forward order.
struct UnitGroup {
  std::vector<Unit*> forward_order;  // the last complete pass's order
  std::vector<Unit*> recording;      // this pass's so far
  std::vector<std::weak_ptr<Unit>> members;
  const Unit* owner = nullptr;  // the root: its forward starts a pass
  // The unit whose reduce-scatter is in flight: one at a time, as FSDP2 bounds it, since each
  // holds a whole unit's gradients in its send buffer.
  Unit* reducing = nullptr;
};

class Unit : public std::enable_shared_from_this<Unit> {
 public:
  Unit(std::shared_ptr<const std::string> name, std::shared_ptr<const DeviceMesh> mesh,
       std::vector<HeldParam> params, FSDPOptions options);

  // The forward-pre hook's work: gathers the parameters (or takes the prefetched gather), puts
  // the whole ones into the module's slots (fresh leaves in grad mode), prefetches the next
  // unit's.
  void before_forward();
  // The forward hook's work: shards back into the slots; with reshard_after_forward the whole
  // parameters' memory is released until backward needs it.
  void after_forward(const Tensor& output);

  void set_requires_gradient_sync(bool sync) { sync_gradients_ = sync; }
  void join(std::shared_ptr<UnitGroup> group) { group_ = std::move(group); }
  const std::shared_ptr<UnitGroup>& group() const { return group_; }
  const std::string& name() const { return *name_; }

 private:
  // One forward call's whole parameters and gradients, collected as backward produces them.
  struct Call {
    std::vector<Tensor> memory;  // aliases of the whole parameters (no autograd state)
    std::vector<Tensor> grads;   // per parameter; undefined until it arrives
    size_t pending = 0;          // gradients still to come
    bool queued = false;         // the end-of-backward callback is queued
    bool reduced = false;
    bool released = false;  // the whole parameters' memory is released until backward
  };
  // An all-gather in flight: the flat buffer it fills.
  struct Gather {
    std::shared_ptr<comm::Work> work;
    Tensor received;
    Tensor send;  // kept until the collective completes
  };
  // A reduce-scatter in flight: the reduced shard it fills.
  struct Reduction {
    std::shared_ptr<comm::Work> work;
    Tensor received;
    Tensor send;  // kept until the collective completes
  };

  Gather start_gather() const;
  // Unpacks a gather into whole parameters: new tensors, or `into`'s (same shapes).
  std::vector<Tensor> finish_gather(Gather gather, const std::vector<Tensor>* into = nullptr) const;
  // The whole parameters: the prefetched gather when there is one, else a gather now.
  std::vector<Tensor> gather(const std::vector<Tensor>* into = nullptr);
  // Issues this unit's gather ahead (no-op when one is in flight or nothing to gather).
  void prefetch();
  // Waits for and drops a gather issued ahead that nobody consumed.
  void drop_prefetch();
  // The unit `step` places after this one in the last pass's forward order (+1: forward's next,
  // -1: backward's next), or null.
  Unit* neighbour(int step) const;

  void before_backward(Call& call);
  void refill(Call& call);
  DTensorSpec with_dtype(DTensorSpec spec) const;
  Tensor plain_gradient(size_t i, const Tensor& grad) const;
  void on_gradient(const std::shared_ptr<Call>& call, size_t i, const Tensor& leaf);
  void reduce_gradients(Call& call);
  void finish_reductions();

  std::shared_ptr<const std::string> name_;
  std::shared_ptr<const DeviceMesh> mesh_;
  std::vector<HeldParam> params_;
  FSDPOptions options_;
  std::shared_ptr<UnitGroup> group_;
  std::shared_ptr<Call> current_call_;  // between before_forward and after_forward
  std::optional<Gather> prefetched_;
  std::vector<Reduction> reductions_;  // issued this backward, finished when it ends
  size_t released_calls_ = 0;          // calls whose memory waits for a backward refill
  bool sync_gradients_ = true;
  std::vector<Tensor> accumulated_;  // whole gradients of backwards run without sync
  FlatLayout layout_;
  int64_t shard_dim_ = 0;          // the mesh dim that shards
  int rank_ = 0;                   // this rank's coordinate on it
  DType dtype_ = kFloat32;         // the whole parameters' and the all-gather's (param_dtype)
  DType reduce_dtype_ = kFloat32;  // the reduce-scatter's
  Device device_ = Device::cpu();
};

}  // namespace loom::fsdp
