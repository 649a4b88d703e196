// Supervises the started ranks until every one has exited: copies their output with a
// "[rank R] " prefix, reaps them, and stops the job (SIGTERM to every rank's process group,
// SIGKILL after the grace period) when
//   - a rank exits non-zero or is killed by a signal   -> exit code: that rank's (128 + signal)
//   - loomrun gets SIGINT, SIGTERM or SIGHUP            -> forwarded; exit code 128 + signal
//     (a second one while stopping sends SIGKILL at once)
//   - --timeout-s passes                                -> exit code 124, like timeout(1)
// A rank that exits 3 (comm::kExitPeerFailed: another rank's failure ended it) does not stop the
// job at once: the rank that failed of itself is likely exiting a moment later, and is named and
// decides the exit code instead when it exits within peer_failure_wait_s (comm::kPeerFailureWait).
// The first cause decides the exit code; when every rank exits 0 it is 0. The last lines name
// the cause of a failure when it is another rank: one stopped (SIGSTOP) while the others timed
// out waiting for it, or one that exited 0 while the others still needed it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/launch_env.h"
#include "tools/loomrun/child_process.h"
#include "tools/loomrun/line_prefixer.h"
#include "tools/loomrun/signal_pipe.h"

namespace loom::loomrun {

// Exit code when --timeout-s stopped the job.
inline constexpr int kTimeoutExitCode = 124;

struct SupervisorConfig {
  double grace_s = 10;   // SIGTERM -> SIGKILL delay
  double timeout_s = 0;  // job time limit; 0: none
  // How long ranks that are all stopped (SIGSTOP) may stay so once every other rank has exited:
  // no peer is left to time out waiting for them (the collectives' default: 300 s, or
  // $LOOM_TIMEOUT_S), after which they are killed and the job fails, instead of waiting forever.
  double stopped_alone_s = 300;
  // How long a rank's exit with status 3 waits for the rank whose failure it reports (above).
  double peer_failure_wait_s = static_cast<double>(comm::kPeerFailureWait.count());
  int stdout_fd = 1;  // where the ranks' prefixed stdout goes
  int stderr_fd = 2;  // where the ranks' prefixed stderr goes
};

class Supervisor {
 public:
  // `signals` must deliver SIGCHLD and the signals to forward (SIGINT, SIGTERM, SIGHUP).
  Supervisor(SupervisorConfig config, SignalPipe& signals);
  ~Supervisor();

  // Takes over a started rank.
  void add_rank(int rank, ChildProcess child);

  // Stops every rank added so far (SIGTERM, then SIGKILL after the grace period) with
  // `exit_code` as loomrun's exit code; for when the launch itself failed. Call run() next to
  // reap them.
  void abort_launch(int exit_code);

  // Runs until every rank has exited and returns loomrun's exit code.
  int run();
  // After run(): the lines naming another rank as the failure's cause (a stopped one, or one that
  // had left), which loomrun prints last, after the flight recorder's report.
  void print_cause() const;
  // After run(): whether the job ended because a rank failed (not a signal to loomrun, its
  // timeout or a failed launch) — what --max-restarts restarts — and that failure, in words
  // ("rank 2 (pid 1234) exited with status 1").
  bool failed_by_rank() const { return !first_failure_.empty(); }
  const std::string& first_failure() const { return first_failure_; }
  // After run(), when failed_by_rank(): the failure's cause, in words — a rank stopped (SIGSTOP)
  // or gone while the others waited for it when there was one (print_cause's first line), else
  // first_failure(). What a restart names.
  std::string cause() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct RankState;
  struct Stream;

  void start_stopping(int signal_number, int exit_code);
  void kill_remaining();
  void on_launcher_signal(int signal_number);
  void on_rank_exit(RankState& state, int wait_status);
  // A rank's exit that stops the job.
  struct Exit {
    int rank;
    pid_t pid;
    int wait_status;
    Clock::time_point when;
  };
  // Stops the job for `failed`, naming it (and what it likely waited for) as the cause.
  void fail_job(const Exit& failed);
  void reap();
  int running_ranks() const;
  // The ranks still running that a signal stopped (SIGSTOP, SIGTSTP), in rank order.
  std::vector<const RankState*> stopped_ranks() const;
  int poll_timeout_ms() const;
  void check_deadlines();

  SupervisorConfig config_;
  SignalPipe& signals_;
  std::vector<std::unique_ptr<RankState>> ranks_;
  std::vector<std::string> stalled_;  // ranks that were stopped when the first one failed
  // Ranks that exited 0 while others still ran, and, once one of those failed, the lines that
  // name them as the cause.
  struct Departure {
    int rank;
    pid_t pid;
    Clock::time_point when;
  };
  std::vector<Departure> departed_;
  std::vector<std::string> departures_before_failure_;
  Clock::time_point start_;
  bool stopping_ = false;
  int stop_signal_ = 0;           // the signal that began stopping (SIGTERM, or a forwarded one)
  std::optional<int> exit_code_;  // set by the first cause of stopping
  std::string first_failure_;     // when that cause was a rank's failure
  // The first rank that exited 3 while no failure had stopped the job yet (see the top).
  std::optional<Exit> peer_failure_;
  int peer_failures_ = 0;             // ranks that exited kExitPeerFailed
  bool peer_failure_logged_ = false;  // loomrun said it waits for the rank that failed
  std::optional<Clock::time_point> kill_deadline_;
  // When the ranks still running all became stopped with no other rank left (stopped_alone_s).
  std::optional<Clock::time_point> stopped_alone_since_;
  bool stopped_alone() const;
};

}  // namespace loom::loomrun
