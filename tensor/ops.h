// Everything in loom::ops: the tensor ops. Each dispatched op is declared once in
// tensor/op_list.h and records autograd when grad mode is on and an input requires grad
// (tensor/dispatch.h); autograd/functions.h names the same functions in loom::.
#pragma once

#include "tensor/ops_copy.h"
#include "tensor/ops_create.h"
#include "tensor/ops_elementwise.h"
#include "tensor/ops_foreach.h"
#include "tensor/ops_grouped_mm.h"
#include "tensor/ops_matmul.h"
#include "tensor/ops_nn.h"
#include "tensor/ops_reduce.h"
#include "tensor/ops_top_k.h"
#include "tensor/ops_views.h"
#include "tensor/rng.h"
