#include "tools/loomrun/child_process.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "base/error.h"

namespace loom::loomrun {

namespace {

struct Pipe {
  UniqueFd read;
  UniqueFd write;
};

Pipe make_pipe() {
  int fds[2];
  LOOM_CHECK(pipe2(fds, O_CLOEXEC) == 0, "cannot create a pipe: {}", std::strerror(errno));
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (const std::string& s : strings) pointers.push_back(const_cast<char*>(s.c_str()));
  pointers.push_back(nullptr);
  return pointers;
}

// Runs in the forked child: only async-signal-safe calls, then exec. Never returns.
[[noreturn]] void exec_child(char* const* argv, char* const* envp, pid_t parent,
                             const sigset_t& original_mask, int stdin_fd, int stdout_fd,
                             int stderr_fd, int status_fd) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // loomrun died before prctl took effect
  for (int signal_number : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD, SIGPIPE}) {
    signal(signal_number, SIG_DFL);
  }
  sigprocmask(SIG_SETMASK, &original_mask, nullptr);
  if (dup2(stdin_fd, STDIN_FILENO) < 0 || dup2(stdout_fd, STDOUT_FILENO) < 0 ||
      dup2(stderr_fd, STDERR_FILENO) < 0) {
    const int error = errno;
    [[maybe_unused]] ssize_t n = write(status_fd, &error, sizeof(error));
    _exit(127);
  }
  execvpe(argv[0], argv, envp);
  const int error = errno;
  [[maybe_unused]] ssize_t n = write(status_fd, &error, sizeof(error));
  _exit(127);
}

void set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  LOOM_CHECK(flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0,
             "cannot make a pipe non-blocking: {}", std::strerror(errno));
}

}  // namespace

ChildProcess spawn_child(const std::vector<std::string>& command,
                         const std::vector<std::string>& environment) {
  LOOM_INTERNAL_ASSERT(!command.empty());
  UniqueFd dev_null(open("/dev/null", O_RDONLY | O_CLOEXEC));
  LOOM_CHECK(dev_null.valid(), "cannot open /dev/null: {}", std::strerror(errno));
  Pipe out = make_pipe();
  Pipe err = make_pipe();
  Pipe status = make_pipe();  // close-on-exec: EOF means exec succeeded, an errno means it failed
  std::vector<char*> argv = c_strings(command);
  std::vector<char*> envp = c_strings(environment);

  // Block every signal across fork so no handler of loomrun's runs in the child before exec.
  sigset_t all;
  sigset_t original_mask;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, &original_mask);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    exec_child(argv.data(), envp.data(), parent, original_mask, dev_null.get(), out.write.get(),
               err.write.get(), status.write.get());
  }
  const int fork_error = errno;
  if (pid > 0) setpgid(pid, pid);  // also here, so the group exists before we might signal it
  sigprocmask(SIG_SETMASK, &original_mask, nullptr);
  LOOM_CHECK(pid > 0, "cannot start '{}': fork failed: {}", command[0], std::strerror(fork_error));

  out.write.reset();
  err.write.reset();
  status.write.reset();
  int exec_error = 0;
  ssize_t got;
  do {
    got = read(status.read.get(), &exec_error, sizeof(exec_error));
  } while (got < 0 && errno == EINTR);
  if (got > 0) {
    int wait_status;
    while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
    }
    LOOM_FAIL("cannot start '{}': {}", command[0], std::strerror(exec_error));
  }
  set_nonblocking(out.read.get());
  set_nonblocking(err.read.get());
  return ChildProcess{pid, std::move(out.read), std::move(err.read)};
}

bool signal_process_group(pid_t pid, int signal_number) {
  LOOM_INTERNAL_ASSERT(pid > 0, "pid {}", pid);
  return kill(-pid, signal_number) == 0;
}

}  // namespace loom::loomrun
