#!/usr/bin/env bash
# The persistent batch-1 decode kernel (kernels_decode_stack.cu) in one device call (after stage.sh):
#   tar -xzf gpu-carry-z/carry.tgz && bash bench/gpu/decode_stack.sh
# Correctness first (every decode-stack test against the per-op kernels), then batch-1 decode at 1k context
# with the kernel on and off (same binary), its per-phase profile (INFERX_DECODE_STACK_PROFILE: one eager
# step's phase times and barrier spreads on stderr), and the timing ablation (INFERX_DECODE_STACK_SKIP:
# 1 no products, 2 no grid barriers, 4 no attention; wrong results, timing only).
# MODELS / QUANTS / SKIPS override the defaults below. Every command has its own timeout: a hang costs
# at most that, not the whole device budget.
set -uo pipefail
source "$(dirname "$0")/common.sh"
if [[ -z "${SKIP_TESTS:-}" ]]; then  # SKIP_TESTS=1 leaves the tests out
  INFERX_REQUIRE_GPU=1 timeout 240 "$C/test_cuda_engine" --gtest_color=no --gtest_filter='*DecodeStack*' \
    >"$OUT/stack_tests.log" 2>&1
  echo "decode stack tests: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/stack_tests.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]|Failure' "$OUT/stack_tests.log" | head -12
fi
# The engine's own GPU tests (graph replay == eager at batch 1 and padded batches, device sampling) with
# the kernel on: batch-1 steps then take it inside the engine's CUDA graphs.
# SKIP_ENGINE=1 leaves this part out.
if [[ -z "${SKIP_ENGINE:-}" ]]; then
  INFERX_DECODE_STACK=1 INFERX_REQUIRE_GPU=1 timeout 90 "$C/test_cuda_engine" --gtest_color=no \
    --gtest_filter='-*DecodeStack*' >"$OUT/stack_engine.log" 2>&1
  echo "engine tests with the stack on: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/stack_engine.log" | tr '\n' ' ')"
fi
one() {  # model quant label env...
  local model=$1 q=$2 label=$3
  shift 3
  local qa=()
  [[ "$q" != bf16 ]] && qa=(--quantize "$q")
  env "$@" timeout 40 "$C/inferx" bench offline -m "dummy:$model" --dtype bf16 "${qa[@]}" --device cuda \
    --max-batch-size 1 --num-prompts 1 --input-len "${INPUT_LEN:-1000}" --output-len 128 --max-model-len 2048 --no-progress \
    --roofline --json >"$OUT/stack.json" 2>"$OUT/stack.err"
  local rc=$?
  echo "$model $q $label: rc=$rc $(python3 -c "
import json; j=json.load(open('$OUT/stack.json')); r=j['roofline']
print(f\"TPOT p50 {j['tpot_ms']['p50']:.3f} ms = {r['tpot_p50_roofline_ratio']*100:.1f}% of the roofline\")" 2>&1 | tail -1)"
  grep 'inferx cuda' "$OUT/stack.err" | head -4
  local keep="err_${model}_${q}_${label}.txt"
  cp "$OUT/stack.err" "$OUT/${keep//[:=]/_}"  # the profile's lines; ':' does not come back from $OUT
}
# MODES: label:VAR=value,VAR=value ... (each a run with those environment variables).
DEFAULT_MODES="per-op:INFERX_DECODE_STACK=0 stack:INFERX_DECODE_STACK=1,INFERX_DECODE_STACK_PROFILE=1,INFERX_WARMUP=0
  stack-16k:INFERX_DECODE_STACK=1,INFERX_DECODE_STACK_STAGE_KB=16
  stack-inflight2:INFERX_DECODE_STACK=1,INFERX_DECODE_STACK_INFLIGHT=2,INFERX_DECODE_STACK_PROFILE=1,INFERX_WARMUP=0
  stack-spin:INFERX_DECODE_STACK=1,INFERX_DECODE_STACK_BACKOFF_NS=0
  stack-inflight2-spin:INFERX_DECODE_STACK=1,INFERX_DECODE_STACK_INFLIGHT=2,INFERX_DECODE_STACK_BACKOFF_NS=0
  stack-generic:INFERX_DECODE_STACK=1,INFERX_DECODE_STACK_GENERIC=1"
for s in ${SKIPS:-1 2 4}; do DEFAULT_MODES+=" skip=$s:INFERX_DECODE_STACK=1,INFERX_DECODE_STACK_SKIP=$s"; done
for m in ${MODELS:-llama-3-8b}; do
  for q in ${QUANTS:-bf16 fp8:lm_head}; do
    for mode in ${MODES:-$DEFAULT_MODES}; do
      IFS=, read -r -a envs <<<"${mode#*:}"
      one "$m" "$q" "${mode%%:*}" "${envs[@]}"
    done
  done
done
