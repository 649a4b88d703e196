// LaunchEnv: who this process is in the job, read from the launcher's environment variables,
// and the rendezvous store every rank meets through.
//
// Sources, in order of precedence:
//   torchrun / loomrun   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
//   OpenMPI (mpirun)     OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   Slurm (srun)         SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, and SLURM_NTASKS_PER_NODE or
//                        else this node's entry of SLURM_TASKS_PER_NODE ("4(x2),3") by SLURM_NODEID
// The first source with its rank or size variable set is used. When torchrun and OpenMPI
// variables are both present they must agree. Slurm variables are not cross-checked: srun
// commonly starts one torchrun per node, whose workers then see the node's SLURM_PROCID.
// LOCAL_RANK/LOCAL_WORLD_SIZE (or the OpenMPI pair) may both be absent, meaning one node
// (local = global); one without the other is an error.
//
// The rendezvous address is always MASTER_ADDR:MASTER_PORT. Only a one-process job may omit
// them (127.0.0.1, port 0 = any free port). Rank 0 serves the store there, unless
// LOOM_AGENT_STORE=1 says the launcher serves it (loomrun does, as torchrun's agent does with
// TORCHELASTIC_USE_AGENT_STORE): then the store outlives any rank, so a rank 0 that fails or
// finishes first does not take the other ranks' failure reports and teardown with it.
//
// Every error lists the relevant variables found (NAME=value) and says what is needed.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "comm/store.h"

namespace loom::comm {

// The timeout of the rendezvous store and of every collective of the world group (and of the
// groups made from it), torch's `timeout=`: a rank waiting longer on a peer fails naming the
// peer. Unset: the environment's LOOM_TIMEOUT_S (seconds, a positive number), else
// kDefaultTimeout. A bad LOOM_TIMEOUT_S is an error naming it. The launcher reads it too (how
// long ranks left alone may stay stopped).
inline constexpr Duration kDefaultTimeout = std::chrono::minutes(5);
// The timeouts a job takes, in seconds: below a millisecond one rounds to none, far above a
// million seconds deadlines overflow the clock.
inline constexpr double kMinTimeoutSeconds = 1e-3, kMaxTimeoutSeconds = 1e6;
Duration timeout_from_env();

// Exit statuses a rank and its launcher agree on (loomrun reads them; train/job_main returns them):
//   kExitFailed      the rank failed: an error of its own.
//   kExitBadInput    bad input (a flag, file or layout), found before the ranks met: the same on
//                    every attempt, so the launcher does not restart the job.
//   kExitPeerFailed  the rank stopped because another rank failed (a comm::PeerFailure,
//                    peer_failure.h: a peer left, broke its connection or did not arrive in
//                    time; Gloo groups say so, NCCL's do not yet). The launcher waits up to
//                    kPeerFailureWait for the rank that failed of itself and blames that one.
inline constexpr int kExitFailed = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitPeerFailed = 3;

// How long a launcher waits, after a rank exits kExitPeerFailed, for the rank whose failure it
// reports: longer than that rank may linger for its peers' records once one of its groups failed
// (comm/gloo: at most 5 s, after its state's 1 s flush), with a margin.
inline constexpr std::chrono::seconds kPeerFailureWait{10};

// The exit status for a rank that ends on `error`: kExitPeerFailed for a PeerFailure,
// kExitBadInput for a loom::InputError, else kExitFailed.
int exit_status_for(const std::exception& error);

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // LOOM_AGENT_STORE=1: the launcher serves the store; every rank, rank 0 too, is a client.
  bool agent_store = false;
  // Where the values came from: "torchrun", "openmpi" or "slurm".
  std::string source;
};

using GetEnv = std::function<std::optional<std::string>(const std::string&)>;

// std::getenv, as a GetEnv.
std::optional<std::string> real_getenv(const std::string& name);

// Reads and validates the launch environment; throws loom::Error (see above).
LaunchEnv read_launch_env(const GetEnv& getenv = real_getenv);

// "rank 3/8 (local 1/4) via torchrun, master 10.0.0.1:29500"
std::string to_string(const LaunchEnv& env);

// The address the rendezvous store's server listens on for `master_addr`: master_addr itself
// when it is a loopback address, else "" (every interface: MASTER_ADDR is often a hostname that
// the master's own /etc/hosts maps to 127.0.1.1).
std::string rendezvous_bind_host(const std::string& master_addr);

// The store every rank rendezvouses through: a TcpStore whose server runs in rank 0 (or, with
// agent_store, in the launcher) at master_addr:master_port, with every rank (rank 0 included)
// connected as a client; the server listens on rendezvous_bind_host(master_addr).
// Connecting retries until `timeout`, so ranks may start before rank 0.
std::shared_ptr<Store> make_rendezvous_store(const LaunchEnv& env,
                                             Duration timeout = kDefaultStoreTimeout);

}  // namespace loom::comm
