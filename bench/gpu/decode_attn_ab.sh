#!/usr/bin/env bash
# The FP8-cache decode attention's tile loaders side by side, in one device call (after bench/gpu/stage.sh):
#   tar -xzf gpu-carry-z/carry.tgz && bash bench/gpu/decode_attn_ab.sh
# v3's loaders (INFERX_DECODE_ATTN_TMA=0: 16-byte cp.async per lane; =1: 2-D tensor copies, TmaLoader): the
# attention tests (float64 references over FP8 and BF16 caches) with each, compute-sanitizer memcheck /
# racecheck of the decode tests with the tensor copies, the kernel rows at the offline run's sizes against
# the copy and read-only ceilings, Nsight Compute's DRAM / L2 figures for one 512-row launch of each, then
# the 1000 x 1000/1000 offline A/B (OFFLINE="" skips it) and batch 1 (B1="" skips it).
set -uo pipefail
source "$(dirname "$0")/common.sh"
ALL="cpasync:0 tma:1"
for a in $ALL; do
  v=${a%%:*}
  INFERX_DECODE_ATTN_TMA=${a#*:} INFERX_REQUIRE_GPU=1 timeout 150 "$C/test_cuda_backend" --gtest_color=no \
    --gtest_filter='*ttention*:*ecode*' >"$OUT/attn_tests_$v.log" 2>&1
  echo "attention tests $v: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/attn_tests_$v.log" | tr '\n' ' ')"
done
# The tensor copies' barriers and proxy fences.
INFERX_DECODE_ATTN_TMA=1 QGEMM_FILTER="" SAN_TIMEOUT=80 \
  BACKEND_FILTER='CudaAttentionTest.DecodeKernel*:CudaAttentionTest.MixedStep*' bash "$(dirname "$0")/sanitize.sh"
for a in $ALL; do
  echo "== ${a%%:*}"
  INFERX_DECODE_ATTN_TMA=${a#*:} INFERX_BENCH_ONLY=decode_fp8 timeout 120 "$C/bench_cuda_kernels" | grep -E "ceiling|decode|read-only"
done
if find_ncu; then
  for a in $ALL; do
    v=${a%%:*}
    # Launch 27 of the FP8 rows: the 512 x 1536 shape's first timed launch (3 warm-up + 20 of 256 x 1024,
    # then its own 3 warm-up).
    INFERX_DECODE_ATTN_TMA=${a#*:} timeout 150 "$NCU" --clock-control none -k regex:decode_attention --launch-skip 26 \
      --launch-count 1 --metrics "gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum,dram__sectors_read.sum,smsp__inst_executed.sum,launch__registers_per_thread" \
      env INFERX_BENCH_ONLY=decode_fp8 "$C/bench_cuda_kernels" >"$OUT/ncu_attn_$v.txt" 2>&1
    echo "ncu $v: $(sed 's/  */ /g' "$OUT/ncu_attn_$v.txt" | grep -E 'sum|pct|thread' | tr '\n' ';')"
  done
fi
[[ -n "${OFFLINE-1}" ]] && WORKLOADS=1000x1000/1000 VARIANTS="cpasync:INFERX_DECODE_ATTN_TMA=0 tma:INFERX_DECODE_ATTN_TMA=1" \
  bash "$(dirname "$0")/offline_ab.sh"
[[ -n "${B1-1}" ]] && VARIANTS="cpasync:INFERX_DECODE_ATTN_TMA=0 tma:INFERX_DECODE_ATTN_TMA=1" \
  QUANTS="fp8:lm_head" bash "$(dirname "$0")/decode_ab.sh"
true
