// The job's command line: true/false flags take their last form (--x, --no-x, --x=VALUE), as
// every other option takes its last value; a value other than true or false is an error.
#include "train/job_command_line.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/testing/errors.h"

namespace loom::train {
namespace {

using ::testing::HasSubstr;

JobConfig parse(std::vector<std::string> args) {
  args.insert(args.begin(), "loom_train");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return parse_command_line(static_cast<int>(argv.size()), argv.data(), "test").job;
}

TEST(JobCommandLineTest, TrueFalseFlagsTakeTheLastFormGiven) {
  EXPECT_TRUE(parse({}).meta_init);
  EXPECT_FALSE(parse({"--no-meta-init"}).meta_init);
  EXPECT_TRUE(parse({"--no-meta-init", "--meta-init"}).meta_init);
  EXPECT_FALSE(parse({"--meta-init", "--no-meta-init"}).meta_init);
  EXPECT_FALSE(parse({"--meta-init=false"}).meta_init);
  EXPECT_TRUE(parse({"--meta-init=true"}).meta_init);
  EXPECT_TRUE(parse({"--resume"}).resume);
  EXPECT_FALSE(parse({"--resume", "--resume=false"}).resume);
  EXPECT_FALSE(parse({"--sequence-parallel=false"}).sequence_parallel);
}

TEST(JobCommandLineTest, AFlagValueOtherThanTrueOrFalseIsAnError) {
  EXPECT_THAT(testing::error_of([] { parse({"--meta-init=maybe"}); }),
              HasSubstr("--meta-init: expected true or false, got 'maybe'"));
  EXPECT_THAT(testing::error_of([] { parse({"--resume=0"}); }),
              HasSubstr("--resume: expected true or false, got '0'"));
}

}  // namespace
}  // namespace loom::train
