#include "parallel/pipeline/schedule_checks.h"

#include "base/error.h"

namespace loom::pipeline::detail {

void check_ranks_and_microbatches(std::string_view generator, int num_ranks, int num_microbatches) {
  LOOM_CHECK(num_ranks >= 1, "{}: got {} ranks; need at least 1", generator, num_ranks);
  LOOM_CHECK(num_microbatches >= 1, "{}: got {} microbatches; need at least 1", generator,
             num_microbatches);
}

}  // namespace loom::pipeline::detail
