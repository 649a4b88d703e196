#!/usr/bin/env bash
# `./loom format --check` is clean: every C++ and CUDA source of the checkout under test is
# formatted by .clang-format (clang-format 14). And the check can fail: in a copy of the script
# and two sources (not a git checkout, so the file list comes from find) with one line
# misformatted, it exits non-zero naming that file. Reads the checkout itself (unsandboxed), like the nested-Bazel tests.
set -euo pipefail
NESTED_TEST_NAME=format_test
source "$(dirname "$0")/nested_bazel_lib.sh"

loom_root="$(nested_loom_root)"
"$loom_root/loom" format --check

# The copy holds what `loom format` reads and two sources, not the whole tree: checking ~500
# files a second time took as long as the first and pushed the test past its timeout under CI's
# load.
copy="$TEST_TMPDIR/loom"
mkdir -p "$copy/base" "$copy/tools/setup"
cp "$loom_root/loom" "$loom_root/.clang-format" "$copy/"
cp "$loom_root/tools/setup/debian-packages.txt" "$copy/tools/setup/"
cp "$loom_root/base/error.cc" "$loom_root/base/error.h" "$copy/base/"
echo 'int   misformatted ( ) {return 1 ;}' >>"$copy/base/error.cc"
status=0
output="$("$copy/loom" format --check 2>&1)" || status=$?
[[ $status -ne 0 ]] || nested_fail "format --check accepted a misformatted base/error.cc: $output"
grep -q '^  base/error.cc$' <<<"$output" || nested_fail "format --check did not name base/error.cc: $output"
grep -q '1 of [0-9]* files are not formatted' <<<"$output" ||
  nested_fail "format --check should find exactly one file: $output"
echo "a misformatted copy is rejected, naming base/error.cc"
