#!/usr/bin/env python3
"""Tokenizer throughput per core in one run: Loom's C++ tokenizer, HF tokenizers and tiktoken.

    python3 tools/bench/tokenizer_throughput.py [--seconds 2] [--tokenizers gpt2 llama3_style]

All three encode the same text (tests/data/fixtures/tokenizer/text.txt, ~170 KB of prose, code,
other scripts, emoji, whitespace runs, digits and special tokens) with the same tokenizer, on one
thread each:

  loom       //tools/bench:tokenizer_bench (built with `bazel build -c opt` first), warm figure:
             the median of repeated encodes of the whole text on one thread
  tokenizers Hugging Face tokenizers (RAYON_NUM_THREADS=1), Tokenizer.from_file(NAME.json),
             `encode(text, add_special_tokens=False)`, the median of repeats after one warm-up
  tiktoken   an Encoding built from the same tokenizer.json (ranks = the vocabulary's ids as bytes,
             the added tokens as special tokens, the tokenizer's own pattern),
             `encode(text, allowed_special="all")`, the median of repeats after one warm-up

MB/s = 1e6 bytes of UTF-8 text per second, single-threaded, so per core. The last columns say
whether each one's ids equal HF tokenizers' (tiktoken merges by the rank of the merged token,
which equals HF's merge order for GPT-2 and for the trained fixtures, and emits a pre-token found
whole in the vocabulary as is, which only Llama 3's ignore_merges does in HF).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import tiktoken  # noqa: E402
import tokenizers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "data", "fixtures", "tokenizer")
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def byte_level_decoder():
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) +
                 list(range(0xAE, 0x100)))
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


def tiktoken_encoding(name, data):
    decoder = byte_level_decoder()
    added = {t["content"]: t["id"] for t in data.get("added_tokens", [])}
    ranks = {}
    for token, i in data["model"]["vocab"].items():
        if token in added or any(c not in decoder for c in token):
            continue
        ranks[bytes(decoder[c] for c in token)] = i
    pre = data["pre_tokenizer"]
    if pre["type"] == "ByteLevel":
        pattern = GPT2_PATTERN
    else:
        pattern = pre["pretokenizers"][0]["pattern"]["Regex"]
    return tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=ranks,
                             special_tokens=added)


def median_seconds(encode, text, budget):
    encode(text)  # warm-up
    times = []
    start = time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < budget:
        t0 = time.perf_counter()
        encode(text)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def loom_figures(args):
    binary = os.path.join(ROOT, "bazel-bin", "tools", "bench", "tokenizer_bench")
    if not args.no_build:
        subprocess.run(["bazel", "build", "-c", "opt", "--ui_event_filters=-info,-stdout,-stderr",
                        "--noshow_progress", "//tools/bench:tokenizer_bench"], cwd=ROOT, check=True)
    out = subprocess.run([binary, "--fixtures", FIXTURES, "--json", "--threads", "1",
                          "--seconds", str(args.seconds), "--tokenizers", *args.tokenizers],
                         check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {row["tokenizer"]: row for row in rows}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizers", nargs="+", default=["gpt2", "llama3_style", "gpt2_style"])
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per figure")
    parser.add_argument("--no-build", action="store_true", help="use bazel-bin's binary as it is")
    args = parser.parse_args()
    with open(os.path.join(FIXTURES, "text.txt"), encoding="utf-8", newline="") as f:
        text = f.read()
    mb = len(text.encode("utf-8")) / 1e6
    loom = loom_figures(args)
    print(f"{mb:.3f} MB of text; single-threaded MB/s (per core), medians over {args.seconds:g} s; "
          f"tokenizers {tokenizers.__version__}, tiktoken {tiktoken.__version__}")
    header = (f"{'tokenizer':<14} {'loom C++':>9} {'tokenizers':>11} {'tiktoken':>9} "
              f"{'loom/tokenizers':>16} {'loom/tiktoken':>14}  ids = HF: loom, tiktoken")
    print(header)
    for name in args.tokenizers:
        path = os.path.join(FIXTURES, name + ".json")
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        hf = tokenizers.Tokenizer.from_file(path)
        tt = tiktoken_encoding(name, data)
        hf_ids = hf.encode(text, add_special_tokens=False).ids
        tt_same = tt.encode(text, allowed_special="all") == hf_ids
        hf_mb_s = mb / median_seconds(lambda s: hf.encode(s, add_special_tokens=False), text,
                                      args.seconds)
        tt_mb_s = mb / median_seconds(lambda s: tt.encode(s, allowed_special="all"), text,
                                      args.seconds)
        loom_mb_s = loom[name]["warm_mb_s"]
        print(f"{name:<14} {loom_mb_s:>9.2f} {hf_mb_s:>11.2f} {tt_mb_s:>9.2f} "
              f"{loom_mb_s / hf_mb_s:>16.2f} {loom_mb_s / tt_mb_s:>14.2f}  "
              f"{loom[name]['ids_match_hf']}, {'yes' if tt_same else 'no'}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
