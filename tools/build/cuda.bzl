"""cuda_library: .cu files compiled by nvcc, wrapped in a cc_library that links the CUDA runtime.

There is no rules_cuda offline, so this is a small rule: one nvcc action per .cu file, producing a
position-independent object, and a native cc_library around those objects. Usage:

    load("//tools/build:cuda.bzl", "cuda_library")   # "@loom//tools/build:cuda.bzl" downstream

    cuda_library(
        name = "smoke_kernel",
        srcs = ["smoke_kernel.cu"],
        hdrs = ["smoke_kernel.h"],
        deps = [":cuda_runtime"],
    )

A .cu file sees the same headers a cc_library in its place would: its own package's hdrs, the
headers of `deps` (their include paths, quote includes, system includes and defines), and the CUDA
toolkit's headers (nvcc adds them itself). Paths come from the dependencies' CcInfo and from
ctx.label.workspace_root, so the rule works unchanged from Loom's workspace and from one that uses
Loom as @loom (sources under external/loom/...).

Emulated builds: with `--define=loom_cuda=emulated` (`--config=cuda_emulated`) each .cu file is
turned into C++ (tools/cuda_emulator/device/cu_to_cc) and compiled by the C++ toolchain against
the emulated device, whose runtime replaces libcudart (//tools/build:cudart): the kernels run on
the CPU, for checking them between GPU checks.

CPU-only builds: with `--define=loom_cuda=false` (`--config=cpu` in .bazelrc; PyTorch's USE_CUDA=0)
no .cu file is compiled. A cuda_library then builds its `stubs` instead: plain C++ definitions of
the same functions that throw loom::Error naming the flag. The CUDA runtime wrappers report no
device in such a build (tensor/cuda/cuda_runtime.cc), so GPU entry points fail with that reason
before any stub is reached.

Flags (see docs/cuda_build.md): -std=c++20, -O3, -Xcompiler -fPIC, device code for sm_80 and sm_90
(CUDA_ARCHS below), -DFMT_USE_CONSTEXPR=1 (see _NVCC_FLAGS), then the target's `copts`. The host
half of each .cu is compiled by the C++ toolchain's own compiler (-ccbin), the same g++ Bazel uses.
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

# (virtual arch, real arch) pairs: SASS for A100 (sm_80) and H100/H200 (sm_90). No PTX is
# embedded, so a newer GPU (sm_100) needs its own entry here rather than a JIT fallback.
CUDA_ARCHS = [
    ("compute_80", "sm_80"),
    ("compute_90", "sm_90"),
]

_NVCC_FLAGS = [
    "-std=c++20",
    "-O3",
    "-Xcompiler",
    "-fPIC",
    # fmt 9 (Debian's libfmt-dev, used by base/error.h) turns FMT_CONSTEXPR off when it sees
    # __NVCC__ but still turns `consteval` format-string checking on in C++20, and nvcc's front end
    # then rejects every fmt::format call. Turning FMT_CONSTEXPR back on makes the .cu see fmt
    # exactly as g++ compiling a .cc does (same inline definitions, no ODR drift).
    "-DFMT_USE_CONSTEXPR=1",
]

_CUDA_RUNTIME = str(Label("//tools/build:cudart"))

# --define=loom_cuda=false (tools/build/BUILD). A Label, so that the select() below means Loom's
# setting from whichever repository calls the macro.
_CUDA_DISABLED = str(Label("//tools/build:cuda_disabled"))

# --define=loom_cuda=emulated (--config=cuda_emulated): each .cu file becomes C++ for the emulated
# device (tools/cuda_emulator/device), compiled by the C++ toolchain with its header forced in.
_CUDA_EMULATED = str(Label("//tools/build:cuda_emulated"))
_EMULATED_DEVICE = str(Label("//tools/cuda_emulator/device:device"))
_EMULATED_COPTS = [
    "-include",
    "tools/cuda_emulator/device/emulated_device.h",
    "-DLOOM_CUDA_EMULATED",
    # Kernels reinterpret registers and shared memory between types (16-byte loads read as
    # elements), which nvcc compiles as meant; g++'s strict aliasing may reorder such accesses.
    "-fno-strict-aliasing",
    "-Wno-unused-variable",
    "-Wno-unused-function",
]

def _stem(src, package):
    """The source path under its package, without extension: kernels/axpy.cu -> kernels/axpy."""
    path = src.short_path
    if path.startswith("../"):
        # A source of an external repository: ../loom/tensor/cuda/x.cu -> tensor/cuda/x.cu.
        path = path.split("/", 2)[2]
    if package and path.startswith(package + "/"):
        path = path[len(package) + 1:]
    return path[:-len("." + src.extension)]

def _cuda_objects_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    compilation = cc_common.merge_cc_infos(
        cc_infos = [dep[CcInfo] for dep in ctx.attr.deps],
    ).compilation_context

    # The repository this target lives in: "" in Loom's own workspace, "external/loom" (or
    # whatever name the user gave it) when used from outside. Sources and generated files of
    # that repository are found from these two roots, like Bazel's own -iquote pair.
    workspace_root = ctx.label.workspace_root
    source_root = workspace_root or "."
    bin_root = ctx.bin_dir.path + ("/" + workspace_root if workspace_root else "")

    # nvcc has no -iquote: quote and plain include paths both become -I, in Bazel's order.
    include_dirs = [source_root, bin_root]
    for path in compilation.quote_includes.to_list() + compilation.includes.to_list():
        if path not in include_dirs:
            include_dirs.append(path)
    include_flags = ["-I" + path for path in include_dirs]
    for path in compilation.system_includes.to_list():
        include_flags += ["-isystem", path]
    define_flags = ["-D" + d for d in compilation.defines.to_list()]
    arch_flags = []
    for virtual, real in CUDA_ARCHS:
        arch_flags += ["-gencode", "arch={},code={}".format(virtual, real)]

    headers = depset(
        ctx.files.hdrs,
        transitive = [compilation.headers, cc_toolchain.all_files],
    )
    objects = []
    for src in ctx.files.srcs:
        obj = ctx.actions.declare_file(
            "_objs/{}/{}.pic.o".format(ctx.label.name, _stem(src, ctx.label.package)),
        )
        args = ctx.actions.args()
        args.add(ctx.executable._nvcc.path)
        args.add("-ccbin", cc_toolchain.compiler_executable)
        args.add_all(_NVCC_FLAGS)
        args.add_all(arch_flags)
        args.add_all(define_flags)
        args.add_all(include_flags)
        args.add_all(ctx.attr.copts)
        args.add_all(["-x", "cu", "-c", src.path, "-o", obj.path])
        ctx.actions.run_shell(
            # nvcc finds cicc, ptxas and its own headers next to itself (nvcc.profile's _HERE_),
            # so run it from the toolkit's real folder rather than through the sandbox's
            # symlink to it, which sits in a folder holding nothing else.
            command = 'nvcc="$(readlink -f "$1")" && shift && exec "$nvcc" "$@"',
            arguments = [args],
            inputs = depset([src], transitive = [headers]),
            outputs = [obj],
            tools = [ctx.executable._nvcc],
            mnemonic = "CudaCompile",
            progress_message = "Compiling CUDA {}".format(src.short_path),
            use_default_shell_env = True,
        )
        objects.append(obj)
    return [DefaultInfo(files = depset(objects))]

def _cuda_emulated_sources_impl(ctx):
    outputs = []
    for src in ctx.files.srcs:
        out = ctx.actions.declare_file(
            "_emulated/{}/{}.cc".format(ctx.label.name, _stem(src, ctx.label.package)),
        )
        ctx.actions.run(
            executable = ctx.executable._cu_to_cc,
            arguments = [src.path, out.path],
            inputs = [src],
            outputs = [out],
            mnemonic = "CudaEmulate",
            progress_message = "Converting CUDA {} for the emulated device".format(src.short_path),
        )
        outputs.append(out)
    return [DefaultInfo(files = depset(outputs))]

# .cu files as C++ for the emulated device (tools/cuda_emulator/device/cu_to_cc).
_cuda_emulated_sources = rule(
    implementation = _cuda_emulated_sources_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "_cu_to_cc": attr.label(
            default = Label("//tools/cuda_emulator/device:cu_to_cc"),
            executable = True,
            cfg = "exec",
        ),
    },
)

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = [".h", ".hpp", ".cuh", ".inl"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "_nvcc": attr.label(
            default = Label("@cuda//:nvcc"),
            executable = True,
            cfg = "exec",
            allow_single_file = True,
        ),
        "_cc_toolchain": attr.label(
            default = Label("@bazel_tools//tools/cpp:current_cc_toolchain"),
        ),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], stubs = [], **kwargs):
    """A cc_library whose sources are .cu files, compiled by nvcc for CUDA_ARCHS.

    Args:
      name: the cc_library's name; the nvcc objects are `name + "_cuda_objects"`.
      srcs: .cu files, one nvcc action (and one object) each.
      hdrs: public headers, visible to the .cu files and to dependents (plain C++ headers: a
        dependent compiled by g++ includes them).
      deps: cc_library targets whose headers the .cu files include and whose code they call.
        @cuda//:cudart is always added.
      copts: extra nvcc flags, after the defaults (e.g. ["-lineinfo"], ["-Xptxas", "-v"]).
      stubs: .cc files compiled instead of `srcs` in a CPU-only build (--define=loom_cuda=false):
        definitions of the functions of `hdrs` that throw loom::Error naming the flag.
      **kwargs: passed to the cc_library (visibility, tags, testonly, alwayslink, ...).
    """
    all_deps = list(deps)
    if _CUDA_RUNTIME not in all_deps:
        all_deps.append(_CUDA_RUNTIME)
    _cuda_objects(
        name = name + "_cuda_objects",
        srcs = select({
            _CUDA_DISABLED: [],
            _CUDA_EMULATED: [],
            "//conditions:default": srcs,
        }),
        hdrs = hdrs,
        deps = all_deps,
        copts = copts,
        tags = kwargs.get("tags", []),
        testonly = kwargs.get("testonly", False),
        visibility = ["//visibility:private"],
    )
    _cuda_emulated_sources(
        name = name + "_emulated_sources",
        srcs = srcs,
        tags = kwargs.get("tags", []),
        testonly = kwargs.get("testonly", False),
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = select({
            _CUDA_DISABLED: stubs,
            _CUDA_EMULATED: [":" + name + "_emulated_sources"],
            "//conditions:default": [":" + name + "_cuda_objects"],
        }),
        hdrs = hdrs,
        copts = select({
            _CUDA_EMULATED: _EMULATED_COPTS,
            "//conditions:default": [],
        }),
        deps = all_deps + select({
            _CUDA_EMULATED: [_EMULATED_DEVICE],
            "//conditions:default": [],
        }),
        **kwargs
    )
