#!/usr/bin/env bash
# Real data end to end: `loom tokenize` turns text into llm.c shards (in parallel, any chunking,
# the same tokens); a job trains on many shards under dp2 x tp2 with the same losses as on the
# same tokens in one file, and as on the text tokenized on the fly; a resume on shards is bitwise;
# the validation loss is recorded, the same on 1 rank and dp2 x tp2; document boundaries; a shard
# with a bad header, a truncated shard and an out-of-range token are each a named error before
# training (exit 2); a .jsonl is one document per line to both; Llama 3's documents start with
# <|begin_of_text|> as llm.c's do; compressed and binary inputs and bad flags are refused, and a
# failed `loom tokenize` leaves no shard behind.
set -euo pipefail
train="$(realpath "$1")"
loomrun="$(realpath "$2")"
tokenize="$(realpath "$3")"
fixtures="$(realpath "$4")"
consolidate="$(realpath "$5")"
cd "${TEST_TMPDIR:-$(mktemp -d)}"

fail() { echo "FAIL: $*" >&2; exit 1; }
tokenizer="$fixtures/gpt2_style.json"
# Several documents of mixed text: the fixture cut into pieces (each a file, so a document).
mkdir -p text
split -n l/6 -d "$fixtures/text.txt" text/doc_
cat text/doc_* > all.txt

# --- loom tokenize: chunking and threads never change the tokens --------------------------------
"$tokenize" --tokenizer "$tokenizer" --out one --shard-tokens 100000000 --threads 1 \
  --no-progress text > tok_one.log 2>&1 || { cat tok_one.log; fail "tokenize (one shard)"; }
"$tokenize" --tokenizer "$tokenizer" --out many --shard-tokens 3001 --threads 2 \
  --chunk-bytes 997 --val-tokens 4000 --no-progress text > tok_many.log 2>&1 ||
  { cat tok_many.log; fail "tokenize (many shards)"; }
grep -q "6 documents" tok_one.log || { cat tok_one.log; fail "expected 6 documents"; }
[[ $(ls one | wc -l) -eq 1 ]] || { ls one; fail "expected one shard"; }
[[ $(ls many/train_*.bin | wc -l) -gt 5 ]] || { ls many; fail "expected many shards"; }
[[ -f many/val_000000.bin ]] || { ls many; fail "expected a val shard"; }
# The val shard and the training shards together are the one shard's tokens, byte for byte.
tail -c +1025 one/train_000000.bin > one.tokens
for f in many/val_*.bin many/train_*.bin; do tail -c +1025 "$f"; done > many.tokens
cmp one.tokens many.tokens || fail "many shards (2 threads, 997-byte chunks) differ from one shard"
echo "ok: loom tokenize: 1 shard = $(ls many | wc -l) shards across 2 threads"
# One line with no newline at all: cut at character boundaries, still the same tokens.
mkdir -p oneline && tr '\n' ' ' < all.txt > oneline/doc.txt
"$tokenize" --tokenizer "$tokenizer" --out line_whole --threads 1 --no-progress oneline > l1.log 2>&1 ||
  { cat l1.log; fail "tokenize one line"; }
"$tokenize" --tokenizer "$tokenizer" --out line_cut --threads 2 --chunk-bytes 501 --no-progress \
  oneline > l2.log 2>&1 || { cat l2.log; fail "tokenize one line in chunks"; }
cmp line_whole/train_000000.bin line_cut/train_000000.bin || fail "one line cut in chunks differs"
echo "ok: a file of one line, cut into 501-byte chunks, gives the same tokens"
# A folder's subfolders are not read, and a file named twice is read twice: each is warned about.
mkdir -p nested/sub && cp oneline/doc.txt nested/a.txt && cp oneline/doc.txt nested/sub/b.txt
ln -sf "$PWD/nested/a.txt" alias.txt
"$tokenize" --tokenizer "$tokenizer" --out nested_out --threads 1 --no-progress nested alias.txt \
  > nested.log 2>&1 || { cat nested.log; fail "tokenize a folder with a subfolder"; }
grep -qF "loom_tokenize: WARNING: the folder 'nested' holds 1 subfolder(s) (sub) whose files are not read" nested.log ||
  { cat nested.log; fail "an unread subfolder is not named"; }
grep -qF "loom_tokenize: WARNING: 'alias.txt' is read twice (also as 'nested/a.txt')" nested.log ||
  { cat nested.log; fail "a file read twice is not named"; }
echo "ok: loom tokenize names a folder's unread subfolders and a file read twice"

common=(--launcher "$loomrun" --steps 6 --batch-size 4 --seq-len 32 --sample-tokens 0 --no-progress
  --plot-out "")
losses() { grep -o '"loss":[^,]*' "$1"; }

# --- many shards = one file = text on the fly, under dp2 x tp2 ----------------------------------
"$train" "${common[@]}" --dp 2 --tp 2 --data one/train_000000.bin --tokenizer "$tokenizer" \
  --metrics-out one.jsonl > one.log 2>&1 || { cat one.log; fail "train on one shard"; }
# The same tokens as many shards: the val shard first, then the training shards, in order.
"$train" "${common[@]}" --dp 2 --tp 2 --data "many/val_000000.bin,many/train_*.bin" \
  --tokenizer "$tokenizer" --metrics-out many.jsonl > many.log 2>&1 ||
  { cat many.log; fail "train on many shards"; }
grep -q "files, " many.log || { cat many.log; fail "expected the shards' description"; }
# The data's unigram entropy (the reference line of the loss plot): the same tokens, the same
# figure, and not zero.
entropy() { grep -o "unigram entropy [0-9.]* nats" "$1"; }
[[ "$(entropy one.log)" == "$(entropy many.log)" && "$(entropy one.log)" != "unigram entropy 0.000 nats" ]] ||
  { entropy one.log; entropy many.log; fail "unigram entropy"; }
[[ "$(losses one.jsonl)" == "$(losses many.jsonl)" ]] ||
  { paste <(losses one.jsonl) <(losses many.jsonl); fail "many shards train differently"; }
"$train" "${common[@]}" --dp 2 --tp 2 --data text --tokenizer "$tokenizer" \
  --metrics-out fly.jsonl > fly.log 2>&1 || { cat fly.log; fail "train on text on the fly"; }
[[ "$(losses one.jsonl)" == "$(losses fly.jsonl)" ]] ||
  { paste <(losses one.jsonl) <(losses fly.jsonl); fail "text on the fly trains differently"; }
echo "ok: dp2 x tp2 losses: one shard = $(ls many/train_*.bin | wc -l) shards = text on the fly"

# --- the tokenizer travels with the checkpoint: --save writes it beside, --init-from finds it ----
mkdir -p saved
"$train" "${common[@]}" --dp 1 --tp 1 --steps 1 --data text --tokenizer "$tokenizer" \
  --save saved/model.safetensors --metrics-out "" > save.log 2>&1 || { cat save.log; fail "--save"; }
cmp saved/tokenizer.json "$tokenizer" || fail "--save did not write the tokenizer beside the model"
# Its config.json names the tokenizer's document tokens (<|endoftext|>, id 3000), not
# transformers' default 50256, outside this vocabulary.
[[ "$(jq -c '[.bos_token_id, .eos_token_id]' saved/config.json)" == "[3000,3000]" ]] ||
  { cat saved/config.json; fail "--save with --tokenizer did not write the tokenizer's ids"; }
"$train" "${common[@]}" --dp 1 --tp 1 --steps 1 --data text --init-from saved \
  --metrics-out "" > init.log 2>&1 || { cat init.log; fail "--init-from saved"; }
grep -q "tokenizer tokenizer.json at saved/tokenizer.json" init.log ||
  { cat init.log; fail "--init-from's tokenizer.json was not used"; }
echo "ok: --save writes tokenizer.json beside the model, --init-from uses it"
# Weights without their config.json: the preset's sizes do not fit them, and the error says why
# first, then lists the first mismatches, not every tensor.
mkdir -p no_config && cp saved/model.safetensors no_config/
status=0
"$train" "${common[@]}" --model tiny --n-layer 4 --dp 1 --tp 1 --steps 1 --data text \
  --init-from no_config --metrics-out "" > noconf.log 2>&1 || status=$?
[[ $status -eq 2 ]] || { cat noconf.log; fail "--init-from without config.json exited $status"; }
grep -q "there is no config.json beside the weights ('no_config/config.json')" noconf.log ||
  { cat noconf.log; fail "the missing config.json is not named"; }
(( $(wc -l < noconf.log) <= 16 )) || { cat noconf.log; fail "the error lists every tensor"; }
echo "ok: --init-from without config.json names it, in a few lines"

# --- what Loom's model config does not hold travels too: the token ids of the config.json it
# started from and its generation_config.json (else generate() after a round trip stops at
# transformers' default ids); and a --save name transformers cannot load is said ------------------
jq '. + {bos_token_id: 5, eos_token_id: 7, pad_token_id: 0}' saved/config.json > ids.json
mv ids.json saved/config.json
printf '{"bos_token_id": 5, "eos_token_id": 7}\n' > saved/generation_config.json
mkdir -p resaved
"$train" "${common[@]}" --dp 1 --tp 1 --steps 1 --data text --init-from saved \
  --save resaved/model.safetensors --metrics-out "" > resave.log 2>&1 || { cat resave.log; fail "--save again"; }
[[ "$(jq -c '[.bos_token_id, .eos_token_id, .pad_token_id]' resaved/config.json)" == "[5,7,0]" ]] ||
  { cat resaved/config.json; fail "--save lost the token ids of --init-from's config.json"; }
cmp saved/generation_config.json resaved/generation_config.json ||
  fail "--save did not copy --init-from's generation_config.json"
# ... and through a distributed checkpoint: the job records them, consolidate writes them (the
# job's --save byte for byte, tokenizer.json with --tokenizer), and a resume without --init-from
# keeps them for its own --save.
mkdir -p ids_saved consolidated resumed
"$train" "${common[@]}" --dp 1 --tp 1 --steps 1 --data text --init-from saved \
  --checkpoint-dir ck_ids --save ids_saved/model.safetensors --metrics-out "" > ck_ids.log 2>&1 ||
  { cat ck_ids.log; fail "--init-from with --checkpoint-dir"; }
"$consolidate" ck_ids consolidated/model.safetensors --tokenizer saved/tokenizer.json \
  > consolidate.log 2>&1 || { cat consolidate.log; fail "consolidate"; }
for f in model.safetensors config.json generation_config.json tokenizer.json; do
  cmp "ids_saved/$f" "consolidated/$f" || fail "consolidate's $f differs from the job's --save"
done
"$train" "${common[@]}" --dp 1 --tp 1 --steps 2 --data text --checkpoint-dir ck_ids --resume \
  --tokenizer saved/tokenizer.json --vocab-size "$(jq .vocab_size saved/config.json)" \
  --save resumed/model.safetensors --metrics-out "" > ids_resume.log 2>&1 ||
  { cat ids_resume.log; fail "resume without --init-from"; }
[[ "$(jq -c '[.bos_token_id, .eos_token_id, .pad_token_id]' resumed/config.json)" == "[5,7,0]" ]] ||
  { cat resumed/config.json; fail "a resumed job's --save lost the token ids"; }
cmp saved/generation_config.json resumed/generation_config.json ||
  fail "a resumed job's --save lost the generation_config.json"
status=0
"$train" "${common[@]}" --dp 1 --tp 1 --steps 1 --data text --save resaved/model.safetensors.index.json \
  --metrics-out "" > badsave.log 2>&1 || status=$?
[[ $status -eq 2 ]] && grep -q "is not a .safetensors file name" badsave.log ||
  { cat badsave.log; fail "--save to a .json name"; }
"$train" "${common[@]}" --dp 1 --tp 1 --steps 1 --data text --save resaved/other.safetensors \
  --metrics-out "" > othersave.log 2>&1 || { cat othersave.log; fail "--save to another name"; }
grep -q "from_pretrained(folder) reads model.safetensors only" othersave.log ||
  { cat othersave.log; fail "no word that transformers will not find other.safetensors"; }
echo "ok: --save keeps the token ids and generation config, and names what transformers cannot load"
# config.json's dropout (transformers trains with it) is not Loom's: a warning names the flag.
mkdir -p pdrop && cp saved/model.safetensors saved/tokenizer.json pdrop/
jq '. + {resid_pdrop: 0.1, attn_pdrop: 0.1}' saved/config.json > pdrop/config.json
"$train" "${common[@]}" --dp 1 --tp 1 --steps 1 --data text --init-from pdrop --attn-dropout 0.1 \
  --metrics-out "" > pdrop.log 2>&1 || { cat pdrop.log; fail "--init-from with pdrops"; }
grep -q "\"resid_pdrop\": 0.1 (transformers trains with it), but this job trains with --dropout 0" pdrop.log ||
  { cat pdrop.log; fail "no warning for config.json's resid_pdrop"; }
! grep -q '"attn_pdrop"' pdrop.log || { cat pdrop.log; fail "a warning for an attn_pdrop the job matches"; }
echo "ok: config.json's dropout that the job does not train with is warned about"

# --- resume on shards is bitwise ---------------------------------------------------------------
"$train" "${common[@]}" --dp 2 --tp 2 --data "many/train_*.bin" --tokenizer "$tokenizer" \
  --checkpoint-dir ckpt --checkpoint-every 3 --metrics-out whole.jsonl > whole.log 2>&1 ||
  { cat whole.log; fail "train with checkpoints"; }
rm -rf ckpt/step_00000006
"$train" "${common[@]}" --dp 2 --tp 2 --data "many/train_*.bin" --tokenizer "$tokenizer" \
  --checkpoint-dir ckpt --resume --metrics-out resumed.jsonl > resumed.log 2>&1 ||
  { cat resumed.log; fail "resume"; }
grep -q "resumed from ckpt/step_00000003 at step 3" resumed.log || { cat resumed.log; fail "resume"; }
[[ "$(losses whole.jsonl | tail -3)" == "$(losses resumed.jsonl)" ]] ||
  { paste <(losses whole.jsonl | tail -3) <(losses resumed.jsonl); fail "resume not bitwise"; }
echo "ok: resume on shards is bitwise"

# --- validation: recorded, and the same on every layout (pp, FSDP, TP, CP, and mixed) -----------
layouts=("--dp 1 --tp 1" "--dp 2 --tp 2" "--pp 2 --dp 1 --tp 1" "--dp 0 --dp-shard 2 --tp 1"
  "--pp 2 --dp 0 --dp-shard 2 --tp 1 --microbatches 2" "--dp 1 --tp 1 --cp 2"
  "--dp 0 --dp-shard 2 --tp 1 --cp 2 --cp-attention alltoall")
val_losses() { grep -o '"val_loss":[^,]*' "$1" | cut -d: -f2; }
for i in "${!layouts[@]}"; do
  # shellcheck disable=SC2086
  "$train" "${common[@]}" ${layouts[$i]} --data "many/train_*.bin" --val-data many/val_000000.bin \
    --val-every 3 --tokenizer "$tokenizer" --metrics-out "val_$i.jsonl" --plot-out "val_$i.png" \
    > "val_$i.log" 2>&1 || { cat "val_$i.log"; fail "validation on ${layouts[$i]}"; }
  grep -q "val loss" "val_$i.log" || { cat "val_$i.log"; fail "no val loss printed"; }
  [[ $(grep -c '"val_loss"' "val_$i.jsonl") -eq 2 ]] || { cat "val_$i.jsonl"; fail "2 validations"; }
  [[ -s "val_$i.png.val.dat" ]] || fail "no validation points beside the plot"
  # Every layout's validation losses equal one rank's to 1e-6 (relative): f32 sums in another order.
  paste <(val_losses val_0.jsonl) <(val_losses "val_$i.jsonl") | awk -v layout="${layouts[$i]}" '
    { d = $1 - $2; if (d < 0) d = -d; m = $1 < 0 ? -$1 : $1; if (m < 1) m = 1
      print "val loss, 1 rank:", $1, layout ":", $2; if (d > 1e-6 * m) bad = 1; n++ }
    END { exit (bad || n != 2) }' || fail "validation losses differ on ${layouts[$i]}"
done
echo "ok: validation loss on 1 rank = dp2 x tp2 = pp2 = dp_shard2 = pp2 x dp_shard2 = cp2 = dp_shard2 x cp2 (1e-6, relative)"

# --- document boundaries ------------------------------------------------------------------------
"$train" "${common[@]}" --dp 1 --tp 1 --data one/train_000000.bin --tokenizer "$tokenizer" \
  --document-boundaries --metrics-out docs.jsonl > docs.log 2>&1 || { cat docs.log; fail "documents"; }
# Each of the 6 files is a document. The text spells <|endoftext|> too, which loom tokenize
# encodes as text (llm.c's split_special_tokens), so it cuts no document.
grep -q "sequences inside one document: 6 documents" docs.log ||
  { cat docs.log; fail "expected 6 documents"; }
# Matched as HF's default encode does (--no-split-special-tokens), each is a separator too.
separators=$(grep -o '<|endoftext|>' all.txt | wc -l)
(( separators > 0 )) || fail "the fixture text spells no <|endoftext|>: the next check tests nothing"
"$train" "${common[@]}" --dp 1 --tp 1 --data text --tokenizer "$tokenizer" --no-split-special-tokens \
  --document-boundaries --metrics-out "" > docs_matched.log 2>&1 || { cat docs_matched.log; fail "documents"; }
grep -q "sequences inside one document: $((6 + separators)) documents" docs_matched.log ||
  { cat docs_matched.log; fail "expected $((6 + separators)) documents"; }
echo "ok: --document-boundaries, special tokens in the text split (the default) or matched"

# --- bad shards: named before training ----------------------------------------------------------
expect_error() {
  local message="$1"
  shift
  local status=0
  "$train" --no-progress --sample-tokens 0 --plot-out "" --metrics-out "" "$@" >out.log 2>err.log || status=$?
  [[ $status -eq 2 ]] || { cat out.log err.log; fail "loom_train $* exited $status, expected 2"; }
  grep -qF -- "$message" err.log || { cat err.log; fail "expected the message: $message"; }
  ! grep -q "^step" out.log || fail "loom_train $* trained before failing"
  echo "ok (2): $message"
}
mkdir -p bad_magic truncated out_of_range
cp many/train_00000[0-2].bin bad_magic/ && printf '\x21\xd8\x34\x01' | dd of=bad_magic/train_000001.bin bs=1 seek=0 conv=notrunc 2>/dev/null
expect_error "'bad_magic/train_000001.bin': unknown magic 20240417 at byte 0" --data bad_magic
cp many/train_00000[0-2].bin truncated/ && truncate -s -7 truncated/train_000002.bin
expect_error "'truncated/train_000002.bin' is truncated: its header declares 3001 tokens but it holds 2997" \
  --data truncated
cp many/train_00000[0-2].bin out_of_range/ && printf '\xff\xff' | dd of=out_of_range/train_000001.bin bs=1 seek=1124 conv=notrunc 2>/dev/null
expect_error "'out_of_range/train_000001.bin' holds token 65535 at index 50 (byte 1124), outside the model's vocabulary" \
  --data out_of_range --tokenizer "$tokenizer"
expect_error "--val-data: 'no_val' does not exist" --data "many/train_*.bin" --val-data no_val
expect_error "--val-every and --val-steps: need --val-data" --val-every 2
# Held-out tokens also given as training data would not be held out.
expect_error "--val-data: 'many/val_000000.bin' is also training data (--data names 'many/val_000000.bin')" \
  --data "many/*.bin" --val-data many/val_000000.bin --tokenizer "$tokenizer"
# A file named twice weighs double: said, not refused (repeating data may be meant).
"$train" "${common[@]}" --dp 1 --tp 1 --steps 1 --tokenizer "$tokenizer" --metrics-out "" \
  --data "many/train_000000.bin,./many/train_000000.bin" > twice.log 2>&1 || { cat twice.log; fail "a file named twice"; }
grep -q "WARNING: --data names './many/train_000000.bin' twice (also as 'many/train_000000.bin')" twice.log ||
  { cat twice.log; fail "a file named twice is not said"; }
# loom tokenize's folder: --data takes its training shards, --val-data its validation ones.
"$train" "${common[@]}" --dp 1 --tp 1 --data many --val-data many --val-every 3 --tokenizer "$tokenizer" \
  --metrics-out "" > folder_split.log 2>&1 || { cat folder_split.log; fail "--data and --val-data on one folder"; }
grep -q "validation on many/val_000000.bin" folder_split.log || { cat folder_split.log; fail "the folder's validation split"; }
# Shards from another tokenizer than GPT-2's, read without it: GPT-2's separator never occurs.
expect_error "--document-boundaries: the document token 50256 never occurs in" \
  --data "many/train_*.bin" --document-boundaries

# loom tokenize refuses a folder that already holds shards (a glob would mix two runs) and an
# input it cannot map (a pipe), by name.
if "$tokenize" --tokenizer "$tokenizer" --out many --no-progress text > again.log 2>&1; then
  fail "tokenize into a folder of shards succeeded"
fi
grep -q "'many' already holds shards" again.log || { cat again.log; fail "stale shards not named"; }
if "$tokenize" --tokenizer "$tokenizer" --out piped --no-progress <(cat all.txt) > pipe.log 2>&1; then
  fail "tokenize of a pipe succeeded"
fi
grep -q "is not a regular file" pipe.log || { cat pipe.log; fail "a pipe not named"; }
echo "ok: loom tokenize refuses a folder of old shards and a pipe, by name"

# --- .jsonl: one document per line, the same to `loom tokenize` and to a job's --tokenizer ------
for f in text/doc_*; do jq -Rsc '{text: ., id: 1}' "$f"; done > docs.jsonl
"$tokenize" --tokenizer "$tokenizer" --out from_jsonl --no-progress docs.jsonl > tok_jsonl.log 2>&1 ||
  { cat tok_jsonl.log; fail "tokenize .jsonl"; }
cmp from_jsonl/train_000000.bin one/train_000000.bin ||
  fail "the .jsonl of the 6 documents tokenized otherwise than the 6 files"
"$train" "${common[@]}" --dp 2 --tp 2 --data docs.jsonl --tokenizer "$tokenizer" \
  --metrics-out jsonl_fly.jsonl > jsonl_fly.log 2>&1 || { cat jsonl_fly.log; fail "train on .jsonl"; }
[[ "$(losses one.jsonl)" == "$(losses jsonl_fly.jsonl)" ]] ||
  { paste <(losses one.jsonl) <(losses jsonl_fly.jsonl); fail ".jsonl on the fly trains differently"; }
echo "ok: a .jsonl is one document per line, to loom tokenize and to the job alike"

# --- Llama 3's documents start with <|begin_of_text|>, as llm.c's shards do ---------------------
"$tokenize" --tokenizer "$fixtures/llama3_style.json" --out llama --no-progress text > llama.log 2>&1 ||
  { cat llama.log; fail "tokenize with the Llama 3 tokenizer"; }
[[ $(od -An -tu2 -j1024 -N2 llama/train_000000.bin | tr -d ' ') == 3000 ]] ||
  fail "the first document does not start with <|begin_of_text|> (3000)"
"$train" "${common[@]}" --model llama-tiny --dp 1 --tp 1 --data "llama/train_*.bin" \
  --tokenizer "$fixtures/llama3_style.json" --document-boundaries --metrics-out llama.jsonl \
  > llama_train.log 2>&1 || { cat llama_train.log; fail "Llama 3 shards with --document-boundaries"; }
# The text spells <|begin_of_text|> too, encoded as text: only the 6 files start documents.
grep -q "sequences inside one document: 6 documents" llama_train.log ||
  { cat llama_train.log; fail "expected the 6 documents of the Llama 3 shards"; }
echo "ok: Llama 3 shards start each document with <|begin_of_text|>, and the job finds them"

# --- loom tokenize: what it refuses, and a failed run leaves no shard ----------------------------
tokenize_error() {  # expected message, then the arguments; exit 2 and no shard left in --out
  local message="$1"
  shift
  local status=0
  "$tokenize" --tokenizer "$tokenizer" --no-progress "$@" > terr.log 2>&1 || status=$?
  [[ $status -eq 2 ]] || { cat terr.log; fail "loom_tokenize $* exited $status, expected 2"; }
  grep -qF -- "$message" terr.log || { cat terr.log; fail "expected the message: $message"; }
  echo "ok (2): $message"
}
gzip -c all.txt > all.txt.gz
tokenize_error "'all.txt.gz' is gzip-compressed, not text: gunzip -k it first" --out gz all.txt.gz
expect_error "--data: 'all.txt.gz' is gzip-compressed, not text" --data all.txt.gz --tokenizer "$tokenizer"
tokenize_error "'one/train_000000.bin' holds a NUL byte at offset" --out binary one/train_000000.bin
tokenize_error "loom_tokenize: --chunk-bytes 0: expected 1 to 2^40" --out chunk0 --chunk-bytes 0 text
! grep -q "loom tokenize:" terr.log || { cat terr.log; fail "the error is prefixed twice"; }
tokenize_error "loom_tokenize: Could not convert: --shard-tokens = abc: expected a whole number" \
  --out badnumber --shard-tokens abc text
tokenize_error "loom_tokenize: --prefix '': expected a file name prefix without '/'" --out noprefix \
  --prefix '' text
tokenize_error "--document-token -7: expected a token id, or -1" --out docm7 --document-token -7 text
tokenize_error "The following argument was not expected: --bogus" --out bogus --bogus text
tokenize_error "--val-tokens 100000000 takes every one of the inputs'" --out allval \
  --val-tokens 100000000 text
[[ -z "$(ls allval)" ]] || fail "a run whose every token went to validation left $(ls allval)"
# The bad line comes after enough documents to fill several shards: the run removes them.
{ cat docs.jsonl docs.jsonl docs.jsonl; echo '{"txt": "no text field"}'; } > bad.jsonl
tokenize_error "'bad.jsonl': line $(( 3 * $(wc -l < docs.jsonl) + 1 )) (at byte $(( 3 * $(wc -c < docs.jsonl) ))) has no string field \"text\"" \
  --out partial --shard-tokens 1000 --threads 1 bad.jsonl
[[ -z "$(ls partial)" ]] || fail "a failed run left shards: $(ls partial)"
"$tokenize" --tokenizer "$tokenizer" --out partial --no-progress docs.jsonl > again2.log 2>&1 ||
  { cat again2.log; fail "the folder of a failed run cannot be used again"; }
# A run ended by a signal (Ctrl-C, SIGTERM) leaves no shard a --data folder or glob would read:
# the finished ones wait hidden (.NAME.bin.pending) until the whole run succeeded, and the next
# run into the folder removes them.
for _ in $(seq 400); do cat all.txt; done > big.txt
"$tokenize" --tokenizer "$tokenizer" --out stopped --shard-tokens 1000 --threads 1 --no-progress \
  big.txt > stopped.log 2>&1 &
pid=$!
for _ in $(seq 600); do
  compgen -G "stopped/.train_*.bin.pending" > /dev/null && break
  sleep 0.05
done
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
[[ $status -eq 143 ]] || { cat stopped.log; fail "loom_tokenize ended by SIGTERM exited $status, expected 143 (the run finished before the signal?)"; }
[[ -z "$(ls stopped)" ]] || fail "a run ended by SIGTERM left shards: $(ls stopped)"
compgen -G "stopped/.train_*.bin.pending" > /dev/null || fail "no shard was pending when the signal came"
"$tokenize" --tokenizer "$tokenizer" --out stopped --no-progress docs.jsonl > again3.log 2>&1 ||
  { cat again3.log; fail "the folder of a stopped run cannot be used again"; }
[[ "$(ls -A stopped)" == "train_000000.bin" ]] || fail "the next run left $(ls -A stopped)"
echo "ok: loom tokenize refuses compressed and binary inputs and bad flags (exit 2), and a failed or stopped run leaves no shard"
