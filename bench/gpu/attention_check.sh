#!/usr/bin/env bash
# Decode-attention change check in one device call (after bench/gpu/stage.sh): the backend and engine tests,
# the per-kernel time of decode-only steps at 256 rows, bf16 and FP8 + FP8 KV (bench/gpu/kernel_profile.sh),
# then compute-sanitizer on the attention / RoPE / norm tests (bench/gpu/sanitize.sh; SAN_TOOLS).
set -uo pipefail
D="$(dirname "$0")"
source "$D/common.sh"
for t in test_cuda_backend test_cuda_qgemm test_cuda_engine; do
  INFERX_REQUIRE_GPU=1 timeout 150 "$C/$t" --gtest_color=no >"$OUT/$t.log" 2>&1
  echo "$t: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED' "$OUT/$t.log" | head -5
done
export INFERX_GEMM_TUNE=0
for q in bf16 fp8; do
  qa=()
  skip=9000
  [[ "$q" != bf16 ]] && qa=(--quantize "$q" --kv-cache-dtype fp8) && skip=14000
  PROFILE_TOP=4 OUT="$OUT" bash "$D/kernel_profile.sh" "dec256_$q" "$skip" "${COUNT:-300}" bench offline \
    -m dummy:llama-3-8b --dtype bf16 "${qa[@]}" --device cuda --max-batch-size 256 --num-prompts 256 \
    --input-len 1024 --output-len 48 --max-model-len 4096 --warmup 0 --no-progress --max-num-batched-tokens 16384
done
# Last: the sanitizer (the slowest part; a call cut short still returns the figures above).
BACKEND_FILTER="${BACKEND_FILTER:-CudaAttentionTest.DecodeKernel*:CudaAttentionTest.MixedStep*:CudaAttentionTest.RopeWrites*:CudaBackendTest.RmsNorm*:CudaBackendTest.RopeAndKvWrite*}" \
  SAN_TIMEOUT="${SAN_TIMEOUT:-80}" OUT="$OUT" bash "$D/sanitize.sh"
