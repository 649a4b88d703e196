#include "comm/launch_env.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "base/error.h"
#include "comm/peer_failure.h"
#include "comm/tcp_store.h"

namespace loom::comm {

Duration timeout_from_env() {
  const char* text = std::getenv("LOOM_TIMEOUT_S");
  if (text == nullptr || *text == '\0') return kDefaultTimeout;
  char* end = nullptr;
  errno = 0;
  const double seconds = std::strtod(text, &end);
  LOOM_CHECK(end != text && *end == '\0' && errno == 0 && seconds >= kMinTimeoutSeconds &&
                 seconds <= kMaxTimeoutSeconds,
             "LOOM_TIMEOUT_S: expected a number of seconds from {:g} to {:.0f}, got '{}'",
             kMinTimeoutSeconds, kMaxTimeoutSeconds, text);
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(seconds));
}

int exit_status_for(const std::exception& error) {
  if (is_peer_failure(error)) return kExitPeerFailed;
  return dynamic_cast<const InputError*>(&error) != nullptr ? kExitBadInput : kExitFailed;
}

namespace {

// Every variable an error may list, in the order it lists them.
const char* const kRelevantVariables[] = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "LOOM_AGENT_STORE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_NODEID",
};

// The four variables one launcher sets.
struct Source {
  const char* name;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};
constexpr Source kTorchrun{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
constexpr Source kOpenMpi{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};
constexpr Source kSlurm{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                        "SLURM_NTASKS_PER_NODE"};

class EnvReader {
 public:
  explicit EnvReader(const GetEnv& getenv) {
    for (const char* name : kRelevantVariables) {
      if (auto value = getenv(name)) found_.emplace_back(name, *value);
    }
  }

  const std::string* raw(const std::string& name) const {
    for (const auto& [n, v] : found_) {
      if (n == name) return &v;
    }
    return nullptr;
  }
  bool has(const std::string& name) const { return raw(name) != nullptr; }

  [[noreturn]] void fail(const std::string& problem, const std::string& need) const {
    std::string found;
    for (const auto& [n, v] : found_)
      found += fmt::format("{}{}={}", found.empty() ? "" : ", ", n, v);
    if (found.empty())
      found = "none of RANK, WORLD_SIZE, OMPI_COMM_WORLD_*, SLURM_*, MASTER_ADDR, MASTER_PORT";
    LOOM_FAIL("read_launch_env: {}; found {}; need {}", problem, found, need);
  }

  // The variable as a non-negative integer, or nullopt when unset.
  std::optional<int> number(const std::string& name) const {
    const std::string* text = raw(name);
    if (text == nullptr) return std::nullopt;
    int value = -1;
    const char* begin = text->data();
    const char* end = begin + text->size();
    const auto [ptr, ec] = std::from_chars(begin, end, value);
    if (ec != std::errc() || ptr != end || begin == end || value < 0) {
      fail(fmt::format("{}={} is not a non-negative integer", name, *text),
           fmt::format("{} to be a decimal number", name));
    }
    return value;
  }

 private:
  std::vector<std::pair<std::string, std::string>> found_;
};

// Local world size from SLURM_TASKS_PER_NODE ("2(x3),1": 2 tasks on each of nodes 0-2, 1 on
// node 3) and SLURM_NODEID.
std::optional<int> slurm_tasks_on_node(const EnvReader& env) {
  const std::string* spec = env.raw("SLURM_TASKS_PER_NODE");
  if (spec == nullptr || !env.has("SLURM_NODEID")) return std::nullopt;
  const int node = *env.number("SLURM_NODEID");
  int first_node = 0;
  size_t pos = 0;
  auto bad = [&] {
    env.fail(fmt::format("SLURM_TASKS_PER_NODE={} is not a list like '4(x2),3'", *spec),
             "SLURM_TASKS_PER_NODE in Slurm's format, or SLURM_NTASKS_PER_NODE");
  };
  while (pos < spec->size()) {
    size_t end = spec->find(',', pos);
    if (end == std::string::npos) end = spec->size();
    const std::string item = spec->substr(pos, end - pos);
    int tasks = 0;
    int repeat = 1;
    const char* b = item.data();
    const char* e = b + item.size();
    auto [p, ec] = std::from_chars(b, e, tasks);
    if (ec != std::errc() || p == b) bad();
    if (p != e) {
      if (e - p < 4 || p[0] != '(' || p[1] != 'x' || e[-1] != ')') bad();
      auto [q, ec2] = std::from_chars(p + 2, e - 1, repeat);
      if (ec2 != std::errc() || q != e - 1 || repeat < 1) bad();
    }
    if (node < first_node + repeat) return tasks;
    first_node += repeat;
    pos = end + 1;
  }
  env.fail(fmt::format("SLURM_NODEID={} is beyond the {} nodes of SLURM_TASKS_PER_NODE={}", node,
                       first_node, *spec),
           "SLURM_NODEID to index SLURM_TASKS_PER_NODE");
}

void read_ranks(const EnvReader& env, const Source& source, LaunchEnv* out) {
  const auto rank = env.number(source.rank);
  const auto size = env.number(source.size);
  if (!rank || !size) {
    const char* missing = rank ? source.size : source.rank;
    const char* present = rank ? source.rank : source.size;
    env.fail(
        fmt::format("{} is set but {} is missing ({} variables)", present, missing, source.name),
        fmt::format("both {} and {}", source.rank, source.size));
  }
  out->rank = *rank;
  out->world_size = *size;
  out->source = source.name;
  auto local_rank = env.number(source.local_rank);
  auto local_size = env.number(source.local_size);
  if (&source == &kSlurm && !local_size) local_size = slurm_tasks_on_node(env);
  if (&source == &kSlurm && !local_rank) {
    env.fail("SLURM_PROCID is set but SLURM_LOCALID is missing",
             "SLURM_LOCALID (set by srun for each task)");
  }
  if (&source == &kSlurm && !local_size) {
    env.fail("cannot tell how many tasks run on this node (Slurm variables)",
             "SLURM_NTASKS_PER_NODE, or SLURM_TASKS_PER_NODE with SLURM_NODEID");
  }
  if (local_rank.has_value() != local_size.has_value()) {
    const char* missing = local_rank ? source.local_size : source.local_rank;
    const char* present = local_rank ? source.local_rank : source.local_size;
    env.fail(
        fmt::format("{} is set but {} is missing", present, missing),
        fmt::format("both {} and {}, or neither (one node)", source.local_rank, source.local_size));
  }
  out->local_rank = local_rank.value_or(out->rank);
  out->local_world_size = local_size.value_or(out->world_size);

  if (out->world_size < 1) {
    env.fail(
        fmt::format("{}={} is not a positive number of processes", source.size, out->world_size),
        fmt::format("{} >= 1", source.size));
  }
  if (out->rank >= out->world_size) {
    env.fail(fmt::format("{}={} is not below {}={}", source.rank, out->rank, source.size,
                         out->world_size),
             fmt::format("0 <= {} < {}", source.rank, source.size));
  }
  if (out->local_world_size < 1 || out->local_world_size > out->world_size) {
    env.fail(fmt::format("local world size {} is not in 1..{}={}", out->local_world_size,
                         source.size, out->world_size),
             fmt::format("1 <= {} <= {}", source.local_size, source.size));
  }
  if (out->local_rank >= out->local_world_size) {
    env.fail(fmt::format("local rank {} is not below the local world size {}", out->local_rank,
                         out->local_world_size),
             fmt::format("0 <= {} < {}", source.local_rank, source.local_size));
  }
}

// torchrun's values must match OpenMPI's when both are present (e.g. a job launched by
// mpirun that also exports RANK by hand).
void check_agreement(const EnvReader& env, const LaunchEnv& out) {
  const std::pair<const char*, const char*> pairs[] = {
      {"RANK", "OMPI_COMM_WORLD_RANK"},
      {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"},
      {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"},
      {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"},
  };
  for (const auto& [torch_name, mpi_name] : pairs) {
    const auto torch_value = env.number(torch_name);
    const auto mpi_value = env.number(mpi_name);
    if (torch_value && mpi_value && *torch_value != *mpi_value) {
      env.fail(fmt::format("torchrun and OpenMPI variables disagree: {}={} but {}={}", torch_name,
                           *torch_value, mpi_name, *mpi_value),
               "one launcher's variables, or both agreeing (unset the ones the other launcher did "
               "not set)");
    }
  }
  (void)out;
}

void read_master(const EnvReader& env, const Source& source, LaunchEnv* out) {
  const std::string* addr = env.raw("MASTER_ADDR");
  const auto port = env.number("MASTER_PORT");
  const std::string need =
      "MASTER_ADDR and MASTER_PORT: the address and port where rank 0 serves the rendezvous store";
  if (out->world_size > 1) {
    if (addr == nullptr || !port) {
      env.fail(fmt::format("{} is not set ({}={} processes)",
                           addr == nullptr ? "MASTER_ADDR" : "MASTER_PORT", source.size,
                           out->world_size),
               need);
    }
    if (*port == 0) {
      env.fail(fmt::format("MASTER_PORT=0 cannot be found by the other ranks ({}={})", source.size,
                           out->world_size),
               "MASTER_PORT in 1..65535");
    }
  }
  if (addr != nullptr) {
    if (addr->empty()) env.fail("MASTER_ADDR is empty", need);
    out->master_addr = *addr;
  } else {
    out->master_addr = "127.0.0.1";
  }
  out->master_port = port.value_or(0);
  if (out->master_port > 65535) {
    env.fail(fmt::format("MASTER_PORT={} is not a TCP port", out->master_port),
             "MASTER_PORT in 1..65535");
  }
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace

std::optional<std::string> real_getenv(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

LaunchEnv read_launch_env(const GetEnv& getenv) {
  const EnvReader env(getenv);
  const Source* source = nullptr;
  for (const Source* candidate : {&kTorchrun, &kOpenMpi, &kSlurm}) {
    if (env.has(candidate->rank) || env.has(candidate->size)) {
      source = candidate;
      break;
    }
  }
  if (source == nullptr) {
    env.fail("no launcher variables are set",
             "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (as torchrun or loomrun set them), or "
             "a run under "
             "mpirun (OMPI_COMM_WORLD_*) or srun (SLURM_*); for one process RANK=0 WORLD_SIZE=1 is "
             "enough");
  }
  LaunchEnv out;
  read_ranks(env, *source, &out);
  if (source == &kTorchrun) check_agreement(env, out);
  read_master(env, *source, &out);
  if (const std::string* agent = env.raw("LOOM_AGENT_STORE")) {
    if (*agent != "0" && *agent != "1") {
      env.fail(fmt::format("LOOM_AGENT_STORE={} is neither 0 nor 1", *agent),
               "LOOM_AGENT_STORE=1 when the launcher serves the rendezvous store, 0 or unset when "
               "rank 0 does");
    }
    out.agent_store = *agent == "1";
  }
  return out;
}

std::string to_string(const LaunchEnv& env) {
  return fmt::format("rank {}/{} (local {}/{}) via {}, master {}:{}{}", env.rank, env.world_size,
                     env.local_rank, env.local_world_size, env.source.empty() ? "?" : env.source,
                     env.master_addr, env.master_port,
                     env.agent_store ? " (store served by the launcher)" : "");
}

std::string rendezvous_bind_host(const std::string& master_addr) {
  return is_loopback(master_addr) ? master_addr : "";
}

std::shared_ptr<Store> make_rendezvous_store(const LaunchEnv& env, Duration timeout) {
  LOOM_CHECK(env.world_size >= 1 && env.rank >= 0 && env.rank < env.world_size,
             "make_rendezvous_store: rank {} is not in 0..{} (world_size {})", env.rank,
             env.world_size - 1, env.world_size);
  LOOM_CHECK(!env.master_addr.empty(), "make_rendezvous_store: master_addr is empty ({})",
             to_string(env));
  LOOM_CHECK(env.master_port > 0 || (env.master_port == 0 && env.world_size == 1),
             "make_rendezvous_store: master_port {} is not usable for {} ranks; need a port in "
             "1..65535 ({})",
             env.master_port, env.world_size, to_string(env));
  TcpStoreOptions options;
  options.is_server = env.rank == 0 && !env.agent_store;
  const std::string bind_host = rendezvous_bind_host(env.master_addr);
  options.bind_host = bind_host.empty() ? "*" : bind_host;
  options.timeout = timeout;
  return std::make_shared<TcpStore>(env.master_addr, env.master_port, options);
}

}  // namespace loom::comm
