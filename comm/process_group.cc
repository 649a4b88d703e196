#include "comm/process_group.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <map>
#include <string_view>

#include "base/error.h"
#include "base/profiler.h"
#include "comm/collective_call.h"
#include "comm/prefix_store.h"

namespace loom::comm {

namespace {

bool debug_collectives_enabled() {
  const char* value = std::getenv("LOOM_DEBUG");
  return value != nullptr && std::string_view(value).find("collectives") != std::string_view::npos;
}

int64_t bytes_of(const Tensor& t) {
  return t.numel() * static_cast<int64_t>(element_size(t.dtype()));
}

std::string tensor_brief(const Tensor& t) {
  return fmt::format("{} {}", dtype_name(t.dtype()), shape_str(t.shape()));
}

struct ObserverRegistry {
  std::mutex mutex;
  std::map<int, CollectiveObserver> observers;
  int next_id = 0;
};

ObserverRegistry& observers() {
  static ObserverRegistry registry;
  return registry;
}

}  // namespace

int64_t CollectiveCounters::total_calls() const {
  int64_t total = 0;
  for (int64_t c : calls) total += c;
  return total;
}

ProcessGroup::ProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                           std::vector<int> global_ranks, ProcessGroupOptions options)
    : store_(std::move(store)),
      rank_(rank),
      size_(size),
      global_ranks_(std::move(global_ranks)),
      options_(std::move(options)),
      debug_collectives_(debug_collectives_enabled()) {
  if (const size_t entries = FlightRecorder::capacity_from_env(); entries > 0) {
    recorder_ =
        std::make_shared<FlightRecorder>(options_.name, rank_, size_, global_ranks_, entries);
    flight_recorder::add(recorder_);
  }
  LOOM_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_,
             "ProcessGroup '{}': rank {} is not in [0, {})", options_.name, rank_, size_);
  LOOM_CHECK(static_cast<int>(global_ranks_.size()) == size_,
             "ProcessGroup '{}': {} global ranks given for a group of size {}", options_.name,
             global_ranks_.size(), size_);
}

int ProcessGroup::add_observer(CollectiveObserver observer) {
  auto& r = observers();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.observers[r.next_id] = std::move(observer);
  return r.next_id++;
}

void ProcessGroup::remove_observer(int id) {
  auto& r = observers();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.observers.erase(id);
}

ProcessGroup::~ProcessGroup() {
  if (recorder_) flight_recorder::retire(*recorder_);
}

std::shared_ptr<Work> ProcessGroup::recorded(const OpInfo& info, std::shared_ptr<Work> work) {
  if (recorder_ && work) {
    work->on_done([recorder = recorder_, handle = info.record](const std::exception_ptr& error) {
      recorder->finish(handle, error);
      if (error) flight_recorder::on_failure(error);
    });
  }
  return work;
}

ProcessGroup::OpInfo ProcessGroup::begin(CollectiveKind kind, int64_t bytes, std::string detail) {
  const uint64_t sequence = sequence_++;
  const bool p2p = kind == CollectiveKind::kSend || kind == CollectiveKind::kRecv;
  OpInfo info{kind, sequence,
              fmt::format("{} #{} ({}) on group '{}' (rank {} of {})", collective_name(kind),
                          sequence, detail, options_.name, rank_, size_)};
  if (recorder_) {
    info.record = recorder_->record(sequence, p2p ? -1 : collectives_issued_, kind, detail);
  }
  if (!p2p) ++collectives_issued_;
  counters_.calls[static_cast<int>(kind)] += 1;
  counters_.bytes[static_cast<int>(kind)] += bytes;
  {
    auto& r = observers();
    std::lock_guard<std::mutex> lock(r.mutex);
    for (const auto& [id, observer] : r.observers) observer(kind, bytes, options_.name);
  }
  const bool point_to_point = kind == CollectiveKind::kSend || kind == CollectiveKind::kRecv;
  if (debug_collectives_ && !point_to_point) check_fingerprint(info, kind, detail);
  return info;
}

void ProcessGroup::check_fingerprint(const OpInfo& info, CollectiveKind kind,
                                     const std::string& detail) {
  // Each rank publishes its kind and detail (dtype, sizes) under its count of collectives so far
  // (not the op sequence number, which also counts send/recv and may differ between ranks), then
  // reads everyone's and compares them as the flight report does (comm/collective_call.h).
  const std::string prefix = fmt::format("debug/collectives/{}/", debug_collectives_checked_++);
  const std::string mine = fmt::format("{}\n{}", static_cast<int>(kind), detail);
  store_->set(prefix + std::to_string(rank_), mine);
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back(prefix + std::to_string(r));
  try {
    store_->wait(keys, options_.timeout);
  } catch (const Error& error) {
    std::vector<int> missing;
    for (int r = 0; r < size_; ++r) {
      if (!store_->check({keys[r]})) missing.push_back(r);
    }
    LOOM_FAIL(
        "{}: timed out after {} ms waiting for ranks [{}] to reach this collective "
        "(LOOM_DEBUG=collectives)",
        info.description, options_.timeout.count(), fmt::join(missing, ", "));
  }
  const std::string my_call = fmt::format("{}({})", collective_name(kind), detail);
  std::vector<AllToAllSizes> sizes;
  for (int r = 0; r < size_; ++r) {
    const std::string text = r == rank_ ? mine : store_->get_string(keys[r]);
    const size_t newline = text.find('\n');
    const auto other_kind = static_cast<CollectiveKind>(std::stoi(text.substr(0, newline)));
    const std::string other_detail = text.substr(newline + 1);
    LOOM_CHECK(call_key(other_kind, other_detail) == call_key(kind, detail),
               "collective mismatch at #{} on group '{}': rank {} called {} but rank {} called "
               "{}({})",
               info.sequence, options_.name, rank_, my_call, r, collective_name(other_kind),
               other_detail);
    if (const auto s = parse_all_to_all(other_detail)) sizes.push_back(*s);
  }
  if (kind == CollectiveKind::kAllToAll && static_cast<int>(sizes.size()) == size_) {
    const std::string mismatch = all_to_all_mismatch(sizes, [](int r) { return r; });
    LOOM_CHECK(mismatch.empty(), "collective mismatch at #{} on group '{}' ({}): {} (group ranks)",
               info.sequence, options_.name, my_call, mismatch);
  }
}

namespace {

void check_tensor(const Tensor& t, const std::string& what, std::string_view op,
                  const ProcessGroup& pg) {
  const std::string& group = pg.name();
  LOOM_CHECK(t.defined(), "{} on group '{}': {} is undefined", op, group, what);
  LOOM_CHECK(
      t.device() == pg.device(),
      "{} on group '{}': {} is on {} but this {} group works on {}; move it there first (ops::to)",
      op, group, what, t.device().str(), pg.backend_name(), pg.device().str());
  LOOM_CHECK(t.is_contiguous(), "{} on group '{}': {} must be contiguous, got {} with strides {}",
             op, group, what, tensor_brief(t), fmt::join(t.strides(), ", "));
  LOOM_CHECK(!t.extension(), "{} on group '{}': {} is a DTensor; pass its local tensor", op, group,
             what);
}

void check_same_dtype(const Tensor& a, const Tensor& b, const std::string& what,
                      std::string_view op, const std::string& group) {
  LOOM_CHECK(a.dtype() == b.dtype() && a.device() == b.device(),
             "{} on group '{}': {} is {} on {} but the input is {} on {}", op, group, what,
             dtype_name(b.dtype()), b.device().str(), dtype_name(a.dtype()), a.device().str());
}

std::string numels(const std::vector<Tensor>& tensors) {
  std::vector<int64_t> sizes;
  for (const Tensor& t : tensors) sizes.push_back(t.numel());
  return fmt::format("[{}]", fmt::join(sizes, ", "));
}

}  // namespace

std::shared_ptr<Work> ProcessGroup::all_reduce(const Tensor& tensor, ReduceOp op) {
  profiler::Scope scope("comm::all_reduce");  // issuing it (waiting is comm::wait)
  check_tensor(tensor, "the tensor", "all_reduce", *this);
  auto info = begin(CollectiveKind::kAllReduce, bytes_of(tensor),
                    fmt::format("{}, {}, {} elements", reduce_op_name(op),
                                dtype_name(tensor.dtype()), tensor.numel()));
  return recorded(info, run_all_reduce(info, tensor, op));
}

std::shared_ptr<Work> ProcessGroup::broadcast(const Tensor& tensor, int root) {
  profiler::Scope scope("comm::broadcast");  // issuing it (waiting is comm::wait)
  check_tensor(tensor, "the tensor", "broadcast", *this);
  LOOM_CHECK(root >= 0 && root < size_,
             "broadcast on group '{}': root {} is not a rank of a group of size {}", name(), root,
             size_);
  auto info = begin(
      CollectiveKind::kBroadcast, bytes_of(tensor),
      fmt::format("root {}, {}, {} elements", root, dtype_name(tensor.dtype()), tensor.numel()));
  return recorded(info, run_broadcast(info, tensor, root));
}

std::shared_ptr<Work> ProcessGroup::all_gather(const std::vector<Tensor>& outputs,
                                               const Tensor& input) {
  profiler::Scope scope("comm::all_gather");  // issuing it (waiting is comm::wait)
  check_tensor(input, "the input", "all_gather", *this);
  LOOM_CHECK(static_cast<int>(outputs.size()) == size_,
             "all_gather on group '{}': got {} outputs for a group of size {}", name(),
             outputs.size(), size_);
  for (int r = 0; r < size_; ++r) {
    check_tensor(outputs[r], fmt::format("output {}", r), "all_gather", *this);
    check_same_dtype(input, outputs[r], fmt::format("output {}", r), "all_gather", name());
  }
  LOOM_CHECK(outputs[rank_].numel() == input.numel(),
             "all_gather on group '{}': rank {}'s output has {} elements but its input has {} ({})",
             name(), rank_, outputs[rank_].numel(), input.numel(), tensor_brief(input));
  auto info = begin(CollectiveKind::kAllGather, bytes_of(input),
                    fmt::format("{}, sizes {}", dtype_name(input.dtype()), numels(outputs)));
  return recorded(info, run_all_gather(info, outputs, input));
}

std::shared_ptr<Work> ProcessGroup::all_gather_into_tensor(const Tensor& output,
                                                           const Tensor& input) {
  profiler::Scope scope("comm::all_gather_into_tensor");  // issuing it (waiting is comm::wait)
  LOOM_CHECK(output.defined() && input.defined() && output.numel() == input.numel() * size_,
             "all_gather_into_tensor on group '{}': output {} must hold {} inputs of {}", name(),
             output.defined() ? tensor_brief(output) : "undefined", size_,
             input.defined() ? tensor_brief(input) : "undefined");
  LOOM_CHECK(output.is_contiguous(),
             "all_gather_into_tensor on group '{}': output must be contiguous", name());
  std::vector<Tensor> pieces;
  const int64_t n = input.numel();
  for (int r = 0; r < size_; ++r) {
    pieces.push_back(
        Tensor::from_storage(output.storage(), {n}, {1}, output.offset() + r * n, output.dtype()));
  }
  const Tensor flat =
      Tensor::from_storage(input.storage(), {n}, {1}, input.offset(), input.dtype());
  LOOM_CHECK(input.is_contiguous(),
             "all_gather_into_tensor on group '{}': input must be contiguous", name());
  return all_gather(pieces, flat);
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter(const Tensor& output,
                                                   const std::vector<Tensor>& inputs, ReduceOp op) {
  profiler::Scope scope("comm::reduce_scatter");  // issuing it (waiting is comm::wait)
  check_tensor(output, "the output", "reduce_scatter", *this);
  LOOM_CHECK(static_cast<int>(inputs.size()) == size_,
             "reduce_scatter on group '{}': got {} inputs for a group of size {}", name(),
             inputs.size(), size_);
  int64_t total = 0;
  for (int r = 0; r < size_; ++r) {
    check_tensor(inputs[r], fmt::format("input {}", r), "reduce_scatter", *this);
    check_same_dtype(output, inputs[r], fmt::format("input {}", r), "reduce_scatter", name());
    total += bytes_of(inputs[r]);
  }
  LOOM_CHECK(inputs[rank_].numel() == output.numel(),
             "reduce_scatter on group '{}': input {} has {} elements but rank {}'s output has {}",
             name(), rank_, inputs[rank_].numel(), rank_, output.numel());
  auto info = begin(CollectiveKind::kReduceScatter, total,
                    fmt::format("{}, {}, sizes {}", reduce_op_name(op), dtype_name(output.dtype()),
                                numels(inputs)));
  return recorded(info, run_reduce_scatter(info, output, inputs, op));
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter_tensor(const Tensor& output, const Tensor& input,
                                                          ReduceOp op) {
  profiler::Scope scope("comm::reduce_scatter_tensor");  // issuing it (waiting is comm::wait)
  LOOM_CHECK(output.defined() && input.defined() && input.numel() == output.numel() * size_,
             "reduce_scatter_tensor on group '{}': input {} must hold {} outputs of {}", name(),
             input.defined() ? tensor_brief(input) : "undefined", size_,
             output.defined() ? tensor_brief(output) : "undefined");
  LOOM_CHECK(input.is_contiguous(), "reduce_scatter_tensor on group '{}': input must be contiguous",
             name());
  std::vector<Tensor> pieces;
  const int64_t n = output.numel();
  for (int r = 0; r < size_; ++r) {
    pieces.push_back(
        Tensor::from_storage(input.storage(), {n}, {1}, input.offset() + r * n, input.dtype()));
  }
  LOOM_CHECK(output.is_contiguous(),
             "reduce_scatter_tensor on group '{}': output must be contiguous", name());
  const Tensor flat =
      Tensor::from_storage(output.storage(), {n}, {1}, output.offset(), output.dtype());
  return reduce_scatter(flat, pieces, op);
}

std::shared_ptr<Work> ProcessGroup::all_to_all(const std::vector<Tensor>& outputs,
                                               const std::vector<Tensor>& inputs) {
  profiler::Scope scope("comm::all_to_all");  // issuing it (waiting is comm::wait)
  LOOM_CHECK(static_cast<int>(outputs.size()) == size_ && static_cast<int>(inputs.size()) == size_,
             "all_to_all on group '{}': got {} outputs and {} inputs for a group of size {}",
             name(), outputs.size(), inputs.size(), size_);
  int64_t total = 0;
  for (int r = 0; r < size_; ++r) {
    check_tensor(inputs[r], fmt::format("input {}", r), "all_to_all", *this);
    check_tensor(outputs[r], fmt::format("output {}", r), "all_to_all", *this);
    check_same_dtype(inputs[0], inputs[r], fmt::format("input {}", r), "all_to_all", name());
    check_same_dtype(inputs[0], outputs[r], fmt::format("output {}", r), "all_to_all", name());
    total += bytes_of(inputs[r]);
  }
  LOOM_CHECK(inputs[rank_].numel() == outputs[rank_].numel(),
             "all_to_all on group '{}': rank {} sends itself {} elements but expects {}", name(),
             rank_, inputs[rank_].numel(), outputs[rank_].numel());
  // The element counts each way, as the flight recorder shows them (uneven under expert
  // parallelism: what a hang's dump must name).
  auto info = begin(CollectiveKind::kAllToAll, total,
                    fmt::format("{}, sends {}, receives {}", dtype_name(inputs[0].dtype()),
                                numels(inputs), numels(outputs)));
  return recorded(info, run_all_to_all(info, outputs, inputs));
}

std::shared_ptr<Work> ProcessGroup::gather(const std::vector<Tensor>& outputs, const Tensor& input,
                                           int root) {
  profiler::Scope scope("comm::gather");  // issuing it (waiting is comm::wait)
  check_tensor(input, "the input", "gather", *this);
  LOOM_CHECK(root >= 0 && root < size_,
             "gather on group '{}': root {} is not a rank of a group of size {}", name(), root,
             size_);
  if (rank_ == root) {
    LOOM_CHECK(static_cast<int>(outputs.size()) == size_,
               "gather on group '{}': root got {} outputs for a group of size {}", name(),
               outputs.size(), size_);
    for (int r = 0; r < size_; ++r) {
      check_tensor(outputs[r], fmt::format("output {}", r), "gather", *this);
      check_same_dtype(input, outputs[r], fmt::format("output {}", r), "gather", name());
    }
  } else {
    LOOM_CHECK(outputs.empty(),
               "gather on group '{}': only the root (rank {}) passes outputs; rank {} passed {}",
               name(), root, rank_, outputs.size());
  }
  auto info = begin(
      CollectiveKind::kGather, bytes_of(input),
      fmt::format("root {}, {}, {} elements", root, dtype_name(input.dtype()), input.numel()));
  return recorded(info, run_gather(info, outputs, input, root));
}

std::shared_ptr<Work> ProcessGroup::scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                                            int root) {
  profiler::Scope scope("comm::scatter");  // issuing it (waiting is comm::wait)
  check_tensor(output, "the output", "scatter", *this);
  LOOM_CHECK(root >= 0 && root < size_,
             "scatter on group '{}': root {} is not a rank of a group of size {}", name(), root,
             size_);
  int64_t total = 0;
  if (rank_ == root) {
    LOOM_CHECK(static_cast<int>(inputs.size()) == size_,
               "scatter on group '{}': root got {} inputs for a group of size {}", name(),
               inputs.size(), size_);
    for (int r = 0; r < size_; ++r) {
      check_tensor(inputs[r], fmt::format("input {}", r), "scatter", *this);
      check_same_dtype(output, inputs[r], fmt::format("input {}", r), "scatter", name());
      total += bytes_of(inputs[r]);
    }
  } else {
    LOOM_CHECK(inputs.empty(),
               "scatter on group '{}': only the root (rank {}) passes inputs; rank {} passed {}",
               name(), root, rank_, inputs.size());
  }
  auto info = begin(
      CollectiveKind::kScatter, total,
      fmt::format("root {}, {}, {} elements", root, dtype_name(output.dtype()), output.numel()));
  return recorded(info, run_scatter(info, output, inputs, root));
}

std::shared_ptr<Work> ProcessGroup::send(const Tensor& tensor, int dst, int tag) {
  profiler::Scope scope("comm::send");  // issuing it (waiting is comm::wait)
  check_tensor(tensor, "the tensor", "send", *this);
  LOOM_CHECK(dst >= 0 && dst < size_ && dst != rank_,
             "send on group '{}': destination {} is not another rank of a group of size {} (this "
             "is rank {})",
             name(), dst, size_, rank_);
  auto info = begin(CollectiveKind::kSend, bytes_of(tensor),
                    fmt::format("to {}, tag {}, {}", dst, tag, tensor_brief(tensor)));
  return recorded(info, run_send(info, tensor, dst, tag));
}

std::shared_ptr<Work> ProcessGroup::recv(const Tensor& tensor, int src, int tag) {
  profiler::Scope scope("comm::recv");  // issuing it (waiting is comm::wait)
  check_tensor(tensor, "the tensor", "recv", *this);
  LOOM_CHECK(
      src >= 0 && src < size_ && src != rank_,
      "recv on group '{}': source {} is not another rank of a group of size {} (this is rank {})",
      name(), src, size_, rank_);
  auto info = begin(CollectiveKind::kRecv, bytes_of(tensor),
                    fmt::format("from {}, tag {}, {}", src, tag, tensor_brief(tensor)));
  return recorded(info, run_recv(info, tensor, src, tag));
}

std::shared_ptr<Work> ProcessGroup::barrier() {
  profiler::Scope scope("comm::barrier");  // issuing it (waiting is comm::wait)
  auto info = begin(CollectiveKind::kBarrier, 0, "");
  return recorded(info, run_barrier(info));
}

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(const std::vector<int>& ranks,
                                                      ProcessGroupOptions options) {
  const uint64_t id = new_group_calls_++;
  LOOM_CHECK(!ranks.empty(), "new_group '{}' from group '{}': the rank list is empty", options.name,
             name());
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    LOOM_CHECK(sorted[i] >= 0 && sorted[i] < size_,
               "new_group '{}' from group '{}': rank {} is not in [0, {})", options.name, name(),
               sorted[i], size_);
    LOOM_CHECK(i == 0 || sorted[i] != sorted[i - 1],
               "new_group '{}' from group '{}': rank {} listed twice", options.name, name(),
               sorted[i]);
  }
  auto it = std::find(sorted.begin(), sorted.end(), rank_);
  if (it == sorted.end()) return nullptr;
  std::vector<int> global;
  for (int r : sorted) global.push_back(global_ranks_[r]);
  auto store = std::make_shared<PrefixStore>(fmt::format("group{}/", id), store_);
  return make_group(std::move(store), static_cast<int>(it - sorted.begin()), std::move(global),
                    std::move(options));
}

}  // namespace loom::comm
