// What a program asked of the emulated device, counted by name: each kernel launch (by the
// kernel's name), each GEMM, each copy by direction, each synchronization. A GPU's step time
// depends on these as much as on the kernels' speed (every launch costs the host microseconds;
// every synchronization empties the queue of work the host had issued ahead), and the emulator
// sees all of them exactly. With LOOM_EMULATED_COUNTS=<prefix>, a process counts and writes its
// counts to <prefix>.<RANK> (its launcher's rank; pid<pid> without one) at exit, one "count name"
// line each (tools/cuda_emulator/launch_counts.sh). Unset, nothing is counted.
#pragma once

#include <string_view>

namespace loom_emu {

void count(std::string_view what);

}  // namespace loom_emu
