#include "models/gpt/parameter_layout.h"

#include <fmt/format.h>

namespace loom::models {

std::vector<PlannedParameter> gpt_planned_parameters(const GPTConfig& config,
                                                     const StageRange& range) {
  const int64_t c = config.n_embd;
  std::vector<PlannedParameter> out;
  const auto add = [&](std::string name, Shape shape, std::optional<int64_t> dim, int64_t block) {
    out.push_back({std::move(name), std::move(shape), dim, block});
  };
  if (range.first || range.last) add("wte.weight", {config.vocab_size, c}, 0, -1);
  if (range.first) add("wpe.weight", {config.block_size, c}, std::nullopt, -1);
  for (int64_t i = range.first_block; i < range.end_block; ++i) {
    const std::string h = fmt::format("h.{}.", i);
    add(h + "ln_1.weight", {c}, std::nullopt, i);
    add(h + "ln_1.bias", {c}, std::nullopt, i);
    add(h + "attn.c_attn.weight", {3 * c, c}, 0, i);
    add(h + "attn.c_attn.bias", {3 * c}, 0, i);
    add(h + "attn.c_proj.weight", {c, c}, 1, i);
    add(h + "attn.c_proj.bias", {c}, std::nullopt, i);
    add(h + "ln_2.weight", {c}, std::nullopt, i);
    add(h + "ln_2.bias", {c}, std::nullopt, i);
    add(h + "mlp.c_fc.weight", {4 * c, c}, 0, i);
    add(h + "mlp.c_fc.bias", {4 * c}, 0, i);
    add(h + "mlp.c_proj.weight", {c, 4 * c}, 1, i);
    add(h + "mlp.c_proj.bias", {c}, std::nullopt, i);
  }
  if (range.last) {
    add("ln_f.weight", {c}, std::nullopt, -1);
    add("ln_f.bias", {c}, std::nullopt, -1);
  }
  return out;
}

}  // namespace loom::models
