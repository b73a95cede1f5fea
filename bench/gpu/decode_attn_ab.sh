#!/usr/bin/env bash
# The FP8-cache decode attention's tile loaders side by side, in one device call (after bench/gpu/stage.sh):
#   tar -xzf gpu-carry-z/carry.tgz && bash bench/gpu/decode_attn_ab.sh
# v3 (16-byte cp.async into swizzled tiles, three stages, four CTAs per SM: the default) and the experiments
# (INFERX_CUDA_DECODE_ATTN=): v3bulk (one bulk copy per key row, rows unswizzled), v3five (two stages at five
# CTAs per SM, 96 registers) and v3bulkfive (both): first the attention tests (float64 references over FP8
# and BF16 caches) of each and compute-sanitizer memcheck / racecheck of the decode tests with the bulk
# variants, then the kernel rows at the offline run's sizes against the copy and read-only ceilings, Nsight
# Compute's DRAM / L2 figures for one 512-row launch of each, and the 1000 x 1000/1000 offline A/B of the
# variants in OFFLINE (default "v3 v3five v3bulk"; empty: none). All of it takes ~9 minutes: run it with
# OFFLINE="" first, then the offline A/B of the variants that passed and were faster.
set -uo pipefail
source "$(dirname "$0")/common.sh"
ALL="v3 v3bulk v3five v3bulkfive"
for v in $ALL; do
  INFERX_CUDA_DECODE_ATTN=$v INFERX_REQUIRE_GPU=1 timeout 150 "$C/test_cuda_backend" --gtest_color=no \
    --gtest_filter='*ttention*:*ecode*' >"$OUT/attn_tests_$v.log" 2>&1
  echo "attention tests $v: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/attn_tests_$v.log" | tr '\n' ' ')"
done
# The bulk loader's barriers and proxy fences (v3bulkfive shares them).
INFERX_CUDA_DECODE_ATTN=v3bulk QGEMM_FILTER="" SAN_TIMEOUT=80 \
  BACKEND_FILTER='CudaAttentionTest.DecodeKernel*:CudaAttentionTest.MixedStep*' bash "$(dirname "$0")/sanitize.sh"
for v in $ALL; do
  echo "== $v"
  INFERX_CUDA_DECODE_ATTN=$v INFERX_BENCH_ONLY=decode_fp8 timeout 120 "$C/bench_cuda_kernels" | grep -E "ceiling|decode|read-only"
done
if find_ncu; then
  for v in $ALL; do
    # Launch 27 of the FP8 rows: the 512 x 1536 shape's first timed launch (3 warm-up + 20 of 256 x 1024,
    # then its own 3 warm-up).
    INFERX_CUDA_DECODE_ATTN=$v timeout 150 "$NCU" --clock-control none -k regex:decode_attention --launch-skip 26 \
      --launch-count 1 --metrics "gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum,dram__sectors_read.sum,smsp__inst_executed.sum,launch__registers_per_thread" \
      env INFERX_BENCH_ONLY=decode_fp8 "$C/bench_cuda_kernels" >"$OUT/ncu_attn_$v.txt" 2>&1
    echo "ncu $v: $(sed 's/  */ /g' "$OUT/ncu_attn_$v.txt" | grep -E 'sum|pct|thread' | tr '\n' ';')"
  done
fi
variants=""
for v in ${OFFLINE-v3 v3five v3bulk}; do variants+=" $v:INFERX_CUDA_DECODE_ATTN=$v"; done
[[ -n "$variants" ]] && WORKLOADS=1000x1000/1000 VARIANTS="$variants" bash "$(dirname "$0")/offline_ab.sh"
