#!/usr/bin/env bash
# Tensor parallelism on a multi-GPU machine, everything issue 7 asks for in one device call (after
# bench/gpu/stage.sh; carry ["gpu-carry-z"]):
#   tar -xzf gpu-carry-z/carry.tgz && bash bench/gpu/tp_scaling.sh
# 1. test_cuda_tensor_parallel: NCCL collectives, TP = 2/4/8 logits against TP = 1 (dummy:tiny f32/bf16),
#    the one-rank path with graphs and overlapped steps;
# 2. bench_collectives: all-reduce / all-gather time and bus bandwidth over all GPUs (nccl-tests' busbw);
# 3. batch-1 decode at 1k context for TP = 1, 2, 4, 8 (those that fit the visible GPUs) on the 8B shape in
#    bf16 and the 70B shape in bf16 (TP >= 2: 141 GB of weights) and FP8, each with its roofline (the
#    largest rank's bytes at one GPU's copy bandwidth);
# 4. throughput at concurrency 256 (1000 prompts, 1024 in / 256 out, offline) for the same sizes, 8B and
#    70B (FP8 + FP8 KV), and the 70B bf16 TP = 2 served run (SERVE=1);
# with the one-shot peer-to-peer all-reduce (INFERX_CUSTOM_ALLREDUCE=1) beside NCCL for the collectives and
# the 8B batch-1 runs, and the BF16 all-reduce of large sums (INFERX_TP_ALLREDUCE_BF16) for 8B c=256.
# Every figure goes to $OUT (one JSON per run) and one summary line per run to stdout.
# Knobs: TPS ("1 2 4 8"), B1=0 / THROUGHPUT=0 / TESTS=0 / COLLECTIVES=0 skip parts, PROMPTS (1000).
set -uo pipefail
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -12
GPUS=$(nvidia-smi --list-gpus | wc -l)
TPS="${TPS:-1 2 4 8}"
PROMPTS="${PROMPTS:-1000}"
export NCCL_NVLS_ENABLE=0  # also set by the communicator; here for the tests' own NCCL use

if [[ "${TESTS:-1}" == 1 ]]; then
  INFERX_REQUIRE_GPU=1 timeout 300 "$C/test_cuda_tensor_parallel" --gtest_color=no >"$OUT/tp_tests.log" 2>&1
  echo "test_cuda_tensor_parallel: rc=$? $(grep -E '^\[  (PASSED|FAILED)|max \|diff\||one rank' "$OUT/tp_tests.log" | tr '\n' ' ')"
fi
if [[ "${COLLECTIVES:-1}" == 1 ]]; then
  timeout 120 "$C/bench_collectives" "$GPUS" >"$OUT/collectives.txt" 2>&1
  echo "bench_collectives: rc=$?"
  cat "$OUT/collectives.txt"
  # The one-shot peer-to-peer all-reduce for the small sums (parallel/nccl/p2p_all_reduce.h).
  INFERX_CUSTOM_ALLREDUCE=1 timeout 120 "$C/bench_collectives" "$GPUS" >"$OUT/collectives_p2p.txt" 2>&1
  echo "bench_collectives, INFERX_CUSTOM_ALLREDUCE=1: rc=$?"
  cat "$OUT/collectives_p2p.txt"
fi

summary() {  # $1: json file; prints TPOT / throughput and the roofline ratio
  python3 -c "
import json, sys
j = json.load(open('$1'))
t = j.get('tpot_ms', {}); r = j.get('roofline', {})
out = [f\"output {j.get('output_throughput', 0):.0f} tok/s\"]
if t.get('p50'): out.append(f\"TPOT p50 {t['p50']:.3f} ms = {1000 / t['p50']:.1f} tok/s\")
if 'tpot_p50_roofline_ratio' in r:
    out.append(f\"= {100 * r['tpot_p50_roofline_ratio']:.1f}% of {r['batch1_roofline_tok_s']:.1f} tok/s ({r['weight_bytes_per_token'] / 1e9:.2f} GB per GPU x {r.get('devices', 1)} at {r['bandwidth_gbs']:.0f} GB/s)\")
print(', '.join(out))" 2>&1 | tail -1
}

run() {  # name, timeout, inferx bench offline arguments...
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$C/inferx" bench offline --device cuda --no-progress --json "$@" >"$OUT/$name.json" \
    2>"$OUT/$name.err"
  echo "$name: rc=$? $(summary "$OUT/$name.json")"
}

# The tensor-parallel machinery on one GPU (one rank through it: unfused o / down, NCCL calls of a group of
# one, the metadata broadcast) against the plain model: its cost before any scaling.
if [[ "${B1:-1}" == 1 ]]; then
  INFERX_TENSOR_PARALLEL_PATH=1 run b1_8b_bf16_tp1_path 240 -m dummy:llama-3-8b --dtype bf16 --max-batch-size 1 \
    --num-prompts 1 --input-len 1000 --output-len 256 --max-model-len 2048 --roofline
fi
for tp in $TPS; do
  ((tp > GPUS)) && continue
  if [[ "${B1:-1}" == 1 ]]; then
    run "b1_8b_bf16_tp$tp" 240 -m dummy:llama-3-8b --dtype bf16 --tensor-parallel-size "$tp" --max-batch-size 1 \
      --num-prompts 1 --input-len 1000 --output-len 256 --max-model-len 2048 --roofline
    ((tp >= 2)) && INFERX_CUSTOM_ALLREDUCE=1 run "b1_8b_bf16_tp${tp}_p2p" 240 -m dummy:llama-3-8b --dtype bf16 \
      --tensor-parallel-size "$tp" --max-batch-size 1 --num-prompts 1 --input-len 1000 --output-len 256 \
      --max-model-len 2048 --roofline
    ((tp >= 2)) && run "b1_70b_bf16_tp$tp" 420 -m dummy:llama-3-70b --dtype bf16 --tensor-parallel-size "$tp" \
      --max-batch-size 1 --num-prompts 1 --input-len 1000 --output-len 128 --max-model-len 2048 --roofline
    run "b1_70b_fp8_tp$tp" 420 -m dummy:llama-3-70b --dtype bf16 --quantize fp8 --tensor-parallel-size "$tp" \
      --max-batch-size 1 --num-prompts 1 --input-len 1000 --output-len 128 --max-model-len 2048 --roofline
  fi
  if [[ "${THROUGHPUT:-1}" == 1 ]]; then
    run "c256_8b_bf16_tp$tp" 420 -m dummy:llama-3-8b --dtype bf16 --tensor-parallel-size "$tp" --max-batch-size 256 \
      --num-prompts "$PROMPTS" --input-len 1024 --output-len 256 --max-model-len 4096 --max-num-batched-tokens 8192
    # The large sums (prefill chunks, batch-256 decode) reduced in BF16: half the bytes over NVLink.
    ((tp >= 2)) && INFERX_TP_ALLREDUCE_BF16=256 run "c256_8b_bf16_tp${tp}_ar_bf16" 420 -m dummy:llama-3-8b --dtype bf16 \
      --tensor-parallel-size "$tp" --max-batch-size 256 --num-prompts "$PROMPTS" --input-len 1024 --output-len 256 \
      --max-model-len 4096 --max-num-batched-tokens 8192
    ((tp >= 2)) && run "c256_70b_fp8_tp$tp" 540 -m dummy:llama-3-70b --dtype bf16 --quantize fp8 --kv-cache-dtype fp8 \
      --tensor-parallel-size "$tp" --max-batch-size 256 --num-prompts "$PROMPTS" --input-len 1024 --output-len 256 \
      --max-model-len 4096 --max-num-batched-tokens 8192
  fi
done

# SERVE=1: Llama-3-70B bf16 served over TP = 2 (the issue's "70B bf16 with TP = 2 serving"), driven by
# inferx bench serve at concurrency 256.
if [[ "${SERVE:-0}" == 1 ]] && ((GPUS >= 2)); then
  "$C/inferx" serve --model dummy:llama-3-70b --dtype bf16 --device cuda --tensor-parallel-size 2 --port 8300 \
    --max-model-len 4096 >"$OUT/serve_70b_tp2.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 240); do curl -sf localhost:8300/health >/dev/null && break; sleep 1; done
  timeout 420 "$C/inferx" bench serve --url http://127.0.0.1:8300 --concurrency 256 --num-prompts "$PROMPTS" \
    --input-len 1024 --output-len 256 --json >"$OUT/serve_70b_bf16_tp2.json" 2>"$OUT/serve_70b_bf16_tp2.err"
  echo "serve 70b bf16 tp2 c256: rc=$? $(summary "$OUT/serve_70b_bf16_tp2.json")"
  kill "$pid"
  wait "$pid" 2>/dev/null
fi
