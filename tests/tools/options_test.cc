#include "tools/loomrun/options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/error.h"

namespace loom::loomrun {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

CommandLine parse(std::vector<std::string> args) {
  args.insert(args.begin(), "loomrun");
  std::vector<const char*> argv;
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data());
}

TEST(OptionsTest, DefaultsAreOneLocalRankOnLoopbackWithAPortToPick) {
  const CommandLine result = parse({"--", "prog"});
  ASSERT_EQ(result.action, CommandLine::Action::kRun) << result.text;
  EXPECT_EQ(result.options.nproc_per_node, 1);
  EXPECT_EQ(result.options.nnodes, 1);
  EXPECT_EQ(result.options.node_rank, 0);
  EXPECT_EQ(result.options.master_addr, "127.0.0.1");
  EXPECT_EQ(result.options.master_port, 0);
  EXPECT_EQ(result.options.timeout_s, 0);
  EXPECT_EQ(result.options.grace_s, 10);
  EXPECT_THAT(result.options.command, ElementsAre("prog"));
}

TEST(OptionsTest, ParsesEveryFlag) {
  const CommandLine result =
      parse({"--nproc-per-node", "4", "--nnodes", "3", "--node-rank", "2", "--master-addr",
             "10.0.0.1", "--master-port", "29500", "--timeout-s", "30", "--grace-s", "2.5", "--",
             "train", "--steps", "10"});
  ASSERT_EQ(result.action, CommandLine::Action::kRun) << result.text;
  EXPECT_EQ(result.options.nproc_per_node, 4);
  EXPECT_EQ(result.options.nnodes, 3);
  EXPECT_EQ(result.options.node_rank, 2);
  EXPECT_EQ(result.options.master_addr, "10.0.0.1");
  EXPECT_EQ(result.options.master_port, 29500);
  EXPECT_EQ(result.options.timeout_s, 30);
  EXPECT_EQ(result.options.grace_s, 2.5);
  EXPECT_EQ(result.options.world_size(), 12);
  EXPECT_THAT(result.options.command, ElementsAre("train", "--steps", "10"));
}

TEST(OptionsTest, AcceptsTorchrunSpellingsAndEqualsSigns) {
  const CommandLine result = parse({"--nproc_per_node=2", "--master_port=1234", "prog"});
  ASSERT_EQ(result.action, CommandLine::Action::kRun) << result.text;
  EXPECT_EQ(result.options.nproc_per_node, 2);
  EXPECT_EQ(result.options.master_port, 1234);
}

TEST(OptionsTest, ProgramWithoutDashDashKeepsItsOwnFlagsEvenIfTheyLookLikeOurs) {
  const CommandLine result =
      parse({"--nproc-per-node", "2", "prog", "--nproc-per-node", "5", "--"});
  ASSERT_EQ(result.action, CommandLine::Action::kRun) << result.text;
  EXPECT_EQ(result.options.nproc_per_node, 2);
  EXPECT_THAT(result.options.command, ElementsAre("prog", "--nproc-per-node", "5", "--"));
}

TEST(OptionsTest, AfterDashDashAProgramMayStartWithADash) {
  const CommandLine result = parse({"--", "-weird", "x"});
  ASSERT_EQ(result.action, CommandLine::Action::kRun) << result.text;
  EXPECT_THAT(result.options.command, ElementsAre("-weird", "x"));
}

TEST(OptionsTest, HelpIsNotAnError) {
  const CommandLine result = parse({"--help"});
  EXPECT_EQ(result.action, CommandLine::Action::kPrintHelp);
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_THAT(result.text, HasSubstr("--nproc-per-node"));
  EXPECT_THAT(result.text, HasSubstr("--timeout-s"));
}

struct BadCase {
  std::vector<std::string> args;
  std::string message;
};

class BadCommandLineTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadCommandLineTest, FailsWithExitCode2AndNamesGivenAndExpected) {
  const CommandLine result = parse(GetParam().args);
  EXPECT_EQ(result.action, CommandLine::Action::kFail);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.text, HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadCommandLineTest,
    ::testing::Values(
        BadCase{{"--nproc-per-node", "0", "prog"}, "--nproc-per-node must be at least 1, got 0"},
        BadCase{{"--nproc-per-node", "-3", "prog"}, "--nproc-per-node must be at least 1, got -3"},
        BadCase{{"--nnodes", "0", "prog"}, "--nnodes must be at least 1, got 0"},
        BadCase{{"--nnodes", "2", "--node-rank", "2", "--master-port", "1", "prog"},
                "--node-rank 2 is out of range for --nnodes 2; expected 0 <= node-rank < 2"},
        BadCase{{"--node-rank", "-1", "prog"},
                "--node-rank -1 is out of range for --nnodes 1; expected 0 <= node-rank < 1"},
        BadCase{{"--nnodes", "2", "prog"}, "--nnodes 2 needs --master-port"},
        BadCase{{"--master-port", "65536", "prog"},
                "--master-port must be in 0..65535 (0: a free port), got 65536"},
        BadCase{{"--master-addr", "", "prog"}, "--master-addr must not be empty"},
        BadCase{{"--timeout-s", "-1", "prog"},
                "--timeout-s must be between 0 and 100000000 seconds (0: no limit), got -1"},
        // Beyond the clock's range a deadline would come at once: refused, not overflowed.
        BadCase{
            {"--timeout-s", "1e10", "prog"},
            "--timeout-s must be between 0 and 100000000 seconds (0: no limit), got 10000000000"},
        BadCase{{"--timeout-s", "inf", "prog"}, "--timeout-s must be between 0 and 100000000"},
        BadCase{{"--grace-s", "-0.5", "prog"},
                "--grace-s must be between 0 and 100000000 seconds, got -0.5"},
        BadCase{{"--grace-s", "inf", "prog"}, "--grace-s must be between 0 and 100000000 seconds"},
        BadCase{{"--nproc-per-node", "2"}, "missing the program to run"},
        BadCase{{"--"}, "missing the program to run"}, BadCase{{}, "missing the program to run"},
        BadCase{{"--bogus", "prog"}, "unknown flag '--bogus'"},
        BadCase{{"--nproc-per-node", "two", "prog"}, "--nproc-per-node"},
        BadCase{{"--nproc-per-node"}, "--nproc-per-node"}));

TEST(ValidateOptionsTest, ThrowsLoomErrorForAnInvalidCombination) {
  LaunchOptions options;
  options.command = {"prog"};
  EXPECT_NO_THROW(validate_options(options));
  options.nnodes = 4;
  options.node_rank = 3;
  options.master_port = 29500;
  EXPECT_NO_THROW(validate_options(options));
  options.node_rank = 4;
  try {
    validate_options(options);
    FAIL() << "expected loom::Error";
  } catch (const Error& error) {
    EXPECT_THAT(error.what(), HasSubstr("--node-rank 4 is out of range for --nnodes 4"));
  }
}

}  // namespace
}  // namespace loom::loomrun
