# Sourced by the bench/gpu scripts that run on the GPU machine (after `tar -xzf gpu-carry-z/carry.tgz`):
# C, the staged binaries and libraries (bench/gpu/stage.sh); OUT, where results go (the device tool's
# $OUT, else gpu-out); the library path the staged binaries need; INFERX_TESTDATA_DIR. find_ncu sets NCU to Nsight Compute's
# command line, or says it is missing and returns 1; wait_http and first_token time a server's start,
# stop_server stops it.
C="${C:-gpu-carry}"
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$C/gpu-libs:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The GPU tests that read shared test data (stories260K.gguf, staged into $C by stage.sh) look here.
export INFERX_TESTDATA_DIR="${INFERX_TESTDATA_DIR:-$PWD/$C}"
# The CLI keeps a GEMM tuning cache in the user's cache folder by default; a benchmark that restored another
# run's tunings would no longer measure what it says (warm-up A/Bs, tuning order), so it is off here unless a
# script asks for it (cold_start.sh does, in folders of its own).
export INFERX_GEMM_CACHE="${INFERX_GEMM_CACHE:-off}"

find_ncu() {
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [[ -n "$NCU" ]] || { echo "ncu: not found"; return 1; }
}

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

first_token() { # seconds for a 1-token completion
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

# Stops the server of process $1: SIGTERM (it drains), SIGKILL after 30 s.
stop_server() {
  kill -TERM "$1" 2>/dev/null
  for _ in $(seq 1 30); do
    kill -0 "$1" 2>/dev/null || break
    sleep 1
  done
  kill -KILL "$1" 2>/dev/null
  wait "$1" 2>/dev/null
}
