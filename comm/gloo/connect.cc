#include "comm/gloo/connect.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <vector>

#include "base/error.h"
#include "base/logging.h"
#include "comm/peer_failure.h"

namespace loom::comm::gloo_detail {

namespace {

// Gloo's rendezvous keys live under `prefix` in a loom Store; waits use the group's timeout.
class StoreAdapter : public ::gloo::rendezvous::Store {
 public:
  StoreAdapter(comm::Store& store, std::string prefix, Duration timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(prefix_ + key, Bytes(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    store_.wait({prefix_ + key}, timeout_);
    const Bytes value = store_.get(prefix_ + key);
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(prefix_ + k);
    store_.wait(full, timeout);
  }

 private:
  comm::Store& store_;
  std::string prefix_;
  Duration timeout_;
};

// Every rank sets prefix + its rank and waits for all others.
void store_barrier(Store& store, const std::string& prefix, int rank, int size, Duration timeout,
                   const std::string& what, const char* verb) {
  store.set(prefix + std::to_string(rank), std::string("1"));
  wait_for_ranks(store, prefix, size, timeout, what, verb);
}

std::string env_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::string(value) : std::string();
}

// The local address this host uses to reach `host` (what a peer that reaches it can reach back):
// a UDP socket connected towards it (no packet is sent) and its own name. Nothing when `host`
// does not resolve or is a loopback address (every rank is on this host: loopback serves).
std::optional<std::string> local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || found == nullptr) return {};
  std::optional<std::string> out;
  const addrinfo& a = *found;
  const bool loopback =
      (a.ai_family == AF_INET &&
       (ntohl(reinterpret_cast<const sockaddr_in*>(a.ai_addr)->sin_addr.s_addr) >> 24) == 127) ||
      (a.ai_family == AF_INET6 &&
       IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(a.ai_addr)->sin6_addr));
  const int fd = loopback ? -1 : ::socket(a.ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    char text[INET6_ADDRSTRLEN] = {};
    if (::connect(fd, a.ai_addr, a.ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
      const void* address =
          local.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (::inet_ntop(local.ss_family, address, text, sizeof text) != nullptr) out = text;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return out;
}

}  // namespace

void wait_for_ranks(Store& store, const std::string& prefix, int size, Duration timeout,
                    const std::string& what, const char* verb) {
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(prefix + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (const Error&) {
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      if (!store.check({keys[r]})) missing.push_back(r);
    }
    // Peers that did not arrive within the timeout: a failure this rank saw in them (exit 3), so
    // that a launcher names the rank that failed of itself, if one did.
    throw PeerFailure(fmt::format("{}: ranks [{}] did not {} within {} ms", what,
                                  fmt::join(missing, ", "), verb, timeout.count()));
  }
}

namespace {

// Every rank counts itself in under gloo/joined/<rank> (an add, not a set: two processes given
// one rank, a launcher's RANK set alike in two environments, are told apart) and waits for all
// others. The second process of a rank fails at once; the others' timeout names it.
void join_barrier(Store& store, int rank, int size, Duration timeout, const std::string& what) {
  const std::string prefix = "gloo/joined/";
  const int64_t joined = store.add(prefix + std::to_string(rank), 1);
  LOOM_CHECK(joined == 1,
             "{}: rank {} joined {} times: two processes were given rank {} (the same RANK in two "
             "environments?); give each process its own rank",
             what, rank, joined, rank);
  try {
    wait_for_ranks(store, prefix, size, timeout, what, "join");
  } catch (const PeerFailure& e) {
    std::vector<int> twice;
    for (int r = 0; r < size; ++r) {
      const std::string key = prefix + std::to_string(r);
      if (store.check({key}) && store.add(key, 0) > 1) twice.push_back(r);
    }
    if (twice.empty()) throw;
    throw PeerFailure(fmt::format("{}; ranks [{}] joined twice: two processes were given one rank",
                                  e.what(), fmt::join(twice, ", ")));
  }
}

}  // namespace

namespace {

// Where a group's TCP endpoint listens (GlooOptions, else the environment: see
// process_group_gloo.h), and how it was chosen, checked: an interface this host has (with an
// address), a name that resolves.
struct Endpoint {
  ::gloo::transport::tcp::attr attr;
  std::string source;
};

// The host's interfaces that have an address, for messages.
std::vector<std::string> interfaces_with_addresses() {
  std::vector<std::string> names;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return names;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr ||
        (a->ifa_addr->sa_family != AF_INET && a->ifa_addr->sa_family != AF_INET6)) {
      continue;
    }
    if (std::find(names.begin(), names.end(), a->ifa_name) == names.end()) {
      names.emplace_back(a->ifa_name);
    }
  }
  ::freeifaddrs(list);
  return names;
}

// `who` begins its errors ("ProcessGroupGloo: group 'default'").
Endpoint choose_endpoint(const GlooOptions& options, const std::string& who) {
  Endpoint out;
  ::gloo::transport::tcp::attr& attr = out.attr;
  std::string& source = out.source;
  if (!options.interface.empty()) {
    attr.iface = options.interface;
    source = fmt::format("interface '{}' (GlooOptions)", attr.iface);
  } else if (!options.hostname.empty()) {
    attr.hostname = options.hostname;
    source = fmt::format("hostname '{}' (GlooOptions)", attr.hostname);
  } else if (auto iface = env_or_empty("LOOM_GLOO_IFNAME"); !iface.empty()) {
    attr.iface = iface;
    source = fmt::format("interface '{}' (LOOM_GLOO_IFNAME)", iface);
  } else if (auto host = env_or_empty("LOOM_GLOO_HOSTNAME"); !host.empty()) {
    attr.hostname = host;
    source = fmt::format("hostname '{}' (LOOM_GLOO_HOSTNAME)", host);
  } else if (const std::string master = env_or_empty("MASTER_ADDR"); !master.empty()) {
    // Ranks on several hosts: listen where the rendezvous host routes to, not on loopback,
    // which a peer on another host cannot reach.
    if (auto local = local_address_towards(master)) {
      attr.hostname = *local;
      source = fmt::format("hostname '{}' (the local address that routes to MASTER_ADDR {})",
                           *local, master);
    } else {
      attr.hostname = "127.0.0.1";
      source = fmt::format("hostname '127.0.0.1' (MASTER_ADDR {} is this host)", master);
    }
  } else {
    attr.hostname = "127.0.0.1";
    source = "hostname '127.0.0.1' (default: loopback)";
  }
  if (!attr.iface.empty()) {
    // Gloo would fail on it with "Unable to find address for" only once the rank connects.
    const std::vector<std::string> names = interfaces_with_addresses();
    LOOM_CHECK(std::find(names.begin(), names.end(), attr.iface) != names.end(),
               "{}: cannot open a TCP endpoint on {}: this host has no "
               "such interface with an address (it has: {}); give one of those, or "
               "LOOM_GLOO_HOSTNAME=<address>",
               who, source, fmt::join(names, ", "));
  }
  if (!attr.hostname.empty()) {
    // Gloo reads getaddrinfo's list without checking that the call succeeded: a name that does
    // not resolve would crash the rank (SIGSEGV) instead of failing with this message.
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int status = ::getaddrinfo(attr.hostname.c_str(), nullptr, &hints, &found);
    if (found != nullptr) ::freeaddrinfo(found);
    LOOM_CHECK(status == 0 && found != nullptr,
               "{}: cannot open a TCP endpoint on {}: the name does "
               "not resolve ({}); give an address or name of this host, or "
               "LOOM_GLOO_IFNAME=<interface>",
               who, source, ::gai_strerror(status));
  }
  return out;
}

}  // namespace

std::shared_ptr<::gloo::transport::Device> open_device(const GlooOptions& options,
                                                       const std::string& group) {
  const Endpoint endpoint =
      choose_endpoint(options, fmt::format("ProcessGroupGloo: group '{}'", group));
  const ::gloo::transport::tcp::attr& attr = endpoint.attr;
  const std::string& source = endpoint.source;
  if (attr.hostname != "127.0.0.1") {
    // Once per process: which address this rank's peers connect to, and how to change it.
    static std::once_flag said;
    std::call_once(said, [&] {
      LOOM_LOG(info,
               "gloo: this rank's endpoints listen on {}; LOOM_GLOO_IFNAME=<interface> or "
               "LOOM_GLOO_HOSTNAME=<address> chooses another",
               source);
    });
  }
  // The device starts Gloo's I/O thread, which inherits this thread's signal mask: start it
  // with SIGPIPE blocked, so a write to a dead peer fails with EPIPE instead of killing the
  // process (Gloo writes with writev, not send(MSG_NOSIGNAL)). No I/O happens on this thread
  // meanwhile, so no SIGPIPE can be left pending when the mask is restored.
  sigset_t pipe, previous;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, &previous);
  try {
    auto device = ::gloo::transport::tcp::CreateDevice(attr);
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    return device;
  } catch (const std::exception& e) {
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    LOOM_FAIL("ProcessGroupGloo: group '{}': cannot open a TCP endpoint on {}: {}", group, source,
              e.what());
  }
}

std::shared_ptr<::gloo::Context> connect_full_mesh(
    Store& store, int rank, int size, Duration timeout,
    const std::shared_ptr<::gloo::transport::Device>& device, const std::string& what) {
  // Join first, so a rank that never comes is named instead of a Gloo key.
  join_barrier(store, rank, size, timeout, what);
  auto context = std::make_shared<::gloo::rendezvous::Context>(rank, size);
  context->setTimeout(timeout);
  StoreAdapter adapter(store, "gloo/connect/", timeout);
  auto dev = device;  // connectFullMesh takes a non-const reference
  try {
    context->connectFullMesh(adapter, dev);
  } catch (const Error& e) {
    // The store's: a peer's address that did not come within the timeout, or the store's host
    // (rank 0) gone. Like I/O with a peer below (its connection timed out, was refused or
    // reset), the peers' failure, not this rank's own (exit 3): a launcher then names the rank
    // that failed of itself, if one did.
    throw PeerFailure(fmt::format("{}: connecting to peers failed: {}", what, e.what()));
  } catch (const ::gloo::IoException& e) {
    throw PeerFailure(fmt::format("{}: connecting to peers failed (gloo: {})", what, e.what()));
  } catch (const std::exception& e) {
    LOOM_FAIL("{}: connecting to peers failed (gloo: {})", what, e.what());
  }
  // Leave only when every rank has connected. Gloo's listening side returns from
  // connectFullMesh as soon as it has accepted, while the connecting side may not yet have seen
  // its connect complete; if the listening rank went on and closed its pairs (its group done),
  // the connecting rank would then read that close and fail with "Connection closed by peer".
  store_barrier(store, "gloo/connected/", rank, size, timeout, what, "finish connecting");
  return context;
}

}  // namespace loom::comm::gloo_detail

namespace loom::comm {

void check_endpoint_env() { gloo_detail::choose_endpoint(GlooOptions{}, "the ranks' Gloo groups"); }

}  // namespace loom::comm
