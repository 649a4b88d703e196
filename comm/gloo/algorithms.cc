#include "comm/gloo/algorithms.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "base/error.h"
#include "comm/gloo/chunks.h"
#include "comm/gloo/reduce.h"
#include "comm/gloo/shm_algorithms.h"

namespace loom::comm::gloo_detail {

namespace {

// Slot prefixes: collectives use kCollectivePrefix + kind (a rank running a different kind of
// collective than its peers then times out instead of exchanging mismatched data).
constexpr uint8_t kCollectivePrefix = 0x40;
constexpr uint8_t kP2PHeaderPrefix = 0x60;
constexpr uint8_t kP2PPayloadPrefix = 0x61;

uint64_t slot(const OpEnv& env, uint32_t phase) {
  return make_slot(static_cast<uint8_t>(kCollectivePrefix + static_cast<uint8_t>(env.kind)),
                   static_cast<uint32_t>(env.index), phase);
}

// The message header of send/recv.
struct Header {
  uint32_t magic;
  uint8_t dtype;
  uint8_t reserved[3];
  int64_t numel;
};
static_assert(sizeof(Header) == 16);
constexpr uint32_t kHeaderMagic = 0x4d4f4f4c;  // "LOOM"

}  // namespace

// Segments a rank's chunk splits into, so that reducing one overlaps the transfers of the next:
// about kSegmentBytes each, at most kMaxSegments.
constexpr size_t kSegmentBytes = size_t{1} << 20;
constexpr int64_t kMaxSegments = 64;

void all_reduce(const OpEnv& env, const Tensor& tensor, ReduceOp op) {
  const int world = env.mesh.size();
  const int me = env.mesh.rank();
  const int64_t count = tensor.numel();
  const size_t esize = element_size(tensor.dtype());
  char* data = bytes(tensor);
  if (world == 1) {
    reduce_pieces(tensor.dtype(), op, {data}, data, count);  // kAvg divides by 1
    return;
  }
  if (ShmChannel* shm = env.mesh.shared_memory()) return shm_all_reduce(*shm, env, tensor, op);
  // Reduce-scatter then all-gather, direct to every peer: chunk j of every rank goes to rank j,
  // which reduces the pieces in rank order (the same order whatever the timing) and sends the
  // result to every rank. Each chunk goes in segments, all posted at once: segment s is reduced
  // and sent back as soon as it has arrived, while later segments are still on the wire.
  const Chunk mine = chunk_of(count, world, me);
  const size_t mine_bytes = static_cast<size_t>(mine.count) * esize;
  char* received = env.scratch.get(mine_bytes * static_cast<size_t>(world));
  // Segments by the largest chunk (rank 0's), so every rank cuts every chunk the same way.
  const int64_t largest = chunk_of(count, world, 0).count;
  const int64_t segments = std::clamp<int64_t>(
      static_cast<int64_t>(static_cast<size_t>(largest) * esize / kSegmentBytes), 1, kMaxSegments);
  const auto segment_of = [&](const Chunk& chunk, int64_t s) {
    const Chunk part = chunk_of(chunk.count, static_cast<int>(segments), static_cast<int>(s));
    return Chunk{chunk.offset + part.offset, part.count};
  };
  std::vector<std::unique_ptr<Transfers>> scatter, gather;
  for (int64_t s = 0; s < segments; ++s) {
    auto& round = scatter.emplace_back(std::make_unique<Transfers>(env.mesh, env.deadline));
    const Chunk local = segment_of({0, mine.count}, s);  // within my chunk
    for (int peer = 0; peer < world; ++peer) {
      if (peer == me) continue;
      const Chunk theirs = segment_of(chunk_of(count, world, peer), s);
      round->recv(peer, slot(env, static_cast<uint32_t>(2 * s)),
                  received + peer * mine_bytes + local.offset * esize,
                  static_cast<size_t>(local.count) * esize);
      round->send(peer, slot(env, static_cast<uint32_t>(2 * s)), data + theirs.offset * esize,
                  static_cast<size_t>(theirs.count) * esize);
    }
  }
  std::vector<const void*> pieces(world);
  for (int64_t s = 0; s < segments; ++s) {
    scatter[s]->wait();
    const Chunk local = segment_of({0, mine.count}, s);
    char* reduced = data + (mine.offset + local.offset) * esize;
    for (int r = 0; r < world; ++r) {
      pieces[r] = r == me ? reduced : received + r * mine_bytes + local.offset * esize;
    }
    reduce_pieces(tensor.dtype(), op, pieces, reduced, local.count);
    auto& round = gather.emplace_back(std::make_unique<Transfers>(env.mesh, env.deadline));
    for (int peer = 0; peer < world; ++peer) {
      if (peer == me) continue;
      const Chunk theirs = segment_of(chunk_of(count, world, peer), s);
      round->recv(peer, slot(env, static_cast<uint32_t>(2 * s + 1)), data + theirs.offset * esize,
                  static_cast<size_t>(theirs.count) * esize);
      round->send(peer, slot(env, static_cast<uint32_t>(2 * s + 1)), reduced,
                  static_cast<size_t>(local.count) * esize);
    }
  }
  for (auto& round : gather) round->wait();
}

void broadcast(const OpEnv& env, const Tensor& tensor, int root) {
  if (ShmChannel* shm = env.mesh.shared_memory()) return shm_broadcast(*shm, env, tensor, root);
  const int world = env.mesh.size();
  const int me = env.mesh.rank();
  Transfers round(env.mesh, env.deadline);
  if (me == root) {
    for (int peer = 0; peer < world; ++peer) {
      if (peer != me) round.send(peer, slot(env, 0), bytes(tensor), nbytes(tensor));
    }
  } else {
    round.recv(root, slot(env, 0), bytes(tensor), nbytes(tensor));
  }
  round.wait();
}

namespace {
// Every rank sends `input_for(peer)` to each peer and receives peer's piece into outputs[peer];
// its own piece is copied. all_gather (one input for all) and all_to_all share it.
template <typename InputFor>
void exchange(const OpEnv& env, const std::vector<Tensor>& outputs, InputFor input_for) {
  const int world = env.mesh.size();
  const int me = env.mesh.rank();
  Transfers round(env.mesh, env.deadline);
  for (int peer = 0; peer < world; ++peer) {
    if (peer == me) continue;
    round.recv(peer, slot(env, 0), bytes(outputs[peer]), nbytes(outputs[peer]));
    round.send(peer, slot(env, 0), bytes(input_for(peer)), nbytes(input_for(peer)));
  }
  copy_bytes(bytes(outputs[me]), bytes(input_for(me)), nbytes(input_for(me)));
  round.wait();
}
}  // namespace

void all_gather(const OpEnv& env, const std::vector<Tensor>& outputs, const Tensor& input) {
  if (ShmChannel* shm = env.mesh.shared_memory()) return shm_all_gather(*shm, env, outputs, input);
  exchange(env, outputs, [&](int) -> const Tensor& { return input; });
}

void reduce_scatter(const OpEnv& env, const Tensor& output, const std::vector<Tensor>& inputs,
                    ReduceOp op) {
  if (ShmChannel* shm = env.mesh.shared_memory()) {
    return shm_reduce_scatter(*shm, env, output, inputs, op);
  }
  const int world = env.mesh.size();
  const int me = env.mesh.rank();
  const size_t piece = nbytes(output);
  char* received = env.scratch.get(piece * static_cast<size_t>(world));
  {
    Transfers round(env.mesh, env.deadline);
    for (int peer = 0; peer < world; ++peer) {
      if (peer == me) continue;
      round.recv(peer, slot(env, 0), received + peer * piece, piece);
      round.send(peer, slot(env, 0), bytes(inputs[peer]), nbytes(inputs[peer]));
    }
    round.wait();
  }
  std::vector<const void*> pieces(world);
  for (int r = 0; r < world; ++r) pieces[r] = r == me ? bytes(inputs[me]) : received + r * piece;
  reduce_pieces(output.dtype(), op, pieces, bytes(output), output.numel());
}

void all_to_all(const OpEnv& env, const std::vector<Tensor>& outputs,
                const std::vector<Tensor>& inputs) {
  exchange(env, outputs, [&](int peer) -> const Tensor& { return inputs[peer]; });
}

void gather(const OpEnv& env, const std::vector<Tensor>& outputs, const Tensor& input, int root) {
  const int world = env.mesh.size();
  const int me = env.mesh.rank();
  Transfers round(env.mesh, env.deadline);
  if (me == root) {
    for (int peer = 0; peer < world; ++peer) {
      if (peer != me) round.recv(peer, slot(env, 0), bytes(outputs[peer]), nbytes(outputs[peer]));
    }
    copy_bytes(bytes(outputs[me]), bytes(input), nbytes(input));
  } else {
    round.send(root, slot(env, 0), bytes(input), nbytes(input));
  }
  round.wait();
}

void scatter(const OpEnv& env, const Tensor& output, const std::vector<Tensor>& inputs, int root) {
  const int world = env.mesh.size();
  const int me = env.mesh.rank();
  Transfers round(env.mesh, env.deadline);
  if (me == root) {
    for (int peer = 0; peer < world; ++peer) {
      if (peer != me) round.send(peer, slot(env, 0), bytes(inputs[peer]), nbytes(inputs[peer]));
    }
    copy_bytes(bytes(output), bytes(inputs[me]), nbytes(output));
  } else {
    round.recv(root, slot(env, 0), bytes(output), nbytes(output));
  }
  round.wait();
}

void barrier(const OpEnv& env) {
  if (ShmChannel* shm = env.mesh.shared_memory()) return shm_barrier(*shm, env);
  const int world = env.mesh.size();
  const int me = env.mesh.rank();
  char token = 1;
  std::vector<char> received(static_cast<size_t>(world));
  Transfers round(env.mesh, env.deadline);
  for (int peer = 0; peer < world; ++peer) {
    if (peer == me) continue;
    round.recv(peer, slot(env, 0), &received[peer], 1);
    round.send(peer, slot(env, 0), &token, 1);
  }
  round.wait();
}

void send(const OpEnv& env, const Tensor& tensor, int dst, int tag, uint32_t message) {
  Header header{kHeaderMagic, static_cast<uint8_t>(tensor.dtype()), {0, 0, 0}, tensor.numel()};
  Transfers round(env.mesh, env.deadline);
  round.send(dst, make_slot(kP2PHeaderPrefix, static_cast<uint32_t>(tag), message), &header,
             sizeof(header));
  round.send(dst, make_slot(kP2PPayloadPrefix, static_cast<uint32_t>(tag), message), bytes(tensor),
             nbytes(tensor));
  round.wait();
}

void recv(const OpEnv& env, const Tensor& tensor, int src, int tag, uint32_t message) {
  Header header{};
  {
    Transfers round(env.mesh, env.deadline);
    round.recv(src, make_slot(kP2PHeaderPrefix, static_cast<uint32_t>(tag), message), &header,
               sizeof(header));
    round.wait();
  }
  LOOM_CHECK(header.magic == kHeaderMagic && header.dtype <= static_cast<uint8_t>(kInt64),
             "rank {} sent a malformed message header (tag {})", src, tag);
  const auto sent_dtype = static_cast<DType>(header.dtype);
  LOOM_CHECK(sent_dtype == tensor.dtype() && header.numel == tensor.numel(),
             "size mismatch: rank {} sent {} elements of {} ({} bytes) with tag {}, but this recv "
             "expects {} "
             "elements of {} ({} bytes)",
             src, header.numel, dtype_name(sent_dtype),
             header.numel * static_cast<int64_t>(element_size(sent_dtype)), tag, tensor.numel(),
             dtype_name(tensor.dtype()), nbytes(tensor));
  Transfers round(env.mesh, env.deadline);
  round.recv(src, make_slot(kP2PPayloadPrefix, static_cast<uint32_t>(tag), message), bytes(tensor),
             nbytes(tensor));
  round.wait();
}

}  // namespace loom::comm::gloo_detail
