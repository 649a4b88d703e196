// A resumed job's metrics (train/metrics_history.h): the lines of the steps before the
// checkpoint's, training and validation, in order; the rest and torn lines dropped.
#include "train/metrics_history.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace loom::train {
namespace {

using Points = std::vector<std::pair<int, double>>;

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "/" + name; }

TEST(MetricsHistoryTest, KeepsTheLinesOfTheStepsTheCheckpointHolds) {
  const std::string path = temp_path("metrics.jsonl");
  std::ofstream(path) << R"({"step":0,"loss":4.5,"lr":0.001})"
                         "\n"
                      << R"({"step":1,"loss":4.25,"lr":0.001})"
                         "\n"
                      << R"({"step":1,"val_loss":4.375,"val_tokens":64})"
                         "\n"
                      << R"({"step":2,"loss":4.0,"lr":0.001})"
                         "\n"
                      << R"({"step":3,"loss":3.5,"lr":0.001})"
                         "\n"
                      << R"({"step":4,"lo)";  // cut short by a kill
  const MetricsHistory history = read_metrics_before(path, 2);
  ASSERT_EQ(history.lines.size(), 3u);
  EXPECT_EQ(history.lines[0], R"({"step":0,"loss":4.5,"lr":0.001})");
  EXPECT_EQ(history.lines[2], R"({"step":1,"val_loss":4.375,"val_tokens":64})");
  EXPECT_EQ(history.curve.train, (Points{{0, 4.5}, {1, 4.25}}));
  EXPECT_EQ(history.curve.validation, (Points{{1, 4.375}}));
  // Resumed at step 4: steps 0-3 kept; the torn line of step 4 is not a line.
  EXPECT_EQ(read_metrics_before(path, 4).lines.size(), 5u);
  EXPECT_TRUE(read_metrics_before(path, 0).lines.empty());
}

TEST(MetricsHistoryTest, NoFileIsNoHistoryAndNonRecordsAreSkipped) {
  const std::string missing = temp_path("missing.jsonl");
  std::filesystem::remove(missing);
  EXPECT_TRUE(read_metrics_before(missing, 5).lines.empty());
  const std::string path = temp_path("odd.jsonl");
  std::ofstream(path) << "not json\n[1,2]\n"
                      << R"({"step":"one"})"
                         "\n"
                      << R"({"loss":1.0})"
                         "\n"
                      << R"({"step":0,"loss":2.0})"
                         "\n";
  const MetricsHistory history = read_metrics_before(path, 5);
  ASSERT_EQ(history.lines.size(), 1u);
  EXPECT_EQ(history.curve.train, (Points{{0, 2.0}}));
}

}  // namespace
}  // namespace loom::train
