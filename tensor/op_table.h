// The table behind call_op (dispatch.h): OpId -> the plain op, unpacking an OpCall (inputs are
// the op's tensors and attrs its non-tensor parameters, both in declaration order). Each group of
// ops registers its entries from one function; op_table.cc calls all of them once, explicitly (no
// static initializers), and checks every op of tensor/op_list.h got one.
#pragma once

#include <functional>
#include <vector>

#include "tensor/dispatch.h"

namespace loom {

using OpFunction = std::function<std::vector<Tensor>(const OpCall&)>;
using OpTable = PerOp<OpFunction>;

void register_core_ops(OpTable& table);  // views, copies, elementwise, reductions, matmul
void register_nn_ops(OpTable& table);    // ops_nn_table.cc: softmax, layer_norm, attention, ...

}  // namespace loom
