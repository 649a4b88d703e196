"""Loom's layer table, enforced by Bazel visibility.

ARCHITECTURE.md's table "Layers" is this data. Each layer names its packages and the layers it may
use directly. `layer_package_groups()` (called once, from tools/build/BUILD) turns it into two
package groups per layer:

  <layer>_users     the layer's own packages, the packages of every layer that may use it, and
                    the application folders (examples/, tests/, tools/)
  <layer>_internal  the layer's own packages, plus tests/ and tools/ (tests and benchmarks of its
                    internals)

and every library target says which it belongs to:

  visibility = loom_visibility("dtensor")           # the layer's public targets
  visibility = loom_internal_visibility("tensor")   # helpers only the layer itself uses

So a target in a lower layer that adds a dependency on a higher one fails to build with Bazel's
"target '//dtensor:dtensor' is not visible from target '//tensor:tensor'" (checked by
//tests/build:layering_test). A new folder must be added here before anything can use it.

Inside Loom's own workspace the public targets are visible to the `_users` groups only. When Loom
is an external repository (`@loom`, a downstream workspace), package groups cannot name the
downstream's packages (Bazel 4.2.3 package groups hold packages of their own repository only), so
the public targets are `//visibility:public` there; Loom's own layering was already checked by
Loom's build, and internal targets stay internal.
"""

# Layer -> (its packages, the layers it may use directly). Order: lowest first.
LAYERS = {
    "base": struct(packages = ["//base/..."], uses = []),
    "tensor": struct(packages = ["//tensor/..."], uses = ["base"]),
    "autograd": struct(packages = ["//autograd/..."], uses = ["base", "tensor"]),
    "comm": struct(packages = ["//comm/..."], uses = ["base", "tensor"]),
    "nn": struct(packages = ["//nn/..."], uses = ["base", "tensor", "autograd"]),
    "mesh": struct(packages = ["//mesh/..."], uses = ["base", "tensor", "comm"]),
    "dtensor": struct(
        packages = ["//dtensor/..."],
        uses = ["base", "tensor", "autograd", "comm", "mesh"],
    ),
    "optim": struct(
        packages = ["//optim/..."],
        uses = ["base", "tensor", "autograd", "comm", "dtensor"],
    ),
    "parallel": struct(
        packages = ["//parallel/..."],
        uses = ["base", "tensor", "autograd", "comm", "nn", "mesh", "dtensor", "optim"],
    ),
    "data": struct(packages = ["//data/..."], uses = ["base", "tensor"]),
    "checkpoint": struct(
        packages = ["//checkpoint/..."],
        uses = ["base", "tensor", "autograd", "comm", "mesh", "dtensor"],
    ),
    "models": struct(
        packages = ["//models/..."],
        uses = ["base", "tensor", "autograd", "comm", "nn", "mesh", "dtensor", "optim", "parallel"],
    ),
    "train": struct(
        packages = ["//train/..."],
        uses = [
            "base",
            "tensor",
            "autograd",
            "comm",
            "nn",
            "mesh",
            "dtensor",
            "optim",
            "parallel",
            "models",
            "checkpoint",
            "data",
        ],
    ),
}

# Folders that may use every layer: programs, tests and tooling.
APPLICATIONS = ["//examples/...", "//tests/...", "//tools/..."]

# Where the internals of a layer may be reached from besides the layer itself.
_INTERNAL_EXTRA = ["//tests/...", "//tools/..."]

# True when Loom is the main repository (its own build and CI), false as @loom downstream.
_LOOM_IS_MAIN = Label("//:WORKSPACE").workspace_name == ""

def _check_layer(layer):
    if layer not in LAYERS:
        fail("unknown layer '{}'; the layers are {} (tools/build/layers.bzl)".format(
            layer,
            ", ".join(LAYERS.keys()),
        ))

def layer_package_groups():
    """Declares <layer>_users and <layer>_internal for every layer; call once in tools/build."""
    for layer, info in LAYERS.items():
        for user in info.uses:
            _check_layer(user)
        users = list(info.packages)
        for other, other_info in LAYERS.items():
            if layer in other_info.uses:
                users += other_info.packages
        native.package_group(
            name = layer + "_users",
            packages = users + APPLICATIONS,
        )
        native.package_group(
            name = layer + "_internal",
            packages = info.packages + _INTERNAL_EXTRA,
        )

def loom_visibility(layer):
    """Visibility of a layer's public targets: its users inside Loom, everyone downstream."""
    _check_layer(layer)
    if not _LOOM_IS_MAIN:
        return ["//visibility:public"]
    return [str(Label("//tools/build:" + layer + "_users"))]

def loom_internal_visibility(layer):
    """Visibility of a layer's internal targets: the layer, its tests and benchmarks."""
    _check_layer(layer)
    return [str(Label("//tools/build:" + layer + "_internal"))]
