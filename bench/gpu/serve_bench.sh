#!/usr/bin/env bash
# Served throughput on one GPU (issue 5, item 4), every InferX figure from `inferx bench serve`, with the
# PyTorch baselines (bench/gpu/torch_baseline.py) run in the same device call.
# Here:   build + bench/gpu/stage.sh (as for run.sh).
# There:  device run, carry ["gpu-carry-z"], command: tar -xzf gpu-carry-z/carry.tgz && bench/gpu/serve_bench.sh
# Env:    N_REQ (default 1000 requests per InferX case), N_BASE (256: one wave of the baselines),
#         CASES ("1024:256 1000:1000"), BASELINES ("manual hf"), MODEL (dummy:llama-3-8b),
#         SERVE_ARGS (extra flags for inferx serve, e.g. "--quantize fp8").
set -uo pipefail
C=gpu-carry
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$C/gpu-libs:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
N_REQ="${N_REQ:-1000}"
N_BASE="${N_BASE:-256}"
CASES="${CASES:-1024:256 1000:1000}"
BASELINES="${BASELINES-manual hf}"
MODEL="${MODEL:-dummy:llama-3-8b}"
DEVICE="${DEVICE:-cuda}"
SERVE_ARGS="${SERVE_ARGS:-}"
PORT=18080
summary=()
note() { summary+=("$*"); echo "$*"; }

# Prints "seconds until GET $1 answers 200" (up to $2 seconds), or fails.
wait_http() {
  python3 - "$1" "$2" <<'EOF'
import sys, time, urllib.request
url, limit = sys.argv[1], float(sys.argv[2])
t0 = time.time()
while time.time() - t0 < limit:
    try:
        if urllib.request.urlopen(url, timeout=2).status == 200:
            print(f"{time.time() - t0:.2f}"); sys.exit(0)
    except Exception:
        time.sleep(0.1)
sys.exit(1)
EOF
}

first_token() {  # seconds for a 1-token completion
  python3 - "$1" <<'EOF'
import json, sys, time, urllib.request
t0 = time.time()
model = json.load(urllib.request.urlopen(sys.argv[1] + "/v1/models", timeout=10))["data"][0]["id"]
req = urllib.request.Request(sys.argv[1] + "/v1/completions", method="POST",
                             headers={"Content-Type": "application/json"},
                             data=json.dumps({"model": model, "prompt": [1, 2, 3, 4], "max_tokens": 1}).encode())
try:
    json.load(urllib.request.urlopen(req, timeout=120))
    print(f"{time.time() - t0:.3f}")
except Exception as e:
    print(f"failed: {e}")
EOF
}

echo "== served throughput: $MODEL $SERVE_ARGS"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
t0=$(date +%s.%N)
# shellcheck disable=SC2086
"$C/inferx" serve -m "$MODEL" --dtype bf16 --device "$DEVICE" --max-batch-size 256 --max-model-len 4096 \
  --port $PORT $SERVE_ARGS >"$OUT/serve.log" 2>&1 &
pid=$!
if ready=$(wait_http "http://127.0.0.1:$PORT/ready" 300); then
  ft=$(first_token "http://127.0.0.1:$PORT")
  t1=$(date +%s.%N)
  note "cold start: serve launch -> /ready ${ready}s; first 1-token completion ${ft}s; launch -> first token $(python3 -c "print(f'{$t1 - $t0:.2f}')")s"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader | sed 's/^/GPU memory in use while serving: /'
  for c in $CASES; do
    in=${c%%:*}
    outl=${c##*:}
    f="$OUT/serve_${in}_${outl}.json"
    timeout 400 "$C/inferx" bench serve --url "http://127.0.0.1:$PORT" --concurrency 256 --num-prompts "$N_REQ" \
      --input-len "$in" --output-len "$outl" --no-progress --json >"$f" 2>"$OUT/serve_${in}_${outl}.err"
    rc=$?
    note "inferx serve ${in}/${outl} x$N_REQ c=256 (rc=$rc): $(python3 -c "
import json,sys
try: j=json.load(open('$f'))
except Exception as e: print('no result', e); sys.exit()
print(f\"output {j['output_throughput']:.0f} tok/s, total {j['total_token_throughput']:.0f} tok/s, \"
      f\"TTFT p50/p99 {j['ttft_ms'].get('p50',0):.0f}/{j['ttft_ms'].get('p99',0):.0f} ms, \"
      f\"TPOT p50/p99 {j['tpot_ms'].get('p50',0):.1f}/{j['tpot_ms'].get('p99',0):.1f} ms, \"
      f\"completed {j['completed']} failed {j['failed']} in {j['duration_s']:.1f} s\")")"
  done
  curl_metrics=$(python3 -c "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())" 2>/dev/null)
  echo "$curl_metrics" | grep -E '^inferx_(preemptions|prefix_cache|num_requests)' | head -20
else
  note "serve did not become ready (see serve.log)"
  tail -20 "$OUT/serve.log"
fi
kill -TERM $pid 2>/dev/null
wait $pid 2>/dev/null

for impl in $BASELINES; do
  for c in $CASES; do
    in=${c%%:*}
    outl=${c##*:}
    r=$(PYTHONUNBUFFERED=1 timeout 300 python3 bench/gpu/torch_baseline.py --impl "$impl" --num-requests "$N_BASE" \
      --input-len "$in" --output-len "$outl" --concurrency 256 2>"$OUT/baseline_${impl}_${in}_${outl}.err" | tail -1)
    note "pytorch baseline $impl ${in}/${outl} x$N_BASE c=256: ${r:-failed (see baseline_${impl}_${in}_${outl}.err)}"
  done
done

echo "== summary"
printf '%s\n' "${summary[@]}"
