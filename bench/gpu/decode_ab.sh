#!/usr/bin/env bash
# Batch-1 decode A/B of the launch and routing switches, in one device call (after bench/gpu/stage.sh):
#   tar -xzf gpu-carry-z/carry.tgz && bash bench/gpu/decode_ab.sh
# Engine-level correctness first (graph replay == eager, PDL on vs off bit-equal), then
# `inferx bench offline` at 1k context for each variant; the same for FP8 / INT4 weights.
# VARIANTS: space-separated "name:ENV=VAL,ENV=VAL" (default below; BIN=NAME runs $C/NAME instead of inferx,
# e.g. an older build staged beside it). Prints one line per variant.
set -uo pipefail
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [[ "${SKIP_ENGINE_TESTS:-0}" != 1 ]]; then  # callers that ran the engine tests already (pending.sh)
  INFERX_REQUIRE_GPU=1 timeout 240 "$C/test_cuda_engine" --gtest_color=no >"$OUT/engine_tests.log" 2>&1
  echo "test_cuda_engine: rc=$? $(grep -E '^\[  (PASSED|FAILED)|graph steps checked' "$OUT/engine_tests.log" | tr '\n' ' ')"
fi
VARIANTS="${VARIANTS:-pdl: nopdl:INFERX_PDL=0 down-gemv:INFERX_GEMV_LONG_K=gemv}"
# INPUT_LEN (default 1000) / MAX_LEN (2048): the context the decode steps run at. EXTRA: more bench flags
# for every variant (e.g. EXTRA="--kv-cache-dtype fp8").
read -r -a extra <<<"${EXTRA:-}"
QUANTS="${QUANTS:-bf16 fp8 int4}"
for q in $QUANTS; do
  qa=()
  [[ "$q" != bf16 ]] && qa=(--quantize "$q")
  tag=${q//:/_}  # file names without colons (the device tool returns only plain names)
  for v in $VARIANTS; do
    name=${v%%:*}
    envs=${v#*:}
    IFS=, read -r -a kv <<<"$envs"
    bin=inferx  # BIN=NAME among a variant's settings: another binary staged in $C (e.g. an older build)
    for e in "${kv[@]}"; do [[ "$e" == BIN=* ]] && bin=${e#BIN=}; done
    env "${kv[@]}" timeout 120 "$C/$bin" bench offline -m dummy:llama-3-8b --dtype bf16 "${qa[@]}" --device cuda \
      --max-batch-size 1 --num-prompts 1 --input-len "${INPUT_LEN:-1000}" --output-len 256 \
      --max-model-len "${MAX_LEN:-2048}" --no-progress "${extra[@]}" \
      --roofline --json >"$OUT/ab_${tag}_$name.json" 2>"$OUT/ab_${tag}_$name.err"
    rc=$?
    echo "decode b1 ctx${INPUT_LEN:-1000} $q $name: rc=$rc $(python3 -c "
import json; j=json.load(open('$OUT/ab_${tag}_$name.json')); t=j['tpot_ms']; r=j.get('roofline', {})
print(f\"TPOT p50 {t['p50']:.3f} ms = {1000/t['p50']:.1f} tok/s\", f\"= {100*r['tpot_p50_roofline_ratio']:.1f}% of {r['batch1_roofline_tok_s']:.1f} ({r['weight_bytes_per_token']/1e9:.3f} GB at {r['bandwidth_gbs']:.0f} GB/s)\" if 'tpot_p50_roofline_ratio' in r else '')" 2>&1 | tail -1)"
  done
done
# PREFILL=1: the 8192-token prefill in one step (TTFT), GEMM autotuning on and off.
if [[ "${PREFILL:-0}" == 1 ]]; then
  for v in tuned: heuristic:INFERX_GEMM_TUNE=0; do
    name=${v%%:*}
    envs=${v#*:}
    IFS=, read -r -a kv <<<"$envs"
    env "${kv[@]}" timeout 120 "$C/inferx" bench offline -m dummy:llama-3-8b --dtype bf16 --device cuda \
      --max-batch-size 1 --num-prompts 1 --warmup 1 --input-len 8192 --output-len 1 --max-model-len 9000 \
      --max-num-batched-tokens 8192 --no-progress --json >"$OUT/prefill_$name.json" 2>"$OUT/prefill_$name.err"
    rc=$?
    echo "prefill 8192 $name: rc=$rc $(python3 -c "
import json; j=json.load(open('$OUT/prefill_$name.json')); t=j['ttft_ms']
print(f\"TTFT p50 {t['p50']:.1f} ms = {8192/t['p50']*1000:.0f} tok/s = {131.7e12/(t['p50']/1e3)/1e12:.0f} TFLOP/s\")" 2>&1 | tail -1)"
  done
fi
# OFFLINE_B256=1: batch-256 offline throughput (1024 in / 256 out, no HTTP) with the engine's host-side step
# profile (INFERX_STEP_PROFILE=1), per quantization and step token budget: shows whether steps wait on the
# device or on host work, and how much of a step the prefill chunks take.
if [[ "${OFFLINE_B256:-0}" == 1 ]]; then
  for q in ${B256_QUANTS:-bf16 fp8}; do
    qa=()
    [[ "$q" != bf16 ]] && qa=(--quantize "$q" --kv-cache-dtype fp8)
    for tok in ${B256_TOKENS:-2048 8192}; do
      INFERX_STEP_PROFILE=1 timeout 150 "$C/inferx" bench offline -m dummy:llama-3-8b --dtype bf16 "${qa[@]}" \
        --device cuda --max-batch-size 256 --num-prompts 256 --input-len 1024 --output-len 256 \
        --max-model-len 4096 --max-num-batched-tokens "$tok" --no-progress --json \
        >"$OUT/b256_${q}_$tok.json" 2>"$OUT/b256_${q}_$tok.err"
      rc=$?
      echo "offline b256 1024/256 $q tokens/step $tok: rc=$rc $(python3 -c "
import json; j=json.load(open('$OUT/b256_${q}_$tok.json'))
print(f\"out {j['output_throughput']:.0f} tok/s, total {j['total_token_throughput']:.0f} tok/s, {j['duration_s']:.2f} s\"); t=j['tpot_ms']
print(f\"TPOT p50 {t['p50']:.1f} ms\")" 2>&1 | tr '\n' ' ')"
      grep -A3 "step profile" "$OUT/b256_${q}_$tok.err"
    done
  done
fi
# PROFILE=1: per-kernel GPU time of batch-1 decode steps (8B at 1k context), bench/gpu/kernel_profile.sh.
if [[ "${PROFILE:-0}" == 1 ]]; then
  for q in ${PROFILE_QUANTS:-bf16 fp8}; do
    qa=()
    [[ "$q" != bf16 ]] && qa=(--quantize "$q")
    OUT="$OUT" bash "$(dirname "$0")/kernel_profile.sh" "b1_$q" "${PROFILE_SKIP:-4000}" "${PROFILE_COUNT:-600}" \
      generate -m dummy:llama-3-8b --dtype bf16 "${qa[@]}" --device cuda --prompt-ids "$(seq -s, 1 1000)" -n 48 \
      --temperature 0 --ignore-eos
  done
fi
