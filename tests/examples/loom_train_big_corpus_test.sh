#!/usr/bin/env bash
# A 10 GiB token corpus (ten 1 GiB llm.c shards, sparse: made here in no time and no disk) trains
# with a rank's resident memory unchanged from a 10 MiB one: shards are memory-mapped and every
# read, the range check's included, releases the pages it touched (data/token_file.h).
set -euo pipefail
train="$(realpath "$1")"
cd "${TEST_TMPDIR:-$(mktemp -d)}"

fail() { echo "FAIL: $*" >&2; exit 1; }

# shard PATH BYTES: an llm.c GPT-2 shard (magic 20240520, version 1) of BYTES bytes, its tokens
# zeros (a hole: sparse).
shard() {
  local path="$1" bytes="$2" count
  count=$(((bytes - 1024) / 2))
  # The header's three int32s, little-endian, then zeros to 1024 bytes.
  printf "$(printf '\\x%02x' 0x88 0xd8 0x34 0x01 1 0 0 0 $((count & 255)) $(((count >> 8) & 255)) \
    $(((count >> 16) & 255)) $(((count >> 24) & 255)))" > "$path"
  truncate -s "$bytes" "$path"
}
mkdir -p big small
for i in 0 1 2 3 4 5 6 7 8 9; do shard "big/train_00000$i.bin" $((1 << 30)); done
shard small/train_000000.bin $((10 << 20))
du -sh big small

# run DATA NAME: trains 3 steps; prints the last step's resident set and its file-backed part
# (the pages of mapped files: the binary, its libraries, the shards), in bytes.
run() {
  "$train" --dp 1 --tp 1 --steps 3 --batch-size 4 --seq-len 64 --sample-tokens 0 --no-progress \
    --plot-out "" --data "$1" --metrics-out "$2.jsonl" > "$2.log" 2>&1 || { cat "$2.log"; fail "$2"; }
  local last
  last="$(tail -1 "$2.jsonl")"
  echo "$(grep -o '"rss_bytes":[0-9]*' <<<"$last" | cut -d: -f2) $(grep -o '"rss_file_bytes":[0-9]*' <<<"$last" | cut -d: -f2)"
}
read -r small_rss small_file <<<"$(run small small)"
read -r big_rss big_file <<<"$(run big big)"
grep -q "10 files, 5368704000 tokens" big.log || { cat big.log; fail "the 10 GiB corpus"; }
echo "resident: 10 MiB corpus $((small_rss >> 10)) KiB (files $((small_file >> 10)) KiB), 10 GiB corpus $((big_rss >> 10)) KiB (files $((big_file >> 10)) KiB)"
# The mapped pages: the same within 4 MiB.
file_diff=$((big_file - small_file))
[[ ${file_diff#-} -le $((4 << 20)) ]] || fail "file-backed resident memory grew by $((file_diff >> 10)) KiB"
# All of it: the 10 GiB corpus adds no more than 4 MiB (the heap's own size varies from run to run
# by tens of MiB whatever the data, so only growth is a failure).
[[ $big_rss -le $((small_rss + (4 << 20))) ]] ||
  fail "resident memory grew by $(((big_rss - small_rss) >> 10)) KiB with the corpus"
echo "ok: resident memory with 10 GiB of shards is that of 10 MiB (file-backed within $((file_diff >> 10)) KiB)"
