// The one place that lists every strategy group (explicit calls, no static initializers).
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
    return t;
  }();
  return table;
}

}  // namespace loom::sharding
