#include "dtensor/dtensor.h"

#include <fmt/format.h>

#include <functional>

#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "base/error.h"
#include "dtensor/redistribute.h"
#include "dtensor/sharding/propagator.h"
#include "dtensor/sharding/strategy.h"
#include "tensor/memory_stats.h"
#include "tensor/ops.h"

namespace loom {

namespace {

using Grads = std::vector<Tensor>;

const DTensorExtension* extension_of(const Tensor& tensor) {
  if (!tensor.defined() || !tensor.extension() ||
      tensor.extension()->kind() != kDTensorExtensionKind)
    return nullptr;
  return static_cast<const DTensorExtension*>(tensor.extension().get());
}

// The gradient placements for a tensor that had `placements`: a Partial value's gradient is
// the same for every contribution, i.e. Replicate.
Placements gradient_placements(const Placements& placements) {
  Placements out = placements;
  for (Placement& p : out) {
    if (p.is_partial()) p = Replicate();
  }
  return out;
}

// A gradient reaching a DTensor op's backward may be a plain tensor (zeros materialized by the
// engine for an unused output): treat it as the full, replicated value.
Tensor as_dtensor_like(const Tensor& grad, const DTensorSpec& like) {
  if (is_dtensor(grad)) return grad;
  DTensorSpec replicated = like;
  replicated.placements = Placements(like.placements.size(), Replicate());
  return make_dtensor(grad, replicated);
}

Tensor redistribute_no_grad(const Tensor& dtensor, const Placements& target) {
  const DTensorSpec& spec = dtensor_spec(dtensor);
  if (spec.placements == target) return dtensor;
  DTensorSpec out_spec = spec;
  out_spec.placements = target;
  return make_dtensor(redistribute_local(local_shard(dtensor), spec, target), std::move(out_spec));
}

}  // namespace

bool is_dtensor(const Tensor& tensor) { return extension_of(tensor) != nullptr; }

const DTensorSpec& dtensor_spec(const Tensor& tensor, std::string_view op) {
  const DTensorExtension* ext = extension_of(tensor);
  LOOM_CHECK(ext != nullptr, "{}: expected a DTensor, got a plain {}", op, tensor.description());
  return ext->spec();
}

const Tensor& local_shard(const Tensor& tensor) {
  const DTensorExtension* ext = extension_of(tensor);
  LOOM_CHECK(ext != nullptr, "local_shard: expected a DTensor, got a plain {}",
             tensor.description());
  return ext->local();
}

Tensor DTensorExtension::whole() const {
  NoGradGuard no_grad;
  return redistribute_local(local_, spec_, Placements(spec_.mesh->ndim(), Replicate()));
}

std::function<Tensor()> DTensorExtension::zeros_maker() const {
  return [spec = spec_, device = local_.device()] {
    return make_dtensor(ops::zeros(spec.local_shape(), spec.dtype, device), spec);
  };
}

bool DTensorExtension::reshapes_locally(const Shape& shape) const {
  return sharding::reshape_keeps_shards(spec_, shape);
}

Tensor make_dtensor(Tensor local, DTensorSpec spec) {
  LOOM_CHECK(local.defined() && !local.extension(),
             "make_dtensor: the local tensor must be a plain tensor, got {}", local.description());
  spec.validate("make_dtensor");
  LOOM_CHECK(spec.has_local_shape(local.shape()),
             "make_dtensor: local shard of shape {} on rank {} does not match {} (expected local "
             "shape {})",
             shape_str(local.shape()), spec.mesh->rank(), spec.str(),
             shape_str(spec.local_shape()));
  LOOM_CHECK(local.dtype() == spec.dtype,
             "make_dtensor: local dtype {} does not match spec dtype {}", dtype_name(local.dtype()),
             dtype_name(spec.dtype));
  // Any DTensor in existence implies its ops can dispatch (an explicit, idempotent call).
  sharding::install_dtensor_dispatch();
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = local.storage();
  impl->shape = spec.shape;
  impl->strides = contiguous_strides(spec.shape);
  impl->dtype = spec.dtype;
  impl->extension = std::make_shared<DTensorExtension>(std::move(spec), std::move(local));
  return Tensor(std::move(impl));
}

Tensor distribute_tensor(const Tensor& tensor, std::shared_ptr<const DeviceMesh> mesh,
                         Placements placements, std::optional<int> src_data_rank) {
  LOOM_CHECK(mesh != nullptr, "distribute_tensor: the mesh is null");
  LOOM_CHECK(tensor.defined() && !is_dtensor(tensor),
             "distribute_tensor: expected a plain tensor, got {}", tensor.description());
  placements = normalize_placements(placements, *mesh, tensor.dim(), "distribute_tensor");
  NoGradGuard no_grad;
  Tensor full = ops::contiguous(tensor);
  // A meta placeholder (a model built on the meta device, nn/meta_init.h) has no values to agree
  // on: each rank takes its layout with no communication, and materializes and initializes it
  // later. A meta tensor that stands for a real one (loom plan tracing a build without meta init)
  // holds the copy the broadcast fills, as the real build does, so the trace's peak is the run's.
  const bool placeholder = tensor.device().is_meta() && meta_placeholders_active();
  if (src_data_rank.has_value() && !placeholder) {
    LOOM_CHECK(
        *src_data_rank == 0,
        "distribute_tensor: src_data_rank {} is not supported; use 0 (the mesh's first rank) or "
        "std::nullopt (no communication)",
        *src_data_rank);
    full = ops::clone(full);  // what rank 0's values arrive in
    // Along each mesh dim from its coordinate 0 (whose group rank is 0 unless the rank array
    // is not ascending). A traced stand-in has no values to send.
    if (!tensor.device().is_meta()) {
      for (int64_t md = 0; md < mesh->ndim(); ++md) {
        mesh->group(md)->broadcast(full, mesh->group_ranks_by_coordinate(md)[0])->wait();
      }
    }
  }
  DTensorSpec replicated{mesh, Placements(mesh->ndim(), Replicate()), tensor.shape(),
                         tensor.dtype()};
  Tensor local = ops::contiguous(redistribute_local(full, replicated, placements));
  // The shard owns its bytes: a dim-0 shard is a contiguous view of the whole tensor, and
  // keeping it would keep the whole tensor alive on every rank (found by `loom plan`: tp ranks
  // held (tp - 1) / tp of every colwise weight twice over).
  if (local.storage()->bytes() > static_cast<size_t>(local.numel()) * element_size(local.dtype()))
    local = ops::clone(local);
  DTensorSpec spec{std::move(mesh), std::move(placements), tensor.shape(), tensor.dtype()};
  Tensor out = make_dtensor(std::move(local), std::move(spec));
  if (tensor.requires_grad()) out.set_requires_grad(true);
  return out;
}

namespace {

// from_local's run_check. Every rank's record — its rank, mesh coordinate, dtype, dims, whether
// its local tensor is its shard of the global shape, the global and local shapes — reaches every
// rank of the mesh (an all-gather along each mesh dim in turn, the records so far each time), so
// every rank reaches the same verdict and throws the same message, and no rank is left waiting
// in a later collective on one that already threw.
constexpr int64_t kListedDims = 8;  // shapes of more dims: the rest folded into the last slot
constexpr int64_t kRecord = 4 + 3 * kListedDims;  // rank, dtype, ndim, fits; coordinate, shapes

void put_dims(std::vector<int64_t>& record, size_t at, const std::vector<int64_t>& dims) {
  for (size_t i = 0; i < static_cast<size_t>(kListedDims); ++i) {
    record[at + i] = i < dims.size() ? dims[i] : -1;
  }
  if (dims.size() > static_cast<size_t>(kListedDims)) {
    int64_t folded = 0;
    for (size_t i = kListedDims - 1; i < dims.size(); ++i) folded = folded * 1000003 + dims[i];
    record[at + kListedDims - 1] = folded;
  }
}

std::string dims_str(const int64_t* dims, int64_t ndim) {
  std::vector<std::string> parts;
  for (int64_t i = 0; i < std::min(ndim, kListedDims); ++i) {
    parts.push_back(ndim > kListedDims && i == kListedDims - 1 ? std::string("...")
                                                               : std::to_string(dims[i]));
  }
  return "(" + fmt::format("{}", fmt::join(parts, ", ")) + (ndim == 1 ? ",)" : ")");
}

// Every rank's record, in rank order, on every rank of the mesh.
std::vector<std::vector<int64_t>> gather_records(const DeviceMesh& mesh,
                                                 std::vector<int64_t> mine) {
  std::vector<int64_t> all = std::move(mine);
  for (int64_t md = 0; md < mesh.ndim(); ++md) {
    const auto& group = mesh.group(md);
    const auto n = static_cast<int64_t>(all.size());
    std::vector<Tensor> parts;
    for (int r = 0; r < group->size(); ++r) parts.push_back(ops::empty({n}, kInt64, mesh.device()));
    group->all_gather(parts, ops::from_vector_i64(all, {n}, mesh.device()))->wait();
    all.clear();
    for (const Tensor& part : parts) {
      const Tensor cpu = ops::to(part, Device::cpu());
      all.insert(all.end(), cpu.data<int64_t>(), cpu.data<int64_t>() + n);
    }
  }
  std::vector<std::vector<int64_t>> records;
  for (size_t at = 0; at < all.size(); at += kRecord) {
    records.emplace_back(all.begin() + static_cast<int64_t>(at),
                         all.begin() + static_cast<int64_t>(at + kRecord));
  }
  std::sort(records.begin(), records.end());  // by rank
  return records;
}

// "rank 0, 1 and 2 pass X; rank 3 passes Y": the ranks of each distinct value, in rank order of
// their first.
std::string by_value(const std::vector<std::vector<int64_t>>& records,
                     const std::function<std::string(const std::vector<int64_t>&)>& show) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> groups;
  for (const auto& r : records) {
    const std::string value = show(r);
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == value; });
    if (it == groups.end()) {
      groups.push_back({value, {}});
      it = groups.end() - 1;
    }
    it->second.push_back(r[0]);
  }
  if (groups.size() == 1) return "";
  std::vector<std::string> parts;
  for (const auto& [value, ranks] : groups) {
    parts.push_back(fmt::format("rank{} {} pass{} {}", ranks.size() > 1 ? "s" : "",
                                fmt::join(ranks, ", "), ranks.size() > 1 ? "" : "es", value));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

void check_ranks_agree(const Tensor& local, const std::shared_ptr<const DeviceMesh>& mesh_ptr,
                       const Placements& placements, const Shape& global, bool shape_given) {
  const DeviceMesh& mesh = *mesh_ptr;
  // Where the global shape puts this rank's shard (uneven shards: `shape` given).
  const bool fits =
      DTensorSpec{mesh_ptr, placements, global, local.dtype()}.has_local_shape(local.shape());
  std::vector<int64_t> mine(kRecord, -1);
  mine[0] = mesh.world()->rank();
  mine[1] = static_cast<int64_t>(local.dtype());
  mine[2] = local.dim();
  mine[3] = fits ? 1 : 0;
  put_dims(mine, 4, mesh.coordinate());
  put_dims(mine, 4 + kListedDims, global);
  put_dims(mine, 4 + 2 * kListedDims, local.shape());
  const auto records = gather_records(mesh, std::move(mine));
  const auto fail = [&](std::string_view what, const std::string& who, std::string_view why) {
    LOOM_FAIL("from_local(run_check) on {}: the ranks disagree on {}: {}; {}", mesh.str(), what,
              who, why);
  };
  const std::string types = by_value(records, [](const std::vector<int64_t>& r) {
    return fmt::format("{} of {} dims", dtype_name(static_cast<DType>(r[1])), r[2]);
  });
  if (!types.empty()) {
    fail("the local tensor's dtype and dims", types,
         "every rank passes a local tensor of one dtype and one number of dims");
  }
  const std::string shapes = by_value(records, [](const std::vector<int64_t>& r) {
    return fmt::format("a global shape of {}", dims_str(r.data() + 4 + kListedDims, r[2]));
  });
  if (!shapes.empty()) {
    fail("the global shape", shapes,
         shape_given ? "every rank gives the same global shape"
                     : "without a global shape, every rank's shard is the same size (even "
                       "shards); pass shape for uneven ones");
  }
  std::vector<std::string> misfits;
  for (const auto& r : records) {
    if (r[3] == 0) {
      misfits.push_back(fmt::format("rank {} (coordinate {}) passes {}", r[0],
                                    dims_str(r.data() + 4, mesh.ndim()),
                                    dims_str(r.data() + 4 + 2 * kListedDims, r[2])));
    }
  }
  LOOM_CHECK(misfits.empty(),
             "from_local(run_check) on {}: {}, which is not its shard of the global shape {} "
             "under {}",
             mesh.str(), fmt::join(misfits, "; "), shape_str(global), placements_str(placements));
}

}  // namespace

Tensor from_local(const Tensor& local, std::shared_ptr<const DeviceMesh> mesh,
                  Placements placements, std::optional<Shape> shape, bool run_check) {
  LOOM_CHECK(mesh != nullptr, "from_local: the mesh is null");
  LOOM_CHECK(local.defined(), "from_local: the local tensor is undefined");
  LOOM_CHECK(!is_dtensor(local),
             "from_local: expected a plain local tensor, got a DTensor ({}); pass its to_local() "
             "or redistribute it",
             local.description());
  placements = normalize_placements(placements, *mesh, local.dim(), "from_local");
  Shape global = local.shape();
  if (shape.has_value()) {
    global = *shape;
  } else {
    for (int64_t md = 0; md < mesh->ndim(); ++md) {
      if (placements[md].is_shard()) global[placements[md].dim()] *= mesh->size(md);
    }
  }
  Tensor data = local;
  if (run_check) {
    NoGradGuard no_grad;
    check_ranks_agree(local, mesh, placements, global, shape.has_value());
    for (int64_t md = 0; md < mesh->ndim(); ++md) {
      if (placements[md].is_replicate()) {
        data = ops::clone(data);  // what the coordinate-0 rank's values arrive in
        mesh->group(md)->broadcast(data, mesh->group_ranks_by_coordinate(md)[0])->wait();
      }
    }
  }
  DTensorSpec spec{std::move(mesh), placements, global, local.dtype()};
  Tensor out = make_dtensor(ops::contiguous(data), spec);
  if (!autograd::any_requires_grad({local})) return out;
  return autograd::record("FromLocalBackward", {local}, out, [spec](const Grads& g) {
    const Tensor grad = as_dtensor_like(g[0], spec);
    return Grads{local_shard(redistribute_no_grad(grad, gradient_placements(spec.placements)))};
  });
}

Tensor to_local(const Tensor& dtensor) {
  const DTensorSpec& spec = dtensor_spec(dtensor, "to_local");
  const Tensor local = local_shard(dtensor);
  if (!autograd::any_requires_grad({dtensor})) return local;
  DTensorSpec grad_spec = spec;
  grad_spec.placements = gradient_placements(spec.placements);
  return autograd::record("ToLocalBackward", {dtensor}, ops::alias(local),
                          [grad_spec](const Grads& g) {
                            return Grads{make_dtensor(ops::contiguous(g[0]), grad_spec)};
                          });
}

Tensor redistribute(const Tensor& dtensor, Placements placements) {
  const DTensorSpec& spec = dtensor_spec(dtensor, "redistribute");
  const Placements target = normalize_placements(
      placements, *spec.mesh, static_cast<int64_t>(spec.shape.size()), "redistribute");
  Tensor out;
  {
    NoGradGuard no_grad;
    out = redistribute_no_grad(dtensor, target);
    if (out.is_same(dtensor))
      out = make_dtensor(local_shard(dtensor), spec);  // a new handle for the graph
  }
  if (!autograd::any_requires_grad({dtensor})) return out;
  const DTensorSpec out_spec = dtensor_spec(out);
  return autograd::record(
      "RedistributeBackward", {dtensor}, out,
      [back = gradient_placements(spec.placements), out_spec](const Grads& g) {
        return Grads{redistribute_no_grad(as_dtensor_like(g[0], out_spec), back)};
      });
}

Tensor full_tensor(const Tensor& dtensor) {
  const DTensorSpec& spec = dtensor_spec(dtensor, "full_tensor");
  return to_local(redistribute(dtensor, Placements(spec.mesh->ndim(), Replicate())));
}

}  // namespace loom
