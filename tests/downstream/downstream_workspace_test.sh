#!/usr/bin/env bash
# Runs `bazel test --config=cpu //...` in a copy of tests/downstream/workspace/, a workspace that
# depends on the Loom source tree under test through local_repository + loom_dependencies(): a
# user's own module and tensor-parallel plan on 2 ranks against one rank, with Loom built
# CPU-only.
set -euo pipefail

NESTED_TEST_NAME=downstream_workspace_test
source "$(dirname "$0")/../build/nested_bazel_lib.sh"

loom_root="$(nested_loom_root)"
runfiles="${TEST_SRCDIR}/${TEST_WORKSPACE:-loom}"

work="${TEST_TMPDIR:?}/downstream"
mkdir -p "$work"
for f in .bazelrc BUILD WORKSPACE uses_loom_test.cc user_plan_test.cc; do
  cp "$(readlink -f "$runfiles/tests/downstream/workspace/$f")" "$work/$f"
done

NESTED_LOG="$TEST_TMPDIR/inner-bazel.log"
cd "$work"
status=0
# CPU-only (--config=cpu, the README's downstream setting): no nvcc in this inner build, whose
# action paths (external/loom/...) share no cache entries with the outer one.
nested_bazel test --config=cpu //... --override_repository=loom="$loom_root" || status=$?

if [[ $status -ne 0 ]]; then
  cat "$NESTED_LOG" >&2
  nested_fail "inner 'bazel test //...' exited with $status (Loom at $loom_root, workspace $work)"
fi
for test in uses_loom_test user_plan_test; do
  grep -q "//:$test .*PASSED" "$NESTED_LOG" || { cat "$NESTED_LOG" >&2; nested_fail "$test did not pass"; }
done
echo "downstream workspace built and passed its tests against $loom_root"
