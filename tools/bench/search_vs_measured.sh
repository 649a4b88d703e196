#!/usr/bin/env bash
# Issue 38's check of the time model where it matters for ranking: `loom plan --search` on this
# machine's calibration ranks every layout of MODEL on RANKS CPU ranks; each ranked layout then
# runs for real (median ms of steps 2 .. STEPS-1; STEPS=8 unless set). Prints every layout's
# predicted and measured step, the measured rank of the predicted best, its measured time over
# the measured best's, and Spearman's rank correlation.
#   bazel build -c opt //examples:loom_train //tools/loomrun && tools/bench/search_vs_measured.sh [MODEL] [RANKS] [EXTRA FLAGS...]
# MEASURED=TABLE (an earlier run's output) takes each layout's measured time from that table
# instead of running it: the time model re-ranked against the same measurements. A layout the
# table lacks is run (so a measurement cut short goes on from its table).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
B=$root/bazel-bin/examples/loom_train
L=$root/bazel-bin/tools/loomrun/loomrun
model="${1:-tiny}"
ranks="${2:-4}"
shift 2 || true
extra=("$@")
steps="${STEPS:-8}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export LOOM_CACHE_DIR="$work/cache"
"$B" --plan --calibrate >/dev/null 2>&1
# The search, every ranked layout printed.
"$B" --plan --model "$model" --dp "$ranks" --tp 1 --search --search-top 1000 --no-search-bound --device cpu \
  "${extra[@]}" >"$work/search.log" 2>&1
head -1 "$work/search.log"
flags() {  # "tp2 pp2 dp_shard1 dp_replicate1 [cp2] [ep2] interleaved v2 m4 ac=full" -> loom_train flags
  local out=(--dp 0)
  for word in $1; do
    case $word in
      tp*|pp*|cp*|ep*) out+=("--${word:0:2}" "${word:2}") ;;
      dp_shard*) out+=(--dp-shard "${word#dp_shard}") ;;
      dp_replicate*) out+=(--dp-replicate "${word#dp_replicate}") ;;
      v[0-9]*) out+=(--virtual-stages "${word#v}") ;;
      m[0-9]*) out+=(--microbatches "${word#m}") ;;
      ac=*) out+=(--activation-checkpoint "${word#ac=}") ;;
      *) out+=(--schedule "$word") ;;
    esac
  done
  echo "${out[@]}"
}
echo "| predicted rank | layout | predicted ms | measured ms |"
echo "|---:|---|---:|---:|"
best_measured="" best_layout="" first_measured=""
while IFS='|' read -r _ rank layout predicted _; do
  rank=$(echo "$rank" | tr -d ' ') layout=$(echo "$layout" | sed 's/^ *//; s/ *$//')
  [[ $rank =~ ^[0-9]+$ ]] || continue
  measured=""
  if [[ -n ${MEASURED:-} ]]; then
    measured=$(awk -F'|' -v l="$layout" '{ x = $3; gsub(/^ +| +$/, "", x) } x == l { gsub(/ /, "", $5); print $5 }' \
      "$MEASURED" | head -1)
  fi
  if [[ -n $measured ]]; then
    :
  # shellcheck disable=SC2046
  elif "$B" --launcher "$L" --model "$model" $(flags "$layout") --device cpu --steps "$steps" --log-every 100 \
      --sample-tokens 0 --no-progress --plot-out "" --metrics-out "$work/m.jsonl" "${extra[@]}" \
      >"$work/run.log" 2>&1; then
    measured=$(sed -n 's/.*"ms_per_step":\([0-9.]*\).*/\1/p' "$work/m.jsonl" | tail -n +3 |
      sort -g | awk '{ a[NR] = $1 } END { printf "%.1f", NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }')
  else
    measured="failed"
  fi
  echo "| $rank | $layout | $(echo "$predicted" | tr -d ' ') | $measured |" | tee -a "$work/rows"
  [[ -z $first_measured ]] && first_measured=$measured
  if [[ $measured != failed ]] && { [[ -z $best_measured ]] || awk -v a="$measured" -v b="$best_measured" 'BEGIN { exit !(a < b) }'; }; then
    best_measured=$measured best_layout=$layout
  fi
done < <(sed -n '/^| rank | layout/,/^$/p' "$work/search.log")
echo
echo "measured best: $best_layout ($best_measured ms); the predicted best measured $first_measured ms:" \
  "$(awk -v a="$first_measured" -v b="$best_measured" 'BEGIN { printf "%.2f", a / b }') x the best"
# Spearman's rank correlation of predicted and measured times over the layouts that ran.
awk -F'|' '$5 !~ /failed/ { gsub(/ /, "", $4); gsub(/ /, "", $5); p[++n] = $4 + 0; m[n] = $5 + 0 }
  END {
    for (i = 1; i <= n; ++i) {
      rp = 1; rm = 1
      for (j = 1; j <= n; ++j) { rp += p[j] < p[i]; rm += m[j] < m[i] }
      d += (rp - rm) ^ 2
    }
    printf "Spearman rank correlation over %d layouts: %.2f\n", n, 1 - 6 * d / (n * (n * n - 1))
  }' "$work/rows"
