#!/usr/bin/env bash
# What was built without a GPU and has not run on one yet (sessions of 2026-12-05: the last layer on the
# logits rows only, now only when it leaves out a 64-row product tile; perplexity --decode-steps and the
# 128-wide student stories-hd128.gguf; the review mends of the attention test), in two device calls of at
# most ~8 minutes each (after bench/gpu/stage.sh; carry ["gpu-carry-z"]):
#   tar -xzf gpu-carry-z/carry.tgz && PART=tests bash bench/gpu/pending.sh
#   tar -xzf gpu-carry-z/carry.tgz && PART=ab bash bench/gpu/pending.sh
# tests: test_cuda_engine, test_cuda_backend, test_cuda_qgemm (its new TrainedStudentDecodeStepsAreAsAccurate
#        AsThePrefill: the decode kernel over BF16 and FP8 caches and the fp8 / int4 / fp8-int4 GEMVs on a
#        trained model), test_cuda_tensor_parallel; then bench/gpu/decode_accuracy.sh (perplexity and KL of
#        the student through the decode steps and the prefill, per KV cache type and with two terms).
#        If an engine test fails with the narrowed last layer, rerun it with INFERX_LAST_LAYER_ALL_ROWS=1.
# ab:    the narrowed last layer against every row: the 8192-token FP8 prefill (predicted ~2% shorter TTFT) and
#        1000 x 1000/1000 FP8 offline (predicted +0.7%), each inside with_clocks.sh (the run is power-capped).
set -uo pipefail
source "$(dirname "$0")/common.sh"
PART="${PART:-tests}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader

if [[ "$PART" == tests ]]; then
  for t in test_cuda_engine test_cuda_backend test_cuda_qgemm test_cuda_tensor_parallel; do
    INFERX_REQUIRE_GPU=1 timeout 300 "$C/$t" --gtest_color=no >"$OUT/$t.log" 2>&1
    echo "$t: rc=$? $(grep -E '^\[  (PASSED|FAILED)|stories-hd128|one rank' "$OUT/$t.log" | tr '\n' ' ')"
  done
  timeout 240 bash "$(dirname "$0")/decode_accuracy.sh"
fi

if [[ "$PART" == ab ]]; then
  for v in narrow: all:INFERX_LAST_LAYER_ALL_ROWS=1; do
    name=${v%%:*}
    IFS=, read -r -a kv <<<"${v#*:}"
    env "${kv[@]}" timeout 120 "$C/inferx" bench offline -m dummy:llama-3-8b --dtype bf16 --quantize fp8 \
      --kv-cache-dtype fp8 --device cuda --max-batch-size 1 --num-prompts 3 --warmup 1 --input-len 8192 \
      --output-len 1 --max-model-len 9000 --max-num-batched-tokens 8192 --no-progress --json \
      >"$OUT/prefill_8192_$name.json" 2>"$OUT/prefill_8192_$name.err"
    echo "prefill 8192 fp8 $name: rc=$? $(python3 -c "
import json; t=json.load(open('$OUT/prefill_8192_$name.json'))['ttft_ms']
print(f\"TTFT p50 {t['p50']:.1f} ms = {8192/t['p50']*1000:.0f} tok/s\")" 2>&1 | tail -1)"
  done
  for v in narrow: all:INFERX_LAST_LAYER_ALL_ROWS=1; do
    bash "$(dirname "$0")/with_clocks.sh" "1000x1000_${v%%:*}" env WORKLOADS=1000x1000/1000 VARIANTS="$v" \
      bash "$(dirname "$0")/offline_ab.sh"
  done
fi
