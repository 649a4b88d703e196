# Sourced by the tests that run a second Bazel inside `bazel test` (the downstream workspace and
# the layering check): where the Loom checkout under test is, and how to run the inner Bazel so
# that it neither waits on nor disturbs the outer one.
#
# Such tests are tagged local, no-sandbox, exclusive, external and no-cache (see their BUILD).

nested_fail() { echo "${NESTED_TEST_NAME:-nested bazel test}: $*" >&2; exit 1; }

# The Loom checkout: the runfile //:WORKSPACE is a symlink into it (the test runs unsandboxed).
nested_loom_root() {
  local runfiles="${TEST_SRCDIR:?run me with bazel test}/${TEST_WORKSPACE:-loom}"
  local root
  root="$(dirname "$(readlink -f "$runfiles/WORKSPACE")")"
  [[ -f "$root/deps.bzl" ]] || nested_fail "no deps.bzl next to $runfiles/WORKSPACE ($root)"
  echo "$root"
}

# Runs `bazel "$@"` from the current folder with its own output root (the outer server holds
# the lock on its output base) and the real user's disk cache (Bazel gives tests a scratch
# HOME; sharing the cache keeps Loom's objects from being recompiled from scratch). Output goes
# to the file named by $NESTED_LOG; returns Bazel's exit status.
nested_bazel() {
  local real_home disk_cache inner_root status=0
  real_home="$(getent passwd "$(id -u)" | cut -d: -f6)"
  disk_cache="${real_home:-$TEST_TMPDIR}/.cache/loom/bazel-disk"
  inner_root="$TEST_TMPDIR/bazel-root"
  local startup=(--output_user_root="$inner_root" --nohome_rc --max_idle_secs=60)
  local command="$1"
  shift
  env -u TEST_TMPDIR -u TEST_SRCDIR -u RUNFILES_DIR -u RUNFILES_MANIFEST_FILE \
      -u TEST_WORKSPACE -u XML_OUTPUT_FILE -u TEST_SHARD_INDEX -u TEST_TOTAL_SHARDS \
      -u TEST_SHARD_STATUS_FILE -u TEST_PREMATURE_EXIT_FILE -u TEST_UNDECLARED_OUTPUTS_DIR \
      bazel "${startup[@]}" "$command" \
        --disk_cache="$disk_cache" \
        --symlink_prefix=/ \
        --noshow_progress --curses=no --color=no \
        "$@" >"${NESTED_LOG:?}" 2>&1 || status=$?
  bazel "${startup[@]}" shutdown >/dev/null 2>&1 || true
  return "$status"
}
