#include "tools/loomrun/exit_status.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>

namespace loom::loomrun {
namespace {

// The real wait status of a child that exits with `code`, or raises `signal_number` when > 0.
int wait_status_of(int code, int signal_number = 0) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (signal_number > 0) {
      signal(signal_number, SIG_DFL);
      raise(signal_number);
    }
    _exit(code);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

TEST(ExitStatusTest, NamesSignals) {
  EXPECT_EQ(signal_name(SIGKILL), "SIGKILL");
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
  EXPECT_EQ(signal_name(SIGINT), "SIGINT");
  EXPECT_EQ(signal_name(200), "signal 200");
}

TEST(ExitStatusTest, CleanExit) {
  const int status = wait_status_of(0);
  EXPECT_FALSE(is_failure(status));
  EXPECT_EQ(exit_code_of(status), 0);
  EXPECT_EQ(describe_wait_status(status), "exited with status 0");
}

TEST(ExitStatusTest, NonZeroExit) {
  const int status = wait_status_of(3);
  EXPECT_TRUE(is_failure(status));
  EXPECT_EQ(exit_code_of(status), 3);
  EXPECT_EQ(describe_wait_status(status), "exited with status 3");
}

TEST(ExitStatusTest, KilledBySignalIs128PlusTheSignal) {
  const int status = wait_status_of(0, SIGKILL);
  EXPECT_TRUE(is_failure(status));
  EXPECT_EQ(exit_code_of(status), 137);
  EXPECT_EQ(describe_wait_status(status), "was killed by signal 9 (SIGKILL)");
  EXPECT_EQ(exit_code_of(wait_status_of(0, SIGTERM)), 143);
}

}  // namespace
}  // namespace loom::loomrun
