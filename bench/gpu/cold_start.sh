#!/usr/bin/env bash
# Cold start of `inferx serve` on the GPU (issue 5: launch -> first token), with and without the engine's
# startup warm-up and the GEMM tuning cache, one line per start (after bench/gpu/stage.sh; carry
# ["gpu-carry-z"]):
#   tar -xzf gpu-carry-z/carry.tgz && bash bench/gpu/cold_start.sh
# CONFIGS: space-separated "name:serve flags" with commas for spaces ("" for none), each started once with the tuning cache
# off (default: the 8B shape in bf16 and in FP8 + FP8 KV at max batch 256, each with and without the
# warm-up). CACHED: configurations started twice with the tuning cache in a fresh folder (INFERX_GEMM_CACHE):
# the first start fills it, the second restores from it (default: bf16 and FP8 as above; "" for none).
# MODEL (dummy:llama-3-8b), DEVICE (cuda), MAX_MODEL_LEN (4096). Each server's log lands in
# $OUT/cold_NAME.log; its warm-up line (steps, graphs, seconds) is printed beside the figures.
set -uo pipefail
source "$(dirname "$0")/common.sh"
MODEL="${MODEL:-dummy:llama-3-8b}"
CONFIGS="${CONFIGS-bf16:--max-batch-size,256 bf16_nowarm:--max-batch-size,256,--no-warmup \
fp8:--quantize,fp8,--kv-cache-dtype,fp8,--max-batch-size,256 \
fp8_nowarm:--quantize,fp8,--kv-cache-dtype,fp8,--max-batch-size,256,--no-warmup}"
CACHED="${CACHED-bf16:--max-batch-size,256 fp8:--quantize,fp8,--kv-cache-dtype,fp8,--max-batch-size,256}"
PORT=18081

# start NAME CACHE_SETTING FLAGS...: one server start, launch -> /ready -> a 1-token completion, then stop.
start() {
  local name=$1 cache=$2
  shift 2
  local log="$OUT/cold_$name.log" t0 t1 ready ft pid
  t0=$(date +%s.%N)
  INFERX_GEMM_CACHE="$cache" "$C/inferx" serve -m "$MODEL" --dtype bf16 --device "${DEVICE:-cuda}" \
    --max-model-len "${MAX_MODEL_LEN:-4096}" --port $PORT "$@" >"$log" 2>&1 &
  pid=$!
  if ready=$(wait_http "http://127.0.0.1:$PORT/ready" 240); then
    ft=$(first_token "http://127.0.0.1:$PORT")
    t1=$(date +%s.%N)
    echo "cold start $name ($*; tuning cache $cache): launch -> /ready ${ready} s, first 1-token completion" \
      "${ft} s, launch -> first token $(python3 -c "print(f'{$t1 - $t0:.2f}')") s;" \
      "$(grep -o 'warm-up: .*' "$log" | head -1) $(grep -o 'GEMM tuning cache.*' "$log" | head -1)"
  else
    echo "cold start $name: not ready in 240 s; $(tail -2 "$log")"
  fi
  stop_server "$pid"
}

for c in $CONFIGS; do
  IFS=, read -r -a args <<<"${c#*:}"
  start "${c%%:*}" off "${args[@]}"
done
for c in $CACHED; do
  IFS=, read -r -a args <<<"${c#*:}"
  dir="$OUT/gemm_cache_${c%%:*}"
  rm -rf "$dir"
  start "${c%%:*}_cache_empty" "$dir" "${args[@]}"
  start "${c%%:*}_cache_filled" "$dir" "${args[@]}"
  echo "  tuning cache files: $(ls "$dir" 2>/dev/null | tr '\n' ' ')($(du -sb "$dir" 2>/dev/null | cut -f1) bytes)"
done
