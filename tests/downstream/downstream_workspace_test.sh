#!/usr/bin/env bash
# Runs `bazel test //...` in a copy of tests/downstream/workspace/, a workspace that depends on
# the Loom source tree under test through local_repository + loom_dependencies().
set -euo pipefail

fail() { echo "downstream_workspace_test: $*" >&2; exit 1; }

# The runfile //:WORKSPACE is a symlink into the Loom checkout (the test runs unsandboxed).
runfiles="${TEST_SRCDIR:?run me with bazel test}/${TEST_WORKSPACE:-loom}"
loom_root="$(dirname "$(readlink -f "$runfiles/WORKSPACE")")"
[[ -f "$loom_root/deps.bzl" ]] || fail "no deps.bzl next to $runfiles/WORKSPACE ($loom_root)"

work="${TEST_TMPDIR:?}/downstream"
mkdir -p "$work"
for f in .bazelrc BUILD WORKSPACE uses_loom_test.cc; do
  cp "$(readlink -f "$runfiles/tests/downstream/workspace/$f")" "$work/$f"
done

# Bazel sets HOME to a scratch folder for tests; share the real user's disk cache with the
# outer build instead (see Loom's .bazelrc), so Loom's objects are not recompiled from scratch.
real_home="$(getent passwd "$(id -u)" | cut -d: -f6)"
disk_cache="${real_home:-$TEST_TMPDIR}/.cache/loom/bazel-disk"

# A separate output root: the outer Bazel server holds the lock on its own output base, and the
# inner one must neither wait on it nor share its server.
inner_root="$TEST_TMPDIR/bazel-root"
bazel_startup=(--output_user_root="$inner_root" --nohome_rc --max_idle_secs=60)
log="$TEST_TMPDIR/inner-bazel.log"

cd "$work"
status=0
env -u TEST_TMPDIR -u TEST_SRCDIR -u RUNFILES_DIR -u RUNFILES_MANIFEST_FILE \
    -u TEST_WORKSPACE -u XML_OUTPUT_FILE -u TEST_SHARD_INDEX -u TEST_TOTAL_SHARDS \
    -u TEST_SHARD_STATUS_FILE -u TEST_PREMATURE_EXIT_FILE -u TEST_UNDECLARED_OUTPUTS_DIR \
    bazel "${bazel_startup[@]}" test //... \
      --override_repository=loom="$loom_root" \
      --disk_cache="$disk_cache" \
      --symlink_prefix=/ \
      --noshow_progress --curses=no --color=no \
      >"$log" 2>&1 || status=$?
bazel "${bazel_startup[@]}" shutdown >/dev/null 2>&1 || true

if [[ $status -ne 0 ]]; then
  cat "$log" >&2
  fail "inner 'bazel test //...' exited with $status (Loom at $loom_root, workspace $work)"
fi
grep -q '//:uses_loom_test .*PASSED' "$log" || { cat "$log" >&2; fail "uses_loom_test did not pass"; }
echo "downstream workspace built and passed its tests against $loom_root"
