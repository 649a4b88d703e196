#include "comm/gloo/host_staging.h"

#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::comm::gloo_detail {

Tensor HostStaging::input(const Tensor& t) {
  if (!active_ || !t.defined()) return t;
  NoGradGuard no_grad;  // the transport's copy, never part of a graph
  return ops::to(t, Device::cpu());
}

Tensor HostStaging::output(const Tensor& t) {
  if (!active_ || !t.defined()) return t;
  Tensor host = ops::empty(t.shape(), t.dtype(), Device::cpu());
  written_.emplace_back(t, host);
  return host;
}

Tensor HostStaging::in_place(const Tensor& t) {
  if (!active_ || !t.defined()) return t;
  NoGradGuard no_grad;
  Tensor host = ops::to(t, Device::cpu());
  written_.emplace_back(t, host);
  return host;
}

std::vector<Tensor> HostStaging::inputs(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  out.reserve(ts.size());
  for (const Tensor& t : ts) out.push_back(input(t));
  return out;
}

std::vector<Tensor> HostStaging::outputs(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  out.reserve(ts.size());
  for (const Tensor& t : ts) out.push_back(output(t));
  return out;
}

void HostStaging::copy_back() const {
  NoGradGuard no_grad;
  // The transport's bytes, not compute's (as comm/fake delivers its messages).
  for (const auto& [device, host] : written_) ops::copy_uncounted_(device, host);
}

}  // namespace loom::comm::gloo_detail
