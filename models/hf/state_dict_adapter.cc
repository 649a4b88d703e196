#include "models/hf/state_dict_adapter.h"

#include <cstring>

#include "base/error.h"
#include "models/hf/checkpoint.h"
#include "tensor/ops.h"

namespace loom::models::hf {

namespace {

Tensor transposed(const Tensor& t) { return ops::contiguous(ops::transpose(t, 0, 1)); }

// The inverse permutation: where each of Loom's rows goes back to in the file.
std::vector<int64_t> inverse(const std::vector<int64_t>& source, const std::string& name) {
  std::vector<int64_t> out(source.size(), -1);
  for (size_t r = 0; r < source.size(); ++r) {
    const int64_t s = source[r];
    LOOM_CHECK(s >= 0 && s < static_cast<int64_t>(source.size()) && out[s] < 0,
               "StateDictAdapter: the row_source of '{}' is not a permutation of its {} rows", name,
               source.size());
    out[s] = static_cast<int64_t>(r);
  }
  return out;
}

}  // namespace

Shape StateDictAdapter::hf_shape(const std::string& name, const Shape& shape) const {
  const auto layout = file_layout(name);
  if (layout && layout->transposed) return {shape.at(1), shape.at(0)};
  return shape;
}

Tensor StateDictAdapter::from_hf(const std::string& name, const Tensor& hf) const {
  const auto layout = file_layout(name);
  if (!layout) return hf;
  const Tensor t = layout->transposed ? transposed(hf) : ops::contiguous(hf);
  return layout->row_source.empty() ? t : gather_rows(t, layout->row_source);
}

Tensor StateDictAdapter::to_hf(const std::string& name, const Tensor& loom) const {
  const auto layout = file_layout(name);
  if (!layout) return loom;
  const Tensor rows = layout->row_source.empty()
                          ? ops::contiguous(loom)
                          : gather_rows(loom, inverse(layout->row_source, name));
  return layout->transposed ? transposed(rows) : rows;
}

bool same_values(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const Tensor fa = ops::contiguous(ops::to(a, kFloat32)),
               fb = ops::contiguous(ops::to(b, kFloat32));
  return std::memcmp(fa.raw_data(), fb.raw_data(),
                     static_cast<size_t>(fa.numel()) * sizeof(float)) == 0;
}

void check_tied_head(const TensorMap& file, const std::string& head,
                     const std::vector<std::string>& embeddings, const std::string& advice,
                     std::vector<std::string>& problems) {
  const auto copy = file.find(head);
  if (copy == file.end() || copy->second.device().is_meta()) return;
  for (const std::string& name : embeddings) {
    const auto it = file.find(name);
    if (it == file.end() || it->second.device().is_meta()) continue;
    if (copy->second.shape() != it->second.shape()) {
      // Neither a tied head nor (the shape check names it) the model's untied one: no advice.
      problems.push_back(fmt::format(
          "tensor '{}' has shape {} in the file, '{}' {}: a head tied to the embeddings is the "
          "embeddings, of their shape",
          head, shape_str(copy->second.shape()), name, shape_str(it->second.shape())));
    } else if (!same_values(copy->second, it->second)) {
      problems.push_back(fmt::format("tensor '{}' differs from '{}': {}", head, name, advice));
    }
  }
}

}  // namespace loom::models::hf
