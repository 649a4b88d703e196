// The flight recorder's cost per operation (issue 37's goal: under 1 % of a 64 KiB all_reduce):
// a 64 KiB all_reduce issued and waited on a one-rank FakeProcessGroup, whose operations move no
// data, so the time is the ProcessGroup front end's own — validation, counters, the Work — with
// the recorder on (the default ring of 2000 entries) and off (LOOM_FLIGHT_RECORDER_ENTRIES=0).
// Their difference is the recorder's cost; comm_bench gives the 64 KiB all_reduce it is
// compared with.
//
//   bazel run -c opt //tools/bench:flight_recorder_bench
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include "comm/fake/fake_process_group.h"
#include "tensor/ops.h"

namespace {

using namespace loom;

void BM_FakeAllReduce64KiB(benchmark::State& state) {
  const bool on = state.range(0) != 0;
  setenv("LOOM_FLIGHT_RECORDER_ENTRIES", on ? "2000" : "0", 1);
  auto world = comm::FakeProcessGroup::create_world(1, {0});
  unsetenv("LOOM_FLIGHT_RECORDER_ENTRIES");
  comm::ProcessGroup& pg = *world.front();
  const Tensor tensor = ops::empty({16384}, kFloat32, Device::meta());
  for (auto _ : state) pg.all_reduce(tensor)->wait();
  state.SetLabel(on ? "recorder on" : "recorder off");
}
BENCHMARK(BM_FakeAllReduce64KiB)->Arg(1)->Arg(0)->Arg(1)->Arg(0)->Repetitions(5);

}  // namespace

BENCHMARK_MAIN();
