// How one model family's parameters appear in Hugging Face checkpoints (torchtitan's
// StateDictAdapter): the file's names, shapes and layouts of Loom's parameters, and the
// config.json transformers reads. A family writes one adapter; loading into any layout (plain,
// tensor parallel, FSDP, a pipeline stage) and saving are models/hf/checkpoint.h's, the same for
// every family.
//
// A family states where each parameter's elements sit in the file (file_layout: a transpose and a
// gather of rows), and the loader reads only the rows and columns each rank's shard needs. A
// family whose conversion is something else overrides from_hf / to_hf / hf_shape (whole tensors)
// instead, and its parameters are read whole, each rank cutting its box out.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
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
  // Where a parameter's elements sit in the file's tensor: Loom's row r (dim 0) is row
  // row_source[r] (r when empty; a permutation) of the file's tensor, transposed first when
  // `transposed` (2-D). Loom's element (r, c) is the file's (row_source[r], c), or
  // (c, row_source[r]) transposed.
  struct FileLayout {
    bool transposed = false;
    std::vector<int64_t> row_source;
  };
  // A parameter the file stores as one tensor per index of its dim 0 (a mixture of experts'
  // (experts, ., .) weights: Mixtral's experts.{e}.w1.weight), those tensors' names in order, each
  // of the parameter's shape without dim 0 and laid out as it is (no transpose or row gather);
  // empty (the default) for a parameter stored as one tensor, named by hf_names.
  virtual std::vector<std::string> stacked_names(const std::string& name) const {
    (void)name;
    return {};
  }
  // The parameter's layout, by which the loader reads only a rank's box; nullopt (the default):
  // the conversion is from_hf's, of whole tensors, and the parameter is read whole.
  virtual std::optional<FileLayout> file_layout(const std::string& name) const {
    (void)name;
    return std::nullopt;
  }
  // The file's shape of a parameter whose (global) shape is `shape`: transposed layouts differ.
  // Default: by file_layout.
  virtual Shape hf_shape(const std::string& name, const Shape& shape) const;
  // A whole tensor from the file's layout to Loom's (the file's shape already checked), and back.
  // Default: by file_layout (the identity without one).
  virtual Tensor from_hf(const std::string& name, const Tensor& hf) const;
  virtual Tensor to_hf(const std::string& name, const Tensor& loom) const;
  // A buffer of Loom's model that the file holds (DeepSeek-V3's e_score_correction_bias: a MoE's
  // expert_bias), named by hf_names: loaded and saved as the parameters are (every rank holds it
  // whole). Its file tensors must also be is_buffer's, so a pipeline stage skips other stages'.
  virtual bool loads_buffer(const std::string& name) const {
    (void)name;
    return false;
  }
  // Tensors a file may hold that are no parameter and are skipped (GPT-2's attention masks,
  // older Llama files' rotary inv_freq) unless a loaded buffer takes them: anything else no
  // parameter takes is refused.
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

// Whether two tensors of a file hold the same values (compared as f32, bit for bit): a tied
// head's copy against the embeddings it must equal.
bool same_values(const Tensor& a, const Tensor& b);

// StateDictAdapter::check_file for a tied head: the file's copy of the head (`head`, when it has
// one with values: headers alone are not compared) against each of `embeddings` it holds; a
// difference is a problem, "tensor 'lm_head.weight' differs from '<embedding>': <advice>".
void check_tied_head(const TensorMap& file, const std::string& head,
                     const std::vector<std::string>& embeddings, const std::string& advice,
                     std::vector<std::string>& problems);

}  // namespace loom::models::hf
