// Everything in loom::ops: the plain (non-differentiable) tensor ops. Differentiable versions
// with the same names live in loom:: (autograd/functions.h).
#pragma once

#include "tensor/ops_copy.h"
#include "tensor/ops_create.h"
#include "tensor/ops_elementwise.h"
#include "tensor/ops_matmul.h"
#include "tensor/ops_nn.h"
#include "tensor/ops_reduce.h"
#include "tensor/ops_views.h"
#include "tensor/rng.h"
