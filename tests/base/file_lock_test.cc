// FileLock (base/file_lock.h): one holder at a time, what the holder wrote shown to the next,
// released on unlock, on destruction, and by the kernel when the holding process dies.
#include "base/file_lock.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>

#include "tests/testing/errors.h"

namespace loom {
namespace {

using testing::error_of;
using Result = FileLock::Result;

TEST(FileLockTest, OneHolderAtATime) {
  const std::string path = ::testing::TempDir() + "/held.lock";
  FileLock first, second;
  std::string holder;
  ASSERT_EQ(first.try_lock(path, "test", "pid 1 on here", &holder), Result::kLocked);
  EXPECT_TRUE(first.locked());
  // Another open of the file (as another job's) is refused, and told who holds it.
  EXPECT_EQ(second.try_lock(path, "test", "pid 2 on there", &holder), Result::kHeld);
  EXPECT_FALSE(second.locked());
  EXPECT_EQ(holder, "pid 1 on here");
  first.unlock();
  // Its note went with it: a later holder that cannot write the file shows no stale pid.
  std::ifstream note(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(note), {}), "");
  ASSERT_EQ(second.try_lock(path, "test", "pid 2 on there", &holder), Result::kLocked);
  {
    FileLock moved = std::move(second);  // the lock moves with it
    EXPECT_EQ(first.try_lock(path, "test", "pid 1 again", &holder), Result::kHeld);
  }  // destroyed: released
  EXPECT_EQ(first.try_lock(path, "test", "pid 1 again", &holder), Result::kLocked);
}

TEST(FileLockTest, ReleasedWhenTheHolderIsKilled) {
  const std::string path = ::testing::TempDir() + "/killed.lock";
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    FileLock lock;
    std::string holder;
    const bool locked = lock.try_lock(path, "test", "the child", &holder) == Result::kLocked;
    const char byte = locked ? 1 : 0;
    [[maybe_unused]] const ssize_t n = ::write(ready[1], &byte, 1);
    ::pause();  // until killed
    ::_exit(0);
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ASSERT_EQ(byte, 1);
  FileLock mine;
  std::string holder;
  EXPECT_EQ(mine.try_lock(path, "test", "the parent", &holder), Result::kHeld);
  EXPECT_EQ(holder, "the child");
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_EQ(mine.try_lock(path, "test", "the parent", &holder), Result::kLocked);
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST(FileLockTest, ALockFileThisProcessCannotWriteIsLockedReadOnly) {
  // Another user's lock file in a shared folder: read-only here, still lockable (as root, which
  // writes anything, the mode alone shows nothing: skipped).
  if (::geteuid() == 0) GTEST_SKIP() << "root writes a read-only file";
  const std::string path = ::testing::TempDir() + "/readonly.lock";
  {
    FileLock make;
    std::string holder;
    ASSERT_EQ(make.try_lock(path, "test", "maker", &holder), Result::kLocked);
  }
  ASSERT_EQ(::chmod(path.c_str(), 0444), 0);
  FileLock lock;
  std::string holder;
  EXPECT_EQ(lock.try_lock(path, "test", "reader", &holder), Result::kLocked);
}

TEST(FileLockTest, AFileThatCannotBeOpenedIsNamed) {
  FileLock lock;
  std::string holder;
  EXPECT_EQ(
      error_of([&] { lock.try_lock("/no/such/folder/x.lock", "--checkpoint-dir", "", &holder); }),
      "--checkpoint-dir: cannot open the lock file '/no/such/folder/x.lock': No such file or "
      "directory");
  // The same command would meet it again: a job exits 2 on it, and is not restarted.
  EXPECT_THROW(lock.try_lock("/no/such/folder/x.lock", "--checkpoint-dir", "", &holder),
               InputError);
}

}  // namespace
}  // namespace loom
