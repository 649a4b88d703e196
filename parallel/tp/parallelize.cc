#include "parallel/tp/parallelize.h"

#include <fnmatch.h>

#include "base/error.h"

namespace loom::tp {

bool fqn_matches(const std::string& pattern, const std::string& fqn) {
  return fnmatch(pattern.c_str(), fqn.c_str(), 0) == 0;
}

void parallelize_module(nn::Module& module, std::shared_ptr<const DeviceMesh> mesh,
                        const ParallelizePlan& plan) {
  LOOM_CHECK(mesh != nullptr, "parallelize_module: the mesh is null");
  const auto modules = module.named_modules();
  for (const auto& [pattern, style] : plan) {
    LOOM_CHECK(style != nullptr, "parallelize_module: plan entry '{}' has no style", pattern);
    bool matched = false;
    for (const auto& [fqn, submodule] : modules) {
      if (fqn.empty() || !fqn_matches(pattern, fqn)) continue;
      style->apply(*submodule, fqn, mesh);
      matched = true;
    }
    LOOM_CHECK(matched, "parallelize_module: plan entry '{}' ({}) matches no submodule of {}",
               pattern, style->name(), module.type_name());
  }
}

}  // namespace loom::tp
