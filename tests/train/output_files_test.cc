// A job's output files (train/output_files.h): the metrics' LineWriter writes whole lines in
// place and syncs on close; write_file replaces a file whole; failures name the flag and path.
#include "train/output_files.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/testing/errors.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;
using loom::testing::error_of;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "/" + name; }

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(OutputFilesTest, LineWriterWritesEachLineThroughAndTruncatesAnOldFile) {
  const std::string path = temp_path("metrics.jsonl");
  std::ofstream(path) << "an old run's lines\n";
  LineWriter metrics;
  EXPECT_FALSE(metrics.is_open());
  metrics = LineWriter(path, "--metrics-out");
  EXPECT_TRUE(metrics.is_open());
  metrics.write_line(R"({"step":0})");
  EXPECT_EQ(read(path), "{\"step\":0}\n");  // visible before close: written, not buffered
  metrics.write_line(R"({"step":1})");
  metrics.close();
  EXPECT_FALSE(metrics.is_open());
  EXPECT_EQ(read(path), "{\"step\":0}\n{\"step\":1}\n");
  EXPECT_THAT(error_of([&] { metrics.write_line("late"); }),
              AllOf(HasSubstr(path), HasSubstr("is not open")));
  metrics.close();  // a second close does nothing
}

TEST(OutputFilesTest, LineWriterInAppendModeGoesOnAfterTheLinesThere) {
  const std::string path = temp_path("resumed.jsonl");
  std::ofstream(path) << "{\"step\":0}\n";
  LineWriter metrics(path, "--metrics-out", SyncedFileWriter::Mode::kAppend);
  metrics.write_line(R"({"step":1})");
  metrics.close();
  EXPECT_EQ(read(path), "{\"step\":0}\n{\"step\":1}\n");
  // No file yet: created, as in truncate mode.
  const std::string fresh = temp_path("fresh.jsonl");
  fs::remove(fresh);
  LineWriter created(fresh, "--metrics-out", SyncedFileWriter::Mode::kAppend);
  created.write_line("a");
  created.close();
  EXPECT_EQ(read(fresh), "a\n");
}

TEST(OutputFilesTest, LineWriterNamesTheFlagAndPathItCannotOpen) {
  const std::string path = temp_path("missing/metrics.jsonl");
  EXPECT_THAT(
      error_of([&] { LineWriter(path, "--metrics-out"); }),
      AllOf(HasSubstr("--metrics-out: "), HasSubstr(path), HasSubstr("No such file or directory")));
}

TEST(OutputFilesTest, WriteFileReplacesTheFileWhole) {
  const std::string path = temp_path("loss.png.dat");
  std::ofstream(path) << "0 9.0\n1 8.0\n2 7.0\n";
  write_file(path, "0 5.5\n", "--plot-out");
  EXPECT_EQ(read(path), "0 5.5\n");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_THAT(error_of([&] { write_file(temp_path("missing/p.dat"), "x", "--plot-out"); }),
              AllOf(HasSubstr("--plot-out: "), HasSubstr(temp_path("missing/p.dat"))));
}

}  // namespace
}  // namespace loom::train
