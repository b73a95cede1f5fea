#!/usr/bin/env bash
# The persistent decode kernel's MLP as one phase (INFERX_DECODE_STACK_MLP_SPLIT=1, kernels_decode_stack.h
# mlp_split) in one device call, after stage.sh (carry ["gpu-carry-z"]):
#   tar -xzf gpu-carry-z/carry.tgz && bash bench/gpu/mlp_split.sh
# 1. test_cuda_engine whole (the decode-stack cases, the split ones among them, and the engine's tests with
#    the BF16 stack as the default); test_cuda_backend.
# 2. 8B bf16 batch 1 at 1k context, per-op / stack / stack with the split, each twice, then the split's
#    per-phase profile and its no-barrier bound. Prediction: the split removes the gate/up -> down barrier
#    (6.9 us per layer) and the activation's L2 read, less its atomics (~1-2 us): ~3-5 us per layer, TPOT
#    5.71 -> ~5.58 ms (+2%).
set -uo pipefail
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [[ -z "${SKIP_TESTS:-}" ]]; then
  for t in ${TESTS:-test_cuda_engine test_cuda_backend}; do
    INFERX_REQUIRE_GPU=1 timeout 280 "$C/$t" --gtest_color=no --gtest_filter="${FILTER:-*}" >"$OUT/$t.log" 2>&1
    echo "$t: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]|Failure' "$OUT/$t.log" | head -12
  done
fi
M="INFERX_DECODE_STACK_MLP_SPLIT=1"
SKIP_TESTS=1 SKIP_ENGINE=1 QUANTS="${QUANTS:-bf16}" MODES="${MODES:-per-op:INFERX_DECODE_STACK=0 stack:INFERX_DECODE_STACK=1
  split:$M per-op2:INFERX_DECODE_STACK=0 stack2:INFERX_DECODE_STACK=1 split2:$M
  splitprof:$M,INFERX_DECODE_STACK_PROFILE=1,INFERX_WARMUP=0 splitskip2:$M,INFERX_DECODE_STACK_SKIP=2}" \
  bash "$(dirname "$0")/decode_stack.sh" 2>&1 | grep -E "^llama|profile|mlp_split|rror"
