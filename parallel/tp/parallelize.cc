#include "parallel/tp/parallelize.h"

#include <fmt/format.h>
#include <fnmatch.h>

#include <map>

#include "base/error.h"

namespace loom::tp {

bool fqn_matches(const std::string& pattern, const std::string& fqn) {
  return fnmatch(pattern.c_str(), fqn.c_str(), 0) == 0;
}

void parallelize_module(nn::Module& module, std::shared_ptr<const DeviceMesh> mesh,
                        const ParallelizePlan& plan) {
  LOOM_CHECK(mesh != nullptr, "parallelize_module: the mesh is null");
  const auto modules = module.named_modules();
  // 1. Every entry matches, and every style fits every module it matches: checked before
  //    anything changes, so a plan that does not fit leaves the model as it was.
  std::vector<std::pair<std::shared_ptr<ParallelStyle>, std::pair<std::string, nn::Module*>>> work;
  // The entry whose style changes each module's parameters (its own and its submodules'): a
  // second one on the module, an ancestor or a descendant would be validated against the
  // parameters as they are now, not as the first leaves them, and could fail half-way through
  // the plan. Hook-only styles (PrepareModuleInput/Output) combine with it.
  std::map<std::string, std::string> parameters_changed_by;
  const auto within = [](const std::string& inner, const std::string& outer) {
    return inner == outer || inner.starts_with(outer + ".");
  };
  for (const auto& [pattern, style] : plan) {
    LOOM_CHECK(style != nullptr, "parallelize_module: plan entry '{}' has no style", pattern);
    bool matched = false;
    for (const auto& [fqn, submodule] : modules) {
      if (fqn.empty() || !fqn_matches(pattern, fqn)) continue;
      if (style->changes_parameters()) {
        for (const auto& [other, other_pattern] : parameters_changed_by) {
          LOOM_CHECK(!within(fqn, other) && !within(other, fqn),
                     "parallelize_module: '{}' (plan entry '{}', {}) and '{}' (plan entry '{}') "
                     "would both change {}'s parameters; a module's parameters take one such "
                     "style: make the keys match disjoint modules",
                     fqn, pattern, style->name(), other, other_pattern,
                     within(fqn, other) ? fqn : other);
        }
        parameters_changed_by.emplace(fqn, pattern);
      }
      style->validate(*submodule, fqn, *mesh);
      work.push_back({style, {fqn, submodule}});
      matched = true;
    }
    LOOM_CHECK(matched, "parallelize_module: plan entry '{}' ({}) matches no submodule of {}",
               pattern, style->name(), module.type_name());
  }
  // 2. Then each style in plan order.
  for (const auto& [style, target] : work) style->apply(*target.second, target.first, mesh);
}

void parallelize_module(nn::Module& module, std::shared_ptr<const DeviceMesh> mesh,
                        const std::shared_ptr<ParallelStyle>& style) {
  LOOM_CHECK(mesh != nullptr, "parallelize_module: the mesh is null");
  LOOM_CHECK(style != nullptr, "parallelize_module: the style is null");
  // Its name in the style's errors.
  const std::string fqn = fmt::format("({}, the module itself)", module.type_name());
  style->validate(module, fqn, *mesh);
  style->apply(module, fqn, mesh);
}

void parallelize_module(nn::Module& module, const DeviceMesh& mesh,
                        const std::shared_ptr<ParallelStyle>& style) {
  parallelize_module(module, std::make_shared<const DeviceMesh>(mesh), style);
}

void parallelize_module(nn::Module& module, const DeviceMesh& mesh, const ParallelizePlan& plan) {
  parallelize_module(module, std::make_shared<const DeviceMesh>(mesh), plan);
}

void parallelize_module(nn::Module& module, const DeviceMesh& mesh, const std::string& dim,
                        const ParallelizePlan& plan) {
  parallelize_module(module, std::make_shared<const DeviceMesh>(mesh[dim]), plan);
}

}  // namespace loom::tp
