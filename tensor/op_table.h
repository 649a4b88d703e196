// The table behind call_op (dispatch.h): op name -> plain implementation taking an OpCall.
// Each group of ops registers its entries from one function, and op_table.cc calls all of them
// once, explicitly (no static initializers).
#pragma once

#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensor/dispatch.h"

namespace loom {

using OpFunction = std::function<std::vector<Tensor>(const OpCall&)>;
using OpTable = std::unordered_map<std::string, OpFunction>;

void register_core_ops(OpTable& table);  // op_table.cc: views, copies, elementwise, reductions, matmul
void register_nn_ops(OpTable& table);    // ops_nn_table.cc: softmax, layer_norm, attention, ...

}  // namespace loom
