// Llama configs: the published Llama 3 sizes come out of the presets (parameter counts as Meta
// reports them: 8,030,261,248 and 70,553,706,496), the SwiGLU width rule, and errors naming the
// field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "models/llama/config.h"
#include "tests/testing/errors.h"

namespace loom::models {
namespace {

using loom::testing::error_of;
using ::testing::HasSubstr;

TEST(LlamaConfigTest, Llama3PresetsHaveTheirPublishedSizes) {
  const LlamaConfig eight = LlamaConfig::preset("llama3-8b");
  EXPECT_EQ(eight.ffn_hidden_dim(), 14336);  // HF intermediate_size
  EXPECT_EQ(eight.head_dim(), 128);
  EXPECT_EQ(eight.parameter_count(), 8030261248);
  const LlamaConfig seventy = LlamaConfig::preset("llama3-70b");
  EXPECT_EQ(seventy.ffn_hidden_dim(), 28672);
  EXPECT_EQ(seventy.parameter_count(), 70553706496);
  // Llama 3.2's small models tie their head to the embeddings (counted once).
  const LlamaConfig one = LlamaConfig::preset("llama3.2-1b");
  EXPECT_TRUE(one.tie_word_embeddings);
  EXPECT_EQ(one.head_dim(), 64);
  EXPECT_EQ(one.parameter_count(), 1235814400);
  const LlamaConfig three = LlamaConfig::preset("llama3.2-3b");
  EXPECT_EQ(three.head_dim(), 128);
  EXPECT_EQ(three.parameter_count(), 3212749824);
  for (const std::string& name : LlamaConfig::preset_names()) {
    EXPECT_NO_THROW(LlamaConfig::preset(name).validate()) << name;
  }
  const LlamaConfig tiny = LlamaConfig::preset("llama-tiny");
  EXPECT_EQ(tiny.ffn_hidden_dim(), 176);  // 4 * 64 * 2/3 = 170, rounded up to 16s
  EXPECT_EQ(tiny.n_heads / tiny.n_kv_heads, 2);
}

TEST(LlamaConfigTest, ErrorsNameTheField) {
  EXPECT_THAT(error_of([] { LlamaConfig::preset("llama2"); }),
              HasSubstr("unknown preset 'llama2'; the presets are llama-tiny, llama3-8b, "
                        "llama3-70b"));
  LlamaConfig c = LlamaConfig::preset("llama-tiny");
  c.n_kv_heads = 3;
  EXPECT_THAT(error_of([&] { c.validate(); }),
              HasSubstr("n_heads 4 do not group over n_kv_heads 3"));
  c = LlamaConfig::preset("llama-tiny");
  c.n_heads = 3;
  EXPECT_THAT(error_of([&] { c.validate(); }), HasSubstr("dim 64 does not split into n_heads 3"));
}

}  // namespace
}  // namespace loom::models
