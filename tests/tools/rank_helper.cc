// A stand-in rank for loomrun's integration tests. What it does depends on its RANK:
//
//   --print-env            print the launcher's variables on stdout, a line on stderr, and a
//                          last stdout line without a newline
//   --pid-dir DIR          write its pid to DIR/rank-<RANK>.pid (once its handlers are set up)
//   --fail-rank R          rank R exits with --exit-code (default 1) after --fail-after-ms
//   --kill-rank R          rank R kills itself with --signal (default 9) after --fail-after-ms
//   --trap-term            on SIGTERM print "rank <RANK> got SIGTERM" and exit 0
//   --ignore-term          ignore SIGTERM (so only SIGKILL stops it)
//   --lines N              print N numbered lines of 100 bytes on stdout, as fast as it can
//   --sleep-s S            the other ranks sleep S seconds, then exit 0 (or --others-exit-code)
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace {

volatile sig_atomic_t g_got_term = 0;

void on_term(int) { g_got_term = 1; }

const char* env_or(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  bool print_env = false, trap_term = false, ignore_term = false;
  std::string pid_dir;
  int fail_rank = -1, kill_rank = -1, exit_code = 1, signal_number = SIGKILL, fail_after_ms = 0;
  int lines = 0, others_exit_code = 0;
  double sleep_s = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "rank_helper: %s needs a value\n", flag.c_str());
        std::exit(64);
      }
      return argv[++i];
    };
    if (flag == "--print-env")
      print_env = true;
    else if (flag == "--trap-term")
      trap_term = true;
    else if (flag == "--ignore-term")
      ignore_term = true;
    else if (flag == "--pid-dir")
      pid_dir = value();
    else if (flag == "--fail-rank")
      fail_rank = std::stoi(value());
    else if (flag == "--kill-rank")
      kill_rank = std::stoi(value());
    else if (flag == "--exit-code")
      exit_code = std::stoi(value());
    else if (flag == "--signal")
      signal_number = std::stoi(value());
    else if (flag == "--fail-after-ms")
      fail_after_ms = std::stoi(value());
    else if (flag == "--sleep-s")
      sleep_s = std::stod(value());
    else if (flag == "--lines")
      lines = std::stoi(value());
    else if (flag == "--others-exit-code")
      others_exit_code = std::stoi(value());
    else {
      std::fprintf(stderr, "rank_helper: unknown flag %s\n", flag.c_str());
      return 64;
    }
  }
  const int rank = std::atoi(env_or("RANK", "-1"));

  if (trap_term) std::signal(SIGTERM, on_term);
  if (ignore_term) std::signal(SIGTERM, SIG_IGN);
  if (!pid_dir.empty()) {
    // Write to a temporary name and rename, so a reader never sees a half-written file.
    const std::string path = pid_dir + "/rank-" + std::to_string(rank) + ".pid";
    const std::string temporary = path + ".tmp";
    FILE* file = std::fopen(temporary.c_str(), "w");
    if (file == nullptr) return 65;
    std::fprintf(file, "%d\n", static_cast<int>(getpid()));
    std::fclose(file);
    std::rename(temporary.c_str(), path.c_str());
  }
  if (print_env) {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                             "MASTER_ADDR", "MASTER_PORT", "LOOM_AGENT_STORE"}) {
      std::printf("%s=%s\n", name, env_or(name, "<unset>"));
    }
    std::fflush(stdout);
    std::fprintf(stderr, "stderr line of rank %d\n", rank);
    std::printf("no newline at the end of rank %d", rank);
    std::fflush(stdout);
  }
  for (int line = 0; line < lines; ++line) {
    // "line R-N " padded with the rank's digit to 100 bytes, so a torn line is easy to see.
    std::string text = "line " + std::to_string(rank) + "-" + std::to_string(line) + " ";
    text.resize(100, static_cast<char>('0' + rank % 10));
    std::printf("%s\n", text.c_str());
  }
  std::fflush(stdout);
  if (rank == fail_rank || rank == kill_rank) {
    std::this_thread::sleep_for(std::chrono::milliseconds(fail_after_ms));
    if (rank == kill_rank) raise(signal_number);
    return exit_code;
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(sleep_s);
  while (std::chrono::steady_clock::now() < end) {
    if (g_got_term) {
      std::printf("rank %d got SIGTERM\n", rank);
      std::fflush(stdout);
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return others_exit_code;
}
