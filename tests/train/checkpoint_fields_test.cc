// check_same_model: a resume's model must be the checkpoint's, size for size; a family's training
// fields (ModelArgs::training_fields, a MoE's balancing coefficients) may change, with a warning.
#include "train/checkpoint_fields.h"

#include <gtest/gtest.h>

#include <memory>

#include "models/family.h"
#include "tests/testing/errors.h"

namespace loom::train {
namespace {

using loom::testing::error_of;

checkpoint::Metadata saved_with(const nlohmann::json& model) {
  checkpoint::Metadata metadata;
  metadata.extra["model"] = model;
  return metadata;
}

// llama-moe-tiny's recorded fields, from its family, and the pointers it calls training fields.
std::unique_ptr<models::ModelArgs> moe_tiny() {
  return models::family_of_model("llama-moe-tiny").from_preset("llama-moe-tiny", {});
}

TEST(CheckSameModel, TheSameModelPassesWithoutWarnings) {
  const auto args = moe_tiny();
  EXPECT_TRUE(
      check_same_model(saved_with(args->fields()), args->fields(), "ck", args->training_fields())
          .empty());
}

TEST(CheckSameModel, AChangedTrainingFieldIsAWarningNamingBothValues) {
  const auto args = moe_tiny();
  ASSERT_EQ(args->training_fields(), (std::vector<models::TrainingField>{
                                         {"/moe/aux_loss_coeff", "--moe-aux-loss-coeff"},
                                         {"/moe/bias_update_rate", "--moe-bias-update-rate"},
                                         {"/moe/capacity_factor", "--moe-capacity-factor"}}));
  nlohmann::json here = args->fields();
  here["moe"]["aux_loss_coeff"] = 0.5;
  here["moe"]["capacity_factor"] = 1.25;
  const std::vector<std::string> warnings =
      check_same_model(saved_with(args->fields()), here, "ck", args->training_fields());
  ASSERT_EQ(warnings.size(), 2u);
  const std::string saved_coeff = args->fields()["moe"]["aux_loss_coeff"].dump();
  EXPECT_NE(warnings[0].find("checkpoint 'ck' trained with --moe-aux-loss-coeff " + saved_coeff +
                             "; this run goes on with --moe-aux-loss-coeff 0.5"),
            std::string::npos)
      << warnings[0];
  EXPECT_NE(warnings[1].find("--moe-capacity-factor 0.0; this run goes on with "
                             "--moe-capacity-factor 1.25"),
            std::string::npos)
      << warnings[1];
}

TEST(CheckSameModel, AnyOtherFieldStillRefusesBesideATrainingOne) {
  const auto args = moe_tiny();
  nlohmann::json here = args->fields();
  here["moe"]["aux_loss_coeff"] = 0.5;
  here["moe"]["top_k"] = 1;  // what the model is: refused
  const std::string error = error_of(
      [&] { check_same_model(saved_with(args->fields()), here, "ck", args->training_fields()); });
  EXPECT_NE(error.find("checkpoint 'ck' was saved from another model config: moe "),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("\"top_k\":2"), std::string::npos) << error;
  // Without the family's training fields every difference is refused, as before.
  nlohmann::json coefficient_only = args->fields();
  coefficient_only["moe"]["aux_loss_coeff"] = 0.5;
  EXPECT_NE(error_of([&] {
              check_same_model(saved_with(args->fields()), coefficient_only, "ck");
            }).find("was saved from another model config"),
            std::string::npos);
}

TEST(CheckSameModel, ATrainingFieldTheCheckpointLacksIsNotCompared) {
  const auto args = moe_tiny();
  nlohmann::json older = args->fields();
  older["moe"].erase("capacity_factor");  // recorded only by later Looms
  EXPECT_TRUE(
      check_same_model(saved_with(older), args->fields(), "ck", args->training_fields()).empty());
}

TEST(WithoutTrainingFields, TwoStepsDifferingInATrainingFieldAreOneRunsSteps) {
  const auto args = moe_tiny();
  nlohmann::json changed = args->fields();
  changed["moe"]["bias_update_rate"] = 0.5;
  EXPECT_NE(changed, args->fields());
  EXPECT_EQ(without_training_fields(changed, args->training_fields()),
            without_training_fields(args->fields(), args->training_fields()));
  EXPECT_FALSE(without_training_fields(changed, args->training_fields())["moe"].contains(
      "bias_update_rate"));
  EXPECT_TRUE(without_training_fields(changed, args->training_fields())["moe"].contains("top_k"));
}

}  // namespace
}  // namespace loom::train
