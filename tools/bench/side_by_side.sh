#!/usr/bin/env bash
# Loom against PyTorch, side by side on this machine (issue 18's ratio table):
#
#   tools/bench/side_by_side.sh                      # every row, 3 interleaved pairs each
#   tools/bench/side_by_side.sh --only train --repeats 5
#
# Installs PyTorch (tools/bench/pytorch/requirements.txt) into a private virtual environment
# ($LOOM_BENCH_VENV, default ~/.cache/loom/torch-venv) on first use, builds Loom's programs, then
# runs tools/bench/side_by_side.py, which prints the table. Run it on an idle machine. The first
# run downloads PyTorch's pip wheel and the CUDA libraries it depends on (several GB; only its CPU
# side runs here); later runs reuse the environment while the requirements file is unchanged.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${LOOM_BENCH_VENV:-$HOME/.cache/loom/torch-venv}"
REQUIREMENTS="$ROOT/tools/bench/pytorch/requirements.txt"

if [[ ! -x "$VENV/bin/python" ]] || ! cmp -s "$REQUIREMENTS" "$VENV/requirements.txt"; then
  echo "side_by_side: installing PyTorch into $VENV" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q -r "$REQUIREMENTS" >&2
  cp "$REQUIREMENTS" "$VENV/requirements.txt"
fi

cd "$ROOT"
bazel build --ui_event_filters=-info,-stdout,-stderr --noshow_progress \
  //examples:loom_train //tools/loomrun //tools/bench:linear_bench \
  //tools/bench:dtensor_dispatch_bench //tools/bench:comm_bench
exec "$VENV/bin/python" "$ROOT/tools/bench/side_by_side.py" \
  --bin "$(bazel info bazel-bin 2>/dev/null)" --python "$VENV/bin/python" "$@"
