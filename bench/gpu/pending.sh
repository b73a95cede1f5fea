#!/usr/bin/env bash
# What is still owed to a GPU run (state of 2026-12-06 03:10: no device machine could be started all that
# session), after bench/gpu/stage.sh, carry ["gpu-carry-z"]:
#   tar -xzf gpu-carry-z/carry.tgz && bash bench/gpu/pending.sh
# 1. Every GPU test binary on this build, then batch 1 at 1k context for the three formats.
# 2. The grid barrier probes on the card at hand.
# 3. The persistent decode kernel: its INT4 reading (new, never run: decode-stack tests and per-op v3 vs
#    the stack), per-op vs the stack one stage ahead (if1), the producer's L2 lead
#    (new: l2=KB per SM requested into L2 beyond the ring, to keep the memory busy through the attention and
#    its barriers), the no-barrier bound (skip2), per-phase profiles; the decode-stack tests, whose FP8
#    tensor-core cases now print per step how far the mma stack is from per-op v5, the plain stack from
#    per-op and per-op v5 from per-op (H100 12-06: the 8B and Mistral mma cases 0.10 off, cause not found).
# 4. GEMV v5 (FP8 W8A8) against v4 at batch 1 on the card at hand (H200 12-05: 2.919 vs 2.988 ms, -2.4%; 70B
#    21.53 vs 20.80, slower) and the FP8 product chains.
# What to do with the answers (record every figure in docs/benchmarks.md first):
#   - the L2 lead beats if1 on bf16 and fp8: make the best (inflight, KB) the stack's default and time the
#     stack against per-op on both cards; the stack becomes the batch-1 default where it wins. If it loses at
#     every lead, remove it (the 12-03 prefetch warp lost too).
#   - INT4: the stack against per-op v3 at int4:lm_head; INT4's 3x needs ~1.53 ms on an H200.
#   - FP8: its phases now read x chunk-major (no 2-way bank conflicts); compare skip2 fp8 with the 12-05 H100
#     bound (76.0%) and if1 fp8 with per-op. If they gained nothing, the conflicts were not FP8's limit.
#   - MMA: "per-op-v5 vs per-op" far above "stack vs per-op" with "stack-mma vs stack" small means v5 is the
#     wrong one (then W8a8KernelMatchesQuantizedReference at the 8B MLP shapes fails too).
#   - v5 (FP8 W8A8): slower than v4 on an H100 (3.597 vs 3.545 ms, 12-06), faster on one H200 node (-2.4%):
#     rerun on an H200 beside v4 before any default changes; remove it if it does not win there again.
# STEPS (default "1 2 3 4") picks the steps: STEPS=3 first (~7 min), then "1 2" (~4 min), then 4 (~5 min). With
# little device time, the correctness part of step 3 alone (~1.5 min): test_cuda_engine
# --gtest_filter='*DecodeStack*int4*:*DecodeStack*mma*:*DecodeStack*l2lead*'.
set -uo pipefail
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
STEPS=" ${STEPS:-1 2 3 4} "
step() { [[ "$STEPS" == *" $1 "* ]]; }
step 1 && for t in test_cuda_backend test_cuda_qgemm test_cuda_engine test_cuda_tensor_parallel; do
  INFERX_REQUIRE_GPU=1 timeout 280 "$C/$t" --gtest_color=no >"$OUT/$t.log" 2>&1
  echo "$t: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$OUT/$t.log" | head -20
done
step 2 && INFERX_BENCH_ONLY=grid_barrier timeout 120 "$C/bench_cuda_kernels" --quick 2>&1 | grep -E "^grid barrier|rror"
step 1 && SKIP_ENGINE_TESTS=1 VARIANTS="default:" QUANTS="bf16 fp8:lm_head int4:lm_head" bash "$(dirname "$0")/decode_ab.sh" |
  grep "^decode"
# Step 3's modes: per-op against the stack one stage ahead (if1), with the producer's L2 lead (l2=KB per SM
# beyond the ring) and without the in-flight limit, and the no-barrier bound (skip2); two per-phase profiles.
S="INFERX_DECODE_STACK=1"
# An L2 prefetch warp ahead of the ring lost at every distance on 12-03 (5.46 / 5.51 / 6.89 / 7.59 ms at 64 /
# 128 / 256 / 384 KB per SM against 5.02; but its 17th warp cut the consumers to 96 registers, and 256+ KB x
# 132 SMs is most of the 50 MB L2): the lead is now the producer's own lane, no extra warp, at 64-256 KB.
L="INFERX_DECODE_STACK_L2_KB"
step 3 && QUANTS="${QUANTS3:-bf16 fp8:lm_head}" MODES="${MODES3:-per-op:INFERX_DECODE_STACK=0
  if1:$S,INFERX_DECODE_STACK_INFLIGHT=1 if1l2=64:$S,INFERX_DECODE_STACK_INFLIGHT=1,$L=64
  if1l2=128:$S,INFERX_DECODE_STACK_INFLIGHT=1,$L=128 if1l2=256:$S,INFERX_DECODE_STACK_INFLIGHT=1,$L=256
  if2l2=128:$S,INFERX_DECODE_STACK_INFLIGHT=2,$L=128 l2=128:$S,$L=128 skip2:$S,INFERX_DECODE_STACK_SKIP=2
  if1l2prof:$S,INFERX_DECODE_STACK_INFLIGHT=1,$L=128,INFERX_DECODE_STACK_PROFILE=1}" \
  SKIP_ENGINE="${SKIP_ENGINE-1}" bash "$(dirname "$0")/decode_stack.sh" 2>&1 | grep -E "^llama|tests|profile|FAILED"
# INT4 in the persistent kernel (new): per-op (GEMV v3) against the stack.
step 3 && SKIP_TESTS=1 SKIP_ENGINE=1 QUANTS="int4:lm_head" MODES="per-op:INFERX_DECODE_STACK=0
  if1:$S,INFERX_DECODE_STACK_INFLIGHT=1 if1l2=128:$S,INFERX_DECODE_STACK_INFLIGHT=1,$L=128
  if2:$S,INFERX_DECODE_STACK_INFLIGHT=2 skip2:$S,INFERX_DECODE_STACK_SKIP=2" \
  bash "$(dirname "$0")/decode_stack.sh" 2>&1 | grep -E "^llama"
# The FP8 tensor-core cases' per-step comparison (cuda_decode_stack_test.cpp): first and last steps.
step 3 && grep -E "^\[ RUN|^  step (0|7|11):" "$OUT/stack_tests.log" | grep -B1 "step" | grep -v "^--" | head -24
if step 4; then
  INFERX_BENCH_ONLY=gemv INFERX_BENCH_GEMV_CASES=fp8 timeout 150 "$C/bench_cuda_kernels" --quick 2>&1 |
    grep -E " m1 " | grep -E " (v3|v4|v5)( |$)| v4 l8 | v5 |rror"
  SKIP_ENGINE_TESTS=1 QUANTS="fp8:lm_head" VARIANTS="v4: v5:INFERX_GEMV_KERNEL=fp8=v5
    v5s0:INFERX_GEMV_KERNEL=fp8=v5,INFERX_GEMV_V5_SMEM_KB=0 v4again:" bash "$(dirname "$0")/decode_ab.sh" | grep "^decode"
  for v in v4: v5:INFERX_GEMV_KERNEL=fp8=v5; do  # 70B FP8 (fits an 80 GB H100 with 1 GiB of KV)
    IFS=, read -r -a kv <<<"${v#*:}"
    env "${kv[@]}" timeout 200 "$C/inferx" bench offline -m dummy:llama-3-70b --dtype bf16 --quantize fp8:lm_head \
      --device cuda --max-batch-size 1 --num-prompts 1 --input-len 1000 --output-len 96 --max-model-len 2048 \
      --kv-cache-memory 1GiB --gpu-memory-utilization 0.99 --no-progress --roofline --json \
      >"$OUT/b1_70b_${v%%:*}.json" 2>"$OUT/b1_70b_${v%%:*}.err"
    echo "decode b1 1k 70b fp8:lm_head ${v%%:*}: rc=$? $(python3 -c "
import json; j=json.load(open('$OUT/b1_70b_${v%%:*}.json')); t=j['tpot_ms']; r=j.get('roofline', {})
print(f\"TPOT p50 {t['p50']:.3f} ms\", f\"= {100*r['tpot_p50_roofline_ratio']:.1f}%\" if 'tpot_p50_roofline_ratio' in r else '')" 2>&1 | tail -1)"
  done
fi
rm -f "$OUT"/*.json "$OUT"/*.err
