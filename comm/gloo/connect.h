// Opening a Gloo TCP device and connecting a group's full mesh through a loom Store (private to
// comm/gloo).
#pragma once

#include <memory>
#include <string>

#include "comm/gloo/process_group_gloo.h"
#include "comm/store.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace loom::comm::gloo_detail {

// The TCP device for `options` (see GlooOptions for the resolution order). `group` names the
// group in errors.
std::shared_ptr<::gloo::transport::Device> open_device(const GlooOptions& options,
                                                       const std::string& group);

// Waits until keys prefix + "0" .. prefix + (size - 1) are all set; after `timeout`, throws
// loom::Error naming the ranks whose key is missing ("<what>: ranks [2] did not <verb> within
// 10000 ms").
void wait_for_ranks(Store& store, const std::string& prefix, int size, Duration timeout,
                    const std::string& what, const char* verb);

// Rendezvous of `size` ranks through `store` (keys under "gloo/"), then a TCP connection to
// every peer. Throws loom::Error naming the ranks that did not join within `timeout`.
// `what` prefixes errors ("ProcessGroupGloo: connecting group 'tp' (rank 1 of 4)").
std::shared_ptr<::gloo::Context> connect_full_mesh(
    Store& store, int rank, int size, Duration timeout,
    const std::shared_ptr<::gloo::transport::Device>& device, const std::string& what);

}  // namespace loom::comm::gloo_detail
