#include "tensor/grad_mode.h"

namespace loom {

namespace {
thread_local bool grad_enabled = true;
thread_local bool below_autograd = false;
}  // namespace

bool GradMode::is_enabled() { return grad_enabled; }
void GradMode::set_enabled(bool enabled) { grad_enabled = enabled; }

BelowAutogradGuard::BelowAutogradGuard() : previous_(below_autograd) { below_autograd = true; }
BelowAutogradGuard::~BelowAutogradGuard() { below_autograd = previous_; }
bool BelowAutogradGuard::active() { return below_autograd; }

}  // namespace loom
