#!/usr/bin/env bash
# The batch-1 decode step's real kernel timeline (GPU clock, PDL overlaps included), per kernel of a layer:
# duration, start relative to the previous kernel's end, and what it adds to the step. One device call after
# bench/gpu/stage.sh (carry ["gpu-carry-z"]):
#   tar -xzf gpu-carry-z/carry.tgz && bash bench/gpu/timeline.sh
# Each QUANTS entry runs `inferx bench offline` at 1k context twice, without and with the CUPTI injection
# library (bench/gpu/kernel_timeline.cpp), so the tracing's own cost shows as the TPOT difference; the traced
# run's CSV goes to $OUT/timeline_<quant>.csv and its summary (bench/gpu/timeline_summary.py) to stdout.
# TAG names the files of a variant (e.g. TAG=norm INFERX_GEMV_NORM=1 bash bench/gpu/timeline.sh).
# MODEL (default dummy:llama-3-8b) and EXTRA (more bench flags) select other shapes, e.g. 70B FP8:
#   MODEL=dummy:llama-3-70b QUANTS=fp8:lm_head EXTRA="--kv-cache-memory 1GiB --gpu-memory-utilization 0.99"
set -uo pipefail
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
LIB="$PWD/$C/libinferx_kernel_timeline.so"
[[ -f "$LIB" ]] || { echo "timeline: $LIB missing (stage.sh copies it when the build has CUPTI)"; exit 1; }
MODEL="${MODEL:-dummy:llama-3-8b}"
QUANTS="${QUANTS:-bf16 fp8:lm_head int4:lm_head}"
OUTPUT_LEN="${OUTPUT_LEN:-64}"
read -r -a extra <<<"${EXTRA:-}"
for q in $QUANTS; do
  qa=()
  [[ "$q" != bf16 ]] && qa=(--quantize "$q")
  tag=${q//:/_}
  for traced in 0 1; do
    envs=()
    [[ $traced == 1 ]] && envs=(CUDA_INJECTION64_PATH="$LIB" INFERX_TIMELINE_OUT="$OUT/timeline_${MODEL#dummy:}_$tag${TAG:+_$TAG}.csv")
    env "${envs[@]}" timeout 150 "$C/inferx" bench offline -m "$MODEL" --dtype bf16 "${qa[@]}" --device cuda \
      --max-batch-size 1 --num-prompts 1 --input-len 1000 --output-len "$OUTPUT_LEN" --max-model-len 2048 \
      --no-progress --roofline --json "${extra[@]}" >"$OUT/tl_${tag}${TAG:+_$TAG}_$traced.json" 2>"$OUT/tl_${tag}${TAG:+_$TAG}_$traced.err"
    rc=$?
    echo "$MODEL $q traced=$traced: rc=$rc $(python3 -c "
import json; j=json.load(open('$OUT/tl_${tag}${TAG:+_$TAG}_$traced.json')); t=j['tpot_ms']; r=j.get('roofline', {})
print(f\"TPOT p50 {t['p50']:.3f} ms\", f\"= {100*r['tpot_p50_roofline_ratio']:.1f}% of the roofline ({r['weight_bytes_per_token']/1e9:.3f} GB at {r['bandwidth_gbs']:.0f} GB/s)\" if 'tpot_p50_roofline_ratio' in r else '')" 2>&1 | tail -1)"
  done
  grep -h "kernel_timeline" "$OUT/tl_${tag}${TAG:+_$TAG}_1.err" | tail -2
  python3 "$(dirname "$0")/timeline_summary.py" "$OUT/timeline_${MODEL#dummy:}_$tag${TAG:+_$TAG}.csv" --skip 8 2>&1
done
