# Helpers for loomrun's shell tests; source it after setting LOOMRUN and HELPER.
set -euo pipefail

WORK="${TEST_TMPDIR:-$(mktemp -d)}/work.$$"
mkdir -p "$WORK"

fail() {
  echo "FAIL: $*" >&2
  for f in "$WORK"/out "$WORK"/err; do
    [[ -f "$f" ]] && { echo "--- $f" >&2; cat "$f" >&2; }
  done
  exit 1
}

# expect_eq ACTUAL EXPECTED WHAT
expect_eq() { [[ "$1" == "$2" ]] || fail "$3: got '$1', expected '$2'"; }

# expect_line FILE LINE: FILE has exactly this line.
expect_line() { grep -qxF -- "$2" "$1" || fail "$1 lacks the line '$2'"; }

# expect_grep FILE REGEX
expect_grep() { grep -qE -- "$2" "$1" || fail "$1 lacks a match for /$2/"; }

now_ms() { date +%s%3N; }

# run_loomrun ARGS...: runs loomrun (killed after 30 s) with stdout/stderr in $WORK/out, $WORK/err;
# sets RC and ELAPSED_MS.
run_loomrun() {
  local start
  start=$(now_ms)
  set +e
  timeout -s KILL 30 "$LOOMRUN" "$@" >"$WORK/out" 2>"$WORK/err"
  RC=$?
  set -e
  ELAPSED_MS=$(( $(now_ms) - start ))
}

# A pid of a rank_helper that is still alive (a zombie counts as gone: its parent reaps it).
helper_alive() {
  local pid="$1" state
  [[ -r "/proc/$pid/stat" ]] || return 1
  grep -q rank_helper "/proc/$pid/cmdline" 2>/dev/null || return 1
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ "$state" != "Z" ]]
}

# expect_no_helper_left DIR: no pid written into DIR/rank-*.pid is still running.
expect_no_helper_left() {
  local file pid count=0
  for file in "$1"/rank-*.pid; do
    [[ -f "$file" ]] || continue
    pid=$(cat "$file")
    count=$((count + 1))
    helper_alive "$pid" && fail "rank pid $pid ($file) is still running after loomrun exited"
  done
  [[ $count -gt 0 ]] || fail "no pid files in $1"
}

# wait_for_files DIR COUNT: waits (up to 10 s) until DIR holds COUNT rank-*.pid files.
wait_for_files() {
  local i
  for i in $(seq 1 1000); do
    [[ $(find "$1" -name 'rank-*.pid' | wc -l) -ge $2 ]] && return 0
    sleep 0.01
  done
  fail "only $(find "$1" -name 'rank-*.pid' | wc -l) of $2 ranks wrote their pid within 10 s"
}
