#include "parallel/tp/parallelize.h"

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
  // The entry whose style changes each module's parameters: a second one would be validated
  // against the parameters as they are now, not as the first leaves them, and could fail half-way
  // through the plan. Hook-only styles (PrepareModuleInput/Output) combine with it.
  std::map<std::string, std::string> parameters_changed_by;
  for (const auto& [pattern, style] : plan) {
    LOOM_CHECK(style != nullptr, "parallelize_module: plan entry '{}' has no style", pattern);
    bool matched = false;
    for (const auto& [fqn, submodule] : modules) {
      if (fqn.empty() || !fqn_matches(pattern, fqn)) continue;
      if (style->changes_parameters()) {
        const auto [earlier, first] = parameters_changed_by.emplace(fqn, pattern);
        LOOM_CHECK(first,
                   "parallelize_module: '{}' is matched by plan entries '{}' and '{}' ({}), both "
                   "styles that change its parameters; a module takes one such style: make the "
                   "keys match disjoint modules",
                   fqn, earlier->second, pattern, style->name());
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
  style->validate(module, "", *mesh);
  style->apply(module, "", mesh);
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
