// The GPU skips every CUDA test uses: a test case that needs a GPU (or several) skips with the
// reason on a machine without them, so the suite passes on CPU machines and says why.
#pragma once

#include <gtest/gtest.h>

#include "tensor/cuda/cuda_runtime.h"

// Skips the current test, with the reason, on a machine without a usable CUDA device.
#define LOOM_SKIP_WITHOUT_CUDA()                          \
  do {                                                    \
    if (!::loom::cuda::available()) {                     \
      GTEST_SKIP() << ::loom::cuda::unavailable_reason(); \
    }                                                     \
  } while (0)

// Skips unless this process sees `gpus` CUDA devices (NCCL runs one rank per GPU).
#define LOOM_SKIP_WITHOUT_GPUS(gpus)                                                   \
  do {                                                                                 \
    LOOM_SKIP_WITHOUT_CUDA();                                                          \
    if (::loom::cuda::device_count() < (gpus)) {                                       \
      GTEST_SKIP() << "needs " << (gpus)                                               \
                   << " CUDA devices (NCCL runs one rank per GPU); this process sees " \
                   << ::loom::cuda::device_count();                                    \
    }                                                                                  \
  } while (0)
