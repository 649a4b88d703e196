#include "tools/loomrun/flight_folder.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "comm/flight_report.h"
#include "tools/loomrun/output.h"
#include "tools/loomrun/restart_history.h"

namespace loom::loomrun {

namespace {
constexpr const char* kVariable = "LOOM_FLIGHT_RECORDER_DIR";
constexpr const char* kProgressVariable = "LOOM_PROGRESS_FILE";
}  // namespace

FlightRecorderFolder::FlightRecorderFolder(const std::string& requested) {
  std::string what = "--flight-recorder-dir";
  if (!requested.empty()) {
    path_ = requested;
  } else if (const char* env = std::getenv(kVariable); env != nullptr && *env != '\0') {
    path_ = env;
    what = kVariable;
  } else {
    what = "loomrun's flight-recorder folder (TMPDIR)";
    const char* tmp = std::getenv("TMPDIR");
    path_ = fmt::format("{}/loomrun-{}-flight", tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                        static_cast<long>(::getpid()));
    made_here_ = true;
  }
  std::error_code error;
  std::filesystem::create_directories(path_, error);
  LOOM_CHECK(!error, "{}: cannot create '{}': {}", what, path_, error.message());
  // A progress file the caller chose (a supervising script's) stays; else this folder's.
  const char* chosen = std::getenv(kProgressVariable);
  progress_path_ = chosen != nullptr && *chosen != '\0' ? chosen : path_ + "/progress";
  // A previous job's dumps and progress here are not this one's.
  clear_dumps();
  std::filesystem::remove(path_ + "/progress", error);
}

void FlightRecorderFolder::clear_dumps() const {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(path_, error)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("rank-") && name.ends_with(".json")) std::filesystem::remove(entry, error);
  }
}

std::optional<long> FlightRecorderFolder::completed_step() const {
  std::ifstream in(progress_path_);
  long step = -1;
  if (!(in >> step) || step < 0) return std::nullopt;
  return step;
}

void FlightRecorderFolder::export_to(std::vector<std::string>& environment) const {
  set_variable(environment, kVariable, path_);
  set_variable(environment, kProgressVariable, progress_path_);
}

FlightRecorderFolder::~FlightRecorderFolder() {
  if (!made_here_) return;
  // Non-throwing throughout (a destructor): increment(error), not the range-for's operator++.
  std::error_code error;
  bool dumps = false;
  for (std::filesystem::directory_iterator it(path_, error), end; !error && it != end;
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    dumps |= name.starts_with("rank-") && name.ends_with(".json");
  }
  if (!dumps && !error) std::filesystem::remove_all(path_, error);
}

void FlightRecorderFolder::report(int exit_code, int world_size) const {
  if (exit_code == 0) {  // the job is over: nothing in a folder made for it is wanted
    std::error_code error;
    if (made_here_) std::filesystem::remove_all(path_, error);
    return;
  }
  // A failed attempt's folder stays until the job ends (~FlightRecorderFolder): a restarted
  // attempt writes its dumps there, and its progress file says at which step this one failed.
  std::vector<comm::RankDump> dumps;
  std::vector<std::string> unreadable;
  try {
    dumps = comm::read_flight_dumps(path_, &unreadable);
  } catch (const std::exception& e) {
    log_line("flight recorder: cannot read the dumps in {}: {}", path_, e.what());
    return;
  }
  // A rank killed while it dumped leaves its file short: the others' report still follows.
  for (const std::string& problem : unreadable) {
    log_line("flight recorder: {}; reporting the other ranks' dumps", problem);
  }
  if (dumps.empty()) return;
  std::istringstream lines(comm::flight_report(dumps, world_size));
  for (std::string line; std::getline(lines, line);) log_line("{}", line);
  log_line("flight recorder: the ranks' dumps are in {}", path_);
}

}  // namespace loom::loomrun
