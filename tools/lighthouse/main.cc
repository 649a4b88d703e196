// lighthouse: the quorum store replica jobs share (torchft's lighthouse): a TcpStore server that
// outlives every replica, so replicas that fail and come back find the running job's state of
// play (parallel/ft/replica_group.h). Serves until SIGINT or SIGTERM.
//
//   lighthouse --port 29510 [--bind 0.0.0.0]
//   loom_train ... --replicas 2 --replica 0 --replica-store HOST:29510   (and replica 1 likewise)
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "comm/tcp_store_server.h"

int main(int argc, char** argv) {
  CLI::App app{"lighthouse: the quorum store of replica jobs (loom_train --replicas)"};
  int port = 0;
  std::string bind = "0.0.0.0";
  app.add_option("--port", port, "port to serve on (0: a free one, printed)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--bind", bind, "address to bind");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help 0; a bad command line 2, as Loom's other tools
  }
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);  // the server thread inherits it; sigwait below
  try {
    loom::comm::TcpStoreServer server(
        loom::comm::TcpStoreServerOptions{.bind_host = bind, .port = port});
    std::printf("lighthouse: serving the replicas' quorum store on %s:%d\n", bind.c_str(),
                server.port());
    std::fflush(stdout);
    int signal_number = 0;
    sigwait(&stop, &signal_number);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lighthouse: %s\n", e.what());
    return 1;
  }
  return 0;
}
