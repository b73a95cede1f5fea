#!/usr/bin/env bash
# Batch-1 decode A/B of the launch and routing switches, in one device call (after bench/gpu/stage.sh):
#   tar -xzf gpu-carry-z/carry.tgz && bash bench/gpu/decode_ab.sh
# Engine-level correctness first (graph replay == eager, PDL on vs off bit-equal), then
# `inferx bench offline` at 1k context for each variant; the same for FP8 / INT4 weights.
# VARIANTS: space-separated "name:ENV=VAL,ENV=VAL" (default below). Prints one line per variant.
set -uo pipefail
C=gpu-carry
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$C/gpu-libs:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
INFERX_REQUIRE_GPU=1 timeout 240 "$C/test_cuda_engine" --gtest_color=no >"$OUT/engine_tests.log" 2>&1
echo "test_cuda_engine: rc=$? $(grep -E '^\[  (PASSED|FAILED)|graph steps checked' "$OUT/engine_tests.log" | tr '\n' ' ')"
VARIANTS="${VARIANTS:-pdl: nopdl:INFERX_PDL=0 down-gemv:INFERX_GEMV_LONG_K=gemv}"
QUANTS="${QUANTS:-bf16 fp8 int4}"
for q in $QUANTS; do
  qa=()
  [[ "$q" != bf16 ]] && qa=(--quantize "$q")
  for v in $VARIANTS; do
    name=${v%%:*}
    envs=${v#*:}
    IFS=, read -r -a kv <<<"$envs"
    env "${kv[@]}" timeout 120 "$C/inferx" bench offline -m dummy:llama-3-8b --dtype bf16 "${qa[@]}" --device cuda \
      --max-batch-size 1 --num-prompts 1 --input-len 1000 --output-len 256 --max-model-len 2048 --no-progress \
      --json >"$OUT/ab_${q}_$name.json" 2>"$OUT/ab_${q}_$name.err"
    rc=$?
    echo "decode b1 1k $q $name: rc=$rc $(python3 -c "
import json; j=json.load(open('$OUT/ab_${q}_$name.json')); t=j['tpot_ms']
print(f\"TPOT p50 {t['p50']:.3f} ms = {1000/t['p50']:.1f} tok/s\")" 2>&1 | tail -1)"
  done
done
# PREFILL=1: the 8192-token prefill in one step (TTFT), GEMM autotuning on and off.
if [[ "${PREFILL:-0}" == 1 ]]; then
  for v in tuned: heuristic:INFERX_GEMM_TUNE=0; do
    name=${v%%:*}
    envs=${v#*:}
    IFS=, read -r -a kv <<<"$envs"
    env "${kv[@]}" timeout 120 "$C/inferx" bench offline -m dummy:llama-3-8b --dtype bf16 --device cuda \
      --max-batch-size 1 --num-prompts 1 --warmup 1 --input-len 8192 --output-len 1 --max-model-len 9000 \
      --max-num-batched-tokens 8192 --no-progress --json >"$OUT/prefill_$name.json" 2>"$OUT/prefill_$name.err"
    rc=$?
    echo "prefill 8192 $name: rc=$rc $(python3 -c "
import json; j=json.load(open('$OUT/prefill_$name.json')); t=j['ttft_ms']
print(f\"TTFT p50 {t['p50']:.1f} ms = {8192/t['p50']*1000:.0f} tok/s = {131.7e12/(t['p50']/1e3)/1e12:.0f} TFLOP/s\")" 2>&1 | tail -1)"
  done
fi
# PROFILE=1: per-kernel GPU time of batch-1 decode (8B bf16, graphs) when Nsight Systems is installed there.
if [[ "${PROFILE:-0}" == 1 ]]; then
  NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  if [[ -n "$NSYS" ]]; then
    timeout 150 "$NSYS" profile -o "$OUT/decode_b1" -f true -t cuda --cuda-graph-trace=node \
      "$C/inferx" generate -m dummy:llama-3-8b --dtype bf16 --device cuda --prompt-ids 1,2,3,4,5,6,7,8 -n 64 \
      --temperature 0 --ignore-eos >/dev/null 2>"$OUT/nsys.err"
    timeout 120 "$NSYS" stats -q -r cuda_gpu_kern_sum -f csv "$OUT/decode_b1.nsys-rep" >"$OUT/kern_sum.csv" 2>>"$OUT/nsys.err"
    echo "== per-kernel GPU time (nsys, 64 decode steps + prompt)"
    python3 - "$OUT/kern_sum.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 8]
head, body = rows[0], rows[1:]
ti, ni, ai, name = head.index("Total Time (ns)"), head.index("Instances"), head.index("Avg (ns)"), head.index("Name")
for r in body[:25]:
    print(f"{float(r[ti])/1e6:9.2f} ms {int(r[ni]):7d} x {float(r[ai])/1e3:8.2f} us  {r[name][:110]}")
PY
  else
    echo "nsys: not found"
  fi
fi
