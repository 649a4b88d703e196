// SIGINT and SIGTERM during an atomic write (base/durable_file.h), with real signals: each test
// forks a child that starts writing, tells the parent through a pipe that it is mid-write, and
// gets the signal from the parent. The temporary file must be gone and the child must end as
// the signal's disposition says (dies of it, a previous handler's exit, or ignored). This
// process never writes durably itself, so every child installs the cleanup afresh, after setting
// the disposition its test is about.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "base/durable_file.h"
#include "base/error.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void tell(int fd) {
  const char byte = 'x';
  while (::write(fd, &byte, 1) < 0 && errno == EINTR) {
  }
}

// Waits for one byte; false when the other side closed the pipe (it died or exited).
bool wait_for(int fd) {
  char byte;
  ssize_t n;
  do {
    n = ::read(fd, &byte, 1);
  } while (n < 0 && errno == EINTR);
  return n == 1;
}

void set_disposition(int signal, void (*handler)(int)) {
  struct sigaction action {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  ::sigaction(signal, &action, nullptr);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, signal);
  ::sigprocmask(SIG_UNBLOCK, &set, nullptr);  // whatever the test runner left blocked
}

struct Child {
  pid_t pid;
  int ready;  // the child writes a byte here when it is mid-write
  int go;     // the parent writes a byte here to let it go on
};

// Runs `body(ready, go)` in a child process whose exit code is its result (98: it threw).
Child start_child(const std::function<int(int ready, int go)>& body) {
  int ready[2], go[2];
  EXPECT_EQ(::pipe(ready), 0);
  EXPECT_EQ(::pipe(go), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(ready[0]);
    ::close(go[1]);
    ::alarm(30);  // a child the test forgets dies of SIGALRM rather than hanging the suite
    int code = 98;
    try {
      code = body(ready[1], go[0]);
    } catch (...) {
    }
    ::_exit(code);
  }
  ::close(ready[1]);
  ::close(go[0]);
  return {pid, ready[0], go[1]};
}

// Waits for the child and closes its pipes.
int finish(const Child& child) {
  int status = 0;
  while (::waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
  }
  ::close(child.ready);
  ::close(child.go);
  return status;
}

std::string describe(int status) {
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "exited with " + std::to_string(WEXITSTATUS(status));
}

class DurableFileSignalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const fs::path dir = fs::path(::testing::TempDir()) /
                         ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir);
    fs::create_directories(dir);
    target_ = (dir / "model.safetensors").string();
    temp_ = target_ + ".tmp";
  }

  // A child that writes "half" of `target_`, says so, and waits for the signal.
  Child start_writer(int signal, void (*disposition)(int)) {
    return start_child([=, this](int ready, int) -> int {
      set_disposition(signal, disposition);
      AtomicFileWriter writer(target_, "--save");
      writer.write("half", 4);
      tell(ready);
      for (;;) ::pause();
    });
  }

  std::string target_, temp_;
};

TEST_F(DurableFileSignalTest, SigintMidWriteRemovesTheTemporaryFileAndKillsTheProcess) {
  const Child child = start_writer(SIGINT, SIG_DFL);
  ASSERT_TRUE(wait_for(child.ready));
  EXPECT_EQ(read(temp_), "half");  // the child is mid-write
  ASSERT_EQ(::kill(child.pid, SIGINT), 0);
  const int status = finish(child);
  ASSERT_TRUE(WIFSIGNALED(status)) << describe(status);
  EXPECT_EQ(WTERMSIG(status), SIGINT);
  EXPECT_FALSE(fs::exists(temp_));
  EXPECT_FALSE(fs::exists(target_));
}

TEST_F(DurableFileSignalTest, SigtermMidWriteKeepsTheOldFile) {
  std::ofstream(target_) << "old";
  const Child child = start_writer(SIGTERM, SIG_DFL);
  ASSERT_TRUE(wait_for(child.ready));
  EXPECT_EQ(read(temp_), "half");
  ASSERT_EQ(::kill(child.pid, SIGTERM), 0);
  const int status = finish(child);
  ASSERT_TRUE(WIFSIGNALED(status)) << describe(status);
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_FALSE(fs::exists(temp_));
  EXPECT_EQ(read(target_), "old");
}

// The handler the process had before its first durable write still runs, after the removal.
TEST_F(DurableFileSignalTest, AHandlerInstalledBeforeStillRuns) {
  const Child child = start_writer(SIGTERM, [](int) { ::_exit(42); });
  ASSERT_TRUE(wait_for(child.ready));
  ASSERT_EQ(::kill(child.pid, SIGTERM), 0);
  const int status = finish(child);
  ASSERT_TRUE(WIFEXITED(status)) << describe(status);
  EXPECT_EQ(WEXITSTATUS(status), 42);
  EXPECT_FALSE(fs::exists(temp_));
}

TEST_F(DurableFileSignalTest, AnIgnoredSignalStaysIgnoredAndTheWriteCompletes) {
  const Child child = start_child([this](int ready, int go) {
    set_disposition(SIGINT, SIG_IGN);
    AtomicFileWriter writer(target_, "--save");
    writer.write("half", 4);
    tell(ready);
    if (!wait_for(go)) return 2;
    writer.write(" and the rest", 13);
    writer.commit();
    return 0;
  });
  ASSERT_TRUE(wait_for(child.ready));
  ASSERT_EQ(::kill(child.pid, SIGINT), 0);  // discarded at once: SIGINT is ignored
  tell(child.go);
  const int status = finish(child);
  ASSERT_TRUE(WIFEXITED(status)) << describe(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(read(target_), "half and the rest");
  EXPECT_FALSE(fs::exists(temp_));
}

volatile sig_atomic_t g_handled = 0;

// A handler that returns (a graceful stop): the process lives on, the interrupted write fails
// naming the signal, and the next write is protected again.
TEST_F(DurableFileSignalTest, AWriteInterruptedByASurvivedSignalFails) {
  std::ofstream(target_) << "old";
  const Child child = start_child([this](int ready, int go) {
    set_disposition(SIGTERM, [](int) { g_handled = g_handled + 1; });
    for (int round = 1; round <= 2; ++round) {
      AtomicFileWriter writer(target_, "--save");
      writer.write("half", 4);
      tell(ready);
      if (!wait_for(go)) return 10;
      if (g_handled != round) return 20 + round;
      if (fs::exists(temp_)) return 30 + round;
      try {
        writer.commit();
        return 40 + round;
      } catch (const Error& e) {
        if (std::string(e.what()).find("--save: writing '" + target_ +
                                       "' was interrupted by signal 15") == std::string::npos) {
          return 50 + round;
        }
      }
    }
    return read(target_) == "old" ? 0 : 60;
  });
  for (int round = 1; round <= 2; ++round) {
    ASSERT_TRUE(wait_for(child.ready)) << "round " << round;
    ASSERT_EQ(::kill(child.pid, SIGTERM), 0);
    tell(child.go);
  }
  const int status = finish(child);
  ASSERT_TRUE(WIFEXITED(status)) << describe(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "see the child's return codes in the test";
  EXPECT_FALSE(fs::exists(temp_));
  EXPECT_EQ(read(target_), "old");
}

}  // namespace
}  // namespace loom
