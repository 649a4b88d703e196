#include "nn/mixed_precision.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/functions.h"
#include "autograd/hooks.h"
#include "autograd/node.h"
#include "base/error.h"
#include "tensor/grad_mode.h"
#include "tensor/ops_copy.h"
#include "tensor/ops_foreach.h"

namespace loom::nn {

namespace {

// The parameters of a tree by owning module and local name, with their f32 masters while a
// forward runs (the slots then hold the casts).
struct Swap {
  struct Entry {
    Module* owner;
    std::string name;
    Tensor master;
    // The cast of `cast_of` the step's forwards share while a graph holds it (see
    // cast_for_forward), and its storage's reference count when only this entry held it.
    Tensor cast;
    Tensor cast_of;
    int64_t sole_count = 0;

    // A graph holds the cast either through a view (a transpose, a DTensor's local shard: its
    // storage gains a reference) or as the tensor itself (linear's node saves its weight: the
    // cast's handles, not its storage's references, grow). Either keeps the cast alive.
    bool cast_held_elsewhere() const {
      return cast.defined() && (cast.handles() > 1 || cast.storage().use_count() > sole_count);
    }
  };
  std::vector<Entry> entries;
  bool swapped = false;

  void restore() {
    if (!swapped) return;
    for (Entry& e : entries) e.owner->set_parameter(e.name, std::exchange(e.master, Tensor()));
    swapped = false;
  }
};

Tensor cast_floating(const Tensor& t, DType dtype) {
  return t.defined() && is_floating(t.dtype()) && t.dtype() != dtype ? to(t, dtype) : t;
}

// Which cast a forward takes. While an earlier forward's graph still holds a master's last cast
// (the graph saves it, or views of it: transposes, local shards), that cast is reused, so the
// microbatches a pipeline keeps in flight share one low-precision copy of the weights instead
// of holding one each until their backward. Its graph node saves nothing and runs in every
// microbatch's backward (reusable), handing each microbatch's gradient to the master as separate
// casts would. Once its gradient is complete and no graph holds it, the entry lets it go (at
// the latest when the backward ends): no copy stays between steps, and the next step casts the
// updated master.
bool records_cast(const Swap::Entry& e) {
  return GradMode::is_enabled() && e.master.requires_grad();
}

bool reuses_cast(const Swap::Entry& e) {
  return e.cast_held_elsewhere() && e.cast_of.is_same(e.master) &&
         e.cast.requires_grad() == records_cast(e);
}

// The new casts of the plain masters in `indices`, made together (ops::foreach_to: on a GPU one
// launch for up to 64 weights instead of one each) and recorded as to() records them.
std::vector<Tensor> cast_together(const Swap& swap, const std::vector<size_t>& indices,
                                  DType dtype) {
  std::vector<Tensor> masters;
  masters.reserve(indices.size());
  for (size_t i : indices) masters.push_back(swap.entries[i].master);
  std::vector<Tensor> casts;
  {
    NoGradGuard no_grad;
    casts = ops::foreach_to(masters, dtype);
  }
  // A leaf master's cast hands its gradient on in the cast's dtype: the master's AccumulateGrad
  // converts it to f32 as it adds it into .grad (autograd/node.cc; on a GPU one kernel where a
  // conversion, then an add, were two per weight and step). A master that is not a leaf gets
  // the conversion as to()'s backward makes it.
  for (size_t j = 0; j < casts.size(); ++j) {
    if (!records_cast(swap.entries[indices[j]])) continue;
    casts[j] = autograd::record(
        "ToDtypeBackward", {masters[j]}, casts[j],
        [leaf = masters[j].is_leaf(), from = masters[j].dtype()](const std::vector<Tensor>& g) {
          return leaf ? g : std::vector<Tensor>{ops::to(g[0], from)};
        });
  }
  return casts;
}

// Entry `index`'s new cast, kept by the entry (and, when recorded, let go once backward has
// passed it and no graph holds it).
Tensor keep_cast(const std::shared_ptr<Swap>& swap, size_t index, Tensor cast) {
  Swap::Entry& e = swap->entries[index];
  if (records_cast(e) && cast.grad_fn()) {
    cast.grad_fn()->set_reusable();
    // Its gradient is converted and accumulated into the master as soon as it is complete:
    // created before the whole forward, the cast would otherwise run last, keeping every
    // layer's low-precision gradient (and cast) until the backward ends.
    cast.grad_fn()->set_runs_first();
    std::weak_ptr<Swap> weak = swap;
    autograd::register_hook(cast, [weak, index](const Tensor&) {
      // Its gradient is complete: this backward's nodes that read it have run and freed what
      // they saved, so unless another graph (a microbatch still in flight) holds it, it goes
      // now, layer by layer as backward passes, rather than every cast until backward ends.
      auto s = weak.lock();
      if (!s) return Tensor();
      if (!s->entries[index].cast_held_elsewhere()) {
        s->entries[index].cast = Tensor();
        return Tensor();
      }
      autograd::queue_backward_callback([weak, index] {
        auto s = weak.lock();
        if (s && !s->entries[index].cast_held_elsewhere()) s->entries[index].cast = Tensor();
      });
      return Tensor();
    });
  }
  e.sole_count = cast.storage().use_count();
  e.cast = cast;
  e.cast_of = e.master;
  return cast;
}

// Every entry's cast for this forward: the last one while a graph holds it (reuses_cast), else a
// new one. The casts no graph holds go first, so old and new never coexist; then the plain
// masters are cast together and the DTensor masters one by one (shard by shard).
std::vector<Tensor> casts_for_forward(const std::shared_ptr<Swap>& swap, DType dtype) {
  std::vector<Tensor> casts(swap->entries.size());
  std::vector<size_t> together, one_by_one;
  for (size_t i = 0; i < swap->entries.size(); ++i) {
    Swap::Entry& e = swap->entries[i];
    e.master = e.owner->parameter(e.name);
    if (reuses_cast(e)) {
      casts[i] = e.cast;
      continue;
    }
    e.cast = Tensor();
    (e.master.extension() ? one_by_one : together).push_back(i);
  }
  const std::vector<Tensor> made = cast_together(*swap, together, dtype);
  for (size_t j = 0; j < together.size(); ++j)
    casts[together[j]] = keep_cast(swap, together[j], made[j]);
  for (size_t i : one_by_one) casts[i] = keep_cast(swap, i, to(swap->entries[i].master, dtype));
  return casts;
}

}  // namespace

void apply_mixed_precision(Module& root, MixedPrecisionPolicy policy) {
  LOOM_CHECK(
      is_floating(policy.param_dtype) && is_floating(policy.output_dtype),
      "apply_mixed_precision: param_dtype {} and output_dtype {} must be floating-point dtypes",
      dtype_name(policy.param_dtype), dtype_name(policy.output_dtype));
  auto swap = std::make_shared<Swap>();
  for (const auto& [path, module] : root.named_modules()) {
    for (const auto& [name, p] : module->named_parameters(/*recurse=*/false)) {
      const std::string full = path.empty() ? name : path + "." + name;
      LOOM_CHECK(p.dtype() == DType::kFloat32,
                 "apply_mixed_precision: parameter '{}' is {}; the master weights must be f32",
                 full, dtype_name(p.dtype()));
      swap->entries.push_back({module, name, Tensor()});
    }
  }
  root.register_forward_pre_hook([swap, policy](Module&, const Tensor& input) {
    // A forward that threw left the casts in place: put the masters back first.
    swap->restore();
    const std::vector<Tensor> casts = casts_for_forward(swap, policy.param_dtype);
    for (size_t i = 0; i < swap->entries.size(); ++i) {
      swap->entries[i].owner->set_parameter(swap->entries[i].name, casts[i]);
    }
    swap->swapped = true;
    return policy.cast_forward_inputs ? cast_floating(input, policy.param_dtype) : input;
  });
  root.register_forward_hook([swap, policy](Module&, const Tensor&, const Tensor& output) {
    swap->restore();
    return cast_floating(output, policy.output_dtype);
  });
}

}  // namespace loom::nn
