// FileStore: the conformance suite, processes sharing the file (fork), the world_size
// lifetime, recovery from a torn record, and the errors for bad paths.
#include "comm/file_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "base/error.h"
#include "tests/comm/store_conformance.h"

namespace loom::comm::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr Duration kLong = std::chrono::seconds(20);

// A fresh path under the test's temporary directory.
std::string fresh_path(const std::string& stem) {
  static std::atomic<int> counter{0};
  const char* dir = std::getenv("TEST_TMPDIR");
  return fmt::format("{}/{}-{}-{}", dir != nullptr ? dir : "/tmp", stem, ::getpid(),
                     counter.fetch_add(1));
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

class FileStoreHarness : public StoreHarness {
 public:
  FileStoreHarness() : path_(fresh_path("conformance")) {}
  ~FileStoreHarness() override { std::remove(path_.c_str()); }
  std::shared_ptr<Store> make_client() override {
    return std::make_shared<FileStore>(path_, -1, kLong);
  }

 private:
  std::string path_;
};

INSTANTIATE_TEST_SUITE_P(FileStore, StoreConformanceTest,
                         ::testing::Values(StoreHarnessFactory{
                             "FileStore", [] { return std::make_unique<FileStoreHarness>(); }}),
                         StoreHarnessName);

// Runs `child` in a forked process; returns its exit status (0 when `child` returned normally).
template <typename Fn>
pid_t fork_child(Fn&& child) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 0;
    try {
      child();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child failed: %s\n", e.what());
      code = 1;
    }
    std::_Exit(code);
  }
  return pid;
}

int wait_child(pid_t pid) {
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(FileStoreTest, ProcessesShareTheStoreAndAddsAreAtomicAcrossThem) {
  const std::string path = fresh_path("processes");
  FileStore parent(path, -1, kLong);
  constexpr int kAdds = 500;
  const pid_t pid = fork_child([&] {
    FileStore child(path, -1, kLong);
    child.wait({"parent-ready"});
    child.set("from-child", "hello parent");
    for (int i = 0; i < kAdds; ++i) child.add("counter", 1);
    child.add("children-done", 1);
  });
  parent.set("parent-ready", "1");
  for (int i = 0; i < kAdds; ++i) parent.add("counter", 1);
  EXPECT_EQ(parent.get_string("from-child"), "hello parent");  // waits for the child's set
  parent.wait({"children-done"});
  EXPECT_EQ(parent.get_string("counter"), std::to_string(2 * kAdds));
  EXPECT_EQ(wait_child(pid), 0);
  std::remove(path.c_str());
}

TEST(FileStoreTest, AGetInOneProcessWaitsForASetInAnother) {
  const std::string path = fresh_path("cross-get");
  FileStore parent(path, -1, kLong);
  const pid_t pid = fork_child([&] {
    std::this_thread::sleep_for(100ms);
    FileStore(path, -1, kLong).set("late", Bytes(100000, 9));
  });
  EXPECT_EQ(parent.get("late"), Bytes(100000, 9));
  EXPECT_EQ(wait_child(pid), 0);
  std::remove(path.c_str());
}

TEST(FileStoreTest, WorldSizeCountsInstancesAndTheLastOneRemovesTheFile) {
  const std::string path = fresh_path("lifetime");
  {
    FileStore a(path, 2, kLong);
    {
      FileStore b(path, 2, kLong);
      b.set("k", "v");
      EXPECT_EQ(a.get_string("k"), "v");
      try {
        FileStore extra(path, 2, kLong);
        FAIL() << "a third instance joined a world of 2";
      } catch (const Error& e) {
        EXPECT_THAT(e.what(), HasSubstr("instance 3 to open the file, but world_size is 2"));
        EXPECT_THAT(e.what(), HasSubstr(path));
        EXPECT_THAT(e.what(), HasSubstr("left over from an earlier run"));
      }
    }
    EXPECT_TRUE(exists(path));  // one of two has left
  }
  EXPECT_FALSE(exists(path));  // both have left
}

TEST(FileStoreTest, WithoutWorldSizeTheFileStays) {
  const std::string path = fresh_path("kept");
  { FileStore(path).set("k", "v"); }
  EXPECT_TRUE(exists(path));
  EXPECT_EQ(FileStore(path).get_string("k"), "v");
  std::remove(path.c_str());
}

TEST(FileStoreTest, ATornRecordAtTheEndIsIgnoredThenTruncated) {
  const std::string path = fresh_path("torn");
  FileStore(path).set("whole", "kept");
  {
    std::ofstream out(path, std::ios::binary | std::ios::app);
    const char partial[] = {1, 5, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 'a', 'b'};  // a set cut short
    out.write(partial, sizeof(partial));
  }
  ::testing::internal::CaptureStderr();
  FileStore store(path, -1, 200ms);
  EXPECT_EQ(store.get_string("whole"), "kept");
  EXPECT_FALSE(store.check({"abcde"}));
  store.set("next", "written");  // the writer drops the torn bytes first
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("dropping an incomplete record of 15 bytes"));
  FileStore reader(path);
  EXPECT_EQ(reader.get_string("next"), "written");
  EXPECT_EQ(reader.get_string("whole"), "kept");
  std::remove(path.c_str());
}

TEST(FileStoreTest, ErrorsNameThePath) {
  EXPECT_THAT([] { FileStore("/nonexistent-dir/loom/store"); },
              ::testing::ThrowsMessage<Error>(HasSubstr(
                  "cannot open '/nonexistent-dir/loom/store': No such file or directory")));
  const std::string path = fresh_path("foreign");
  { std::ofstream(path) << "not a store file"; }
  EXPECT_THAT([&] { FileStore{path}; }, ::testing::ThrowsMessage<Error>(HasSubstr(
                                            "'" + path + "' exists and is not a FileStore file")));
  std::remove(path.c_str());
  FileStore store(fresh_path("timeout"), -1, 200ms);
  EXPECT_THAT([&] { store.get("absent"); }, ::testing::ThrowsMessage<Error>(HasSubstr(fmt::format(
                                                "on '{}': key 'absent' was not set within the "
                                                "timeout of 200 ms",
                                                store.path()))));
  std::remove(store.path().c_str());
}

}  // namespace
}  // namespace loom::comm::testing
