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

TEST(MetricsHistoryTest, AnotherRunsLinesAreDroppedByTheCheckpointsLoss) {
  // The default --metrics-out is shared by every run in a folder: after another run wrote it,
  // the checkpoint's step-1 loss (4.25, bit for bit) is not the file's.
  const std::string path = temp_path("shared.jsonl");
  std::ofstream(path) << R"({"step":0,"loss":4.5})"
                         "\n"
                      << R"({"step":1,"loss":4.0999999999999996})"
                         "\n"
                      << R"({"step":2,"loss":3.75})"
                         "\n";
  const MetricsHistory other = read_metrics_before(path, 2, SavedLoss{1, 4.1000000000000005});
  EXPECT_TRUE(other.lines.empty());
  EXPECT_TRUE(other.curve.train.empty());
  EXPECT_EQ(other.dropped,
            "its step 1 logged loss 4.1 where the checkpoint's run logged 4.1000000000000005");
  // The same run's lines: kept, and nothing said.
  const MetricsHistory same = read_metrics_before(path, 2, SavedLoss{1, 4.1});
  EXPECT_EQ(same.lines.size(), 2u);
  EXPECT_EQ(same.dropped, "");
  // No line of the saved step (a file of another run that stopped earlier): dropped too.
  const MetricsHistory missing = read_metrics_before(path, 5, SavedLoss{4, 3.0});
  EXPECT_TRUE(missing.lines.empty());
  EXPECT_EQ(missing.dropped, "it has no line of the checkpoint's step 4");
  // Nothing to keep: nothing dropped.
  EXPECT_EQ(read_metrics_before(path, 0, SavedLoss{4, 3.0}).dropped, "");
}

}  // namespace
}  // namespace loom::train
