// split_layers (even and explicit splits, errors) and LayerSequence (builds only its layers,
// under their whole-model names).
#include "parallel/pipeline/split.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "tests/parallel/pipeline/pipeline_testing.h"

namespace loom::pipeline {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(SplitTest, EvenSplitGivesTheFirstStagesTheRemainder) {
  EXPECT_THAT(split_layers(8, 4),
              ElementsAre(LayerRange{0, 2}, LayerRange{2, 4}, LayerRange{4, 6}, LayerRange{6, 8}));
  EXPECT_THAT(split_layers(10, 4),
              ElementsAre(LayerRange{0, 3}, LayerRange{3, 6}, LayerRange{6, 8}, LayerRange{8, 10}));
  EXPECT_THAT(split_layers(3, 1), ElementsAre(LayerRange{0, 3}));
}

TEST(SplitTest, ExplicitSplit) {
  EXPECT_THAT(split_layers(8, {1, 3, 4}),
              ElementsAre(LayerRange{0, 1}, LayerRange{1, 4}, LayerRange{4, 8}));
}

TEST(SplitTest, BadSplitsAreNamed) {
  EXPECT_THAT([] { split_layers(3, 4); },
              ThrowsMessage<Error>(HasSubstr("cannot split 3 layers into 4 stages")));
  EXPECT_THAT([] { split_layers(8, 0); }, ThrowsMessage<Error>(HasSubstr("got 0 stages")));
  EXPECT_THAT(
      [] {
        split_layers(8, {2, 2, 3});
      },
      ThrowsMessage<Error>(HasSubstr("the split [2, 2, 3] has 7 layers but the model has 8")));
  EXPECT_THAT(
      [] {
        split_layers(8, {4, 0, 4});
      },
      ThrowsMessage<Error>(HasSubstr("the split [4, 0, 4] gives stage 1 0 layers")));
  EXPECT_THAT([] { split_layers(8, std::vector<int64_t>{}); },
              ThrowsMessage<Error>(HasSubstr("the split is empty")));
}

TEST(SplitTest, LayerSequenceHoldsOnlyItsLayersUnderTheirModelNames) {
  std::vector<int64_t> built;
  auto stage = LayerSequence::build({2, 4}, [&](int64_t layer) {
    built.push_back(layer);
    return std::make_shared<testing::Block>(layer);
  });
  EXPECT_THAT(built, ElementsAre(2, 3));
  std::vector<std::string> names;
  for (const auto& [name, p] : stage->named_parameters()) names.push_back(name);
  EXPECT_THAT(names, ElementsAre("2.fc.weight", "2.fc.bias", "3.fc.weight", "3.fc.bias"));
  // Same weights as the same layers of the whole stack.
  auto whole = testing::build_layers({0, testing::kLayers});
  EXPECT_EQ(ops::to_vector(stage->state_dict().at("3.fc.weight")),
            ops::to_vector(whole->state_dict().at("3.fc.weight")));
}

}  // namespace
}  // namespace loom::pipeline
