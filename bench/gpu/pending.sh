#!/usr/bin/env bash
# 12-07 22:25 (H100): STEPS="42 1" passed on the structured-output carry (b1ab144): every GPU test (engine 56/56
# with the new constrained-rows test), racecheck 0 hazards (the f6ce7af __syncwarp holds), batch 1 bf16 85.6%,
# FP8 1.74x, INT4 2.48x. Owed, on an H200 only, carry ["gpu-carry-z"]: STEPS=40 (records), then 41, then 6.
# 18:40 on 12-07 (H100): step 1 passed on the review commit 6d697e9 (backend 75/75, qgemm 20/20, engine 55/55,
# TP 5/5); 18:55 step 42's racecheck found the newest-key overwrite's missing __syncwarp, fixed in f6ce7af (not
# GPU-run: no device time was left; the carry is staged from the review commit da89efc). First, on any card: SAN_TIMEOUT=90 STEPS=42 (attention tests, memcheck,
# racecheck - expect 0 hazards; ~2.5 min), with STEPS="42 40" on an H200. Still owed, on an H200 only, carry
# ["gpu-carry-z"]:
#   tar -xzf gpu-carry-z/carry.tgz && STEPS=40 bash bench/gpu/pending.sh (records + v4 staging, ~6.5 min),
#   then STEPS=41 (RoPE fusion, cluster merge, 8 loads per lane), then STEPS=6 (timelines).
# What is still owed to a GPU run (state of 2026-12-07 11:10), after bench/gpu/stage.sh, carry ["gpu-carry-z"]:
#   any card first: STEPS=1 (every GPU test: the review commit e72c911 moved the attention stamps' host
#   side to decode_attention_stamps.cpp and shared the merges' output store, compiled only); then on an H200
#   tar -xzf gpu-carry-z/carry.tgz && STEPS="17 28 29" bash bench/gpu/pending.sh (~7 min; 17 on an H200
#   only), then STEPS="6" (timelines, never taken on an H200). At 11:00 on 12-07 (H100) step 1 passed
#   on the review build dab80cc (backend 73/73, qgemm 20/20, engine 55/55, TP 5/5); steps 29 / 30 were measured.
# 13:25-15:30 on 12-07: no device machine came (every H200 and H100 start failed or was refused), so all of
# the above is still owed; the carry is restaged from 33df052 (same GPU code as e72c911). If the budget is
# short on an H200, this is the smallest useful first call: the attention tests of e72c911, then step 17:
#   tar -xzf gpu-carry-z/carry.tgz && source bench/gpu/common.sh && INFERX_REQUIRE_GPU=1 \
#     $C/test_cuda_backend --gtest_filter='CudaAttentionTest.*:DecodeSplitPlan.*'; STEPS=17 bash bench/gpu/pending.sh
# Step 28 was run again on an H100 at 08:50 on 12-07 (the decisions hold there).
# Step 18's switches were measured at 23:40 on 12-06 (H100) and are the defaults now. Step 19 (the sampler's
# warp bin pick and kept step totals) was measured on an H100 at 03:30 on 12-07 and is the only path now.
# On an H200: step 17 (1000 x 1000/1000 FP8 with the defaults since 452b385 - the zeroing-kernel graph
# rewrite, vector RoPE, q/k/v deferral from 64 rows: +1.4-1.6% on H100s - and the gap switches; then batch 1
# for the three formats; the last H200 figures are of 12-06 10:10: 17,369 = 98.1% of 17.7k, bf16 batch 1
# 78.0-78.8%, FP8 1.52x, INT4 1.97x), then step 15 (the lazy rescale: level on an H100 at 18:20, so delete
# it unless the H200 gains), then 6 / 6b (batch-1 timelines, never taken on an H200) and 7 (70B served).
# 18:20 on 12-06 (H100, steps 16 and 1's test binaries, build 9f5c975): every GPU test passes (backend 72/72,
# qgemm 20/20, engine 54/54 with the new defaults, tensor parallel 5/5); 1000/1000 fp8 15,053, lazy 14,980,
# fp8:tensor 15,018. Steps 9-13 (the SiLU trims, the memset hoist / zeroing kernel, vector RoPE, deferral) are
# measured and decided (docs/benchmarks.md, 12-06); their commands are in git history.
# 19:30 (H100): batch-1 timelines on this build - per layer 170.8 us bf16, 102.8 fp8:lm_head - and a 33 us gap
# between decode steps (argmax 10.4 us, then copy-engine hand-overs; docs/architecture.md, overlapped steps):
# the next batch-1 work that a GPU can check in one call (timeline.sh's "gap between replays"). Step 18 measures
# the first third of it (the ids' copy on a side stream, built 19:50, off until then).
# 1. Every GPU test binary on this build, then batch 1 at 1k context for the three formats (per-op: the
#    default). (Last run on 67aae9b, H100 12-06 13:45: all pass.)
# 2. The grid barrier probes on the card at hand (H100 12-06: 1.0 us alone, 2.9 us under 32 KB in flight
#    per SM, 29.7 us under 192 KB); on an H200 they were last probed on 12-03.
# 3. The persistent decode kernel (INFERX_DECODE_STACK=1 here): its tests, per-op against it twice each, the
#    ring-deep producer (if0), the no-barrier bound (skip2), a per-phase profile of a real context
#    (INFERX_WARMUP=0), FP8 in the stack. On an H200 pass MODES3 with INFERX_DECODE_STACK_INFLIGHT=2 (one
#    stage in flight, the H100 setting, is 8% slower there).
# 4. GEMV v5 (FP8 W8A8) against v4 at batch 1 on the card at hand (H200 12-05: 2.919 vs 2.988 ms, -2.4%; 70B
#    21.53 vs 20.80, slower) and the FP8 product chains.
# 5. 1000 x 1000/1000 FP8 + FP8 KV with the plain FP8 plan, the quantized lm_head and per-tensor weight scales
#    (H100 12-06 11:35: 14,510 / 14,706 (+1.35%) / 14,769 (+1.8%) with fp8:tensor:lm_head).
# 6. The batch-1 kernel timeline on this card (bench/gpu/timeline.sh): 8B bf16 and fp8:lm_head, 70B
#    fp8:lm_head (6b). Never taken on an H200: the H200 per-op step's ~31 us per layer beyond its bytes is
#    measured on H100s only (19-20 us of small kernels there).
# 7. 70B FP8 + FP8 KV served through the OpenAI endpoint with the default KV budget (~50 GB of cache: needs the
#    H200's 141 GB), 64 requests 1024/256 at concurrency 32.
# 8. The kernel timeline of FP8 + FP8 KV decode steps at 512 rows and 1.2-1.6k context (the 1000/1000 run's decode
#    steps, 72% of it): where the ~9.8 ms of a step that is not the decode attention goes (BIN8=NAME: another
#    staged binary; QUANT8: the plan).
# The 512-row FP8 decode step (step 8, H100 12-06): decode attention 68% (~95% of copy), FP8 GEMMs 22%, passes
# ~10%; per layer above their bytes: SiLU 17.0 us for 12.1 (register pass, trimmed 12-06 13:45), RoPE 11.2 for
# 7.3, the norms ~3 each, and the gate/up GEMM's cuBLASLt memset node (+1.5, 0.9 us, then the GEMM +4.2 us: its
# every heuristic candidate needs the 4-byte workspace; now a zeroing kernel). All-loads-at-once RoPE lost (29.3 us).
# Next kernel work the 12-06 runs point at: on the H200 the per-op batch-1 step spends ~31 us per layer (bf16)
# to ~38 (FP8) beyond its bytes; the stack cannot keep 4.2 TB/s with one stage in flight per SM, and more in
# flight slows its barriers.
# STEPS (default "1 2 3 4") picks the steps: STEPS=3 first (~2 min), then "1 2" (~3 min), then 4 (~5 min);
# "6 5 7" ~7-8 min on an H200.
set -uo pipefail
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
STEPS=" ${STEPS:-1 2 3 4} "
step() { [[ "$STEPS" == *" $1 "* ]]; }
# One GPU test binary in $C (optionally filtered; under ENV=VAL settings): its summary line and first
# failures, the whole log in $OUT/TAG.log. run_tests TAG BINARY [FILTER] [ENV=VAL ...]
run_tests() {
  local tag=$1 bin=$2 filter=${3:-*}
  shift $(($# < 3 ? $# : 3))
  env "$@" INFERX_REQUIRE_GPU=1 timeout 300 "$C/$bin" --gtest_color=no --gtest_filter="$filter" \
    >"$OUT/$tag.log" 2>&1
  echo "$tag: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$tag.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED|Failure|Which is|seed ' "$OUT/$tag.log" | head -20
}
# 70B fp8:lm_head at batch 1, 1k context, 96 tokens (an 80 GB H100 fits it with 1 GiB of KV), once per variant
# in decode_ab.sh's form: "name:ENV=VAL,ENV=VAL" (BIN=NAME runs $C/NAME instead of inferx).
b1_70b() {
  local v name bin e
  for v in "$@"; do
    name=${v%%:*}
    IFS=, read -r -a kv <<<"${v#*:}"
    bin=inferx
    local envs=()
    for e in "${kv[@]}"; do [[ "$e" == BIN=* ]] && bin=${e#BIN=} || envs+=("$e"); done
    env "${envs[@]}" timeout 200 "$C/$bin" bench offline -m dummy:llama-3-70b --dtype bf16 --quantize fp8:lm_head \
      --device cuda --max-batch-size 1 --num-prompts 1 --input-len 1000 --output-len 96 --max-model-len 2048 \
      --kv-cache-memory 1GiB --gpu-memory-utilization 0.99 --no-progress --roofline --json \
      >"$OUT/b1_70b_$name.json" 2>"$OUT/b1_70b_$name.err"
    echo "decode b1 1k 70b fp8:lm_head $name: rc=$? $(python3 -c "
import json; j=json.load(open('$OUT/b1_70b_$name.json')); t=j['tpot_ms']; r=j.get('roofline', {})
print(f\"TPOT p50 {t['p50']:.3f} ms\", f\"= {100*r['tpot_p50_roofline_ratio']:.1f}%\" if 'tpot_p50_roofline_ratio' in r else '')" 2>&1 | tail -1)"
  done
}
step 1 && for t in test_cuda_backend test_cuda_qgemm test_cuda_engine test_cuda_tensor_parallel; do
  INFERX_REQUIRE_GPU=1 timeout 280 "$C/$t" --gtest_color=no >"$OUT/$t.log" 2>&1
  echo "$t: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$OUT/$t.log" | head -20
done
step 2 && INFERX_BENCH_ONLY=grid_barrier timeout 120 "$C/bench_cuda_kernels" --quick 2>&1 | grep -E "^grid barrier|rror"
step 1 && SKIP_ENGINE_TESTS=1 VARIANTS="default:" QUANTS="bf16 fp8:lm_head int4:lm_head" bash "$(dirname "$0")/decode_ab.sh" |
  grep "^decode"
# Step 3: per-op against the stack (one stage in flight by default), each twice; the stack as deep as the ring
# (if0); the no-barrier bound (skip2); per-phase profiles.
S="INFERX_DECODE_STACK=1"
step 3 && QUANTS="${QUANTS3:-bf16}" MODES="${MODES3:-per-op:INFERX_DECODE_STACK=0 stack:$S
  per-op2:INFERX_DECODE_STACK=0 stack2:$S if0:$S,INFERX_DECODE_STACK_INFLIGHT=0 skip2:$S,INFERX_DECODE_STACK_SKIP=2
  prof:$S,INFERX_DECODE_STACK_PROFILE=1,INFERX_WARMUP=0}" \
  SKIP_ENGINE="${SKIP_ENGINE-}" bash "$(dirname "$0")/decode_stack.sh" 2>&1 | grep -E "^llama|tests|profile|FAILED"
step 3 && SKIP_TESTS=1 SKIP_ENGINE=1 QUANTS="fp8:lm_head" MODES="per-op:INFERX_DECODE_STACK=0 stack:$S
  skip2:$S,INFERX_DECODE_STACK_SKIP=2 prof:$S,INFERX_DECODE_STACK_PROFILE=1,INFERX_WARMUP=0" \
  bash "$(dirname "$0")/decode_stack.sh" 2>&1 | grep -E "^llama|profile"
if step 4; then
  INFERX_BENCH_ONLY=gemv INFERX_BENCH_GEMV_CASES=fp8 timeout 150 "$C/bench_cuda_kernels" --quick 2>&1 |
    grep -E " m1 " | grep -E " (v3|v4|v5)( |$)| v4 l8 | v5 |rror"
  SKIP_ENGINE_TESTS=1 QUANTS="fp8:lm_head" VARIANTS="v4: v5:INFERX_GEMV_KERNEL=fp8=v5
    v5s0:INFERX_GEMV_KERNEL=fp8=v5,INFERX_GEMV_V5_SMEM_KB=0 v4again:" bash "$(dirname "$0")/decode_ab.sh" | grep "^decode"
  b1_70b v4: v5:INFERX_GEMV_KERNEL=fp8=v5
fi
if step 5; then
  i=0
  for q in fp8 fp8:lm_head fp8:tensor:lm_head; do
    i=$((i + 1))
    QUANT_ARGS="--quantize $q --kv-cache-dtype fp8" WORKLOADS=1000x1000/1000 VARIANTS="q$i-${q//:/-}:" \
      bash "$(dirname "$0")/offline_ab.sh"
  done
fi
step 6 && QUANTS="${QUANTS6:-bf16 fp8:lm_head}" bash "$(dirname "$0")/timeline.sh"
step 6b && MODEL=dummy:llama-3-70b QUANTS=fp8:lm_head OUTPUT_LEN=48 \
  EXTRA="--kv-cache-memory 1GiB --gpu-memory-utilization 0.99" bash "$(dirname "$0")/timeline.sh"
step 7 && MODEL=dummy:llama-3-70b SERVE_ARGS="--quantize fp8 --kv-cache-dtype fp8" CASES=1024:256 N_REQ=64 \
  CONCURRENCY=32 BASELINES="" TOTAL_S="${TOTAL_S7:-200}" bash "$(dirname "$0")/serve_bench.sh" 2>&1 | grep -E "^=>|rror|kv|KV"
if step 8; then
  CUDA_INJECTION64_PATH="$PWD/$C/libinferx_kernel_timeline.so" INFERX_TIMELINE_OUT="$OUT/timeline_dec512_fp8.csv" \
    timeout 240 "$C/${BIN8:-inferx}" bench offline -m dummy:llama-3-8b --dtype bf16 --quantize "${QUANT8:-fp8}" \
    --kv-cache-dtype fp8 --device cuda --max-batch-size 512 --num-prompts 512 --input-len 1200 --output-len 400 \
    --max-model-len 4096 --no-progress --json >"$OUT/tl_dec512.json" 2>"$OUT/tl_dec512.err"
  echo "dec512 traced: rc=$? $(grep -h kernel_timeline "$OUT/tl_dec512.err" | tail -1)"
  python3 "$(dirname "$0")/timeline_summary.py" "$OUT/timeline_dec512_fp8.csv" --skip 4 2>&1
fi
# 14. The new defaults (452b385) on the card at hand: their tests, then 1000 x 1000/1000 with the FP8 plan and the
#    per-tensor one (~4.5 min on an H200).
if step 14; then
  INFERX_REQUIRE_GPU=1 timeout 120 "$C/test_cuda_qgemm" --gtest_filter='*Deferred*' 2>&1 |
    grep -E "^\[  (PASSED|FAILED|SKIPPED)|Failure|rror" | head -10
  # 17:00: the rewrite on a clone with the recorded graph as fallback (never run on a GPU yet), and the lazy
  # rescale's bit test. 17:25 review (9f5c975, also never run): one chain matcher for both rewrites, the
  # dedicated slots keyed on the capture flag (set on the quantized GEMM's LtMatmul too) - the timeline
  # (the "per layer" lines of STEPS=8 under the defaults) should still show workspace_zero_kernel_impl
  # before the gate/up GEMM.
  INFERX_REQUIRE_GPU=1 timeout 200 "$C/test_cuda_backend" --gtest_filter='*Replaced*:*Rewrite*:*Dedicated*:*LazyRescale*' \
    2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED)|Failure|rror" | head -10
  [[ -z "${SKIP_ENGINE_TESTS:-}" ]] && INFERX_REQUIRE_GPU=1 timeout 200 "$C/test_cuda_engine" --gtest_color=no 2>&1 |
    grep -E "^\[  (PASSED|FAILED)|Failure" | head
  [[ -z "${SKIP_OFFLINE:-}" ]] && for q in fp8 fp8:tensor; do
    QUANT_ARGS="--quantize $q --kv-cache-dtype fp8" WORKLOADS=1000x1000/1000 VARIANTS="${q//:/-}:" \
      bash "$(dirname "$0")/offline_ab.sh"
  done
fi
# 15. (12-06 17:00) The lazy rescale of the attention kernels' running output (INFERX_ATTN_LAZY_RESCALE=1, off
#    by default; bit-identical results): its test, the decode attention in the 1000/1000 run's shape and the
#    prefill rows with it off / on, then 1000 x 1000/1000 off / on (~5 min on an H100). Predicted: decode
#    attention level where it streams at copy bandwidth (H100), a few % where it is issue-bound; prefill
#    attention a few % faster (64 of ~350 instructions per thread and tile skipped once the maxima settle).
if step 15; then
  INFERX_REQUIRE_GPU=1 timeout 200 "$C/test_cuda_backend" --gtest_filter='*LazyRescale*' 2>&1 |
    grep -E "^\[  (PASSED|FAILED)|Failure" | head
  for lz in 0 1; do
    INFERX_ATTN_LAZY_RESCALE=$lz INFERX_BENCH_ONLY=decode_context timeout 120 "$C/bench_cuda_kernels" --quick 2>&1 |
      grep -vE "^device" | head -16 | sed "s/^/lazy $lz: /"
    INFERX_ATTN_LAZY_RESCALE=$lz INFERX_BENCH_ONLY=prefill timeout 120 "$C/bench_cuda_kernels" --quick 2>&1 |
      grep -iE "prefill" | head -8 | sed "s/^/lazy $lz: /"
  done
  WORKLOADS=1000x1000/1000 VARIANTS="def: lazy:INFERX_ATTN_LAZY_RESCALE=1" bash "$(dirname "$0")/offline_ab.sh"
fi
# 16. (12-06 18:15) Steps 14 and 15 in one call, for sessions where a device is hard to get: 14's tests, the
#    lazy rescale's test and kernel rows off / on, then 1000 x 1000/1000 with the FP8 plan (default, lazy) and
#    the per-tensor plan (~6 min on an H100, less on an H200).
if step 16; then
  STEPS=14 SKIP_OFFLINE=1 bash "$0"
  STEPS=15 bash "$0"
  QUANT_ARGS="--quantize fp8:tensor --kv-cache-dtype fp8" WORKLOADS=1000x1000/1000 VARIANTS="fp8-tensor:" \
    bash "$(dirname "$0")/offline_ab.sh"
fi
# 17. (12-06 18:30) The records on an H200 with the current defaults: 1000 x 1000/1000 with the FP8 plan and
#    with fp8:lm_head, then batch 1 (bf16, fp8:lm_head, int4:lm_head) at 1k context (~4 min). Nothing on another card.
if step 17; then
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    # Most wanted first (a call cut short by its time limit still returns what ran).
    WORKLOADS=1000x1000/1000 VARIANTS="fp8:" bash "$(dirname "$0")/offline_ab.sh"
    SKIP_ENGINE_TESTS=1 VARIANTS="default:" QUANTS="bf16 fp8:lm_head" bash "$(dirname "$0")/decode_ab.sh" |
      grep "^decode"
    QUANT_ARGS="--quantize fp8:lm_head --kv-cache-dtype fp8" WORKLOADS=1000x1000/1000 VARIANTS="fp8-lm_head:" \
      bash "$(dirname "$0")/offline_ab.sh"
    SKIP_ENGINE_TESTS=1 VARIANTS="default:" QUANTS="int4:lm_head" bash "$(dirname "$0")/decode_ab.sh" | grep "^decode"
  else  # the 512-row timeline it ran here was taken on this build's graphs at 19:30 on 12-06
    echo "step 17: not an H200, nothing to record"
  fi
fi
# 18. (measured H100 12-06 23:40, now the defaults) The gap between batch-1 decode steps: none / copy /
#    copy+upload / all = 33.4 / 19.5 / 17.5 / 13.7 us; GAP_VARIANTS picks timelines (tag:copy:upload:rows).
if step 18; then
  for v in ${GAP_VARIANTS:-none:0:0:0 all:1:1:16}; do
    IFS=: read -r tag sc us ac <<<"$v"
    TAG=$tag INFERX_SAMPLE_COPY_STREAM=$sc INFERX_UPLOAD_SIDE_STREAM=$us INFERX_SELECT_CLUSTER_ROWS=$ac \
      QUANTS=fp8:lm_head bash "$(dirname "$0")/timeline.sh" 2>&1 | grep -E "traced=0|gap between replays" |
      sed "s/^/$tag: /"
  done
fi
# 19. (measured H100 12-07 03:30: the warp pick gained everywhere, now the only path; docs/benchmarks.md)
#    Its tests, the sampling rows and every engine test (re-run after any sampler change).
if step 19; then
  INFERX_REQUIRE_GPU=1 timeout 120 "$C/test_cuda_backend" --gtest_filter='*Argmax*:*Sampling*' 2>&1 |
    grep -E "^\[  (PASSED|FAILED)|Failure|rror|seed" | head -20
  INFERX_BENCH_ONLY=sampling timeout 120 "$C/bench_cuda_kernels" --quick 2>&1 | grep -vE "^device"
  INFERX_REQUIRE_GPU=1 timeout 240 "$C/test_cuda_engine" --gtest_color=no 2>&1 |
    grep -E "^\[  (PASSED|FAILED)|Failure" | head
fi
# 20. (measured H100 12-07 03:30 / 03:50, removed) GEMV v3's INT4 weights staged in shared memory by cp.async:
#    faster rows (lm_head 77.4 -> 89.4% of copy) but slower in the model at batch 1 (2.414 -> 2.540 ms;
#    staged only where the rows gained: 2.645-2.675). The record: kernels_gemv.cu's INT4 notes. Commands in
#    git history (cdd93db, 792809e).
# 21-23. (measured H100 12-07 05:03-05:33; commands in git history, 1182187..86203be) 21: one shared-memory
#    carve-out for every kernel (INFERX_SMEM_CARVEOUT): 100 slower for every format (+3..+24%), the switch
#    removed. 22: the one-row RMSNorm's loads before its stores: FP8 -0.5%, INT4 -1.1%, bf16 level. 23: the
#    decode attention's merge ticket as one acq_rel atomic: -0.3..-0.5 us per layer. Both kept
#    (docs/benchmarks.md, "H100, 2026-12-07 05:00-05:50").
# 24. (12-07 05:50; measured H100 05:47: v5 0.9% slower, as on 12-06; owed on an H200) GEMV v5 (FP8 as W8A8 on tensor cores) against v4 at batch 1 on this card: 2.4%
#    faster on one H200 node (12-05 22:45), 1.5% slower on an H100 (12-06 00:42), opt-in since. If an H200
#    confirms the gain, v5 becomes the FP8 default where the card's DRAM bandwidth per SM is H200-like (the
#    v4 kernel's instruction and L1 work per weight byte is what grows with bandwidth; an estimate, not
#    profiled). Two runs of each, alternating.
if step 24; then
  SKIP_ENGINE_TESTS=1 VARIANTS="${VARIANTS24:-v4: v5:INFERX_GEMV_KERNEL=fp8=v5 v4b: v5b:INFERX_GEMV_KERNEL=fp8=v5}" \
    QUANTS="${QUANTS24:-fp8:lm_head}" bash "$(dirname "$0")/decode_ab.sh" | grep "^decode"
fi
# 25. (12-07 05:50; measured H100 05:47: the v4 kernels held to 4 CTAs per SM by barriers - step 26; again after it) Why 8B FP8 products stream at 72-88% of copy inside the batch-1 graph where
#    BF16 ones reach 96% (timelines, 05:34): ncu's stall reasons, issue and L1 / DRAM throughput of three
#    consecutive v4 launches (q/k/v, o, gate/up of a decode step; eager) for fp8:lm_head, then bf16. The v4
#    FP8 granule costs 2 x-loads from L1 and ~98 instructions per 32 weight bytes (R = 2) against BF16's 1 and
#    ~50 - an estimate from the source; the measurement says whether issue, L1 or latency binds.
if step 25; then
  for q in ${QUANTS25:-fp8:lm_head bf16}; do
    qa=()
    [[ "$q" != bf16 ]] && qa=(--quantize "$q")
    # 129 (fp8) / 97 (bf16) gemv_stream_kernel launches a decode step, +1 for the prefill's logits row.
    skip=$([[ "$q" == bf16 ]] && echo 195 || echo 259)
    LAUNCH_COUNT=3 PROFILE_TIMEOUT=300 bash "$(dirname "$0")/ncu_detail.sh" "gemv_${q//:/_}" gemv_stream_kernel "$skip" \
      bench offline -m dummy:llama-3-8b --dtype bf16 "${qa[@]}" --device cuda --max-batch-size 1 --num-prompts 1 \
      --input-len 1000 --output-len 8 --max-model-len 2048 --no-progress --warmup 0
  done
fi
# 26-27. (measured H100 12-07 07:18 / 07:52; commands in git history, b1c5b0c..cf6ea87; docs/benchmarks.md) 26:
#    GEMV v4 with as many CTAs per SM as fit once its barrier ids became immediates: fp8:lm_head -1.4%, now the
#    default; the 8-load kernels held to 5 CTAs lost. 27: INT4 through v4 at 5 / 6 CTAs and v3 with 4 / 2 warps
#    per CTA: all slower than v3. Both needed staged builds that were never commits.
# 28. (12-07 08:00; the H100 half measured 08:05-08:12: staging off -2.2% for FP8, so off by default except on
#    the H200, whose 96 KB was measured on 12-03 with an older build at 4 CTAs per SM) On an H200: "as many
#    CTAs as fit" against 4, and the prefetch budget (96, the H200's default, against off / 64), fp8:lm_head
#    and bf16 at batch 1, 70B fp8:lm_head off / 96. If off wins there too, v4_smem_kb_for_card goes.
if step 28; then
  SKIP_ENGINE_TESTS=1 VARIANTS="def: c4:INFERX_GEMV_V4_CTAS_PER_SM=4 s0:INFERX_GEMV_V4_SMEM_KB=0 s64:INFERX_GEMV_V4_SMEM_KB=64 def2: s0b:INFERX_GEMV_V4_SMEM_KB=0" \
    QUANTS="fp8:lm_head" bash "$(dirname "$0")/decode_ab.sh" | grep "^decode"
  SKIP_ENGINE_TESTS=1 VARIANTS="def: s0:INFERX_GEMV_V4_SMEM_KB=0" QUANTS="bf16" bash "$(dirname "$0")/decode_ab.sh" | grep "^decode"
  b1_70b s0:INFERX_GEMV_V4_SMEM_KB=0 s96:INFERX_GEMV_V4_SMEM_KB=96
fi
# 29. (measured H100 12-07 11:00) The decode attention's cluster merge: form 1 (the default) against the
#    global merge (0): FP8 3.313 / 3.317 vs 3.345 / 3.345 ms, bf16 5.747 / 5.750 vs 5.761 / 5.767, INT4 level;
#    form 2 (rank 0's area in its tiles) +0.3% FP8, removed. On an H200: on (default) against off, and stamps.
if step 29; then
  SKIP_ENGINE_TESTS=1 VARIANTS="on: off:INFERX_DECODE_CLUSTER=0 on2: off2:INFERX_DECODE_CLUSTER=0" \
    QUANTS="fp8:lm_head bf16" bash "$(dirname "$0")/decode_ab.sh" | grep "^decode"
  INFERX_DECODE_ATTN_STAMPS=1 timeout 120 "$C/inferx" bench offline -m dummy:llama-3-8b \
    --dtype bf16 --quantize fp8:lm_head --device cuda --max-batch-size 1 --num-prompts 1 --input-len 1000 \
    --output-len 128 --max-model-len 2048 --no-progress --json >"$OUT/stamps.json" 2>"$OUT/stamps.err"
  echo "stamps: $(grep -h "stamps" "$OUT/stamps.err")"
fi
# 30. (measured H100 12-07 11:00, removed) The RoPE kernel's L2 prefetch of a one-token step's cached K / V:
#    FP8 +15%, bf16 +7.8%, INT4 +22% (docs/architecture.md). Commands in git history (4be6a39).
# 31. (12-07 16:30) RoPE + the KV write inside the decode attention kernel (DecodeRope, INFERX_DECODE_ROPE,
#    default on): one kernel boundary fewer per layer in one-token steps whose q/k/v are F32 tensors.
#    Predicted (estimate): batch 1 -1.0..-1.8% on an H100 (the RoPE kernel adds 1.6-2.0 us per layer there),
#    -2..-3% on an H200 (~3.75 us per boundary). First form (H100 16:35: the last split wrote the key to the
#    cache, fenced and synced before copying its tile; queries rotated through shared memory): fp8:lm_head
#    -0.2%, bf16 -0.3%, int4:lm_head -0.9%, and its test hit a misaligned shared address. Second form (now):
#    angles tabled in shared memory before the wait, queries rotated in registers, the newest key written
#    over the landed tile's row (no copy waits on it); 2b (the default, a3c72bd): the new key staged in shared
#    memory. Measured H100 16:33: fp8:lm_head -0.4%, bf16 -0.55%, int4:lm_head -1.1%; tests pass. Owed on an
#    H200: this step (with QUANTS31 as wanted) after step 17.
if step 31; then
  run_tests attention_tests test_cuda_backend 'CudaAttentionTest.*:DecodeSplitPlan.*'
  run_tests engine_tests test_cuda_engine
  SKIP_ENGINE_TESTS=1 VARIANTS="on: off:INFERX_DECODE_ROPE=0 on2: off2:INFERX_DECODE_ROPE=0" \
    QUANTS="${QUANTS31:-fp8:lm_head bf16 int4:lm_head}" bash "$(dirname "$0")/decode_ab.sh" | grep "^decode"
fi
# 32. (12-07 16:40) DecodeRope's second form where its time goes and beyond batch 1: the batch-1 timelines on
#    and off (fp8:lm_head; the attention's duration against RoPE + attention), then offline 512 x 1000/200
#    on and off in bf16 (pure decode steps of up to 512 rows take it) and FP8 + FP8 KV (its decode steps from
#    64 rows read the deferred q/k/v product: the RoPE kernel stays; a check that nothing moved).
if step 32; then
  for v in on:1 off:0; do
    TAG=rope_${v%%:*} INFERX_DECODE_ROPE=${v#*:} QUANTS=fp8:lm_head bash "$(dirname "$0")/timeline.sh" 2>&1 |
      grep -vE "^NVIDIA|^name" | sed "s/^/${v%%:*}: /"
  done
  QUANT_ARGS=" " WORKLOADS=512x1000/200 VARIANTS="on: off:INFERX_DECODE_ROPE=0" \
    bash "$(dirname "$0")/offline_ab.sh"
  WORKLOADS=512x1000/200 VARIANTS="on: off:INFERX_DECODE_ROPE=0" bash "$(dirname "$0")/offline_ab.sh"
fi
# 33. (12-07 17:20) DecodeRope reading the deferred q/k/v product (FP8 decode steps from 64 rows: the
#    1000/1000 run's decode steps lose their RoPE kernel, ~9.6 us per layer of ~740 at 512 rows on an H100).
#    Predicted (estimate): 1000 x 1000/1000 FP8 +0.3..+0.9% (decode steps ~72% of the run; the attention's
#    CTAs each pay their table and the product's scales). Measured H100 17:05: attention tests 15/15,
#    test_cuda_engine 55/55 off and on, 1000/1000 15,121 / 15,098 on vs 15,071 off (+0.2..+0.3%): on by
#    default since (INFERX_DECODE_ROPE_PRODUCT=0 turns it off). Owed on an H200 with step 17.
if step 33; then
  run_tests attention_tests test_cuda_backend 'CudaAttentionTest.*:DecodeSplitPlan.*'
  run_tests engine_tests test_cuda_engine
  run_tests engine_tests_without_product test_cuda_engine '*' INFERX_DECODE_ROPE_PRODUCT=0
  WORKLOADS=1000x1000/1000 VARIANTS="on: off:INFERX_DECODE_ROPE_PRODUCT=0 on2:" \
    bash "$(dirname "$0")/offline_ab.sh"
fi
# 40. (12-07 18:45) The H200 call in one, most wanted first (a call cut short by its limit keeps what ran;
#    ~6.5 min estimated): the 1000/1000 FP8 record (issue 6's 17.7k: 17,369 on 12-06, ~17.67k estimated since),
#    the batch-1 records with v4's shared-memory staging at the H200 default (96 KB) and off (off won on H100s by
#    2.2% for FP8: if it wins here too, v4_smem_kb_for_card goes), 70B FP8 the same, then the fp8:lm_head plan's
#    1000/1000. Nothing on another card (step 1 is the test call there). Predicted (estimates from the H100
#    same-call gains since 12-06 10:10, not measurements): 1000/1000 FP8 17.5k-17.8k (17,369 x 1.014-1.019 x
#    1.002-1.003); bf16 batch 1 4.48-4.55 ms (78-79%: on H100s bf16 moved only -1.2% since); fp8:lm_head
#    2.83-2.95 ms (1.53-1.60x; -1.5..-5.5% from the CTA fit, the merge ticket, the cluster merge and RoPE
#    in the attention); staging off vs 96 KB within +-2.5% either way (H100: off -2.2%; H200 12-03 at 4 CTAs
#    per SM: 96 KB -2%); 70B FP8 20.0-20.7 ms (80-83%).
if step 40; then
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    WORKLOADS=1000x1000/1000 VARIANTS="fp8:" bash "$(dirname "$0")/offline_ab.sh"
    SKIP_ENGINE_TESTS=1 VARIANTS="def: s0:INFERX_GEMV_V4_SMEM_KB=0" QUANTS="bf16 fp8:lm_head int4:lm_head" \
      bash "$(dirname "$0")/decode_ab.sh" | grep "^decode"
    b1_70b def: s0:INFERX_GEMV_V4_SMEM_KB=0
    QUANT_ARGS="--quantize fp8:lm_head --kv-cache-dtype fp8" WORKLOADS=1000x1000/1000 VARIANTS="fp8-lm_head:" \
      bash "$(dirname "$0")/offline_ab.sh"
  else
    echo "step 40: not an H200, nothing to record"
  fi
fi
# 41. (12-07 18:45) The H200's second call: RoPE inside the decode attention on / off (step 31's A/B), the
#    cluster merge on / off, and FP8 with 8 loads per lane (more bytes in flight for the H200's larger
#    bandwidth-latency product; lost on H100s for 8B FP8's 4 KB rows), then the attention tests.
if step 41; then
  SKIP_ENGINE_TESTS=1 VARIANTS="on: off:INFERX_DECODE_ROPE=0 l8:INFERX_GEMV_V4_LOADS=8 cl0:INFERX_DECODE_CLUSTER=0 on2:" \
    QUANTS="fp8:lm_head bf16" bash "$(dirname "$0")/decode_ab.sh" | grep "^decode"
  run_tests attention_tests test_cuda_backend 'CudaAttentionTest.*:DecodeSplitPlan.*'
fi
# 42. (12-07 19:00, any card) compute-sanitizer memcheck and racecheck on the RoPE-in-attention tests (the
#    newest key staged in shared memory and written over the landed tile's row: never sanitized), on a quick
#    subset of their loops (INFERX_ATTN_TEST_QUICK=1: three decode cases, two split settings). Run on an
#    H100 at 18:55 (92 s): memcheck 0 errors; racecheck 264 write-after-write warnings in every cp.async
#    instance, all between the last tile's LDGSTS and the newest key's STS (a lane's cp.async wait covers its
#    own copies only): fixed with a __syncwarp before the overwrite; run again to see 0 hazards.
if step 42; then
  run_tests attention_tests test_cuda_backend 'CudaAttentionTest.*:DecodeSplitPlan.*'
  INFERX_ATTN_TEST_QUICK=1 BACKEND_FILTER='CudaAttentionTest.RopeInTheDecodeKernel*' QGEMM_FILTER="" \
    SAN_TIMEOUT=${SAN_TIMEOUT:-150} bash "$(dirname "$0")/sanitize.sh"
fi
rm -f "$OUT"/*.json "$OUT"/*.err
