// Meta-device initialization, as torchtitan builds a model (torch's `with torch.device("meta")`,
// module.to_empty(device), model.init_weights()): the model is built with shapes only, laid out
// by the parallel plan (tensor parallelism, FSDP's sharding, a pipeline's split) while nothing
// has values, and only then does each rank give its own shards bytes and values. A rank's memory
// during construction is therefore its shard of the model, never the whole.
//
//   std::shared_ptr<nn::Module> model;
//   { nn::MetaBuildScope meta; model = make_model(); }  // placeholders, no bytes
//   tp::parallelize_module(*model, ...);  fsdp::fully_shard(...);  // layouts, no values
//   nn::materialize(*model, device);      // this rank's shards get bytes on `device`
//   model->init_weights();                // ... and values (nn/module.h)
//
// Values equal the eagerly built model's bit for bit under every layout: each module's
// reset_parameters() draws what its constructor draws, and every random value is a function of
// the seed and the element's global index (tensor/rng.h), so a shard draws exactly its slice.
#pragma once

#include "nn/module.h"
#include "tensor/device.h"
#include "tensor/memory_stats.h"

namespace loom::nn {

// While alive, factories make meta tensors (DefaultDeviceGuard) and their placeholder bytes are
// counted apart (by a process-wide tracker), not as this thread's memory: what a rank's tracker
// sees of construction is what materialize() gives bytes, and whatever real tensors the model
// computes (Llama's RoPE tables, on the host).
class MetaBuildScope {
 public:
  MetaBuildScope();
  MetaBuildScope(const MetaBuildScope&) = delete;
  MetaBuildScope& operator=(const MetaBuildScope&) = delete;

 private:
  DefaultDeviceGuard device_;
  ScopedMetaPlaceholderTracker placeholders_;
};

// Gives every meta parameter and buffer of the tree bytes on `device` in place
// (Storage::materialize): the tensors stay the same objects, so whatever holds them (FSDP's
// units, a DTensor's local shard, tied weights) sees the materialized memory. Contents are
// uninitialized: call init_weights() next. Tensors already off meta are left alone.
void materialize(Module& module, Device device);

// Whether any parameter or buffer of the tree is a meta tensor.
bool has_meta_tensors(const Module& module);

}  // namespace loom::nn
