#!/usr/bin/env bash
# compute-sanitizer memcheck + racecheck on the kernel tests of the kernels changed most recently, in one
# device call (after bench/gpu/stage.sh): tar -xzf gpu-carry-z/carry.tgz && bash bench/gpu/sanitize.sh
# BACKEND_FILTER / QGEMM_FILTER: gtest filters (QGEMM_FILTER="" skips that binary; unset: the default
# below); SAN_TOOLS; SAN_TIMEOUT: seconds per tool and binary.
set -uo pipefail
source "$(dirname "$0")/common.sh"
SAN=/usr/local/cuda/bin/compute-sanitizer
[[ -x "$SAN" ]] || { echo "compute-sanitizer: not found at $SAN"; exit 0; }
BACKEND_FILTER="${BACKEND_FILTER:-CudaAttentionTest.DecodeKernel*:CudaAttentionTest.MixedStep*:CudaAttentionTest.RopeWrites*:CudaBackendTest.RmsNorm*:CudaBackendTest.AddRmsNorm*:CudaBackendTest.RopeAndKvWrite*}"
QGEMM_FILTER="${QGEMM_FILTER-QuantizedGemmTest.Fp8Fused*:QuantizedGemmTest.Fp8MatchesTheCpuW8A8OnOddShapes}"
for tool in ${SAN_TOOLS:-memcheck racecheck}; do
  for pair in "test_cuda_backend|$BACKEND_FILTER" "test_cuda_qgemm|$QGEMM_FILTER"; do
    bin=${pair%%|*}
    filter=${pair#*|}
    [[ -z "$filter" ]] && continue
    [[ "$tool" == racecheck && "$bin" == test_cuda_qgemm ]] && continue  # no shared-memory kernels of ours
    INFERX_REQUIRE_GPU=1 timeout "${SAN_TIMEOUT:-120}" "$SAN" --tool "$tool" --error-exitcode 1 "$C/$bin" \
      --gtest_color=no --gtest_filter="$filter" >"$OUT/sanitizer_${tool}_$bin.log" 2>&1
    echo "compute-sanitizer $tool $bin: rc=$? $(grep -E '(ERROR|RACECHECK) SUMMARY|^\[  (PASSED|FAILED)' \
      "$OUT/sanitizer_${tool}_$bin.log" | tr '\n' ' ')"
  done
done
