#!/usr/bin/env bash
# What was built without a GPU and has not run on one yet (2026-12-04 night and 2026-12-05 sessions: the
# latter added review mends - g3p's GQA 3/8/12/16 rows in the prefill variants test, a one-GPU
# embedding_shard test, the tensor-parallel failure path that drops graphs before aborting NCCL; a hang in
# a test now means a bug there, each binary runs under `timeout`), in three device calls
# of at most ~6 minutes each (after bench/gpu/stage.sh; carry ["gpu-carry-z"]):
#   tar -xzf gpu-carry-z/carry.tgz && PART=tests bash bench/gpu/pending.sh
#   tar -xzf gpu-carry-z/carry.tgz && PART=kernels bash bench/gpu/pending.sh
#   tar -xzf gpu-carry-z/carry.tgz && PART=ab bash bench/gpu/pending.sh
# tests:   test_cuda_engine (device logit edits and penalties, overlapped steps), test_cuda_backend (the
#          dummy-weight fill blocks, the g3p prefill configuration against float64), test_cuda_qgemm with
#          and without FP8 fast accumulation (the accuracy side of that switch), test_cuda_tensor_parallel
#          (collectives on one GPU, the one-rank tensor-parallel path with graphs and overlapped steps, the
#          P2P all-reduce with several ranks on one GPU);
# kernels: bench_collectives on one GPU (a collective's call overhead on the stream), the decode attention in
#          the 1000/1000 run's shape (INFERX_BENCH_ONLY=decode_context), the prefill variants test under
#          compute-sanitizer memcheck, the prefill attention rows of every configuration (8 x 1000-token
#          prompts, T2048, T8192);
# ab:      gpu_ceilings.py (FP8 with and without fast accumulation), the 8192-token FP8 prefill with fast
#          accumulation off / on, 1000 x 1000/1000 FP8 offline: default, fast accumulation, g3p.
set -uo pipefail
source "$(dirname "$0")/common.sh"
PART="${PART:-tests}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader

if [[ "$PART" == tests ]]; then
  for t in test_cuda_engine test_cuda_backend test_cuda_qgemm test_cuda_tensor_parallel; do
    INFERX_REQUIRE_GPU=1 timeout 300 "$C/$t" --gtest_color=no >"$OUT/$t.log" 2>&1
    echo "$t: rc=$? $(grep -E '^\[  (PASSED|FAILED)|one rank|one-rank path' "$OUT/$t.log" | tr '\n' ' ')"
  done
  INFERX_FP8_FAST_ACCUM=1 INFERX_REQUIRE_GPU=1 timeout 300 "$C/test_cuda_qgemm" --gtest_color=no \
    >"$OUT/test_cuda_qgemm_fast_accum.log" 2>&1
  echo "test_cuda_qgemm, fast accumulation: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_cuda_qgemm_fast_accum.log" | tr '\n' ' ')"
fi

if [[ "$PART" == kernels ]]; then
  timeout 60 "$C/bench_collectives" 1 >"$OUT/collectives_1gpu.txt" 2>&1
  echo "bench_collectives (1 GPU): rc=$?"
  cat "$OUT/collectives_1gpu.txt"
  INFERX_BENCH_ONLY=decode_context timeout 180 "$C/bench_cuda_kernels" >"$OUT/decode_context.txt" 2>&1
  echo "decode_context: rc=$?"
  cat "$OUT/decode_context.txt"
  # The new prefill configuration under compute-sanitizer memcheck (out-of-bounds Q / output rows).
  INFERX_REQUIRE_GPU=1 timeout 240 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$C/test_cuda_backend" --gtest_color=no --gtest_filter='CudaAttentionTest.PrefillVariants*' \
    >"$OUT/memcheck_prefill_variants.log" 2>&1
  echo "memcheck prefill variants: rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' "$OUT/memcheck_prefill_variants.log" | tr '\n' ' ')"
  INFERX_BENCH_ONLY=prefill INFERX_BENCH_PREFILL_VARIANTS=1 timeout 180 "$C/bench_cuda_kernels" \
    >"$OUT/prefill_rows.txt" 2>&1
  echo "prefill rows: rc=$?"
  grep -E "prefill|copy|GEMM" "$OUT/prefill_rows.txt"
fi

if [[ "$PART" == ab ]]; then
  # The decode attention over 32 layers' caches fell to 78.5% of copy against 88.9% for one (kernels part,
  # 2026-12-05): how many caches it takes, and whether sorted block tables win it back.
  INFERX_BENCH_ONLY=decode_context timeout 180 "$C/bench_cuda_kernels" >"$OUT/decode_context_sweep.txt" 2>&1
  echo "decode_context sweep: rc=$?"
  grep -E "fp8 attn|ceiling" "$OUT/decode_context_sweep.txt"
  # The FP8 ceiling with and without fast accumulation (torch._scaled_mm 8192^3; the tool prints both): the
  # 1000/1000 run's big FP8 GEMMs already reach 1.41-1.51 PFLOP/s, so the gain hangs on which one that is.
  OUT="$OUT" timeout 200 python3 "$C/tools/gpu_ceilings.py" >"$OUT/ceilings.log" 2>&1
  echo "gpu_ceilings: rc=$? $(grep -E 'fp8|copy' "$OUT/ceilings.log" | tr '\n' ' ')"
  for v in off: fast:INFERX_FP8_FAST_ACCUM=1; do
    name=${v%%:*}
    IFS=, read -r -a kv <<<"${v#*:}"
    env "${kv[@]}" timeout 120 "$C/inferx" bench offline -m dummy:llama-3-8b --dtype bf16 --quantize fp8 \
      --device cuda --max-batch-size 1 --num-prompts 1 --warmup 1 --input-len 8192 --output-len 1 \
      --max-model-len 9000 --max-num-batched-tokens 8192 --no-progress --json >"$OUT/prefill_fp8_$name.json" \
      2>"$OUT/prefill_fp8_$name.err"
    echo "prefill 8192 fp8 $name: rc=$? $(python3 -c "
import json; t=json.load(open('$OUT/prefill_fp8_$name.json'))['ttft_ms']
print(f\"TTFT p50 {t['p50']:.1f} ms = {8192/t['p50']*1000:.0f} tok/s\")" 2>&1 | tail -1)"
  done
  # g3p left out: level with g3 on the 8 x 1000-token prompt rows (kernels part, 2026-12-05).
  WORKLOADS=1000x1000/1000 VARIANTS="off: fast:INFERX_FP8_FAST_ACCUM=1" \
    bash "$(dirname "$0")/offline_ab.sh"
fi
