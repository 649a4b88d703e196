#include "comm/gloo/shm_algorithms.h"

#include <algorithm>
#include <cstring>

#include "comm/gloo/chunks.h"
#include "comm/gloo/reduce.h"

namespace loom::comm::gloo_detail {

namespace {

// What every rank must agree on: the op, its sequence number, its size and `aux`.
ShmStamp stamp(const OpEnv& env, uint64_t total_bytes, uint32_t aux) {
  return ShmStamp{static_cast<uint32_t>(env.kind), aux, env.index, total_bytes};
}

// The part of a `total`-long buffer that round [start, start + per_round) covers.
int64_t in_round(int64_t total, int64_t start, int64_t per_round) {
  return std::clamp<int64_t>(total - start, 0, per_round);
}

}  // namespace

void shm_all_reduce(ShmChannel& channel, const OpEnv& env, const Tensor& tensor, ReduceOp op) {
  const int world = channel.world();
  const int me = channel.rank();
  const size_t esize = element_size(tensor.dtype());
  const int64_t count = tensor.numel();
  const int64_t per_round = static_cast<int64_t>(channel.slot_bytes() / esize);
  const ShmStamp mine = stamp(
      env, nbytes(tensor), static_cast<uint32_t>(tensor.dtype()) << 8 | static_cast<uint32_t>(op));
  char* data = bytes(tensor);
  std::vector<const void*> pieces(world);
  for (int64_t start = 0; start < count; start += per_round) {
    const int64_t n = std::min(per_round, count - start);
    std::memcpy(channel.slot(me), data + start * esize, static_cast<size_t>(n) * esize);
    channel.arrive_and_wait(mine, env.deadline);
    const Chunk share = chunk_of(n, world, me);
    for (int r = 0; r < world; ++r) pieces[r] = channel.slot(r) + share.offset * esize;
    reduce_pieces(tensor.dtype(), op, pieces, channel.slot(me) + share.offset * esize, share.count);
    channel.arrive_and_wait(mine, env.deadline);
    for (int r = 0; r < world; ++r) {
      const Chunk theirs = chunk_of(n, world, r);
      std::memcpy(data + (start + theirs.offset) * esize, channel.slot(r) + theirs.offset * esize,
                  static_cast<size_t>(theirs.count) * esize);
    }
    channel.next_round();
  }
}

void shm_broadcast(ShmChannel& channel, const OpEnv& env, const Tensor& tensor, int root) {
  const int64_t total = static_cast<int64_t>(nbytes(tensor));
  const int64_t per_round = static_cast<int64_t>(channel.slot_bytes());
  const ShmStamp mine = stamp(env, nbytes(tensor), static_cast<uint32_t>(root));
  char* data = bytes(tensor);
  for (int64_t start = 0; start < total; start += per_round) {
    const size_t n = static_cast<size_t>(std::min(per_round, total - start));
    if (channel.rank() == root) std::memcpy(channel.slot(root), data + start, n);
    channel.arrive_and_wait(mine, env.deadline);
    if (channel.rank() != root) std::memcpy(data + start, channel.slot(root), n);
    channel.next_round();
  }
}

void shm_all_gather(ShmChannel& channel, const OpEnv& env, const std::vector<Tensor>& outputs,
                    const Tensor& input) {
  const int world = channel.world();
  const int me = channel.rank();
  int64_t largest = 0;
  uint64_t total = 0;
  for (const Tensor& out : outputs) {
    largest = std::max(largest, static_cast<int64_t>(nbytes(out)));
    total += nbytes(out);
  }
  const int64_t per_round = static_cast<int64_t>(channel.slot_bytes());
  const ShmStamp mine = stamp(env, total, static_cast<uint32_t>(input.dtype()));
  const int64_t my_bytes = static_cast<int64_t>(nbytes(input));
  for (int64_t start = 0; start < largest; start += per_round) {
    std::memcpy(channel.slot(me), bytes(input) + start,
                static_cast<size_t>(in_round(my_bytes, start, per_round)));
    channel.arrive_and_wait(mine, env.deadline);
    for (int r = 0; r < world; ++r) {
      const auto n =
          static_cast<size_t>(in_round(static_cast<int64_t>(nbytes(outputs[r])), start, per_round));
      copy_bytes(bytes(outputs[r]) + start, r == me ? bytes(input) + start : channel.slot(r), n);
    }
    channel.next_round();
  }
}

void shm_reduce_scatter(ShmChannel& channel, const OpEnv& env, const Tensor& output,
                        const std::vector<Tensor>& inputs, ReduceOp op) {
  const int world = channel.world();
  const int me = channel.rank();
  const size_t esize = element_size(output.dtype());
  int64_t largest = 0;
  uint64_t total = 0;
  for (const Tensor& in : inputs) {
    largest = std::max(largest, in.numel());
    total += nbytes(in);
  }
  // A round carries the same element range of every rank's piece: piece j at j * per_round.
  const int64_t per_round = static_cast<int64_t>(channel.slot_bytes() / (esize * world));
  const ShmStamp mine =
      stamp(env, total, static_cast<uint32_t>(output.dtype()) << 8 | static_cast<uint32_t>(op));
  std::vector<const void*> pieces(world);
  for (int64_t start = 0; start < largest; start += per_round) {
    for (int j = 0; j < world; ++j) {
      std::memcpy(channel.slot(me) + j * per_round * esize, bytes(inputs[j]) + start * esize,
                  static_cast<size_t>(in_round(inputs[j].numel(), start, per_round)) * esize);
    }
    channel.arrive_and_wait(mine, env.deadline);
    for (int r = 0; r < world; ++r) pieces[r] = channel.slot(r) + me * per_round * esize;
    reduce_pieces(output.dtype(), op, pieces, bytes(output) + start * esize,
                  in_round(output.numel(), start, per_round));
    channel.next_round();
  }
}

void shm_barrier(ShmChannel& channel, const OpEnv& env) {
  channel.arrive_and_wait(stamp(env, 0, 0), env.deadline);
}

}  // namespace loom::comm::gloo_detail
