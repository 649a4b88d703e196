// Expected collective counts, per kind, against what a CommDebugMode saw:
//
//   CommDebugMode comm;
//   Tensor y = redistribute(x, {Replicate()});
//   expect_collectives(comm, {.all_gather = 1}, "S(0) -> R");
//
// Every kind not named must be absent: a change that adds a collective (or a broadcast, a
// barrier) fails.
#pragma once

#include <cstdint>
#include <source_location>
#include <string>

#include "dtensor/comm_debug_mode.h"

namespace loom::testing {

struct Collectives {
  int64_t all_reduce = 0;
  int64_t all_gather = 0;
  int64_t reduce_scatter = 0;
  int64_t all_to_all = 0;

  int64_t total() const { return all_reduce + all_gather + reduce_scatter + all_to_all; }
  bool operator==(const Collectives&) const = default;
};

// "2 all_reduce, 1 all_gather"; "none".
std::string collectives_str(const Collectives& c);

void expect_collectives(const CommDebugMode& comm, const Collectives& expected,
                        const std::string& what,
                        std::source_location where = std::source_location::current());

}  // namespace loom::testing
