// Checks a kernel makes on the device and the host reports at its next synchronization.
//
// Why: checking a GPU tensor's indices on the host copies them back, which makes the host wait
// for every kernel queued before (a synchronization in every step, at the embedding and again at
// the loss). A kernel that reads the indices checks them itself instead:
//
//   int64_t* first_bad = cuda::begin_device_check(device, [=](int64_t position) {
//     return fmt::format("embedding: index {} at position {} ... out of range ...", ...);
//   });
//   kernels::embedding_forward(..., first_bad, device);  // atomicMin(first_bad, position)
//
// Contract:
//   - begin_device_check returns a device int64 on `device` set to PendingChecks::kNoFailure,
//     stream-ordered before anything queued after it on the compute stream; a kernel lowers it
//     to the first failing position it finds (atomicMin) and treats a failing element as
//     harmless (reads nothing out of bounds).
//   - synchronize(device) and every copy to the host (cuda_runtime.h) read the slots of the
//     checks begun before them, in order, and throw loom::Error with the first failure's message
//     followed by where it was found. Nothing else is reported: the failing op's output is not
//     used by anyone who later reads a value.
//   - `describe` runs only on failure, after the device has finished, on the thread that
//     synchronizes; it may copy to the host (it runs with no check pending).
//   - At most kDeviceCheckSlots checks are pending per device; one more synchronizes first.
#pragma once

#include <cstdint>

#include "tensor/cuda/pending_checks.h"

namespace loom::cuda {

inline constexpr int kDeviceCheckSlots = 256;

int64_t* begin_device_check(int device, PendingChecks::Describe describe);

// Reads the pending checks of `device` and throws the first failure. Call only once the host has
// waited for the device's compute stream (synchronize and the host copies do).
void raise_failed_device_checks(int device);

}  // namespace loom::cuda
