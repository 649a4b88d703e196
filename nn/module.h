// Module: a tree of named submodules and parameters, like torch.nn.Module.
//
// Names are dotted paths in registration order ("h.0.attn.c_attn.weight"), the same names
// state_dict() uses and that parallel plans (parallelize_module) match against.
//
// Parameters live in slots owned by the module; subclasses keep a reference to their slot
// (`Tensor& weight_ = register_parameter(...)`), so replacing a parameter through
// set_parameter() — as tensor parallelism does when it swaps in a DTensor — is seen by forward.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace loom::nn {

struct CheckpointPolicy;  // nn/checkpoint.h

using StateDict = std::map<std::string, Tensor>;

class Module : public std::enable_shared_from_this<Module> {
 public:
  using ForwardPreHook = std::function<Tensor(Module&, const Tensor& input)>;
  using ForwardHook = std::function<Tensor(Module&, const Tensor& input, const Tensor& output)>;

  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The single-tensor forward most modules have; modules with other signatures define their own
  // and leave this one throwing.
  virtual Tensor forward(const Tensor& input);
  // Runs forward-pre hooks (which may replace the input), forward, then forward hooks (which
  // may replace the output) — the points where parallel styles redistribute inputs and outputs.
  // A checkpointed module (nn/checkpoint.h) keeps only its input when recording a graph.
  Tensor operator()(const Tensor& input);
  // Activation checkpointing of this module's forward (nn/checkpoint.h): its activations are
  // recomputed in backward instead of kept — all of them (set_checkpointed), or all but the
  // outputs of the ops a policy keeps (set_checkpoint_policy).
  void set_checkpointed(bool checkpointed);
  void set_checkpoint_policy(std::shared_ptr<const CheckpointPolicy> policy) {
    checkpoint_ = std::move(policy);
  }
  bool checkpointed() const { return checkpoint_ != nullptr; }
  const std::shared_ptr<const CheckpointPolicy>& checkpoint_policy() const { return checkpoint_; }
  void register_forward_pre_hook(ForwardPreHook hook) { pre_hooks_.push_back(std::move(hook)); }
  void register_forward_hook(ForwardHook hook) { post_hooks_.push_back(std::move(hook)); }

  // (dotted name, parameter) for this module and, with recurse, all submodules, in
  // registration order (depth first). A parameter shared by two modules appears once.
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  // (dotted name, module) for this module ("") and every descendant, depth first.
  std::vector<std::pair<std::string, Module*>> named_modules();
  // The same modules in the same order, without building their names (torch's modules()): for
  // walks that run every step.
  std::vector<Module*> modules();
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  // The submodule at a dotted path ("h.0.attn"); throws naming the missing part.
  Module& submodule(const std::string& path);

  // Replaces parameter `name` (a direct parameter of this module) with `value`; the shape may
  // change (a sharded DTensor's local shape differs) but the name must exist.
  void set_parameter(const std::string& name, Tensor value);
  const Tensor& parameter(const std::string& name) const;
  // Whether this module has a direct parameter `name` (an optional one it lacks, e.g. a Linear
  // built without bias, is not one).
  bool has_parameter(const std::string& name) const;

  // Initializes this module's own parameters (not its submodules') in place, as its constructor
  // does (torch's reset_parameters): the constructors call it, and a model built on the meta
  // device gets its values from it once materialized (nn/meta_init.h), so both give the same
  // values. Each value is a function of the module's seed and the element's global index, so a
  // sharded parameter (a DTensor) draws exactly its slice. A module with parameters of its own
  // overrides it; the default throws naming them (a module with none has nothing to do).
  virtual void reset_parameters();
  // Initializes the whole tree in place: every child's init_weights(), then this module's
  // reset_parameters() (torchtitan's init_weights). A model initialized as a whole rather than
  // module by module (GPT-2's, by parameter name) overrides it.
  virtual void init_weights();

  // Sets every parameter's grad to undefined (PyTorch's set_to_none=True).
  void zero_grad();
  // Moves every parameter and buffer of the tree to `device` (torch's module.to(device)):
  // parameters stay leaves with their requires_grad. Call it before parallelize_module and DDP,
  // which hold on to the parameters they find.
  void to(Device device);
  void train(bool training = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Parameters and buffers by dotted name (the tensors themselves, not copies).
  StateDict state_dict() const;
  // Copies values into the existing tensors. strict: the key sets must match exactly; an
  // error lists missing and unexpected keys. Shapes must match (error names the key).
  void load_state_dict(const StateDict& state, bool strict = true);

  const std::string& type_name() const { return type_name_; }

 protected:
  Tensor& register_parameter(const std::string& name, Tensor value, bool requires_grad = true);
  Tensor& register_buffer(const std::string& name, Tensor value);
  // What a module binds an optional parameter reference to when it has none (e.g. Linear
  // without bias): always undefined.
  static const Tensor& absent_parameter();
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    register_module_impl(name, module);
    return module;
  }

 private:
  struct Slot {
    std::string name;
    Tensor value;
  };
  void register_module_impl(const std::string& name, std::shared_ptr<Module> module);
  void check_new_name(const std::string& name) const;
  void collect_parameters(const std::string& prefix, bool recurse,
                          std::vector<std::pair<std::string, Tensor>>& out,
                          std::vector<const TensorImpl*>& seen) const;
  void collect_state(const std::string& prefix, StateDict& out) const;

  std::string type_name_;
  std::deque<Slot> parameters_;  // deque: references to slots stay valid as more are added
  std::shared_ptr<const CheckpointPolicy> checkpoint_;  // null: not checkpointed
  std::deque<Slot> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<ForwardPreHook> pre_hooks_;
  std::vector<ForwardHook> post_hooks_;
  bool training_ = true;
};

// Submodules named "0", "1", ... (torch.nn.ModuleList), so a stack of blocks gets the names
// "h.0.attn...", "h.1.attn...". `first_index` starts the numbering elsewhere: a pipeline stage
// holding blocks 4..7 of a model names them h.4..h.7, as the whole model does.
class ModuleList : public Module {
 public:
  explicit ModuleList(size_t first_index = 0) : Module("ModuleList"), first_index_(first_index) {}
  template <typename M>
  std::shared_ptr<M> append(std::shared_ptr<M> module) {
    return register_module(std::to_string(first_index_ + size_++), std::move(module));
  }
  size_t size() const { return size_; }

 private:
  size_t first_index_;
  size_t size_ = 0;
};

}  // namespace loom::nn
