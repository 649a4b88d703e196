// Whether a Gloo group gets a shared-memory channel, and the rendezvous that sets it up (private
// to comm/gloo).
//
// A group uses shared memory when every rank runs on the same host, judged from each rank's host
// identity (hostname, boot id, PID namespace and the /dev/shm mount; not LOCAL_WORLD_SIZE, which
// says nothing about a sub-group of a mesh), and every rank allows it (GlooOptions::shared_memory
// and LOOM_GLOO_SHM != 0). Otherwise, or when the segment cannot be created or opened on some
// rank (no space in /dev/shm, permissions), every rank agrees to stay on TCP; rank 0 logs why.
// Rank 0 creates the segment and unlinks it as soon as every rank has mapped it, so a crash never
// leaves one behind in /dev/shm.
#pragma once

#include <memory>
#include <string>

#include "comm/gloo/process_group_gloo.h"
#include "comm/gloo/shm_channel.h"
#include "comm/store.h"

namespace loom::comm::gloo_detail {

// This process's host identity: equal for two processes iff they can share a segment.
std::string host_identity();

// Collective over the group's `store` (keys under "gloo/shm/"): a channel, or nullptr when the
// group stays on TCP. Throws loom::Error (prefixed by `what`) when a rank does not take part
// within `timeout`.
// `options`: shared_memory, host_identity and shared_memory_slot_bytes (rank 0's is used).
std::unique_ptr<ShmChannel> connect_shared_memory(Store& store, int rank, int size,
                                                  Duration timeout, const GlooOptions& options,
                                                  const std::string& what);

}  // namespace loom::comm::gloo_detail
