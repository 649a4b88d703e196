#include "tools/loomrun/supervisor.h"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstring>
#include <limits>

#include "base/error.h"
#include "comm/launch_env.h"
#include "tools/loomrun/exit_status.h"
#include "tools/loomrun/output.h"

namespace loom::loomrun {

namespace {

std::string ranks_phrase(int count) {
  return count == 1 ? "1 rank" : fmt::format("{} ranks", count);
}

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}

}  // namespace

// One output pipe of a rank and the prefixer its bytes go through.
struct Supervisor::Stream {
  UniqueFd fd;
  LinePrefixer prefixer;

  bool open() const { return fd.valid(); }

  // Reads what is available now (one chunk, or until the pipe is empty); closes the stream at
  // end of file.
  void read_available(bool until_drained) {
    static char buffer[64 * 1024];
    while (fd.valid()) {
      const ssize_t got = read(fd.get(), buffer, sizeof(buffer));
      if (got > 0) {
        prefixer.feed(std::string_view(buffer, static_cast<std::size_t>(got)));
        if (!until_drained) return;
      } else if (got < 0 && errno == EINTR) {
        continue;
      } else if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return;
      } else {
        close();  // end of file, or an error: nothing more will come
      }
    }
  }

  void close() {
    prefixer.finish();
    fd.reset();
  }
};

struct Supervisor::RankState {
  int rank;
  pid_t pid;
  bool running = true;
  Stream out;
  Stream err;
  int stopped_by = 0;  // the signal that stopped it (SIGSTOP, SIGTSTP, ...) while stopped, else 0
};

Supervisor::Supervisor(SupervisorConfig config, SignalPipe& signals)
    : config_(config), signals_(signals), start_(Clock::now()) {}

Supervisor::~Supervisor() = default;

void Supervisor::add_rank(int rank, ChildProcess child) {
  const std::string prefix = fmt::format("[rank {}] ", rank);
  const int stdout_fd = config_.stdout_fd;
  const int stderr_fd = config_.stderr_fd;
  ranks_.push_back(std::unique_ptr<RankState>(new RankState{
      rank,
      child.pid,
      true,
      Stream{std::move(child.stdout_read),
             LinePrefixer(prefix, [stdout_fd](std::string_view s) { write_all(stdout_fd, s); })},
      Stream{std::move(child.stderr_read),
             LinePrefixer(prefix, [stderr_fd](std::string_view s) { write_all(stderr_fd, s); })},
  }));
}

std::vector<const Supervisor::RankState*> Supervisor::stopped_ranks() const {
  std::vector<const RankState*> out;
  for (const auto& state : ranks_) {
    if (state->running && state->stopped_by != 0) out.push_back(state.get());
  }
  return out;
}

int Supervisor::running_ranks() const {
  return static_cast<int>(
      std::count_if(ranks_.begin(), ranks_.end(), [](const auto& r) { return r->running; }));
}

void Supervisor::start_stopping(int signal_number, int exit_code) {
  if (!exit_code_) exit_code_ = exit_code;
  if (!stopping_) stop_signal_ = signal_number;
  stopping_ = true;
  for (const auto& state : ranks_) {
    if (!state->running) continue;
    signal_process_group(state->pid, signal_number);
    // A stopped rank would hold the signal until SIGKILL: let it run to receive it.
    if (state->stopped_by != 0) signal_process_group(state->pid, SIGCONT);
  }
  if (!kill_deadline_) kill_deadline_ = Clock::now() + seconds(config_.grace_s);
}

void Supervisor::abort_launch(int exit_code) { start_stopping(SIGTERM, exit_code); }

void Supervisor::kill_remaining() {
  for (const auto& state : ranks_) {
    if (state->running) signal_process_group(state->pid, SIGKILL);
  }
}

void Supervisor::on_launcher_signal(int signal_number) {
  const int running = running_ranks();
  if (!stopping_) {
    log_line("got {}; forwarding it to {}", signal_name(signal_number), ranks_phrase(running));
    start_stopping(signal_number, 128 + signal_number);
  } else if (running > 0) {
    log_line("got {} while stopping; sending SIGKILL to {}", signal_name(signal_number),
             ranks_phrase(running));
    kill_remaining();
  }
}

void Supervisor::on_rank_exit(RankState& state, int wait_status) {
  state.running = false;
  // Everything the rank wrote before exiting is in its pipes now: copy it out and close them.
  state.out.read_available(/*until_drained=*/true);
  state.err.read_available(/*until_drained=*/true);
  state.out.close();
  state.err.close();
  if (stopping_) return;
  if (!is_failure(wait_status)) {
    // A rank that finishes while others still run is normal at the end of a job, but if one of
    // those then fails, this departure is what it most likely failed on (a collective its peer
    // never joined): remember it, to name it last.
    if (running_ranks() > 0) {
      departed_.push_back({state.rank, state.pid, Clock::now()});
    }
    if (peer_failure_ && running_ranks() == 0) fail_job(*peer_failure_);
    return;
  }
  const Exit exit{state.rank, state.pid, wait_status, Clock::now()};
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == comm::kExitPeerFailed) {
    // It failed because another rank did: that rank is likely exiting too, a moment later (its
    // peers see its connections close while it still unwinds). Wait a little for it, so that it
    // is the one named and its status the job's; stop the job with this one if none comes. A
    // rank stopped (SIGSTOP) is what it lost: none will fail of itself, so stop now.
    const bool stopped = !stopped_ranks().empty();
    ++peer_failures_;
    if (!peer_failure_) {
      peer_failure_ = exit;
      if (running_ranks() > 0 && !stopped) {
        peer_failure_logged_ = true;
        log_line(
            "rank {} (pid {}) exited with status {}: another rank failed; waiting up to {} s "
            "for that one to exit",
            state.rank, state.pid, comm::kExitPeerFailed, config_.peer_failure_wait_s);
      }
    }
    if (running_ranks() == 0 || stopped) fail_job(*peer_failure_);
    return;
  }
  fail_job(exit);
}

void Supervisor::fail_job(const Exit& failed) {
  // A departed rank is the cause of the failures that follow it: say so last. One that left
  // after the first failure (while loomrun waited for the rank that failed of itself) is not.
  const Clock::time_point first =
      peer_failure_ ? std::min(peer_failure_->when, failed.when) : failed.when;
  for (const Departure& d : departed_) {
    if (d.when > first) continue;
    departures_before_failure_.push_back(fmt::format(
        "rank {} (pid {}) had exited 0 after {:.1f} s, {:.1f} s before the first failure, while "
        "the others still ran: they were waiting for it",
        d.rank, d.pid, std::chrono::duration<double>(d.when - start_).count(),
        std::chrono::duration<double>(failed.when - d.when).count()));
  }
  // A rank stopped while the others run is what they were waiting for when they timed out:
  // remember it, to name it last.
  for (const RankState* other : stopped_ranks()) {
    stalled_.push_back(fmt::format("rank {} (pid {}), stopped by {}", other->rank, other->pid,
                                   signal_name(other->stopped_by)));
  }
  const int others = running_ranks();
  // Two or more ranks, and every one that failed, failed on a peer (a collective timed out
  // everywhere, say): the one reaped first is no more the cause than the others.
  const bool all_on_peers =
      others == 0 && peer_failure_ && peer_failure_->pid == failed.pid && peer_failures_ >= 2;
  if (!exit_code_) {
    first_failure_ = all_on_peers ? fmt::format(
                                        "every rank that failed ({}) failed on a peer, "
                                        "none of itself (status {})",
                                        peer_failures_, comm::kExitPeerFailed)
                                  : fmt::format("rank {} (pid {}) {}", failed.rank, failed.pid,
                                                describe_wait_status(failed.wait_status));
  }
  // The rank that exited 3, already named while loomrun waited: say why the wait ended.
  const bool reported =
      peer_failure_ && peer_failure_->pid == failed.pid && peer_failure_logged_ && others > 0;
  if (all_on_peers) {
    // Their messages and the flight recorder's report say which collective and which rank each
    // waited for.
    log_line(
        "rank {} (pid {}) {}, as every rank that failed did ({}): each failed on a peer (a "
        "collective timed out or a connection closed) and none of itself; the ranks' messages "
        "above name the peer each waited for",
        failed.rank, failed.pid, describe_wait_status(failed.wait_status), peer_failures_);
  } else if (others == 0) {
    log_line("rank {} (pid {}) {}", failed.rank, failed.pid,
             describe_wait_status(failed.wait_status));
  } else if (reported && stalled_.empty()) {
    log_line("no rank failed of itself within {} s; stopping the other {}",
             config_.peer_failure_wait_s, others == 1 ? "rank" : ranks_phrase(others));
  } else if (reported) {
    log_line("a rank is stopped, not failing: stopping the other {}",
             others == 1 ? "rank" : ranks_phrase(others));
  } else {
    log_line("rank {} (pid {}) {}; stopping the other {}", failed.rank, failed.pid,
             describe_wait_status(failed.wait_status), others == 1 ? "rank" : ranks_phrase(others));
  }
  peer_failure_.reset();
  start_stopping(SIGTERM, exit_code_of(failed.wait_status));
}

void Supervisor::reap() {
  for (;;) {
    int wait_status = 0;
    const pid_t pid = waitpid(-1, &wait_status, WNOHANG | WUNTRACED | WCONTINUED);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) return;  // none changed (0) or no children left (ECHILD)
    for (const auto& state : ranks_) {
      if (state->pid != pid || !state->running) continue;
      if (WIFSTOPPED(wait_status)) {
        state->stopped_by = WSTOPSIG(wait_status);
        log_line("rank {} (pid {}) was stopped by {}; its peers wait for it until their timeout",
                 state->rank, state->pid, signal_name(state->stopped_by));
        // A peer already failed for want of a rank: this one (no rank will fail of itself).
        if (peer_failure_ && !stopping_) fail_job(*peer_failure_);
      } else if (WIFCONTINUED(wait_status)) {
        state->stopped_by = 0;
      } else {
        on_rank_exit(*state, wait_status);
      }
    }
  }
}

bool Supervisor::stopped_alone() const {
  const int running = running_ranks();
  return running > 0 && running < static_cast<int>(ranks_.size()) &&
         std::all_of(ranks_.begin(), ranks_.end(),
                     [](const auto& r) { return !r->running || r->stopped_by != 0; });
}

int Supervisor::poll_timeout_ms() const {
  std::optional<Clock::time_point> next = kill_deadline_;
  if (stopped_alone_since_ && !stopping_) {
    const Clock::time_point alone_deadline =
        *stopped_alone_since_ + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(config_.stopped_alone_s));
    if (!next || alone_deadline < *next) next = alone_deadline;
  }
  if (peer_failure_ && !stopping_) {
    const Clock::time_point wait_deadline =
        peer_failure_->when + seconds(config_.peer_failure_wait_s);
    if (!next || wait_deadline < *next) next = wait_deadline;
  }
  if (config_.timeout_s > 0 && !stopping_) {
    const Clock::time_point job_deadline = start_ + seconds(config_.timeout_s);
    if (!next || job_deadline < *next) next = job_deadline;
  }
  if (!next) return -1;
  const auto left = std::chrono::duration<double, std::milli>(*next - Clock::now()).count();
  // poll() takes an int: a deadline days away waits in steps of at most ~24.8 days.
  return static_cast<int>(
      std::clamp(std::ceil(left), 0.0, static_cast<double>(std::numeric_limits<int>::max())));
}

void Supervisor::check_deadlines() {
  const Clock::time_point now = Clock::now();
  if (peer_failure_ && !stopping_ &&
      now >= peer_failure_->when + seconds(config_.peer_failure_wait_s)) {
    fail_job(*peer_failure_);
  }
  if (stopping_ || !stopped_alone()) {
    stopped_alone_since_.reset();
  } else if (!stopped_alone_since_) {
    stopped_alone_since_ = now;
  } else if (now - *stopped_alone_since_ >=
             std::chrono::duration<double>(config_.stopped_alone_s)) {
    if (peer_failure_) {
      fail_job(*peer_failure_);  // names the stopped ranks as what the others waited for
    } else {
      log_line(
          "{} stopped for {} s after every other rank had exited: no peer is left to wait "
          "for {}; killing {}",
          ranks_phrase(running_ranks()), config_.stopped_alone_s,
          running_ranks() == 1 ? "it" : "them", running_ranks() == 1 ? "it" : "them");
      first_failure_ = "a rank stopped after every other rank had exited";
      start_stopping(SIGKILL, 1);
    }
  }
  if (config_.timeout_s > 0 && !stopping_ && now >= start_ + seconds(config_.timeout_s)) {
    const int running = running_ranks();
    log_line("--timeout-s {} reached with {} running; stopping them", config_.timeout_s,
             ranks_phrase(running));
    start_stopping(SIGTERM, kTimeoutExitCode);
  }
  if (kill_deadline_ && now >= *kill_deadline_) {
    const int running = running_ranks();
    if (running > 0) {
      std::string pids;
      for (const auto& state : ranks_) {
        if (state->running) {
          pids +=
              fmt::format("{}rank {} (pid {})", pids.empty() ? "" : ", ", state->rank, state->pid);
        }
      }
      log_line("{} still running {} s after {}; sending SIGKILL: {}", ranks_phrase(running),
               config_.grace_s, signal_name(stop_signal_), pids);
      kill_remaining();
    }
    kill_deadline_.reset();
  }
}

int Supervisor::run() {
  std::vector<pollfd> fds;
  std::vector<Stream*> streams;  // streams[i] belongs to fds[i + 1]
  for (;;) {
    reap();
    check_deadlines();
    const bool any_open = std::any_of(ranks_.begin(), ranks_.end(),
                                      [](const auto& r) { return r->out.open() || r->err.open(); });
    if (running_ranks() == 0 && !any_open) break;

    fds.assign(1, pollfd{signals_.fd(), POLLIN, 0});
    streams.clear();
    for (const auto& state : ranks_) {
      for (Stream* stream : {&state->out, &state->err}) {
        if (!stream->open()) continue;
        fds.push_back(pollfd{stream->fd.get(), POLLIN, 0});
        streams.push_back(stream);
      }
    }
    const int ready = poll(fds.data(), fds.size(), poll_timeout_ms());
    if (ready < 0) {
      LOOM_CHECK(errno == EINTR, "poll failed: {}", std::strerror(errno));
      continue;
    }
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) streams[i - 1]->read_available(/*until_drained=*/false);
    }
    if (fds[0].revents != 0) {
      for (int signal_number : signals_.take()) {
        if (signal_number != SIGCHLD) on_launcher_signal(signal_number);
      }
    }
  }
  return exit_code_.value_or(0);
}

std::string Supervisor::cause() const {
  if (!stalled_.empty()) return stalled_.front() + " while the others waited for it";
  if (!departures_before_failure_.empty()) return departures_before_failure_.front();
  return first_failure_;
}

void Supervisor::print_cause() const {
  // When ranks failed while another was stopped, the stopped one is the cause (the failures are
  // their timeouts waiting for it), whichever rank exited first; likewise one that had left.
  for (const std::string& rank : stalled_) {
    log_line("{} when the first rank failed: the others were waiting for it", rank);
  }
  for (const std::string& departure : departures_before_failure_) log_line("{}", departure);
}

}  // namespace loom::loomrun
