// --max-restarts: whether loomrun starts a failed job again, and the lines that say why. Each
// failed attempt is logged with its cause and the step it reached; a job that fails at the same
// step (or before its first step) kSameStepLimit times in a row is not restarted again (a
// deterministic failure would only loop), nor one that used up its restarts — both with a report
// of every attempt.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace loom::loomrun {

inline constexpr int kSameStepLimit = 3;

class RestartHistory {
 public:
  explicit RestartHistory(int max_restarts) : max_restarts_(max_restarts) {}
  // An attempt failed with `cause` after completing `completed_step` (none: before any step, or
  // the job reports no progress). Logs it; returns whether to start the job again.
  bool restart_after(const std::string& cause, std::optional<long> completed_step);

 private:
  struct Failure {
    std::string cause;
    std::optional<long> completed_step;
  };
  std::string attempts_report() const;
  int max_restarts_;
  std::vector<Failure> failures_;
};

// "NAME=value" in `environment`, replacing an entry of that name.
void set_variable(std::vector<std::string>& environment, const std::string& name,
                  const std::string& value);

}  // namespace loom::loomrun
