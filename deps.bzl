"""Loom's external dependencies, for Loom itself and for workspaces that depend on it.

A downstream WORKSPACE needs only:

    local_repository(name = "loom", path = "...")
    load("@loom//:deps.bzl", "loom_dependencies")
    loom_dependencies()

Nothing here downloads: the rules Bazel 4.2.3 would fetch are local stand-ins under
third_party/, and the libraries come from Debian packages (installed by `./loom setup`)
and the CUDA toolkit under /usr/local/cuda.
"""

def _loom_third_party_impl(rctx):
    # Label("//:WORKSPACE") resolves inside the repository that holds this file, so the
    # same code finds third_party/ from Loom's own workspace and from a downstream one.
    root = rctx.path(Label("//:WORKSPACE")).dirname
    src = root.get_child("third_party").get_child(rctx.attr.subdir)
    for child in src.readdir():
        rctx.symlink(child, child.basename)

_loom_third_party = repository_rule(
    implementation = _loom_third_party_impl,
    attrs = {"subdir": attr.string(mandatory = True)},
    local = True,
)

# (repository name, host path, BUILD file under third_party/)
_SYSTEM_LIBRARIES = [
    ("com_google_googletest", "/usr", "googletest.BUILD"),
    ("fmt", "/usr", "fmt.BUILD"),
    ("openblas", "/usr", "openblas.BUILD"),
    ("blis", "/usr", "blis.BUILD"),
    ("dnnl", "/usr", "dnnl.BUILD"),
    ("gloo", "/usr", "gloo.BUILD"),
    ("google_benchmark", "/usr", "benchmark.BUILD"),
    ("nlohmann_json", "/usr", "nlohmann_json.BUILD"),
    ("cli11", "/usr", "cli11.BUILD"),
    ("tomlplusplus", "/usr", "tomlplusplus.BUILD"),
    ("openssl", "/usr", "openssl.BUILD"),
    ("pcre2", "/usr", "pcre2.BUILD"),
    ("cuda", "/usr/local/cuda", "cuda.BUILD"),
]

def loom_dependencies():
    """Declares every external repository Loom needs; call once from WORKSPACE."""
    for name in ["rules_cc", "rules_java", "remote_coverage_tools"]:
        if not native.existing_rule(name):
            _loom_third_party(name = name, subdir = name)
    for name, path, build_file in _SYSTEM_LIBRARIES:
        if not native.existing_rule(name):
            native.new_local_repository(
                name = name,
                path = path,
                build_file = str(Label("//third_party:" + build_file)),
            )
