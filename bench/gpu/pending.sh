#!/usr/bin/env bash
# What is still owed to a GPU run (state of 2026-12-05 17:45), in one device call of ~6-8 minutes, on an
# H200 (the issues' figures are H200 figures; calls that get an H100 still check correctness), after
# bench/gpu/stage.sh; carry ["gpu-carry-z"]:
#   tar -xzf gpu-carry-z/carry.tgz && bash bench/gpu/pending.sh
# 1. The GPU test binaries in full (the GEMV v4 K split and the loads-by-row-length rule passed them on an
#    H100 on 12-05; the review after them moved the stream-kernel tests' checks into one helper and added
#    that a forced split must change the sums' bits against the unsplit launch - not yet run on a GPU).
# 2. Batch 1 at 1k context on a typical H200 node: GEMV v4's loads per lane by row length (the default since
#    12-05 17:00: 8 for 8 KB rows in BF16 and for FP8 products of >= 8192 rows) against 4 everywhere
#    (INFERX_GEMV_V4_LOADS=4), and BF16's down projection on the GEMV (INFERX_GEMV_LONG_K=gemv; +0.3% on an
#    H100, -2.2% on an H200 with GEMV v1 on 12-03); 8B bf16 / fp8:lm_head / int4:lm_head.
# 3. Llama-3-70B FP8 at batch 1 against its roofline (issue 6: >= 85%; 8 loads gave +4.9% on a slow H200
#    node, 76.2 -> 80.0%, where 82.3% had been measured on another node at 14:30), default vs 4 loads, and
#    GEMV v1 for FP8 (one warp per row: alone in chains it beat v4 on the 70B q/k/v, 26.9 vs 28.7 us with 8
#    loads, and gate/up, 112.8 vs 113.9; v4 was chosen at 8B for its behaviour inside the graph).
# 4. SKIP_OFFLINE=0: offline 1000 x 1000/1000 FP8 + FP8 KV (issue 6: 17.7k; 17,306 on 12-05 14:30).
# 5. What a grid-wide barrier of the persistent decode kernel's shape costs by itself (INFERX_BENCH_ONLY=
#    grid_barrier, new, never run): its 12-03 profile had 2.1-6.5 us per barrier; if the barrier alone is
#    ~1 us, the rest is the slowest CTA's work or the producer (docs/architecture.md, "What is left to try").
#    And what a kernel boundary costs alone (INFERX_BENCH_ONLY=boundary, new: a graph of 1000 empty dependent
#    kernels, with and without PDL, 1 to 8 CTAs per SM): against the ~4 us per boundary inside the batch-1
#    step, the rest is the real kernels' ramps and tails.
set -uo pipefail
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit,memory.total --format=csv,noheader

for t in test_cuda_backend test_cuda_qgemm test_cuda_engine test_cuda_tensor_parallel; do
  INFERX_REQUIRE_GPU=1 timeout 280 "$C/$t" --gtest_color=no >"$OUT/$t.log" 2>&1
  echo "$t: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')"
done

SKIP_ENGINE_TESTS=1 VARIANTS="${VARIANTS:-default: l4:INFERX_GEMV_V4_LOADS=4 downgemv:INFERX_GEMV_LONG_K=gemv default2:}" \
  QUANTS="${QUANTS:-bf16 fp8:lm_head int4:lm_head}" bash "$(dirname "$0")/decode_ab.sh" | grep "^decode"

# 70B FP8 fits an 80 GB H100 only with a small KV cache; the same flags everywhere for comparable runs.
for v in default:X=1 l4:INFERX_GEMV_V4_LOADS=4 v1:INFERX_GEMV_KERNEL=fp8=v1 default2:X=1; do
  name=${v%%:*}
  env "${v#*:}" timeout 170 "$C/inferx" bench offline --device cuda --no-progress --json -m dummy:llama-3-70b \
    --dtype bf16 --quantize fp8:lm_head --max-batch-size 1 --num-prompts 1 --input-len 1000 --output-len 128 \
    --max-model-len 2048 --kv-cache-memory 1GiB --gpu-memory-utilization 0.99 --roofline \
    >"$OUT/b1_70b_fp8_$name.json" 2>"$OUT/b1_70b_fp8_$name.err"
  echo "70B fp8:lm_head b1 $name: rc=$? $(python3 -c "
import json; j=json.load(open('$OUT/b1_70b_fp8_$name.json')); t=j['tpot_ms']; r=j['roofline']
print(f\"TPOT p50 {t['p50']:.3f} ms = {100*r['tpot_p50_roofline_ratio']:.1f}% of {r['batch1_roofline_tok_s']:.1f} tok/s at {r['bandwidth_gbs']:.0f} GB/s\")" 2>&1 | tail -1)"
done

for probe in grid_barrier boundary; do
  INFERX_BENCH_ONLY=$probe timeout 60 "$C/bench_cuda_kernels" 2>&1 | grep -E "^grid barrier|^kernel boundary|rror"
done

if [[ "${SKIP_OFFLINE:-1}" != 1 ]]; then
  bash "$(dirname "$0")/with_clocks.sh" 1000x1000 env WORKLOADS=1000x1000/1000 VARIANTS="default:" RUN_TIMEOUT=110 \
    STEP_PROFILE=1 bash "$(dirname "$0")/offline_ab.sh"
fi
