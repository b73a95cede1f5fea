#!/usr/bin/env bash
# What is still owed to a GPU run (state of 2026-12-05 19:00), in one device call of ~6-8 minutes, after
#   EXTRA_BINS="inferx_base=/tmp/inferx_base" bash bench/gpu/stage.sh   (inferx_base: the build before the
#   changes below, stripped), carry ["gpu-carry-z"]:
#   tar -xzf gpu-carry-z/carry.tgz && bash bench/gpu/pending.sh
# 1. The GPU tests: test_cuda_backend in full (GEMV v4 reading INT4, new; the attention kernels with the
#    newest key's tile asked into L2 before the PDL wait, new) and test_cuda_engine.
# 2. The INT4 products alone, v3 (tensor-core decode, the default) against v4 with its INT4 decoder
#    (INFERX_BENCH_ONLY=gemv, INT4 rows).
# 3. Batch 1 at 1k context, 8B: the build before (BIN=inferx_base) against this one (the attention's L2
#    warm-up), and int4:lm_head with INFERX_GEMV_KERNEL=int4=v4.
# 4. The INT4 v4 step's kernel timeline (bench/gpu/timeline.sh).
# 5. 70B fp8:lm_head at batch 1, before / after.
set -uo pipefail
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit,memory.total --format=csv,noheader

for t in test_cuda_backend test_cuda_engine; do
  INFERX_REQUIRE_GPU=1 timeout 300 "$C/$t" --gtest_color=no >"$OUT/$t.log" 2>&1
  echo "$t: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$OUT/$t.log" | head -20
done

INFERX_BENCH_ONLY=gemv INFERX_BENCH_GEMV_CASES="${GEMV_CASES:-int4}" timeout 200 "$C/bench_cuda_kernels" --quick 2>&1 |
  grep -iE "int4|copy|rror" | head -120

SKIP_ENGINE_TESTS=1 VARIANTS="${VARIANTS:-base:BIN=inferx_base new: base2:BIN=inferx_base new2:}" \
  QUANTS="${QUANTS:-bf16 fp8:lm_head}" bash "$(dirname "$0")/decode_ab.sh" | grep "^decode"
SKIP_ENGINE_TESTS=1 VARIANTS="base:BIN=inferx_base v3: v4:INFERX_GEMV_KERNEL=int4=v4 v3b: v4b:INFERX_GEMV_KERNEL=int4=v4" \
  QUANTS="int4:lm_head" bash "$(dirname "$0")/decode_ab.sh" | grep "^decode"

TAG=v4 INFERX_GEMV_KERNEL=int4=v4 QUANTS=int4:lm_head bash "$(dirname "$0")/timeline.sh" 2>&1 | grep -v "^$" | head -16

# 70B FP8 fits an 80 GB H100 only with a small KV cache; the same flags everywhere for comparable runs.
for v in base:inferx_base new:inferx; do
  name=${v%%:*}
  timeout 170 "$C/${v#*:}" bench offline --device cuda --no-progress --json -m dummy:llama-3-70b \
    --dtype bf16 --quantize fp8:lm_head --max-batch-size 1 --num-prompts 1 --input-len 1000 --output-len 96 \
    --max-model-len 2048 --kv-cache-memory 1GiB --gpu-memory-utilization 0.99 --roofline \
    >"$OUT/b1_70b_fp8_$name.json" 2>"$OUT/b1_70b_fp8_$name.err"
  echo "70B fp8:lm_head b1 $name: rc=$? $(python3 -c "
import json; j=json.load(open('$OUT/b1_70b_fp8_$name.json')); t=j['tpot_ms']; r=j['roofline']
print(f\"TPOT p50 {t['p50']:.3f} ms = {100*r['tpot_p50_roofline_ratio']:.1f}% of {r['batch1_roofline_tok_s']:.1f} tok/s at {r['bandwidth_gbs']:.0f} GB/s\")" 2>&1 | tail -1)"
done
cd "$OUT" && gzip -9 -f timeline_*.csv 2>/dev/null
rm -f "$OUT"/*.err
