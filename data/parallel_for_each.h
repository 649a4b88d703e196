// fn(0) .. fn(count - 1) on several threads: the one loop behind data/'s whole-corpus passes
// (token_corpus.h) and loom tokenize's chunks (tokenize_files.h).
#pragma once

#include <cstddef>
#include <functional>

namespace loom::data {

// Calls fn(i) once for every i in [0, count), on up to `threads` threads (0: every core), this
// one included; indices are handed out in order as threads free up. After the first exception no
// new index starts; it is rethrown once every thread has stopped. A thread the system cannot
// start is done without (the running ones take its share).
void parallel_for_each(size_t count, size_t threads, const std::function<void(size_t)>& fn);

}  // namespace loom::data
