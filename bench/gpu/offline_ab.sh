#!/usr/bin/env bash
# Offline throughput A/B (no HTTP) of environment switches, in one device call (after bench/gpu/stage.sh):
#   tar -xzf gpu-carry-z/carry.tgz && VARIANTS="fused: unfused:INFERX_CUDA_FP8_FUSE=0" bash bench/gpu/offline_ab.sh
# VARIANTS: space-separated "name:ENV=VAL,ENV=VAL" (BIN=NAME runs $C/NAME instead of $C/inferx); WORKLOADS: space-separated PROMPTSxINPUT/OUTPUT (default
# 512x1000/200 1000x1000/1000, the second the setting TensorRT-LLM publishes 17.7k output tok/s for in FP8);
# QUANT_ARGS: the model's quantization (default FP8 weights + FP8 KV cache). `inferx bench offline` on the
# Llama-3-8B shape with dummy weights, --max-batch-size MAX_BATCH (default 512); ENGINE_ARGS: more engine
# options (e.g. --max-num-batched-tokens 16384). One line per workload and variant; STEP_PROFILE=1
# adds the engine's host step profile (INFERX_STEP_PROFILE: scheduling / launch / wait per step kind).
set -uo pipefail
source "$(dirname "$0")/common.sh"
VARIANTS="${VARIANTS:-default:}"
WORKLOADS="${WORKLOADS:-512x1000/200 1000x1000/1000}"
read -r -a quant <<<"${QUANT_ARGS:---quantize fp8 --kv-cache-dtype fp8}"
read -r -a engine <<<"${ENGINE_ARGS:-}"
for w in $WORKLOADS; do
  prompts=${w%%x*}
  io=${w#*x}
  in=${io%/*}
  out=${io#*/}
  for v in $VARIANTS; do
    name=${v%%:*}
    IFS=, read -r -a kv <<<"${v#*:}"
    # BIN=NAME (not an environment setting): run $C/NAME instead of $C/inferx (an older build staged beside it).
    bin="$C/inferx"
    for i in "${!kv[@]}"; do
      [[ "${kv[$i]}" == BIN=* ]] && bin="$C/${kv[$i]#BIN=}" && unset 'kv[i]'
    done
    tag="${prompts}_${in}_${out}_$name"
    [[ "${STEP_PROFILE:-0}" == 1 ]] && kv+=(INFERX_STEP_PROFILE=1)
    env "${kv[@]}" timeout "${RUN_TIMEOUT:-200}" "$bin" bench offline -m dummy:llama-3-8b --dtype bf16 \
      "${quant[@]}" "${engine[@]}" --device cuda --max-batch-size "${MAX_BATCH:-512}" --num-prompts "$prompts" \
      --input-len "$in" \
      --output-len "$out" --max-model-len 4096 --no-progress --json >"$OUT/off_$tag.json" 2>"$OUT/off_$tag.err"
    rc=$?
    echo "offline $w ${quant[*]} ${engine[*]} max batch ${MAX_BATCH:-512} $name: rc=$rc $(python3 -c "
import json; j=json.load(open('$OUT/off_$tag.json')); t=j['tpot_ms']; f=j['ttft_ms']
print(f\"out {j['output_throughput']:.0f} tok/s, total {j['total_token_throughput']:.0f} tok/s, {j['duration_s']:.2f} s, TPOT p50 {t['p50']:.1f} ms, TTFT p50/p99 {f['p50']/1e3:.2f}/{f['p99']/1e3:.2f} s\")" 2>&1 | tail -1)"
    [[ $rc != 0 ]] && tail -3 "$OUT/off_$tag.err"
    [[ "${STEP_PROFILE:-0}" == 1 ]] && grep -A2 "step profile" "$OUT/off_$tag.err"
  done
done
