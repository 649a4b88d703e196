// fault_rank: one rank of a real multi-process Gloo job that injects a fault on one rank — the
// program that //tests/comm/multiprocess:faults_test launches N times (directly, or through
// loomrun).
//
//   RANK=r WORLD_SIZE=n MASTER_ADDR=127.0.0.1 MASTER_PORT=p fault_rank --fault F --victim V
//
// Every rank calls init_process_group("gloo") with InitOptions::timeout = --timeout-ms (the
// group's operation timeout too), runs --warmup all_reduces (#0 .. #W-1, checking the sums),
// then all ranks call all_reduce #W (the "fault op") while rank V does, by --fault:
//   none            nothing (every rank exits 0)
//   kill_in_op      issues all_reduce #W, then raise(SIGKILL) before waiting on it (the others
//                   issue #W 100 ms later, so the victim is certainly inside its op)
//   kill_mid_large  issues a --large-elements all_reduce #W with everyone, sleeps 1 ms, then
//                   raise(SIGKILL) while the transfers are in flight
//   stop_before_op  raise(SIGSTOP) before issuing #W (the test SIGKILLs it afterwards)
//   exit_between    std::exit(0) after #W-1, with its group still alive, while the others call #W
//   mismatch_op     calls broadcast #W instead of all_reduce (needs LOOM_DEBUG=collectives)
//   mismatch_size   calls all_reduce #W with twice the elements (needs LOOM_DEBUG=collectives)
// A rank that catches a loom::Error prints "fault_rank: rank R caught loom::Error after T ms: ..."
// on stderr and exits kCaughtError (17). A survivor whose fault op succeeds runs 3 more
// all_reduces; if none fails it prints "no error" and exits 0. Other exits: 2 bad flags,
// 3 init_process_group failed, 4 wrong warm-up sums, 5 another exception type.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "base/error.h"
#include "comm/init.h"
#include "tensor/ops.h"

namespace {

constexpr int kCaughtError = 17;
constexpr int kBadFlags = 2;
constexpr int kInitFailed = 3;
constexpr int kWrongSum = 4;
constexpr int kOtherException = 5;
constexpr int64_t kSmallElements = 1024;

using Clock = std::chrono::steady_clock;

int64_t ms_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

void write_pid_file(const std::string& dir, int rank) {
  if (dir.empty()) return;
  const std::string path = fmt::format("{}/rank-{}.pid", dir, rank);
  const std::string text = fmt::format("{}\n", getpid());
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  ssize_t ignored = write(fd, text.data(), text.size());
  (void)ignored;
  close(fd);
}

// Prints to stderr with the rank, unbuffered (the process may be killed right after).
template <typename... Args>
void say(int rank, fmt::format_string<Args...> format, Args&&... args) {
  fmt::print(stderr, "fault_rank: rank {} {}\n", rank,
             fmt::format(format, std::forward<Args>(args)...));
  std::fflush(stderr);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace loom;
  CLI::App app{"One rank of a multi-process Gloo job that injects a fault on one rank"};
  std::string fault = "none";
  int victim = 1;
  int timeout_ms = 2000;
  int warmup = 3;
  int64_t large_elements = 16 << 20;
  std::string pid_dir;
  app.add_option("--fault", fault, "which fault rank --victim injects")
      ->check(CLI::IsMember({"none", "kill_in_op", "kill_mid_large", "stop_before_op",
                             "exit_between", "mismatch_op", "mismatch_size"}));
  app.add_option("--victim", victim, "the rank that injects the fault")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--timeout-ms", timeout_ms,
                 "InitOptions::timeout (rendezvous and every operation)")
      ->check(CLI::Range(100, 600000));
  app.add_option("--warmup", warmup, "all_reduces before the fault op")->check(CLI::Range(0, 1000));
  app.add_option("--large-elements", large_elements, "f32 elements of kill_mid_large's all_reduce")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--pid-dir", pid_dir, "write this process's pid to DIR/rank-<RANK>.pid");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kBadFlags;
  }
  const char* debug = std::getenv("LOOM_DEBUG");
  const bool debug_collectives =
      debug != nullptr && std::string(debug).find("collectives") != std::string::npos;
  if ((fault == "mismatch_op" || fault == "mismatch_size") && !debug_collectives) {
    fmt::print(stderr,
               "fault_rank: --fault {} needs LOOM_DEBUG=collectives (without it Gloo aborts the "
               "process)\n",
               fault);
    return kBadFlags;
  }

  const auto timeout = std::chrono::milliseconds(timeout_ms);
  std::shared_ptr<comm::ProcessGroup> world;
  const char* rank_env = std::getenv("RANK");
  write_pid_file(pid_dir, rank_env ? std::atoi(rank_env) : -1);
  try {
    world = comm::init_process_group("gloo", comm::InitOptions{.timeout = timeout});
  } catch (const std::exception& e) {
    fmt::print(stderr, "fault_rank: init_process_group failed: {}\n", e.what());
    return kInitFailed;
  }
  const int rank = world->rank();
  const int size = world->size();
  if (victim >= size) {
    say(rank, "--victim {} is not a rank of a world of {}", victim, size);
    return kBadFlags;
  }
  const bool is_victim = rank == victim;

  Clock::time_point start = Clock::now();
  try {
    for (int i = 0; i < warmup; ++i) {
      Tensor t = ops::full({kSmallElements}, rank + 1.0);
      world->all_reduce(t)->wait();
      const double expected = size * (size + 1) / 2.0;
      if (ops::to_vector(t)[0] != expected) {
        say(rank, "warm-up all_reduce #{} gave {}, expected {}", i, ops::to_vector(t)[0], expected);
        return kWrongSum;
      }
    }
    say(rank, "warmed up ({} all_reduces); fault '{}' on rank {}", warmup, fault, victim);

    start = Clock::now();
    if (is_victim) {
      if (fault == "kill_in_op") {
        Tensor t = ops::ones({kSmallElements});
        auto work = world->all_reduce(t);
        std::raise(SIGKILL);
      } else if (fault == "kill_mid_large") {
        Tensor t = ops::ones({large_elements});
        auto work = world->all_reduce(t);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::raise(SIGKILL);
      } else if (fault == "stop_before_op") {
        std::raise(SIGSTOP);
        say(rank, "continued after SIGSTOP");
      } else if (fault == "exit_between") {
        std::exit(0);
      } else if (fault == "mismatch_op") {
        Tensor t = ops::ones({kSmallElements});
        world->broadcast(t, 0)->wait();
      } else if (fault == "mismatch_size") {
        Tensor t = ops::ones({2 * kSmallElements});
        world->all_reduce(t)->wait();
      }
    }
    // The survivors (and the victim of "none"): the fault op, then a few more.
    if (fault == "kill_in_op") std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const int64_t elements = fault == "kill_mid_large" ? large_elements : kSmallElements;
    for (int i = 0; i < 4; ++i) {
      Tensor t = ops::ones({i == 0 ? elements : kSmallElements});
      world->all_reduce(t)->wait();
    }
    if (fault != "none") {
      say(rank, "no error: the fault op and 3 more all_reduces succeeded");
    }
    return 0;
  } catch (const Error& e) {
    say(rank, "caught loom::Error after {} ms: {}", ms_since(start), e.what());
    return kCaughtError;
  } catch (const std::exception& e) {
    say(rank, "caught a std::exception that is not a loom::Error after {} ms: {}", ms_since(start),
        e.what());
    return kOtherException;
  }
}
