// How one model family's parameters appear in Hugging Face checkpoints (torchtitan's
// StateDictAdapter): the file's names, shapes and layouts of Loom's parameters, and the
// config.json transformers reads. A family writes one adapter; loading into any layout (plain,
// tensor parallel, FSDP, a pipeline stage) and saving are models/hf/checkpoint.h's, the same for
// every family.
//
// Every conversion is of whole tensors (the full parameter, whatever the layout): the loader cuts
// each rank's box out of the converted whole tensor by the parameter's placements.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/hf/safetensors.h"
#include "tensor/tensor.h"

namespace loom::models::hf {

class StateDictAdapter {
 public:
  virtual ~StateDictAdapter() = default;

  // The names a Loom parameter may have in a file, the one save writes first
  // ("h.0.ln_1.weight" -> {"transformer.h.0.ln_1.weight", "h.0.ln_1.weight"}).
  virtual std::vector<std::string> hf_names(const std::string& name) const = 0;
  // The file's shape of a parameter whose (global) shape is `shape`: transposed layouts differ.
  virtual Shape hf_shape(const std::string& name, const Shape& shape) const {
    (void)name;
    return shape;
  }
  // A whole tensor from the file's layout to Loom's (the file's shape already checked), and back.
  virtual Tensor from_hf(const std::string& name, const Tensor& hf) const {
    (void)name;
    return hf;
  }
  virtual Tensor to_hf(const std::string& name, const Tensor& loom) const {
    (void)name;
    return loom;
  }
  // Tensors a file may hold that are no parameter and are skipped (GPT-2's attention masks,
  // older Llama files' rotary inv_freq): anything else no parameter takes is refused.
  virtual bool is_buffer(const std::string& hf_name) const {
    (void)hf_name;
    return false;
  }
  // The file's tensors check_file reads the values of, besides the parameters being loaded.
  virtual std::vector<std::string> checked_tensors() const { return {}; }
  // Checks across the file's tensors before anything loads (GPT-2: an lm_head must equal wte,
  // since Loom ties them); appends a line per problem. Tensors without values (meta: headers
  // only) are not compared.
  virtual void check_file(const TensorMap& file, std::vector<std::string>& problems) const {
    (void)file;
    (void)problems;
  }
  // Tensors save writes besides the parameters (GPT-2: lm_head.weight, a copy of wte).
  virtual void add_saved(TensorMap& file) const { (void)file; }
  // The config.json written beside a saved file.
  virtual nlohmann::json config_json() const = 0;
};

}  // namespace loom::models::hf
