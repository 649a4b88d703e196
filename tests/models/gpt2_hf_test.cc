// GPT <-> Hugging Face GPT-2 safetensors: the c_attn permutation on its own, a Loom round trip,
// a file in HF's layout built by hand in this test (explicit index math, independent of the code
// under test) giving the reference model's logits, and all-or-nothing loading.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>

#include "autograd/grad_mode.h"
#include "base/error.h"
#include "models/gpt/hf.h"
#include "models/hf/checkpoint.h"
#include "models/hf/safetensors.h"
#include "tensor/ops.h"
#include "tests/models/gpt2_hf_test_config.h"

namespace loom::models {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "/" + name; }

GPTConfig small_config() { return gpt2_hf_test_config(); }

Tensor tokens(const GPTConfig& config) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 2 * config.block_size; ++i)
    ids.push_back((i * 7 + 3) % config.vocab_size);
  return ops::from_vector_i64(ids, {2, config.block_size});
}

std::vector<double> logits(GPT& model, const GPTConfig& config) {
  NoGradGuard no_grad;
  return ops::to_vector(model(tokens(config)));
}

std::map<std::string, std::vector<double>> snapshot(const GPT& model) {
  std::map<std::string, std::vector<double>> values;
  for (const auto& [name, p] : model.named_parameters()) values[name] = ops::to_vector(p);
  return values;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The reference model's parameters in HF GPT-2's layout, by explicit index math.
TensorMap hf_tensors_by_hand(const GPT& reference, const std::string& prefix) {
  const GPTConfig& config = reference.config();
  const int64_t C = config.n_embd, H = config.n_head, D = C / H;
  TensorMap out;
  for (const auto& [name, p] : reference.named_parameters()) {
    const std::vector<double> loom = ops::to_vector(p);
    std::vector<float> hf(loom.size());
    Shape shape = p.shape();
    if (ends_with(name, "attn.c_attn.weight")) {
      // Loom (3C, C), row h*3D + w*D + d; HF Conv1D (C, 3C), column w*C + h*D + d.
      shape = {C, 3 * C};
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < 3; ++w)
          for (int64_t d = 0; d < D; ++d)
            for (int64_t in = 0; in < C; ++in)
              hf[in * 3 * C + (w * C + h * D + d)] =
                  static_cast<float>(loom[(h * 3 * D + w * D + d) * C + in]);
    } else if (ends_with(name, "attn.c_attn.bias")) {
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < 3; ++w)
          for (int64_t d = 0; d < D; ++d)
            hf[w * C + h * D + d] = static_cast<float>(loom[h * 3 * D + w * D + d]);
    } else if (ends_with(name, "c_proj.weight") || ends_with(name, "c_fc.weight")) {
      const int64_t rows = p.size(0), cols = p.size(1);  // Loom (out, in) -> HF (in, out)
      shape = {cols, rows};
      for (int64_t o = 0; o < rows; ++o)
        for (int64_t in = 0; in < cols; ++in)
          hf[in * rows + o] = static_cast<float>(loom[o * cols + in]);
    } else {
      for (size_t i = 0; i < loom.size(); ++i) hf[i] = static_cast<float>(loom[i]);
    }
    out[prefix + name] = ops::from_vector(hf, shape);
  }
  return out;
}

std::string load_error(GPT& model, const std::string& path) {
  try {
    load_gpt2_hf(model, path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CAttnPermutationTest, SmallCaseByHand) {
  // n_head 2, head_dim 1: qkv-major [q0 q1 k0 k1 v0 v1], head-major [q0 k0 v0 q1 k1 v1].
  EXPECT_EQ(c_attn_head_major_source(2, 1), (std::vector<int64_t>{0, 2, 4, 1, 3, 5}));
  EXPECT_EQ(c_attn_qkv_major_source(2, 1), (std::vector<int64_t>{0, 3, 1, 4, 2, 5}));
  // n_head 2, head_dim 2: head 1's k = qkv-major features [6, 7] sit at head-major [8, 9].
  const auto source = c_attn_head_major_source(2, 2);
  EXPECT_EQ(source[8], 6);
  EXPECT_EQ(source[9], 7);
}

TEST(CAttnPermutationTest, MapsAreInversePermutations) {
  for (auto [heads, dim] : {std::pair<int64_t, int64_t>{1, 4}, {3, 2}, {12, 64}}) {
    const auto to_loom = c_attn_head_major_source(heads, dim),
               to_hf = c_attn_qkv_major_source(heads, dim);
    ASSERT_EQ(to_loom.size(), static_cast<size_t>(3 * heads * dim));
    std::vector<int64_t> sorted = to_loom;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> iota(sorted.size());
    std::iota(iota.begin(), iota.end(), 0);
    EXPECT_EQ(sorted, iota);
    for (size_t j = 0; j < to_loom.size(); ++j)
      EXPECT_EQ(to_hf[to_loom[j]], static_cast<int64_t>(j));
  }
  if (c_attn_head_major_source(1, 4) != c_attn_qkv_major_source(1, 4))
    ADD_FAILURE() << "one head: identity both ways";
}

TEST(CAttnPermutationTest, GatherRowsPicksRows) {
  const Tensor t = ops::from_vector({0, 1, 10, 11, 20, 21}, {3, 2});
  EXPECT_EQ(ops::to_vector(hf::gather_rows(t, {2, 0, 1})),
            (std::vector<double>{20, 21, 0, 1, 10, 11}));
  EXPECT_THROW(hf::gather_rows(t, {0, 1}), Error);
  EXPECT_THROW(hf::gather_rows(t, {0, 1, 3}), Error);
}

TEST(GPT2HFTest, RoundTripGivesIdenticalParametersAndLogits) {
  const GPTConfig config = small_config();
  GPT source(config, 1);
  const std::string path = temp_path("round_trip.safetensors");
  save_gpt2_hf(source, path);
  // The file is in HF's layout and names.
  const SafetensorsFile file = load_safetensors(path);
  EXPECT_EQ(file.tensors.at("transformer.h.0.attn.c_attn.weight").shape(), (Shape{16, 48}));
  EXPECT_EQ(file.tensors.at("transformer.h.1.mlp.c_fc.weight").shape(), (Shape{16, 64}));
  EXPECT_EQ(file.tensors.at("transformer.h.1.mlp.c_proj.weight").shape(), (Shape{64, 16}));
  EXPECT_EQ(ops::to_vector(file.tensors.at("lm_head.weight")),
            ops::to_vector(source.wte->weight()));

  GPT loaded(config, 2);
  ASSERT_NE(logits(loaded, config), logits(source, config));
  load_gpt2_hf(loaded, path);
  EXPECT_EQ(snapshot(loaded), snapshot(source));
  EXPECT_EQ(logits(loaded, config), logits(source, config));
}

TEST(GPT2HFTest, HandBuiltHFFileGivesTheReferenceLogits) {
  const GPTConfig config = small_config();
  GPT reference(config, 11);
  const std::vector<double> expected = logits(reference, config);

  // GPT2LMHeadModel: "transformer." names plus lm_head.
  TensorMap lm_head_model = hf_tensors_by_hand(reference, "transformer.");
  lm_head_model["lm_head.weight"] = lm_head_model.at("transformer.wte.weight");
  save_safetensors(temp_path("hf_lm_head.safetensors"), lm_head_model, {{"format", "pt"}});
  GPT a(config, 12);
  load_gpt2_hf(a, temp_path("hf_lm_head.safetensors"));
  EXPECT_EQ(logits(a, config), expected);

  // GPT2Model: bare names, no lm_head, and HF's attention-mask buffers (skipped).
  TensorMap bare_model = hf_tensors_by_hand(reference, "");
  for (int64_t i = 0; i < config.n_layer; ++i) {
    bare_model[fmt::format("h.{}.attn.bias", i)] =
        ops::ones({1, 1, config.block_size, config.block_size});
    bare_model[fmt::format("h.{}.attn.masked_bias", i)] = ops::scalar_tensor(-1e4);
  }
  save_safetensors(temp_path("hf_bare.safetensors"), bare_model);
  GPT b(config, 13);
  load_gpt2_hf(b, temp_path("hf_bare.safetensors"));
  EXPECT_EQ(logits(b, config), expected);
  EXPECT_EQ(snapshot(b), snapshot(reference));
}

TEST(GPT2HFTest, BF16FileIsConvertedToTheParameterDType) {
  const GPTConfig config = small_config();
  GPT reference(config, 21);
  TensorMap tensors = hf_tensors_by_hand(reference, "transformer.");
  for (auto& [name, t] : tensors) t = ops::to(t, kBFloat16);
  save_safetensors(temp_path("bf16.safetensors"), tensors);
  GPT model(config, 22);
  load_gpt2_hf(model, temp_path("bf16.safetensors"));
  const Tensor wte = model.wte->weight();
  EXPECT_EQ(wte.dtype(), kFloat32);
  EXPECT_EQ(ops::to_vector(wte),
            ops::to_vector(ops::to(ops::to(reference.wte->weight(), kBFloat16), kFloat32)));
}

class GPT2HFAllOrNothingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    source_ = std::make_unique<GPT>(small_config(), 31);
    target_ = std::make_unique<GPT>(small_config(), 32);
    tensors_ = hf_tensors_by_hand(*source_, "transformer.");
    before_ = snapshot(*target_);
  }
  // Writes tensors_ and returns the error loading it into target_; target_ must be unchanged.
  std::string load_expecting_failure(const std::string& file) {
    const std::string path = temp_path(file);
    save_safetensors(path, tensors_);
    const std::string message = load_error(*target_, path);
    EXPECT_THAT(message, AllOf(HasSubstr(path), HasSubstr("the model is unchanged")));
    EXPECT_EQ(snapshot(*target_), before_) << "a failed load changed the model";
    return message;
  }
  std::unique_ptr<GPT> source_, target_;
  TensorMap tensors_;
  std::map<std::string, std::vector<double>> before_;
};

TEST_F(GPT2HFAllOrNothingTest, MissingTensorIsNamedAndNothingLoads) {
  tensors_.erase("transformer.h.1.mlp.c_proj.bias");  // sorted late: everything before it is valid
  EXPECT_THAT(load_expecting_failure("missing.safetensors"),
              HasSubstr("missing tensor 'transformer.h.1.mlp.c_proj.bias' (shape (16,))"));
}

TEST_F(GPT2HFAllOrNothingTest, WrongShapeNamesBothShapes) {
  tensors_["transformer.h.1.attn.c_attn.weight"] =
      ops::zeros({48, 16});  // Loom's layout, not Conv1D's
  EXPECT_THAT(load_expecting_failure("shape.safetensors"),
              HasSubstr("tensor 'transformer.h.1.attn.c_attn.weight' has shape (48, 16) in the "
                        "file but the model "
                        "expects (16, 48)"));
}

TEST_F(GPT2HFAllOrNothingTest, UnexpectedTensorIsNamed) {
  tensors_["transformer.h.2.ln_1.weight"] = ops::ones({16});  // a third layer the model lacks
  EXPECT_THAT(load_expecting_failure("unexpected.safetensors"),
              HasSubstr("unexpected tensor 'transformer.h.2.ln_1.weight'"));
}

TEST_F(GPT2HFAllOrNothingTest, UntiedLmHeadIsRejected) {
  tensors_["lm_head.weight"] = ops::zeros({37, 16});
  EXPECT_THAT(load_expecting_failure("untied.safetensors"),
              AllOf(HasSubstr("'lm_head.weight' differs from 'transformer.wte.weight'"),
                    HasSubstr("untied")));
}

TEST_F(GPT2HFAllOrNothingTest, AHeadOfAnotherShapeThanTheEmbeddingsIsNamedWithBothShapes) {
  tensors_["lm_head.weight"] = ops::zeros({20, 16});
  EXPECT_THAT(load_expecting_failure("short_head.safetensors"),
              HasSubstr("tensor 'lm_head.weight' has shape (20, 16) in the file, "
                        "'transformer.wte.weight' (37, 16): a head tied to the embeddings is the "
                        "embeddings, of their shape"));
}

TEST_F(GPT2HFAllOrNothingTest, IntegerTensorForAFloatParameterIsRejected) {
  tensors_["transformer.ln_f.bias"] = ops::to(ops::zeros({16}), kInt32);
  EXPECT_THAT(
      load_expecting_failure("int.safetensors"),
      HasSubstr("tensor 'transformer.ln_f.bias' is i32 in the file but the parameter is f32"));
}

}  // namespace
}  // namespace loom::models
