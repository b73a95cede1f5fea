#!/usr/bin/env bash
# What is still owed to a GPU run (state of 2026-12-05 19:30), after bench/gpu/stage.sh, carry
# ["gpu-carry-z"]: tar -xzf gpu-carry-z/carry.tgz && bash bench/gpu/pending.sh
# 1. The decode GEMV split into one file per kernel (kernels_gemv_v1v2.cu, kernels_gemv_tc.cu,
#    kernels_gemv_stream.cu; the dispatch in kernels_gemv.cu) compiled and linked here but never ran on a
#    GPU: every GPU test binary, then batch 1 at 1k context for the three formats (the same TPOT as before
#    the split is expected: 8B bf16 ~5.93, fp8:lm_head ~3.54, int4:lm_head ~2.45 ms on an H100).
# 2. The barrier-cost model (docs/architecture.md, 12-05 evening): the persistent kernel's barrier while
#    each CTA keeps 0-192 KB of bulk copies in flight (INFERX_BENCH_ONLY=grid_barrier, "under a stream",
#    new, never run): if the model holds, us per round ~ 1 + 2 x (KB in flight) / (the SM's share of the
#    copy bandwidth), and the stream's rate saturates near 32 KB. The same for the candidate fix, a
#    two-level barrier over clusters (members released through distributed shared memory; leaders
#    streaming or idle): if it stays near its no-stream time under a stream, it is the barrier to build.
#    Both again "+ writes": each CTA stores a phase's outputs before every round and the cluster barrier
#    runs its real protocol (a member's GPU-scope fence before it arrives): if the fence waits behind the
#    stream as the model says of acknowledgements, the cluster barrier only pays off where members need no
#    fence of their own - the decisive row.
# 3. The persistent decode kernel on an H200 (docs/benchmarks.md 12-05 19:10): per-op vs stack with the
#    producer 1 and 2 stages ahead, bf16 and FP8 (on one H100 node 1 ahead was +1.3% at bf16, level on
#    another); and with its grid barriers in two levels over clusters of 2 and 4 (INFERX_DECODE_STACK_CLUSTER,
#    12-05 late, never run; its tests are in step 1's test_cuda_engine): worth it if step 2's "+ writes"
#    cluster rows stay well under the plain barrier's under a stream. And its FP8 products on tensor cores
#    (INFERX_DECODE_STACK_MMA, W8A8, one warp per stage; never run): "mmaskip2" is FP8's bound without
#    barriers (76% of the roofline with the scalar consumers; BF16's is 97%), fp8:lm_head's rows the ones
#    that count (the MMA switch changes nothing for bf16).
# 4. GEMV v5 (kernels_gemv_tc_stream.cu, 12-05 evening; never run): v3's tensor-core products on v4's
#    streaming plan; BF16, FP8 as W8A8 on E4M3 tensor cores, INT4 as v3 (bf16 also with its down projection
#    on v5 instead of cuBLASLt: INFERX_GEMV_LONG_K=gemv). Its kernel tests
#    (CudaGemvTest.W8a8KernelMatchesQuantizedReference, .TcStreamKernelReadsInt4LikeV3, and v5 on INT4 in every
#    weight-only test: step 1's test_cuda_backend), the quantized-model tests with v5 as the FP8 and INT4
#    kernel (test_cuda_qgemm: the trained student's FP8 decode steps then use the prefill's W8A8 numerics),
#    the FP8 and INT4 product chains (% of copy, v3 / v4 / v5), and batch 1 at 1k context: fp8:lm_head v4 vs
#    v5 (4 and 2 chunks per batch, no staging, the cp.async ring of 3 / 4 batches), int4:lm_head v3 vs v5
#    (and its ring), 70B fp8:lm_head v4 vs v5. Predicted:
#    the 8B FP8 products from 72-88% of copy to BF16's 94-100% (TPOT 3.54 -> ~3.25 ms on an H100, 1.8x
#    bf16); INT4's from ~68% (v3: a CTA per 16 rows, no staging) toward 85-90% (2.45 -> ~2.1 ms).
# What to do with the answers (record every figure in docs/benchmarks.md first):
#   - v5 faster than v4 at batch 1 (step 5) with its tests green: make it the measured default for that format
#     (kernels_gemv.cu measured_kernel; FP8 at m >= 2 too if step 4's m4/m16 rows beat v3), pick chunks /
#     staging / ring from the same runs, and for BF16's down projection flip INFERX_GEMV_LONG_K's default if
#     "v5down" wins. Slower: keep it opt-in and profile gemv_tc_stream_kernel with ncu_detail.sh.
#   - Cluster rows "+ writes" (step 2) well under the plain barrier's at 32-192 KB in flight, and the stack's
#     cl2/cl4 runs (step 3) faster than per-op: the two-level barrier stays and the persistent kernel's FP8
#     consumers on tensor cores (docs/architecture.md) come next. Not faster: remove the cluster mode.
# STEPS (default "1 2 3 4 5") picks the steps. The whole is more than one call's 10 minutes: run STEPS="1 2"
# (~6 min), then STEPS=4 (~4 min), STEPS=5 (~7 min: step 4's batch-1 figures), then STEPS=3 (~6 min), each a
# call on the warm machine.
set -uo pipefail
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
STEPS=" ${STEPS:-1 2 3 4 5} "
step() { [[ "$STEPS" == *" $1 "* ]]; }
step 1 && for t in test_cuda_backend test_cuda_qgemm test_cuda_engine test_cuda_tensor_parallel; do
  INFERX_REQUIRE_GPU=1 timeout 280 "$C/$t" --gtest_color=no >"$OUT/$t.log" 2>&1
  echo "$t: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$OUT/$t.log" | head -20
done
step 2 && INFERX_BENCH_ONLY=grid_barrier timeout 120 "$C/bench_cuda_kernels" --quick 2>&1 | grep -E "^grid barrier|^cluster barrier|rror"
step 1 && SKIP_ENGINE_TESTS=1 VARIANTS="default:" QUANTS="bf16 fp8:lm_head int4:lm_head" bash "$(dirname "$0")/decode_ab.sh" |
  grep "^decode"
step 3 && QUANTS="bf16 fp8:lm_head" MODES="per-op:INFERX_DECODE_STACK=0 if1:INFERX_DECODE_STACK=1,INFERX_DECODE_STACK_INFLIGHT=1
  if2:INFERX_DECODE_STACK=1,INFERX_DECODE_STACK_INFLIGHT=2 stack:INFERX_DECODE_STACK=1
  cl2if1:INFERX_DECODE_STACK=1,INFERX_DECODE_STACK_INFLIGHT=1,INFERX_DECODE_STACK_CLUSTER=2,INFERX_DECODE_STACK_PROFILE=1
  cl4if1:INFERX_DECODE_STACK=1,INFERX_DECODE_STACK_INFLIGHT=1,INFERX_DECODE_STACK_CLUSTER=4
  cl2:INFERX_DECODE_STACK=1,INFERX_DECODE_STACK_CLUSTER=2
  mmaif1:INFERX_DECODE_STACK=1,INFERX_DECODE_STACK_INFLIGHT=1,INFERX_DECODE_STACK_MMA=1
  mmaskip2:INFERX_DECODE_STACK=1,INFERX_DECODE_STACK_MMA=1,INFERX_DECODE_STACK_SKIP=2
  mmacl2if1:INFERX_DECODE_STACK=1,INFERX_DECODE_STACK_INFLIGHT=1,INFERX_DECODE_STACK_MMA=1,INFERX_DECODE_STACK_CLUSTER=2" \
  bash "$(dirname "$0")/decode_stack.sh" 2>&1 | grep -E "^llama|tests"
if step 4; then
  INFERX_GEMV_KERNEL=fp8=v5,int4=v5 INFERX_REQUIRE_GPU=1 timeout 200 "$C/test_cuda_qgemm" --gtest_color=no \
    >"$OUT/qgemm_v5.log" 2>&1
  echo "test_cuda_qgemm fp8=v5,int4=v5: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/qgemm_v5.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]|stories-hd128' "$OUT/qgemm_v5.log" | head -20
  for cases in fp8 int4 bf16; do
    INFERX_BENCH_ONLY=gemv INFERX_BENCH_GEMV_CASES="$cases" timeout 150 "$C/bench_cuda_kernels" --quick 2>&1 |
      grep -E " (v3|v4|v5)( |$)| v5 |copy|rror"
  done
fi
if step 5; then  # step 4's decode figures: batch 1 at 1k context, each variant a fresh process
  SKIP_ENGINE_TESTS=1 QUANTS="bf16" VARIANTS="v4: v5:INFERX_GEMV_KERNEL=bf16=v5
    v5down:INFERX_GEMV_KERNEL=bf16=v5,INFERX_GEMV_LONG_K=gemv" bash "$(dirname "$0")/decode_ab.sh" | grep "^decode"
  SKIP_ENGINE_TESTS=1 QUANTS="fp8:lm_head" VARIANTS="v4: v5:INFERX_GEMV_KERNEL=fp8=v5
    v5c2:INFERX_GEMV_KERNEL=fp8=v5,INFERX_GEMV_V5_CHUNKS=2 v5s0:INFERX_GEMV_KERNEL=fp8=v5,INFERX_GEMV_V5_SMEM_KB=0
    v5r3:INFERX_GEMV_KERNEL=fp8=v5,INFERX_GEMV_V5_RING=3 v5r4:INFERX_GEMV_KERNEL=fp8=v5,INFERX_GEMV_V5_RING=4
    v4again:" bash "$(dirname "$0")/decode_ab.sh" | grep "^decode"
  SKIP_ENGINE_TESTS=1 QUANTS="int4:lm_head" VARIANTS="v3: v5:INFERX_GEMV_KERNEL=int4=v5
    v5s0:INFERX_GEMV_KERNEL=int4=v5,INFERX_GEMV_V5_SMEM_KB=0 v5r3:INFERX_GEMV_KERNEL=int4=v5,INFERX_GEMV_V5_RING=3
    v5r4:INFERX_GEMV_KERNEL=int4=v5,INFERX_GEMV_V5_RING=4" bash "$(dirname "$0")/decode_ab.sh" | grep "^decode"
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
