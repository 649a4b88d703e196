// ProcessGroupGloo: the CPU backend. Collectives over Gloo's TCP transport.
//
//   auto store = std::make_shared<InMemoryStore>();            // or a FileStore / TcpStore
//   auto pg = ProcessGroupGloo::create(store, rank, world, {.name = "default",
//                                      .timeout = std::chrono::seconds(30)});
//   Tensor grad = ...;
//   auto work = pg->all_reduce(grad, ReduceOp::kAvg);          // returns at once
//   ... compute ...
//   work->wait();                                              // throws loom::Error on failure
//
// create() is collective: every rank of the group calls it with the same store and size; it
// returns once all ranks are connected (full mesh of TCP connections), or throws naming the
// ranks that did not join within options.timeout. `store` must be this group's own key space
// (a fresh store or a PrefixStore); the group writes keys under "gloo/".
//
// Threads. Each group runs its collectives on ONE worker thread, one at a time, in issue order:
// run_* enqueue and return a Work immediately, so communication overlaps the caller's compute.
// send/recv are posted at once on helper threads instead (a recv waiting for a late tag must
// not block other traffic); a send matches the recv of the same tag on the peer, in issue
// order. Tensors must stay alive and untouched until their Work completes. Issuing ops on one
// group from several threads at once is not supported (the ProcessGroup front end is not
// thread-safe); abort() and Work methods may be called from any thread. A group also has one
// thread writing its progress records (below); new_group() reuses the parent's TCP device (one
// listening socket and Gloo I/O thread per create()).
//
// Algorithms. Loom drives Gloo's transport (pairs, unbound buffers) directly instead of Gloo's
// collective algorithms, so every transfer can be aborted and uneven sizes need no staging:
//   all_reduce       = reduce_scatter of balanced chunks + all_gather of the reduced chunks,
//                      each a direct exchange with every peer (2(W-1)/W of the tensor sent per
//                      rank, like a ring, in 2 steps instead of 2(W-1)).
//   reduce_scatter   = each rank sends inputs[j] to rank j, then reduces the W pieces locally.
//                      Same bytes as a ring reduce-scatter; no all-reduce + slice (2x bytes).
//   all_gather, all_to_all, gather, scatter, broadcast: direct sends into the caller's output
//                      tensors (uneven sizes, no staging copies); barrier: 1 byte each way.
// Transports. When every rank of a group runs on one host (same hostname, boot id, PID
// namespace and /dev/shm mount; judged per group, so a mesh's sub-groups each decide for
// themselves), all_reduce, reduce_scatter, all_gather, broadcast and barrier go through a
// shared-memory segment the group maps at create() (copy in, one futex-backed barrier, copy out;
// all_reduce reduces each rank's 1/W share in place between two barriers) instead of TCP:
// several times faster at 4-64 MiB, same results bit for bit. all_to_all, gather, scatter and
// send/recv always use TCP. GlooOptions::shared_memory = false or LOOM_GLOO_SHM=0 on any rank
// keeps the group on TCP. Failures over shared memory are named as over TCP: a peer that does
// not arrive by the deadline times out; one whose group failed, was aborted or destroyed, or
// whose process exited is a broken connection to that rank. Ranks also compare each
// collective's kind, sequence number and size at its first barrier, so a mismatch there fails
// on every rank with an error naming both sides instead of exchanging wrong data.
// Reductions run in rank order 0..W-1, so results are deterministic and identical on every
// rank. bf16/f16 are sent in their own format (half the bytes of f32) and reduced in f32,
// rounded once at the end (round to nearest even): more accurate than NCCL's per-step
// rounding. kAvg = sum / W (integer dtypes: truncating division). Integer sum and product wrap
// on overflow. Tensors must be contiguous and on the CPU.
//
// Failures. Every operation has the group's timeout (options.timeout, read when the op is
// issued). When a peer is gone or never arrives the Work fails with a loom::Error naming the
// group, the op and its sequence number, and the ranks that did not arrive ("ranks [2] did not
// arrive at this all_reduce"): each rank records, off the caller's thread, how many collectives
// it has started under "gloo/progress/<rank>" in the group's store, and a failing rank reads the
// others' records. After the first failure the group is poisoned: its connections are closed
// (so peers blocked on this rank fail at once instead of waiting out the timeout) and every
// later op fails at once with an error naming that first failure.
// Size mismatches: a recv whose size or dtype differs from the send fails with an error naming
// both sides (a 16-byte header precedes each message). Over TCP, collectives do not exchange
// sizes (that would cost a round trip per op): a transfer only matches one of its own size (the
// size is in the Gloo slot), so ranks whose sizes differ time out with an error saying so, and a
// different collective kind at the same position times out too (slots are per kind). Over shared
// memory the first barrier compares kind and size, and mismatches fail at once on every rank
// naming both sides. Run with LOOM_DEBUG=collectives to compare every collective's op, dtype and
// sizes across ranks first, on either transport; mismatches then raise on every rank, naming
// both sides.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"

namespace gloo::transport {
class Device;
}  // namespace gloo::transport

namespace loom::comm {

namespace gloo_detail {
class GroupState;
class HostStaging;
class OpRunner;
struct OpEnv;
}  // namespace gloo_detail

// Where the group's TCP endpoint listens. Resolution: `interface` if set, else `hostname` if
// set, else env LOOM_GLOO_IFNAME, else env LOOM_GLOO_HOSTNAME, else, with env MASTER_ADDR (as
// launchers set it) naming another host, the local address that routes to it (what a peer on
// that side can reach back), else "127.0.0.1" (loopback: every rank on one host, as in tests).
// A rank listening off loopback says where, once per process.
// Throws loom::Error naming the variable and what this host has when LOOM_GLOO_IFNAME names no
// interface of it with an address, or LOOM_GLOO_HOSTNAME does not resolve (a job checks it
// before its ranks start, rather than every rank failing to connect).
void check_endpoint_env();
// LOOM_GLOO_SHM: true unset or "1"/"true"/"on", false for "0"/"false"/"off"; throws loom::Error
// naming any other value (a job checks it before its ranks start).
bool shared_memory_allowed_by_env();

struct GlooOptions {
  std::string interface;  // a network interface name ("eth0")
  std::string hostname;   // a hostname or address this rank's peers can reach
  // Same-host groups run all_reduce, reduce_scatter, all_gather, broadcast and barrier through a
  // shared-memory segment instead of TCP (see "Transports" above). false (or env LOOM_GLOO_SHM=0
  // on any rank) keeps the whole group on TCP.
  bool shared_memory = true;
  // This rank's host identity for that choice; empty detects it (shm_connect.h). Ranks that give
  // different identities stay on TCP, as ranks on different hosts do.
  std::string host_identity;
  // Bytes each rank moves through shared memory per round; 0 picks it (env LOOM_GLOO_SHM_SLOT,
  // else 1 MiB). Rank 0's value is the group's. Small values exercise the multi-round paths in
  // tests.
  size_t shared_memory_slot_bytes = 0;
  // Where the group's tensors live. The CPU by default. A CUDA device (cuda:k) makes a group for
  // ranks that share one GPU, which cannot form an NCCL communicator (torch's Gloo backend does
  // the same for CUDA tensors): each op copies what it reads to the host when issued (which
  // synchronizes the device's compute stream), runs over the host copies, and queues the results'
  // copy back onto the compute stream before its Work completes (comm/gloo/host_staging.h). The
  // same results as on CPU tensors, bit for bit, with one more rule than a CPU group's: an op
  // reads its inputs when issued, so a tensor that a pending op writes must not be an input of
  // the next op before that op's Work is waited for (torch's Gloo has the same rule). Slow (every
  // byte crosses PCIe twice): for tests and one-GPU runs of multi-rank layouts. Sub-groups
  // (new_group) inherit it.
  Device device = Device::cpu();
  static GlooOptions loopback() { return GlooOptions{.interface = "", .hostname = "127.0.0.1"}; }
};

class ProcessGroupGloo : public ProcessGroup {
 public:
  // Collective (see above). Throws loom::Error naming the group and the ranks that did not join.
  static std::shared_ptr<ProcessGroupGloo> create(std::shared_ptr<Store> store, int rank, int size,
                                                  ProcessGroupOptions options,
                                                  GlooOptions gloo = {});
  // The same, for a group whose ranks are not a job's world: `global_ranks[i]` is the rank that
  // group rank i's process has in its own job (its flight recorder dumps the group's operations
  // into that rank's file; replicas of a job, each its own launch, share one rank number).
  static std::shared_ptr<ProcessGroupGloo> create(std::shared_ptr<Store> store, int rank, int size,
                                                  std::vector<int> global_ranks,
                                                  ProcessGroupOptions options,
                                                  GlooOptions gloo = {});

  // Runs what is still queued (each op ends by its timeout at the latest; after a failure the
  // rest fail at once), then joins the group's threads. Call abort() first to drop queued work.
  ~ProcessGroupGloo() override;

  std::string backend_name() const override { return "gloo"; }
  // The CPU, or GlooOptions::device's GPU (its tensors staged through host memory).
  Device device() const override { return gloo_options_.device; }

  // Poisons the group with `reason`: queued and later ops fail at once naming it, transfers in
  // flight are interrupted, and the connections are closed so peers fail fast (their errors name
  // this rank and `reason`). Thread-safe; idempotent (the first reason wins). An all_reduce or
  // other collective already running ends within milliseconds.
  void abort(const std::string& reason);
  // The first failure's message (or "aborted: <reason>"); empty while the group is usable. (The
  // same as ProcessGroupNccl::failure().)
  std::string failure() const;
  // Whether this group's collectives go through shared memory (see "Transports").
  bool uses_shared_memory() const;

  // Private: use create() or new_group().
  struct Token;
  ProcessGroupGloo(const Token&, std::shared_ptr<Store> store, int rank, int size,
                   std::vector<int> global_ranks, ProcessGroupOptions options, GlooOptions gloo,
                   std::shared_ptr<gloo::transport::Device> device);

 protected:
  std::shared_ptr<Work> run_all_reduce(const OpInfo& info, const Tensor& tensor,
                                       ReduceOp op) override;
  std::shared_ptr<Work> run_broadcast(const OpInfo& info, const Tensor& tensor, int root) override;
  std::shared_ptr<Work> run_all_gather(const OpInfo& info, const std::vector<Tensor>& outputs,
                                       const Tensor& input) override;
  std::shared_ptr<Work> run_reduce_scatter(const OpInfo& info, const Tensor& output,
                                           const std::vector<Tensor>& inputs, ReduceOp op) override;
  std::shared_ptr<Work> run_all_to_all(const OpInfo& info, const std::vector<Tensor>& outputs,
                                       const std::vector<Tensor>& inputs) override;
  std::shared_ptr<Work> run_gather(const OpInfo& info, const std::vector<Tensor>& outputs,
                                   const Tensor& input, int root) override;
  std::shared_ptr<Work> run_scatter(const OpInfo& info, const Tensor& output,
                                    const std::vector<Tensor>& inputs, int root) override;
  std::shared_ptr<Work> run_send(const OpInfo& info, const Tensor& tensor, int dst,
                                 int tag) override;
  std::shared_ptr<Work> run_recv(const OpInfo& info, const Tensor& tensor, int src,
                                 int tag) override;
  std::shared_ptr<Work> run_barrier(const OpInfo& info) override;
  std::shared_ptr<ProcessGroup> make_group(std::shared_ptr<Store> store, int rank,
                                           std::vector<int> group_ranks_global,
                                           ProcessGroupOptions options) override;

 private:
  using Body = std::function<void(const gloo_detail::OpEnv& env)>;
  // Collectives: run on the worker thread in issue order. `host` holds the op's staged tensors
  // (staging()); what the op wrote goes back to the device once `body` has run.
  std::shared_ptr<Work> enqueue(const OpInfo& info, gloo_detail::HostStaging host, Body body);
  // send/recv: run at once on a helper thread (`host` as for enqueue).
  std::shared_ptr<Work> post_p2p(const OpInfo& info, int peer, gloo_detail::HostStaging host,
                                 Body body);
  // `body`, then the staged results' copy back.
  static Body copying_back(gloo_detail::HostStaging host, Body body);
  // Staging for one op's tensors: active on a CUDA group.
  gloo_detail::HostStaging staging() const;

  GlooOptions gloo_options_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo_detail::GroupState> state_;
  std::unique_ptr<gloo_detail::OpRunner> runner_;
  uint64_t collectives_issued_ = 0;
  // Per-peer, per-tag message counters: the n-th send to a peer with a tag matches the n-th
  // recv from this rank with that tag.
  std::vector<std::map<int, uint32_t>> sends_issued_;
  std::vector<std::map<int, uint32_t>> recvs_issued_;
};

}  // namespace loom::comm
