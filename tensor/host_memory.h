// The host allocator policy a training process wants (an application's choice, like PyTorch's
// advice to preload jemalloc for CPU training).
//
// Tensors of a training step are freed and allocated again at the same sizes every step. glibc
// serves blocks over its mmap threshold (128 KiB, adapting up to 32 MiB) with fresh mmaps and
// returns freed heap tops to the kernel, so each step page-faults and zeroes its activations anew
// (perf: a quarter of `small`'s time in the kernel, clear_page). FSDP's flat buffers are the same
// story: every all-gather and reduce-scatter buffer is a unit's size. Keeping freed memory in the
// heap for reuse makes `--model small` on 1 rank ~30% faster (64-78 -> 80-102 tokens/s, A/B runs
// alternated); peak memory is unchanged because the step's peak is what the heap grows to anyway.
#pragma once

namespace loom {

// Raises glibc's mmap and trim thresholds to 1 GiB: freed tensor memory stays in the heap. Call
// once, first thing in main (loom_train and the benchmarks do).
void keep_freed_host_memory();

}  // namespace loom
