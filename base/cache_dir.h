// Where Loom keeps what it measured or computed once and reuses (the machine's calibration,
// traced steps): $LOOM_CACHE_DIR, else ~/.cache/loom (XDG's place), else /tmp/.cache/loom.
#pragma once

#include <string>

namespace loom {

std::string loom_cache_dir();

}  // namespace loom
