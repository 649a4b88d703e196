#include "tools/loomrun/restart_history.h"

#include <fmt/format.h>

#include <algorithm>

#include "tools/loomrun/output.h"

namespace loom::loomrun {

namespace {

std::string where(const std::optional<long>& completed_step) {
  return completed_step ? fmt::format("at step {}", *completed_step + 1) : "before its first step";
}

}  // namespace

std::string RestartHistory::attempts_report() const {
  std::string out;
  for (size_t i = 0; i < failures_.size(); ++i) {
    out += fmt::format("{}attempt {}: {} {}", i == 0 ? "" : "; ", i + 1, failures_[i].cause,
                       where(failures_[i].completed_step));
  }
  return out;
}

bool RestartHistory::restart_after(const std::string& cause, std::optional<long> completed_step) {
  failures_.push_back({cause, completed_step});
  const int restarts_done = static_cast<int>(failures_.size()) - 1;
  if (max_restarts_ == 0) return false;
  // The same step failing kSameStepLimit times in a row is not a fault restarts get past; nor is
  // failing before the first step each time (a checkpoint that cannot be loaded, say).
  const size_t n = failures_.size();
  if (n >= static_cast<size_t>(kSameStepLimit) &&
      std::all_of(failures_.end() - kSameStepLimit, failures_.end(),
                  [&](const Failure& f) { return f.completed_step == completed_step; })) {
    log_line("the job failed {} {} times in a row; not restarting it again ({})",
             where(completed_step), kSameStepLimit, attempts_report());
    return false;
  }
  if (restarts_done >= max_restarts_) {
    log_line("the job failed after {} restart{} (--max-restarts {}); not restarting it again ({})",
             restarts_done, restarts_done == 1 ? "" : "s", max_restarts_, attempts_report());
    return false;
  }
  log_line(
      "restart {} of {}: {} {}; starting the job again (LOOM_RESTART_COUNT={}; a job that "
      "saves checkpoints resumes from its latest)",
      restarts_done + 1, max_restarts_, cause, where(completed_step), restarts_done + 1);
  return true;
}

void set_variable(std::vector<std::string>& environment, const std::string& name,
                  const std::string& value) {
  const std::string prefix = name + "=";
  std::erase_if(environment, [&](const std::string& e) { return e.rfind(prefix, 0) == 0; });
  environment.push_back(prefix + value);
}

}  // namespace loom::loomrun
