#!/usr/bin/env bash
# What is still owed to a GPU run (state of 2026-12-05 19:00), after bench/gpu/stage.sh, carry
# ["gpu-carry-z"]: tar -xzf gpu-carry-z/carry.tgz && bash bench/gpu/pending.sh
# The GPU tests with GEMV v4 reading INT4 (f55f54b; its A/B ran on 12-05 18:55, the test logs did not come
# back): test_cuda_backend in full and test_cuda_engine, the failures listed.
set -uo pipefail
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for t in test_cuda_backend test_cuda_engine; do
  INFERX_REQUIRE_GPU=1 timeout 280 "$C/$t" --gtest_color=no >"$OUT/$t.log" 2>&1
  echo "$t: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]|Failure|Expected|Which is' "$OUT/$t.log" | head -30
  grep -E '^\[       OK \] (CudaGemvTest.Stream|GemvStreamInt4)' "$OUT/$t.log"
done
