#!/usr/bin/env bash
# Cold start of `inferx serve` on the GPU (issue 5: launch -> first token), with and without the engine's
# startup warm-up, one line per configuration (after bench/gpu/stage.sh; carry ["gpu-carry-z"]):
#   tar -xzf gpu-carry-z/carry.tgz && bash bench/gpu/cold_start.sh
# CONFIGS: space-separated "name:serve flags" with commas for spaces (default: the 8B shape in bf16 and in FP8
# + FP8 KV at max batch 256, each with and without the warm-up). MODEL (dummy:llama-3-8b), DEVICE (cuda),
# MAX_MODEL_LEN (4096). Each server's log
# lands in $OUT/cold_NAME.log; its warm-up line (steps, graphs, seconds) is printed beside the figures.
set -uo pipefail
source "$(dirname "$0")/common.sh"
MODEL="${MODEL:-dummy:llama-3-8b}"
CONFIGS="${CONFIGS:-bf16:--max-batch-size,256 bf16_nowarm:--max-batch-size,256,--no-warmup \
fp8:--quantize,fp8,--kv-cache-dtype,fp8,--max-batch-size,256 \
fp8_nowarm:--quantize,fp8,--kv-cache-dtype,fp8,--max-batch-size,256,--no-warmup}"
PORT=18081
for c in $CONFIGS; do
  name=${c%%:*}
  IFS=, read -r -a args <<<"${c#*:}"
  log="$OUT/cold_$name.log"
  t0=$(date +%s.%N)
  "$C/inferx" serve -m "$MODEL" --dtype bf16 --device "${DEVICE:-cuda}" --max-model-len "${MAX_MODEL_LEN:-4096}" --port $PORT "${args[@]}" \
    >"$log" 2>&1 &
  pid=$!
  if ready=$(wait_http "http://127.0.0.1:$PORT/ready" 240); then
    ft=$(first_token "http://127.0.0.1:$PORT")
    t1=$(date +%s.%N)
    echo "cold start $name (${args[*]}): launch -> /ready ${ready} s, first 1-token completion ${ft} s," \
      "launch -> first token $(python3 -c "print(f'{$t1 - $t0:.2f}')") s; $(grep -o 'warm-up: .*' "$log" | head -1)"
  else
    echo "cold start $name: not ready in 240 s; $(tail -2 "$log")"
  fi
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 30); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
done
