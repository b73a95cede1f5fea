#!/usr/bin/env bash
# Served throughput on one GPU (issue 5, item 4), every InferX figure from `inferx bench serve`, with the
# PyTorch baselines (bench/gpu/torch_baseline.py) run in the same device call.
# Here:   build + bench/gpu/stage.sh (as for run.sh).
# There:  device run, carry ["gpu-carry-z"], timeout_s 600,
#         command: tar -xzf gpu-carry-z/carry.tgz && TOTAL_S=540 bench/gpu/serve_bench.sh
#
# The whole script stays under TOTAL_S seconds (set it ~50 s under the call's limit: unpacking, start-up
# and the device tool's own time come on top). Every part (an InferX case, a baseline for a case) runs under
# `timeout` with an equal share of what is left when it starts (time a part leaves unused goes to the later
# ones), capped by SERVE_CAP_S / BASE_CAP_S, and prints its figure the moment it ends (a line starting with
# "=>"; the baselines also print a line per wave), so a cut call still returns the parts that finished;
# "== summary" repeats them. Full outputs land in $OUT (serve_*.json/.err, baseline_*.jsonl/.err).
#
# Env:    TOTAL_S (540)        seconds for the whole script
#         SERVE (1)            0: no InferX part (baselines only)
#         CASES ("1024:256")   input:output lengths, e.g. "1024:256 1000:1000"
#         N_REQ (1000)         requests per InferX case; CONCURRENCY (256) for InferX and the baselines
#         SERVE_CAP_S (300)    most seconds for one InferX case (a cut case reports its progress bar)
#         BASELINES ("manual hf")  torch_baseline.py --impl values, run in this order after the server stops
#         N_BASE (1000)        requests per baseline part, in waves of CONCURRENCY; each part stops starting
#                              waves when the next would not fit its time (the figure is over the waves done)
#         BASE_CAP_S (0)       most seconds for one baseline part (0: no cap beyond its share)
#         BASE_LOAD_S (45)     seconds of a baseline part kept for imports, weights and warm-up
#         BASE_ARGS ("")       extra torch_baseline.py flags (e.g. "--compile" for hf)
#         CHECK (0)            1: first check that hf and manual give the same greedy tokens on the 8B shape
#                              (fp32, 8 prompts of 128 tokens, 16 new; ~30-60 s)
#         MODEL (dummy:llama-3-8b), DEVICE (cuda), SERVE_ARGS (extra inferx serve flags, e.g. "--quantize fp8")
set -uo pipefail
T0=$(date +%s)
source "$(dirname "$0")/common.sh"
TOTAL_S="${TOTAL_S:-540}"
SERVE="${SERVE:-1}"
N_REQ="${N_REQ:-1000}"
N_BASE="${N_BASE:-1000}"
CONCURRENCY="${CONCURRENCY:-256}"
CASES="${CASES:-1024:256}"
BASELINES="${BASELINES-manual hf}"
SERVE_CAP_S="${SERVE_CAP_S:-300}"
BASE_CAP_S="${BASE_CAP_S:-0}"
BASE_ARGS="${BASE_ARGS:-}"
CHECK="${CHECK:-0}"
MODEL="${MODEL:-dummy:llama-3-8b}"
DEVICE="${DEVICE:-cuda}"
SERVE_ARGS="${SERVE_ARGS:-}"
PORT=18080
RESERVE_S=10 # kept for the summary and the server's shutdown
BASE_LOAD_S="${BASE_LOAD_S:-45}" # a baseline's imports, weights and warm-up before its timed waves
summary=()
declare -A inferx_tps=()
note() {
  summary+=("$*")
  echo "=> $*"
}
elapsed() { echo $(($(date +%s) - T0)); }
left() { echo $((TOTAL_S - ($(date +%s) - T0) - RESERVE_S)); }
min() { if (($1 < $2)); then echo "$1"; else echo "$2"; fi; }

# One line from `inferx bench serve --json` output ($1), or from its progress bar ($2) when it was cut.
fmt_serve() {
  python3 - "$1" "$2" "$3" <<'EOF'
import json, re, sys
f, err, out_len = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    j = json.load(open(f))
    print(f"output {j['output_throughput']:.0f} tok/s, total {j['total_token_throughput']:.0f} tok/s, "
          f"TTFT p50/p99 {j['ttft_ms'].get('p50', 0):.0f}/{j['ttft_ms'].get('p99', 0):.0f} ms, "
          f"TPOT p50/p99 {j['tpot_ms'].get('p50', 0):.1f}/{j['tpot_ms'].get('p99', 0):.1f} ms, "
          f"completed {j['completed']} failed {j['failed']} in {j['duration_s']:.1f} s")
    print(f"TPS {j['output_throughput']:.1f}")
except Exception as e:
    try:
        bars = re.findall(r"\] (\d+)/(\d+) ([0-9.]+) s", open(err, errors="replace").read())
    except OSError:
        bars = []
    if bars:
        done, n, t = int(bars[-1][0]), int(bars[-1][1]), float(bars[-1][2])
        print(f"no result ({e}); progress: {done}/{n} requests completed in {t:.1f} s "
              f"= at least {done * out_len / max(t, 1e-9):.0f} output tok/s (finished requests only)")
    else:
        print(f"no result ({e})")
EOF
}

# One line from the last JSON line of torch_baseline.py ($1).
fmt_base() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
lines = [l for l in open(sys.argv[1], errors="replace") if l.startswith("{")]
ref = float(sys.argv[2]) if sys.argv[2] else 0.0
if not lines:
    print("no result"); sys.exit()
j = json.loads(lines[-1])
s = (f"output {j['output_tok_per_s']:.0f} tok/s over {j['requests']}/{j['requests_asked']} requests "
     f"in {j['seconds']:.1f} s; waves {j['wave_tok_per_s']} tok/s, prefill {j['wave_prefill_s']} s, "
     f"decode {j['wave_decode_step_ms']} ms/step")
if j.get("partial_wave"):
    s += f"; cut wave {j['partial_wave']}"
if j.get("stopped"):
    s += f"; stopped: {j['stopped']}"
if ref and j["output_tok_per_s"]:
    s += f"; InferX / this = {ref / j['output_tok_per_s']:.2f}x"
extra = {k: j[k] for k in ("transformers", "torch", "hf_path", "compile", "attn", "load_seconds", "peak_gib")
         if k in j}
print(s + f" {json.dumps(extra)}")
EOF
}

# Filter for torch_baseline.py's stdout: one short line per JSON line (the full lines go to the .jsonl file,
# and the device tool returns only the last 12k characters of the output).
read -r -d '' COMPACT <<'EOF'
import json, sys
for line in sys.stdin:
    try:
        j = json.loads(line)
    except ValueError:
        print("  " + line.rstrip()[:300], flush=True)
        continue
    w = j.get("wave_tok_per_s") or []
    s = f"  {j.get('impl')}: {j['requests']}/{j['requests_asked']} requests, {j['output_tok_per_s']:.0f} tok/s so far"
    if w:
        s += (f"; wave {len(w)}: {w[-1]:.0f} tok/s in {j['wave_seconds'][-1]} s (prefill {j['wave_prefill_s'][-1]} s,"
              f" decode {j['wave_decode_step_ms'][-1]} ms/step)")
    if j.get("stopped"):
        s += f"; stopped: {j['stopped']}"
    print(s, flush=True)
EOF

n_cases=$(wc -w <<<"$CASES")
parts_left=$(($(wc -w <<<"$BASELINES") * n_cases))
[[ "$SERVE" != 0 ]] && parts_left=$((parts_left + n_cases))
echo "== served throughput: $MODEL $SERVE_ARGS; cases $CASES; InferX $N_REQ requests, baselines ($BASELINES)" \
  "$N_BASE requests, concurrency $CONCURRENCY; budget $TOTAL_S s"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader

if [[ "$SERVE" != 0 ]]; then
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  "$C/inferx" serve -m "$MODEL" --dtype bf16 --device "$DEVICE" --max-batch-size "$CONCURRENCY" \
    --max-model-len 4096 --port $PORT $SERVE_ARGS >"$OUT/serve.log" 2>&1 &
  pid=$!
  if ready=$(wait_http "http://127.0.0.1:$PORT/ready" "$(min 300 "$(left)")"); then
    ft=$(first_token "http://127.0.0.1:$PORT")
    t1=$(date +%s.%N)
    note "cold start: serve launch -> /ready ${ready}s; first 1-token completion ${ft}s; launch -> first token" \
      "$(python3 -c "print(f'{$t1 - $t0:.2f}')")s"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader | sed 's/^/GPU memory in use while serving: /'
    for c in $CASES; do
      in=${c%%:*}
      outl=${c##*:}
      f="$OUT/serve_${in}_${outl}.json"
      err="$OUT/serve_${in}_${outl}.err"
      lim=$(min "$SERVE_CAP_S" $(($(left) / parts_left)))
      parts_left=$((parts_left - 1))
      if ((lim < 20)); then
        note "inferx serve ${in}/${outl}: skipped (${lim} s for it)"
        continue
      fi
      echo "-- inferx bench serve ${in}/${outl} x$N_REQ c=$CONCURRENCY (limit ${lim} s, at $(elapsed) s)"
      timeout -k 10 "$lim" "$C/inferx" bench serve --url "http://127.0.0.1:$PORT" --concurrency "$CONCURRENCY" \
        --num-prompts "$N_REQ" --input-len "$in" --output-len "$outl" --json >"$f" 2>"$err"
      rc=$?
      res=$(fmt_serve "$f" "$err" "$outl")
      tps=$(sed -n 's/^TPS //p' <<<"$res")
      [[ -n "$tps" ]] && inferx_tps[$c]=$tps
      note "inferx serve ${in}/${outl} x$N_REQ c=$CONCURRENCY (rc=$rc): $(grep -v '^TPS ' <<<"$res")"
    done
    python3 -c "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())" \
      2>/dev/null | grep -E '^inferx_(preemptions|num_preemptions|prefix_cache|num_requests|generation_tokens)' | head -20
  else
    note "serve did not become ready (see serve.log)"
    parts_left=$((parts_left - n_cases))
    tail -20 "$OUT/serve.log"
  fi
  stop_server "$pid"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader | sed 's/^/GPU memory in use after the server stopped: /'
fi

export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
if [[ "$CHECK" != 0 && -n "$BASELINES" ]]; then
  lim=$(min 150 "$(left)")
  echo "-- hf vs manual greedy tokens, llama-3-8b shape, fp32 (limit ${lim} s)"
  # shellcheck disable=SC2086
  r=$(timeout -k 10 "$lim" python3 bench/gpu/torch_baseline.py --check --shape llama-3-8b --input-len 128 \
    --output-len 16 --concurrency 8 $BASE_ARGS 2>"$OUT/check.err" | tail -1 | tee "$OUT/check.json")
  rc=$?
  r=$(python3 - "$r" 2>/dev/null <<'EOF'
import json, sys
j = json.loads(sys.argv[1])
print(f"token match {j['token_match']} (first mismatch steps {j['first_mismatch_step']}), "
      f"transformers {j.get('transformers')}, {j.get('hf_path')}, {j['seconds']} s")
EOF
  )
  note "check hf vs manual (rc=$rc): ${r:-failed: $(tail -3 "$OUT/check.err" | tr '\n' ' ')}"
fi

for impl in $BASELINES; do
  for c in $CASES; do
    in=${c%%:*}
    outl=${c##*:}
    lim=$(($(left) / parts_left))
    ((BASE_CAP_S > 0)) && lim=$(min "$BASE_CAP_S" "$lim")
    parts_left=$((parts_left - 1))
    tag="pytorch baseline $impl ${in}/${outl} x$N_BASE c=$CONCURRENCY"
    if ((lim < BASE_LOAD_S + 15)); then
      note "$tag: skipped (${lim} s for it)"
      continue
    fi
    budget=$((lim - BASE_LOAD_S))
    jsonl="$OUT/baseline_${impl}_${in}_${outl}.jsonl"
    err="$OUT/baseline_${impl}_${in}_${outl}.err"
    echo "-- $tag (limit ${lim} s, timed waves ${budget} s, at $(elapsed) s)"
    # shellcheck disable=SC2086
    timeout -k 15 "$lim" python3 bench/gpu/torch_baseline.py --impl "$impl" --num-requests "$N_BASE" \
      --input-len "$in" --output-len "$outl" --concurrency "$CONCURRENCY" --time-budget "$budget" $BASE_ARGS \
      2>"$err" | tee "$jsonl" | python3 -u -c "$COMPACT"
    rc=${PIPESTATUS[0]}
    res=$(fmt_base "$jsonl" "${inferx_tps[$c]:-}")
    if [[ "$res" == "no result" ]]; then
      res="no result; stderr: $(grep -v -i warn "$err" | tail -4 | tr '\n' ' ')"
    fi
    note "$tag (rc=$rc): $res"
  done
done

echo "== summary (after $(elapsed) s of $TOTAL_S)"
printf '%s\n' "${summary[@]}"
