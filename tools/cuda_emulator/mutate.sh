#!/bin/bash
# mutate.sh NAME 'sed-expr' [harness args, default: "16 all bf16 0"]: a mutation check. Applies
# sed-expr to the extracted kernels (run.sh first, which leaves them in $WORK), rebuilds the
# harness in $WORK/mut_NAME and reports how many cases fail: a planted defect must be caught.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
WORK=${WORK:-${TMPDIR:-/tmp}/loom-cuda-emulator}
name=$1; expr=$2; shift 2; args=${*:-16 all bf16 0}
d=$WORK/mut_$name; rm -rf "$d"; mkdir -p "$d"
cp "$WORK/tiles_part.inc" "$d/"
sed "$expr" "$WORK/kern_part.inc" > "$d/kern_part.inc"
if cmp -s "$d/kern_part.inc" "$WORK/kern_part.inc"; then echo "$name: sed changed nothing"; exit; fi
g++ -std=c++20 -O2 -pthread -I/usr/local/cuda/include -I"$root" -I"$d" "$here/harness.cc" -o "$d/h" 2>"$d/compile.log" || { echo "$name: compile failed"; exit; }
timeout 1200 "$d/h" $args > "$d/log" 2>&1
echo "$name ($args): $(grep -c '^FAIL' "$d/log") of $(grep -c '^ok\|^FAIL' "$d/log") cases failing"
grep -m3 -B3 '^FAIL' "$d/log" | cut -c1-230
