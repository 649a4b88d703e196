#include "train/metrics_history.h"

#include <fstream>
#include <nlohmann/json.hpp>

namespace loom::train {

MetricsHistory read_metrics_before(const std::string& path, int64_t steps_done) {
  MetricsHistory history;
  std::ifstream file(path);
  for (std::string line; std::getline(file, line);) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer()) {
      continue;
    }
    const int step = record["step"].get<int>();
    if (step >= steps_done) continue;
    if (record.contains("loss"))
      history.curve.train.emplace_back(step, record["loss"].get<double>());
    if (record.contains("val_loss")) {
      history.curve.validation.emplace_back(step, record["val_loss"].get<double>());
    }
    history.lines.push_back(line);
  }
  return history;
}

}  // namespace loom::train
