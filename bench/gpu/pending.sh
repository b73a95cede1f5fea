#!/usr/bin/env bash
# What is still owed to a GPU run (state of 2026-12-05 15:10), in one device call of ~5-7 minutes, best on an
# H200 (the issues' figures are H200 figures), after bench/gpu/stage.sh; carry ["gpu-carry-z"]:
#   tar -xzf gpu-carry-z/carry.tgz && bash bench/gpu/pending.sh
# 1. test_cuda_engine and the GEMM tests of test_cuda_backend: the cuBLASLt candidate list became a vector
#    (LtMatmul::set_candidates), the backend takes an external stream (CudaBackendOptions::external_stream)
#    and a stream priority - none run on a GPU yet (defaults unchanged: 16 candidates, own stream, priority 0).
# 2. The decode step's attention / GEMM overlap on disjoint SMs (bench_cuda_kernels INFERX_BENCH_ONLY=overlap
#    with INFERX_BENCH_GREEN_SMS: green contexts, never run yet): whether "together" falls toward the larger of
#    the two alone once each runs on its own SM partition, and what the two-half-batch pipelined schedule takes
#    eagerly and as one CUDA graph across the two streams (or why the capture fails), and a mixed step's decode
#    attention beside its prefill attention (8 x 1000-token chunks) on the two partitions. H100 12-05: stream
#    priority + cuBLASLt's SM target alone left "together" at 90-99% of the sum; a read stream on 66 of 132 SMs
#    reaches 99% of the whole GPU's read bandwidth, the FP8 GEMMs on 66 SMs take 1.31x their whole-GPU time.
# 3. Cold start with the GEMM tuning cache (bench/gpu/cold_start.sh, CACHED configurations: the first start
#    fills a fresh cache folder, the second restores from it) and test_cuda_backend's
#    TuningCacheRestoresBucketsWithoutTiming (in step 1's GEMM tests). Never run on a GPU yet.
# 4. SKIP_OFFLINE=0: 1000 x 1000/1000 FP8 + FP8 KV under with_clocks.sh (OFFLINE_VARIANTS, default the
#    defaults only) with INFERX_GEMM_STATS=1 and the step profile.
# 5. While the call has time left (B70_BEFORE seconds, default 300) and only where it fits (an H200):
#    Llama-3-70B FP8 at batch 1 against its roofline from the same process (issue 6: >= 85%; 82.3% on 12-05
#    14:30).
# ENGINE_FILTER: a gtest filter for step 1; GREEN_SMS: step 2's partitions (default "64 80 96").
set -uo pipefail
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader

INFERX_REQUIRE_GPU=1 timeout 200 "$C/test_cuda_engine" --gtest_color=no ${ENGINE_FILTER:+--gtest_filter=$ENGINE_FILTER} \
  >"$OUT/test_cuda_engine.log" 2>&1
echo "test_cuda_engine: rc=$? $(grep -E '^\[  (PASSED|FAILED)|^warm-up ' "$OUT/test_cuda_engine.log" | tr '\n' ' ')"
INFERX_REQUIRE_GPU=1 timeout 120 "$C/test_cuda_backend" --gtest_color=no --gtest_filter='CudaGemm*:*Matmul*' \
  >"$OUT/test_cuda_backend_gemm.log" 2>&1
echo "test_cuda_backend GEMM tests: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_cuda_backend_gemm.log" | tr '\n' ' ')"

INFERX_BENCH_ONLY=overlap INFERX_BENCH_SM_TARGETS="0" INFERX_BENCH_GREEN_SMS="${GREEN_SMS:-64 80 96}" \
  INFERX_BENCH_OVERLAP_ROWS="490" timeout 150 "$C/bench_cuda_kernels" >"$OUT/overlap.txt" 2>&1
echo "overlap bench: rc=$?"
grep -E "^overlap" "$OUT/overlap.txt"

CONFIGS="" bash "$(dirname "$0")/cold_start.sh"

if [[ "${SKIP_OFFLINE:-1}" != 1 ]]; then
  for v in ${OFFLINE_VARIANTS:-default:}; do
    name=${v%%:*}
    INFERX_GEMM_STATS=1 bash "$(dirname "$0")/with_clocks.sh" "1000x1000_$name" env WORKLOADS=1000x1000/1000 \
      VARIANTS="$v" RUN_TIMEOUT=110 STEP_PROFILE=1 bash "$(dirname "$0")/offline_ab.sh"
    grep -E "cuBLASLt|warm-up" "$OUT/off_1000_1000_1000_$name.err"
  done
fi

gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if ((SECONDS < ${B70_BEFORE:-300} && gpu_mib > 100000)); then
  timeout 170 "$C/inferx" bench offline --device cuda --no-progress --json -m dummy:llama-3-70b --dtype bf16 \
    --quantize fp8:lm_head --max-batch-size 1 --num-prompts 1 --input-len 1000 --output-len 128 \
    --max-model-len 2048 --roofline >"$OUT/b1_70b_fp8.json" 2>"$OUT/b1_70b_fp8.err"
  echo "70B fp8:lm_head b1: rc=$? $(python3 -c "
import json; j=json.load(open('$OUT/b1_70b_fp8.json')); t=j['tpot_ms']; r=j['roofline']
print(f\"TPOT p50 {t['p50']:.3f} ms = {100*r['tpot_p50_roofline_ratio']:.1f}% of {r['batch1_roofline_tok_s']:.1f} tok/s at {r['bandwidth_gbs']:.0f} GB/s\")" 2>&1 | tail -1)"
  grep "warm-up" "$OUT/b1_70b_fp8.err"
fi
