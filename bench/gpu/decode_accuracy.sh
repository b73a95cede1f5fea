#!/usr/bin/env bash
# Decode-path accuracy on the GPU (after bench/gpu/stage.sh): perplexity and KL of the trained student with
# Llama-3-wide heads (tests/unit/model/fixtures/stories-hd128.gguf: head_dim 128, 2 query heads per KV head;
# scripts/tiny_model/train.py) over tests/unit/model/fixtures/stories_eval.txt, against the CPU's F32 run.
# Each variant once with every scored position in a one-token step of its own (--decode-steps: the decode
# attention kernel, replayed CUDA graphs - the path generated tokens take) and once per chunk in one prefill
# (the prefill attention kernel), at CTX tokens per chunk (default "128 256": the student was trained on
# 256-token sequences). VARIANTS: space-separated
# "name:ENV=VAL,ENV=VAL:inferx options with _ for spaces".
#   tar -xzf gpu-carry-z/carry.tgz && bash bench/gpu/decode_accuracy.sh
# (DEVICE=cpu C=build/cuda/src/cli VARIANTS="f32::--kv-cache-dtype_f32": a dry run of the script on the CPU)
set -uo pipefail
source "$(dirname "$0")/common.sh"
M=tests/unit/model/fixtures/stories-hd128.gguf
T=tests/unit/model/fixtures/stories_eval.txt
VARIANTS="${VARIANTS:-bf16kv::--kv-cache-dtype_bf16 fp8kv::--kv-cache-dtype_fp8 \
fp8kv-terms2:INFERX_DECODE_ATTN_TERMS=2:--kv-cache-dtype_fp8 fp8w-fp8kv::--kv-cache-dtype_fp8_--quantize_fp8}"
for ctx in ${CTX:-128 256}; do
  base="$OUT/acc_base_$ctx.kl"
  "$C/inferx" perplexity -m "$M" -f "$T" --ctx "$ctx" --kl-divergence-base "$base" --kl-top-k 512 \
    >"$OUT/acc_base_$ctx.txt" 2>&1 || { echo "base ctx $ctx failed"; tail -3 "$OUT/acc_base_$ctx.txt"; continue; }
  echo "ctx $ctx cpu f32: $(grep '^perplexity' "$OUT/acc_base_$ctx.txt")"
  for v in $VARIANTS; do
    name=${v%%:*}
    rest=${v#*:}
    IFS=, read -r -a envs <<<"${rest%%:*}"
    read -r -a opts <<<"${rest#*:}"
    opts=("${opts[@]//_/ }")
    read -r -a opts <<<"${opts[*]}"
    for mode in prefill decode; do
      extra=()
      [[ $mode == decode ]] && extra=(--decode-steps)
      f="$OUT/acc_${ctx}_${name}_$mode.txt"
      env "${envs[@]}" timeout 300 "$C/inferx" perplexity -m "$M" -f "$T" --ctx "$ctx" --device "${DEVICE:-cuda}" "${opts[@]}" \
        "${extra[@]}" --kl-divergence-base "$base" --kl-divergence >"$f" 2>&1
      rc=$?
      echo "ctx $ctx $name $mode: rc=$rc $(grep -E '^perplexity|^mean KL|^top-1' "$f" | tr '\n' ' ')"
    done
  done
done
