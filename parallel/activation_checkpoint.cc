#include "parallel/activation_checkpoint.h"

#include <fmt/format.h>

#include <charconv>

#include "base/error.h"
#include "nn/checkpoint.h"

namespace loom::parallel {

ActivationCheckpointing ActivationCheckpointing::parse(std::string_view text,
                                                       std::string_view what) {
  if (text == "none") return {};
  if (text == "full") return {.mode = Mode::kFull};
  if (text == "selective-op") return {.mode = Mode::kSelectiveOp};
  constexpr std::string_view kLayer = "selective-layer:";
  if (text.starts_with(kLayer)) {
    const std::string_view number = text.substr(kLayer.size());
    int64_t every = 0;
    const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), every);
    if (error == std::errc() && end == number.data() + number.size() && every >= 1) {
      return {.mode = Mode::kSelectiveLayer, .every = every};
    }
  }
  LOOM_FAIL(
      "{}: expected none, full, selective-op or selective-layer:N (N >= 1: every N-th block), "
      "got '{}'",
      what, text);
}

std::string ActivationCheckpointing::str() const {
  switch (mode) {
    case Mode::kNone:
      return "none";
    case Mode::kFull:
      return "full";
    case Mode::kSelectiveLayer:
      return fmt::format("selective-layer:{}", every);
    case Mode::kSelectiveOp:
      return "selective-op";
  }
  return "?";
}

bool ActivationCheckpointing::checkpoints(int64_t index) const {
  switch (mode) {
    case Mode::kNone:
      return false;
    case Mode::kFull:
    case Mode::kSelectiveOp:
      return true;
    case Mode::kSelectiveLayer:
      return index % every == 0;
  }
  return false;
}

void ActivationCheckpointing::apply(const std::vector<DataParallel::Block>& blocks,
                                    int64_t first_block) const {
  const auto policy = std::make_shared<const nn::CheckpointPolicy>(
      mode == Mode::kSelectiveOp ? nn::CheckpointPolicy::selective_op()
                                 : nn::CheckpointPolicy::full());
  for (size_t i = 0; i < blocks.size(); ++i) {
    const bool on = checkpoints(first_block + static_cast<int64_t>(i));
    blocks[i].module->set_checkpoint_policy(on ? policy : nullptr);
  }
}

}  // namespace loom::parallel
