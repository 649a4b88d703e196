#include "comm/gloo/connect.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <pthread.h>
#include <signal.h>

#include <cstdlib>
#include <vector>

#include "base/error.h"

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
    LOOM_FAIL("{}: ranks [{}] did not {} within {} ms", what, fmt::join(missing, ", "), verb,
              timeout.count());
  }
}

std::shared_ptr<::gloo::transport::Device> open_device(const GlooOptions& options,
                                                       const std::string& group) {
  ::gloo::transport::tcp::attr attr;
  std::string source;
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
  } else {
    attr.hostname = "127.0.0.1";
    source = "hostname '127.0.0.1' (default: loopback)";
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
  store_barrier(store, "gloo/joined/", rank, size, timeout, what, "join");
  auto context = std::make_shared<::gloo::rendezvous::Context>(rank, size);
  context->setTimeout(timeout);
  StoreAdapter adapter(store, "gloo/connect/", timeout);
  auto dev = device;  // connectFullMesh takes a non-const reference
  try {
    context->connectFullMesh(adapter, dev);
  } catch (const Error& e) {
    LOOM_FAIL("{}: connecting to peers failed: {}", what, e.what());
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
