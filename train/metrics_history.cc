#include "train/metrics_history.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>

namespace loom::train {

MetricsHistory read_metrics_before(const std::string& path, int64_t steps_done,
                                   const std::optional<SavedLoss>& saved) {
  MetricsHistory history;
  std::optional<double> loss_at_saved_step;
  std::ifstream file(path);
  for (std::string line; std::getline(file, line);) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer()) {
      continue;
    }
    const int step = record["step"].get<int>();
    if (step >= steps_done) continue;
    const auto loss = record.find("loss");
    const bool has_loss = loss != record.end() && loss->is_number();
    if (has_loss) history.curve.train.emplace_back(step, loss->get<double>());
    if (saved && step == saved->step && has_loss) loss_at_saved_step = loss->get<double>();
    if (record.contains("val_loss")) {
      history.curve.validation.emplace_back(step, record["val_loss"].get<double>());
    }
    history.lines.push_back(line);
  }
  if (saved && !history.lines.empty() && loss_at_saved_step != saved->loss) {
    history.dropped =
        loss_at_saved_step
            ? fmt::format("its step {} logged loss {} where the checkpoint's run logged {}",
                          saved->step, *loss_at_saved_step, saved->loss)
            : fmt::format("it has no line of the checkpoint's step {}", saved->step);
    history.lines.clear();
    history.curve = {};
  }
  return history;
}

}  // namespace loom::train
