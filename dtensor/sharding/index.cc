// The one place that lists every strategy group (explicit calls, no static initializers), and
// checks the table against tensor/op_list.h: every kExtended op has a strategy.
#include "base/error.h"
#include "dtensor/sharding/strategy.h"

namespace loom::sharding {

const StrategyTable& strategy_table() {
  static const StrategyTable table = [] {
    StrategyTable t;
    register_elementwise_strategies(t);
    register_matmul_strategies(t);
    register_reduction_strategies(t);
    register_view_strategies(t);
    register_nn_strategies(t);
    const auto missing =
        t.missing([](const OpInfo& info) { return info.extensions == OpExtensions::kExtended; });
    LOOM_INTERNAL_ASSERT(!missing,
                         "op '{}' is kExtended (tensor/op_list.h) but has no sharding "
                         "strategy in dtensor/sharding/",
                         op_name(*missing));
    return t;
  }();
  return table;
}

}  // namespace loom::sharding
