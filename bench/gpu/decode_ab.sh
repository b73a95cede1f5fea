#!/usr/bin/env bash
# Batch-1 decode A/B of the launch and routing switches, in one device call (after bench/gpu/stage.sh):
#   tar -xzf gpu-carry-z/carry.tgz && bash bench/gpu/decode_ab.sh
# Engine-level correctness first (graph replay == eager, PDL on vs off bit-equal), then
# `inferx bench offline` at 1k context for each variant; the same for FP8 / INT4 weights.
# VARIANTS: space-separated "name:ENV=VAL,ENV=VAL" (default below). Prints one line per variant.
set -uo pipefail
C=gpu-carry
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$C/gpu-libs:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
INFERX_REQUIRE_GPU=1 timeout 240 "$C/test_cuda_engine" --gtest_color=no >"$OUT/engine_tests.log" 2>&1
echo "test_cuda_engine: rc=$? $(grep -E '^\[  (PASSED|FAILED)|graph steps checked' "$OUT/engine_tests.log" | tr '\n' ' ')"
VARIANTS="${VARIANTS:-pdl: nopdl:INFERX_PDL=0 down-cublas:INFERX_GEMV_LONG_K=cublas}"
QUANTS="${QUANTS:-bf16 fp8 int4}"
for q in $QUANTS; do
  qa=()
  [[ "$q" != bf16 ]] && qa=(--quantize "$q")
  for v in $VARIANTS; do
    name=${v%%:*}
    envs=${v#*:}
    IFS=, read -r -a kv <<<"$envs"
    env "${kv[@]}" timeout 120 "$C/inferx" bench offline -m dummy:llama-3-8b --dtype bf16 "${qa[@]}" --device cuda \
      --max-batch-size 1 --num-prompts 1 --input-len 1000 --output-len 256 --max-model-len 2048 --no-progress \
      --json >"$OUT/ab_${q}_$name.json" 2>"$OUT/ab_${q}_$name.err"
    rc=$?
    echo "decode b1 1k $q $name: rc=$rc $(python3 -c "
import json; j=json.load(open('$OUT/ab_${q}_$name.json')); t=j['tpot_ms']
print(f\"TPOT p50 {t['p50']:.3f} ms = {1000/t['p50']:.1f} tok/s\")" 2>&1 | tail -1)"
  done
done
