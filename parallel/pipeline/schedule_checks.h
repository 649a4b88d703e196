// Argument checks shared by the schedule generators (private to parallel/pipeline).
#pragma once

#include <string_view>

namespace loom::pipeline::detail {

// Throws naming `generator` when p < 1 or m < 1.
void check_ranks_and_microbatches(std::string_view generator, int num_ranks, int num_microbatches);

}  // namespace loom::pipeline::detail
