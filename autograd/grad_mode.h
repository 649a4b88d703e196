// GradMode and NoGradGuard live in the tensor layer (every dispatched op asks them); this header
// keeps autograd's spelling of the include.
#pragma once

#include "tensor/grad_mode.h"
