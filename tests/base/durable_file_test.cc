// Durable writes (base/durable_file.h): an atomic write replaces the file whole and leaves no
// temporary file; failures throw naming the caller's `what`, the path and the reason, and leave
// the old file; the streaming writer removes its temporary file unless committed; the in-place
// writer and sync_directory. Signals are tested in durable_file_signal_test.cc.
#include "base/durable_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "tests/testing/errors.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using loom::testing::error_of;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A fresh empty folder per test.
class DurableFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // The names in the folder, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void put(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST_F(DurableFileTest, AtomicWriteReplacesTheFileAndLeavesNoTemporaryFile) {
  put(path("out.txt"), "an older and longer content");
  const std::string bytes("new\0bytes\n", 10);  // binary, with a NUL
  write_file_atomically(path("out.txt"), bytes, "--out");
  EXPECT_EQ(read(path("out.txt")), bytes);
  EXPECT_THAT(entries(), ElementsAre("out.txt"));
  write_file_atomically(path("out.txt"), "", "--out");
  EXPECT_EQ(read(path("out.txt")), "");
  EXPECT_THAT(entries(), ElementsAre("out.txt"));
}

// A killed writer's PATH.tmp is truncated and renamed away by the next write.
TEST_F(DurableFileTest, AStaleTemporaryFileIsReplaced) {
  put(path("out.txt.tmp"), "half a file from a writer that was killed");
  write_file_atomically(path("out.txt"), "whole", "--out");
  EXPECT_EQ(read(path("out.txt")), "whole");
  EXPECT_THAT(entries(), ElementsAre("out.txt"));
}

// A bare name lives in the working folder, which is the one synced.
TEST_F(DurableFileTest, ABareNameIsWrittenInTheWorkingFolder) {
  const fs::path previous = fs::current_path();
  fs::current_path(dir_);
  write_file_atomically("bare.txt", "here", "--out");
  fs::current_path(previous);
  EXPECT_EQ(read(path("bare.txt")), "here");
  EXPECT_THAT(entries(), ElementsAre("bare.txt"));
}

// A special file with nothing to sync (/dev/null, as --metrics-out /dev/null gives) is written,
// synced and closed without an error: its fsync's EINVAL is no failure to keep data.
TEST_F(DurableFileTest, DevNullTakesWritesAndSyncs) {
  SyncedFileWriter out("/dev/null", "--metrics-out", SyncedFileWriter::Mode::kAppend);
  out.write("step\n", 5);
  out.sync();
  out.close();
  EXPECT_FALSE(out.is_open());
}

TEST_F(DurableFileTest, AMissingFolderIsNamed) {
  const std::string target = path("missing/out.txt");
  EXPECT_THAT(error_of([&] { write_file_atomically(target, "x", "--metrics-out"); }),
              AllOf(HasSubstr("--metrics-out: "), HasSubstr(target),
                    HasSubstr("No such file or directory")));
  EXPECT_THAT(entries(), ElementsAre());
}

TEST_F(DurableFileTest, AReadOnlyFolderIsNamedAndTheOldFileKept) {
  if (::geteuid() == 0) {
    GTEST_SKIP() << "running as root, which writes into read-only folders regardless";
  }
  put(path("out.txt"), "old");
  ASSERT_EQ(::chmod(dir_.c_str(), 0555), 0);
  const std::string message =
      error_of([&] { write_file_atomically(path("out.txt"), "new", "--save"); });
  ::chmod(dir_.c_str(), 0755);
  EXPECT_THAT(message, AllOf(HasSubstr("--save: "), HasSubstr(path("out.txt")),
                             HasSubstr("Permission denied")));
  EXPECT_EQ(read(path("out.txt")), "old");
  EXPECT_THAT(entries(), ElementsAre("out.txt"));
}

TEST_F(DurableFileTest, APathThatIsAFolderIsNamedAndTheTemporaryFileRemoved) {
  fs::create_directories(path("out"));
  EXPECT_THAT(error_of([&] { write_file_atomically(path("out"), "x", "--plot-out"); }),
              AllOf(HasSubstr("--plot-out: cannot rename '" + path("out.tmp") + "' to '" +
                              path("out") + "'"),
                    HasSubstr("Is a directory")));
  EXPECT_TRUE(fs::is_directory(path("out")));
  EXPECT_THAT(entries(), ElementsAre("out"));
}

TEST_F(DurableFileTest, StreamingWriterShowsNothingUntilCommit) {
  put(path("big.bin"), "old");
  {
    AtomicFileWriter writer(path("big.bin"), "safetensors");
    EXPECT_EQ(writer.temp_path(), path("big.bin.tmp"));
    writer.write("abc", 3);
    writer.write("", 0);
    writer.write("defg", 4);
    EXPECT_EQ(read(path("big.bin")), "old");  // a reader still sees the old file
    writer.commit();
    EXPECT_EQ(read(path("big.bin")), "abcdefg");
    EXPECT_THAT(error_of([&] { writer.commit(); }), HasSubstr("already committed"));
  }
  EXPECT_EQ(read(path("big.bin")), "abcdefg");  // the destructor leaves a committed file
  EXPECT_THAT(entries(), ElementsAre("big.bin"));
}

// Two writers of one PATH at once (two jobs given one --save): the second fails naming PATH,
// and the first one's temporary file, bytes and commit are untouched; once it committed, PATH's
// temporary name is free for the next writer.
TEST_F(DurableFileTest, ASecondWriterOfOnePathFailsAndTheFirstCommits) {
  {
    AtomicFileWriter first(path("model.safetensors"), "--save");
    first.write("first's bytes", 13);
    EXPECT_THAT(
        error_of([&] { AtomicFileWriter second(path("model.safetensors"), "--save"); }),
        AllOf(HasSubstr("--save: cannot write '" + path("model.safetensors") + "': another writer"),
              HasSubstr("holds '" + path("model.safetensors.tmp") + "'")));
    EXPECT_THROW(write_file_atomically(path("model.safetensors"), "x", "--save"), PathBusyError);
    EXPECT_EQ(read(path("model.safetensors.tmp")), "first's bytes");
    first.write("!", 1);
    first.commit();
  }
  EXPECT_EQ(read(path("model.safetensors")), "first's bytes!");
  write_file_atomically(path("model.safetensors"), "next", "--save");
  EXPECT_EQ(read(path("model.safetensors")), "next");
  EXPECT_THAT(entries(), ElementsAre("model.safetensors"));
}

// Another process holding PATH's temporary file: the same refusal (the lock is the file's, not
// the process's), and a killed writer's leftover file, holding no lock, is taken over.
TEST_F(DurableFileTest, AWriterInAnotherProcessIsRefusedUntilItEnds) {
  int ready[2], release[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(release), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    AtomicFileWriter writer(path("out.bin"), "child");
    writer.write("child", 5);
    char byte = 1;
    (void)!::write(ready[1], &byte, 1);
    (void)!::read(release[0], &byte, 1);
    ::_exit(0);  // dies uncommitted, as a killed writer: its file stays, unlocked
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  EXPECT_THAT(error_of([&] { write_file_atomically(path("out.bin"), "parent", "--out"); }),
              HasSubstr("another writer"));
  EXPECT_EQ(read(path("out.bin.tmp")), "child");
  ASSERT_EQ(::write(release[1], &byte, 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  write_file_atomically(path("out.bin"), "parent", "--out");
  EXPECT_EQ(read(path("out.bin")), "parent");
  EXPECT_THAT(entries(), ElementsAre("out.bin"));
  for (int fd : {ready[0], ready[1], release[0], release[1]}) ::close(fd);
}

TEST_F(DurableFileTest, StreamingWriterDestroyedUncommittedRemovesItsTemporaryFile) {
  put(path("big.bin"), "old");
  {
    AtomicFileWriter writer(path("big.bin"), "safetensors");
    writer.write("partial", 7);
    EXPECT_EQ(read(path("big.bin.tmp")), "partial");
  }
  EXPECT_EQ(read(path("big.bin")), "old");
  EXPECT_THAT(entries(), ElementsAre("big.bin"));
  {
    AtomicFileWriter writer(path("new.bin"), "safetensors");  // no old file
    writer.write("partial", 7);
  }
  EXPECT_THAT(entries(), ElementsAre("big.bin"));
}

// More writers at once than the signal registry has slots still write (unprotected).
TEST_F(DurableFileTest, ManyWritersAtOnceAllCommit) {
  std::vector<std::unique_ptr<AtomicFileWriter>> writers;
  for (int i = 0; i < 80; ++i) {
    writers.push_back(std::make_unique<AtomicFileWriter>(path(std::to_string(i)), "many"));
    writers.back()->write("x", 1);
  }
  for (auto& writer : writers) writer->commit();
  writers.clear();
  EXPECT_EQ(entries().size(), 80u);
  EXPECT_EQ(read(path("79")), "x");
}

TEST_F(DurableFileTest, SyncedWriterWritesInPlace) {
  put(path("rank.bin"), "an older and longer content");
  SyncedFileWriter writer(path("rank.bin"), "checkpoint");
  EXPECT_TRUE(writer.is_open());
  writer.write("ab", 2);
  EXPECT_EQ(read(path("rank.bin")), "ab");  // in place: truncated, then written through
  SyncedFileWriter moved = std::move(writer);
  moved.sync();  // durable so far, and still open
  EXPECT_TRUE(moved.is_open());
  moved.write("c", 1);
  moved.close();
  EXPECT_FALSE(moved.is_open());
  EXPECT_EQ(read(path("rank.bin")), "abc");
  EXPECT_THAT(error_of([&] { moved.write("d", 1); }),
              AllOf(HasSubstr("checkpoint: cannot write '" + path("rank.bin") + "'"),
                    HasSubstr("not open")));
  EXPECT_THAT(error_of([&] { moved.sync(); }),
              AllOf(HasSubstr("checkpoint: cannot sync '" + path("rank.bin") + "'"),
                    HasSubstr("not open")));
  write_file_synced(path("meta.json"), "{}", "checkpoint");
  EXPECT_EQ(read(path("meta.json")), "{}");
  EXPECT_THAT(error_of([&] { write_file_synced(path("no/meta.json"), "{}", "checkpoint"); }),
              AllOf(HasSubstr("checkpoint: cannot create '" + path("no/meta.json") + "'"),
                    HasSubstr("No such file or directory")));
}

TEST_F(DurableFileTest, SyncDirectoryNamesWhatIsNotAFolder) {
  sync_directory(dir_.string(), "checkpoint");
  put(path("file"), "x");
  EXPECT_THAT(error_of([&] { sync_directory(path("file"), "checkpoint"); }),
              AllOf(HasSubstr("checkpoint: cannot open the directory '" + path("file") + "'"),
                    HasSubstr("Not a directory")));
  EXPECT_THAT(error_of([&] { sync_directory(path("none"), "checkpoint"); }),
              AllOf(HasSubstr(path("none")), HasSubstr("No such file or directory")));
}

}  // namespace
}  // namespace loom
