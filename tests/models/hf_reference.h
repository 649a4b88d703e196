// The logits fixtures written by transformers (tests/models/fixtures/make_hf_*_fixture.py): the
// token ids, the logits PyTorch computed for them and their shape, and the whole JSON (a fixture
// may carry more, such as the model config).
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tensor/ops.h"

namespace loom::models::testing {

struct HfReference {
  Tensor ids;  // (B, T) int64
  std::vector<double> logits;
  Shape logits_shape;
  nlohmann::json json;
};

inline HfReference read_hf_reference(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  HfReference r;
  r.json = nlohmann::json::parse(in);
  const auto rows = r.json.at("ids").get<std::vector<std::vector<int64_t>>>();
  std::vector<int64_t> flat;
  for (const auto& row : rows) flat.insert(flat.end(), row.begin(), row.end());
  r.ids = ops::from_vector_i64(
      flat, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
  r.logits = r.json.at("logits").get<std::vector<double>>();
  r.logits_shape = r.json.at("logits_shape").get<Shape>();
  return r;
}

}  // namespace loom::models::testing
