#!/usr/bin/env bash
# `inferx generate --tensor-parallel-size N --device cpu` end to end: the greedy text of TP=2 and TP=4
# equals TP=1's, on stories260K (text prompt through its tokenizer) when the shared test data is there,
# and on the llama-tiny GGUF fixture (token-id prompt) always.
set -euo pipefail
inferx="$1" source_dir="$2" testdata="$3"

run() {  # model, tp, prompt args...
  local model="$1" tp="$2"
  shift 2
  "$inferx" generate -m "$model" "$@" -n 24 --temperature 0 --ignore-eos -t 1 --device cpu \
    --tensor-parallel-size "$tp" 2>/dev/null
}

check() {  # model, prompt args...
  local model="$1"
  shift
  local base
  base="$(run "$model" 1 "$@")"
  [[ -n "$base" ]] || { echo "FAIL: empty output at TP=1 for $model"; exit 1; }
  for tp in 2 4; do
    local got
    got="$(run "$model" "$tp" "$@")"
    if [[ "$got" != "$base" ]]; then
      printf 'FAIL: %s TP=%s differs from TP=1\n  tp1: %s\n  tp%s: %s\n' "$model" "$tp" "$base" "$tp" "$got"
      exit 1
    fi
    echo "ok: $(basename "$model") TP=$tp: $got"
  done
}

check "$source_dir/tests/golden/fixtures/llama-tiny.gguf" --prompt-ids 1,5,9,14,2,77
if [[ -f "$testdata/stories260K.gguf" ]]; then
  check "$testdata/stories260K.gguf" -p "Once upon a time"
else
  echo "note: $testdata/stories260K.gguf not found, checked the fixture only"
fi
# A size that does not divide the heads is refused with a message naming them.
if msg="$("$inferx" generate -m "$source_dir/tests/golden/fixtures/llama-tiny.gguf" --prompt-ids 1 -n 1 \
  --tensor-parallel-size 3 -t 1 2>&1)"; then
  echo "FAIL: --tensor-parallel-size 3 was accepted"; exit 1
fi
[[ "$msg" == *"attention heads"* ]] || { echo "FAIL: unexpected error: $msg"; exit 1; }
echo "ok: --tensor-parallel-size 3 refused"
