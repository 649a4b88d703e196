// Hugging Face checkpoints for any model family, through its StateDictAdapter: one loader and one
// saver for every family and every layout.
//
// Files: `path` is a .safetensors file, a sharded checkpoint's index
// (model.safetensors.index.json: its "weight_map" names a shard file per tensor, read beside it),
// or a folder holding either (as save_pretrained writes it). config.json sits beside them.
//
// Load (no communication): every rank reads the file's headers, then, of each parameter it holds
// (a pipeline stage its own), the box its shard holds by the parameter's placements
// (DTensorSpec::local_offset / local_shape, the same boxes a distributed checkpoint reads):
// plain parameters, tensor-parallel and FSDP shards (nested shards of one dim included) and
// pipeline stages alike. Where the family states the parameter's file layout (a transpose and a
// row gather: StateDictAdapter::file_layout) only the box's bytes are read (file_boxes.h), so N
// ranks each read about 1/N of the file; otherwise the whole tensor is read, converted
// (from_hf) and cut; a parameter stored as one tensor per index of its dim 0
// (StateDictAdapter::stacked_names: experts) reads only the tensors of its box. All or nothing:
// every name, shape and dtype is checked first, and any problem (a missing tensor, a shape, a
// tensor no parameter takes, the adapter's checks on the boxes read) is reported together with the
// others, the model unchanged.
//
// Save: the caller gathers the whole parameters (whole_parameters: full_tensor on every rank of
// their meshes, collective; kept by the ranks that write) and the ranks with `write` write the
// file atomically, and config.json beside it.
#pragma once

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "models/hf/state_dict_adapter.h"
#include "nn/module.h"

namespace loom::models::hf {

// The tensors of a checkpoint (a file, an index and its shards, or a folder holding either).
// Throws naming the file for anything unreadable or malformed. With `values` false, headers only
// (meta tensors: names, shapes, dtypes).
// With `only`, values are read for the tensors it names alone.
TensorMap read_tensors(const std::string& path, bool values = true,
                       const std::set<std::string>* only = nullptr);
// The file the checkpoint's tensors are in, or its index, when `path` is a folder; else `path`.
std::string resolve_checkpoint_path(const std::string& path);
// config.json beside the checkpoint (in the folder when `path` is one).
std::string config_json_path(const std::string& path);
// generation_config.json and tokenizer.json beside it, as config.json.
std::string generation_config_path(const std::string& path);
std::string tokenizer_json_path(const std::string& path);
// The three files a checkpoint's readers read and --save writes beside its model file.
std::vector<std::string> files_beside(const std::string& path);

// What a load read: the bytes of tensor data read (each rank only its boxes of the parameters
// whose file layout its family states), of the checkpoint's tensor bytes in all.
struct LoadStats {
  int64_t bytes_read = 0;
  int64_t file_bytes = 0;
};

// Loads every parameter of `module` (a whole model or a pipeline stage, plain or DTensor
// parameters) from the checkpoint at `path`. `model_names`: every parameter name of the whole
// model, so a stage skips the tensors of other stages while a tensor no parameter of the model
// takes is refused. `who` starts the error ("load_llama_hf").
LoadStats load(nn::Module& module, const StateDictAdapter& adapter, const std::string& path,
               const std::vector<std::string>& model_names, const std::string& who);

// The checks of load() against the checkpoint's headers, reading no parameter's values: what a
// job checks before it starts. Only the adapter's checked tensors are read (a tied head's copy and
// the embeddings it must equal), when the file holds two of them. `module` may be on the meta
// device.
void check(const nn::Module& module, const StateDictAdapter& adapter, const std::string& path,
           const std::vector<std::string>& model_names, const std::string& who);

// Whole copies of `module`'s parameters on the CPU, in named_parameters order, then of the
// buffers `adapter` saves (StateDictAdapter::loads_buffer). Collective:
// DTensor parameters are gathered (full_tensor), so every rank of their meshes calls it. Only a
// rank that `keep`s them (the one that writes the file) holds them all; the others drop each
// gathered parameter at once and get an empty list, holding at most one whole parameter.
std::vector<std::pair<std::string, Tensor>> whole_parameters(const nn::Module& module,
                                                             const StateDictAdapter& adapter,
                                                             bool keep = true);
// The parameters alone (no adapter: no buffer).
std::vector<std::pair<std::string, Tensor>> whole_parameters(const nn::Module& module,
                                                             bool keep = true);

// Throws loom::Error naming `what` (the flag or tool) when `path` is not a file save() can write:
// a name without .safetensors (transformers would not find it), or not writable
// (loom::check_writable: a folder that does not exist, a folder itself, no permission).
void check_save_path(const std::string& path, std::string_view what);

// Writes whole parameters (Loom's layout, on the CPU) as a safetensors file at `path`, and the
// adapter's config.json beside it, each atomically.
void save(const std::vector<std::pair<std::string, Tensor>>& parameters,
          const StateDictAdapter& adapter, const std::string& path);

// A copy of `tensor` whose row j along dim 0 is row source[j] of `tensor` (index_select on dim 0):
// the permutations adapters apply.
Tensor gather_rows(const Tensor& tensor, const std::vector<int64_t>& source);

}  // namespace loom::models::hf
