// A Gloo job whose ranks diverge on purpose, for loomrun's flight-recorder test: every rank runs
// --ops all_reduces of 1024 f32 on the world group, except --odd-rank, which (--how) hangs
// (sleeps --sleep-s) before its last one, skips its last one, or calls its second with 2048
// elements. A failing rank exits 1 with its error on stderr.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "base/error.h"
#include "comm/init.h"
#include "tensor/ops.h"

int main(int argc, char** argv) {
  int odd = 1, ops_count = 3;
  double sleep_s = 60;
  std::string how = "hang";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--odd-rank") odd = std::stoi(value);
    if (flag == "--ops") ops_count = std::stoi(value);
    if (flag == "--how") how = value;
    if (flag == "--sleep-s") sleep_s = std::stod(value);
  }
  try {
    auto pg = loom::comm::init_process_group("gloo");
    const bool me = pg->rank() == odd;
    for (int i = 0; i < ops_count; ++i) {
      const bool last = i == ops_count - 1;
      if (me && last && how == "hang") {
        std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
      }
      if (me && last && how == "skip") break;
      const int64_t n = me && i == 1 && how == "size" ? 2048 : 1024;
      pg->all_reduce(loom::ops::ones({n}))->wait();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "diverging_ranks: %s\n", e.what());
    return 1;
  }
  return 0;
}
