#!/usr/bin/env bash
# The layer table (tools/build/layers.bzl) is enforced by Bazel: in a copy of the Loom checkout,
# probe targets add dependencies and an analysis-only build (--nobuild: nothing compiles) must
#   - reject an upward dependency (the tensor layer using dtensor) with Bazel's visibility error,
#   - reject a layer reaching another layer's internals (dtensor using //tensor/cpu:loops),
#   - accept a downward dependency (models using dtensor), so the rejections are visibility's.
set -euo pipefail
NESTED_TEST_NAME=layering_test
source "$(dirname "$0")/nested_bazel_lib.sh"

loom_root="$(nested_loom_root)"
copy="$TEST_TMPDIR/loom"
mkdir -p "$copy"
tar -C "$loom_root" --exclude='./bazel-*' --exclude=./.git -cf - . | tar -C "$copy" -xf -

cat >>"$copy/tensor/BUILD" <<'PROBE'

cc_library(name = "layering_probe_upward", deps = ["//dtensor"])
PROBE
cat >>"$copy/dtensor/BUILD" <<'PROBE'

cc_library(name = "layering_probe_internal", deps = ["//tensor/cpu:loops"])
PROBE
cat >>"$copy/models/BUILD" <<'PROBE'

cc_library(name = "layering_probe_downward", deps = ["//dtensor"])
PROBE

NESTED_LOG="$TEST_TMPDIR/inner-bazel.log"
cd "$copy"
status=0
nested_bazel build --nobuild --keep_going \
  //tensor:layering_probe_upward //dtensor:layering_probe_internal \
  //models:layering_probe_downward || status=$?
[[ $status -ne 0 ]] || { cat "$NESTED_LOG" >&2; nested_fail "the probes were all accepted"; }

expect_error() {  # the log holds this exact visibility error
  grep -qF "$1" "$NESTED_LOG" || { cat "$NESTED_LOG" >&2; nested_fail "expected: $1"; }
  echo "rejected as expected: $1"
}
expect_error "target '//dtensor:dtensor' is not visible from target '//tensor:layering_probe_upward'"
expect_error "target '//tensor/cpu:loops' is not visible from target '//dtensor:layering_probe_internal'"
if grep -F "//models:layering_probe_downward" "$NESTED_LOG" | grep -qi "error"; then
  cat "$NESTED_LOG" >&2
  nested_fail "the downward dependency //models -> //dtensor was rejected"
fi
echo "accepted as expected: //models:layering_probe_downward -> //dtensor"
