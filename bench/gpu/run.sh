#!/usr/bin/env bash
# The one GPU run: correctness first, then every timing, in a single device call.
# Here:   build with `cmake --preset cuda -DINFERX_NATIVE=OFF`, then stage the binaries:
#         bench/gpu/stage.sh   (copies inferx, test_cuda_backend, non-CUDA shared libs and
#                               ../shared/tools into gpu-carry/, which .git/info/exclude ignores)
# There:  device run, carry ["gpu-carry-z"], command: tar -xzf gpu-carry-z/carry.tgz && bench/gpu/run.sh
# Writes logs under $OUT (default ./gpu-out) and prints a summary table last.
set -uo pipefail
source "$(dirname "$0")/common.sh"
summary=()
note() { summary+=("$*"); echo "$*"; }

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
date -u

echo "== 1. CUDA backend op tests (vs CPU backend and float64 references)"
INFERX_REQUIRE_GPU=1 "$C/test_cuda_backend" --gtest_color=no --gtest_output="xml:$OUT/cuda_tests.xml" >"$OUT/cuda_tests.log" 2>&1
rc=$?
tail -5 "$OUT/cuda_tests.log"
note "cuda op tests: rc=$rc $(grep -E '^\[  (PASSED|FAILED)' "$OUT/cuda_tests.log" | tr '\n' ' ')"

echo "== 1a. engine on the GPU (device sampling, decode graphs, KV sizing) and tensor-parallel tests (skip on 1 GPU)"
for t in test_cuda_engine test_cuda_tensor_parallel; do
  if [[ -x "$C/$t" ]]; then
    INFERX_REQUIRE_GPU=1 timeout 240 "$C/$t" --gtest_color=no >"$OUT/$t.log" 2>&1
    note "$t: rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$OUT/$t.log" | tr '\n' ' ')"
  else
    note "$t: missing"
  fi
done

echo "== 1b. compute-sanitizer memcheck + racecheck on attention kernel tests (FP8 RoPE write, decode, prefill)"
SAN=/usr/local/cuda/bin/compute-sanitizer
SAN_FILTER='CudaAttentionTest.RopeWrites*:CudaKernelsTest.DecodeAttentionLongContexts:CudaKernelsTest.PrefillAttentionLongChunks'
if [[ -x "$SAN" ]]; then
  for tool in memcheck racecheck; do
    INFERX_REQUIRE_GPU=1 timeout 150 "$SAN" --tool "$tool" --error-exitcode 1 "$C/test_cuda_backend" --gtest_color=no \
      --gtest_filter="$SAN_FILTER" >"$OUT/sanitizer_$tool.log" 2>&1
    rc=$?
    note "compute-sanitizer $tool: rc=$rc $(grep -E '(ERROR|RACECHECK) SUMMARY|^\[  (PASSED|FAILED)' "$OUT/sanitizer_$tool.log" | tr '\n' ' ')"
  done
else
  note "compute-sanitizer: not found at $SAN"
fi

echo "== 2. greedy generation, CPU vs CUDA backend"
gen() { "$C/inferx" generate --temperature 0 "$@" 2>>"$OUT/generate.err"; }
for spec in "tests/golden/fixtures/llama-tiny" "tests/golden/fixtures/llama3-tiny" "tests/golden/fixtures/mistral-tiny" \
            "tests/golden/fixtures/qwen2-tiny" "tests/golden/fixtures/qwen3-tiny" "tests/golden/fixtures/llama-tiny.gguf" \
            "tests/golden/fixtures/qwen2-tiny.gguf"; do
  cpu=$(gen -m "$spec" --prompt-ids 1,5,9,33,70 -n 20 --ignore-eos --device cpu)
  # fp32 mode (F32 KV cache) for the token-for-token comparison; the BF16 default is checked by the tests.
  gpu=$(INFERX_CUDA_KV_DTYPE=f32 gen -m "$spec" --prompt-ids 1,5,9,33,70 -n 20 --ignore-eos --device cuda)
  [[ "$cpu" == "$gpu" && -n "$cpu" ]] && r=same || r="DIFFERENT cpu=[$cpu] gpu=[$gpu]"
  note "greedy $(basename "$spec"): $r"
done
S="$C/stories260K.gguf"
cpu=$(gen -m "$S" -p "Once upon a time" -n 150 --device cpu)
gpu=$(INFERX_CUDA_KV_DTYPE=f32 gen -m "$S" -p "Once upon a time" -n 150 --device cuda)
[[ "$cpu" == "$gpu" && -n "$cpu" ]] && r=same || r="DIFFERENT"
note "greedy stories260K: $r"

echo "== 3. ceilings (shared/tools/gpu_ceilings.py)"
OUT="$OUT" timeout 300 python3 "$C/tools/gpu_ceilings.py" >"$OUT/ceilings.log" 2>&1
tail -25 "$OUT/ceilings.log"

echo "== 4. batch-1 decode, Llama-3-8B shape, dummy bf16 weights (v1: BF16 KV, CUDA graph replay; host sampling)"
"$C/inferx" generate -m dummy:llama-3-8b --dtype bf16 --device cuda --prompt-ids 1,2,3,4,5,6,7,8 -n 128 \
  --temperature 0 --ignore-eos >/dev/null 2>"$OUT/decode_8b.err"
note "decode 8B bf16 (graphs): $(tail -1 "$OUT/decode_8b.err")"
INFERX_GRAPHS=0 "$C/inferx" generate -m dummy:llama-3-8b --dtype bf16 --device cuda --prompt-ids 1,2,3,4,5,6,7,8 \
  -n 128 --temperature 0 --ignore-eos >/dev/null 2>"$OUT/decode_8b_eager.err"
note "decode 8B bf16 (eager): $(tail -1 "$OUT/decode_8b_eager.err")"
# The issue's setting: batch-1 decode at 1k context (1000-token prompt, then 128 tokens).
"$C/inferx" generate -m dummy:llama-3-8b --dtype bf16 --device cuda --prompt-ids "$(seq -s, 1 1000)" -n 128 \
  --temperature 0 --ignore-eos >/dev/null 2>"$OUT/decode_8b_1k.err"
note "decode 8B bf16 at 1k context (graphs): $(tail -1 "$OUT/decode_8b_1k.err")"

echo "== 4b. the same through the engine (inferx bench offline): batch-1 decode at 1k context, 8k prefill"
"$C/inferx" bench offline -m dummy:llama-3-8b --dtype bf16 --device cuda --max-batch-size 1 --num-prompts 1 \
  --input-len 1000 --output-len 256 --max-model-len 2048 --no-progress --json >"$OUT/bench_b1_1k.json" 2>"$OUT/bench_b1_1k.err"
note "bench offline batch-1 1000 in/256 out: rc=$? $(python3 -c "
import json; j=json.load(open('$OUT/bench_b1_1k.json')); t=j['tpot_ms']
print(f\"TPOT p50 {t['p50']:.3f} ms = {1000/t['p50']:.1f} tok/s; TTFT p50 {j['ttft_ms']['p50']:.0f} ms\")" 2>&1 | tail -1)"
"$C/inferx" bench offline -m dummy:llama-3-8b --dtype bf16 --device cuda --max-batch-size 1 --num-prompts 1 \
  --input-len 8192 --output-len 1 --max-model-len 9000 --max-num-batched-tokens 8192 --no-progress --json \
  >"$OUT/bench_prefill_8k.json" 2>"$OUT/bench_prefill_8k.err"
note "bench offline 8192-token prefill: rc=$? $(python3 -c "
import json; j=json.load(open('$OUT/bench_prefill_8k.json')); t=j['ttft_ms']
print(f\"TTFT p50 {t['p50']:.1f} ms = {8192/t['p50']*1000:.0f} tok/s\")" 2>&1 | tail -1)"

"$C/inferx" bench offline -m dummy:llama-3-8b --dtype bf16 --device cuda --max-batch-size 1 --num-prompts 1 \
  --input-len 8192 --output-len 1 --max-model-len 9000 --no-progress --json \
  >"$OUT/bench_prefill_8k_chunked.json" 2>"$OUT/bench_prefill_8k_chunked.err"
note "bench offline 8192-token prefill in 2048-token chunks (default budget): rc=$? $(python3 -c "
import json; j=json.load(open('$OUT/bench_prefill_8k_chunked.json')); t=j['ttft_ms']
print(f\"TTFT p50 {t['p50']:.1f} ms = {8192/t['p50']*1000:.0f} tok/s\")" 2>&1 | tail -1)"

echo "== 5. kernel micro-benchmarks vs ceilings measured in the same run (bench/gpu/bench_kernels.cpp)"
if [[ -x "$C/bench_cuda_kernels" ]]; then
  timeout 300 "$C/bench_cuda_kernels" >"$OUT/bench_kernels.log" 2>&1
  rc=$?
  cat "$OUT/bench_kernels.log"
  note "kernel bench: rc=$rc (table in bench_kernels.log)"
  while IFS= read -r line; do summary+=("  $line"); done < <(grep -E '^(ceiling|decode|prefill|add_rms|silu|argmax|sample)' "$OUT/bench_kernels.log")
else
  note "kernel bench: missing ($C/bench_cuda_kernels; rebuild and rerun stage.sh)"
fi

echo "== 6. quantized weights on the GPU (issue 6): quantized GEMM tests, FP8/INT4 8B decode + 4000-token prefill, 70B FP8"
if [[ -x "$C/test_cuda_qgemm" ]]; then
  INFERX_REQUIRE_GPU=1 timeout 240 "$C/test_cuda_qgemm" --gtest_color=no >"$OUT/qgemm_tests.log" 2>&1
  rc=$?
  tail -5 "$OUT/qgemm_tests.log"
  note "qgemm tests: rc=$rc $(grep -E '^\[  (PASSED|FAILED)' "$OUT/qgemm_tests.log" | tr '\n' ' ')"
else
  note "qgemm tests: missing ($C/test_cuda_qgemm; rebuild and rerun stage.sh)"
fi
for q in fp8 int4 fp8-int4; do
  timeout 180 "$C/inferx" generate -m dummy:llama-3-8b --dtype bf16 --quantize "$q" --device cuda \
    --prompt-ids 1,2,3,4,5,6,7,8 -n 64 --temperature 0 --ignore-eos >/dev/null 2>"$OUT/decode_8b_$q.err"
  note "decode 8B $q: rc=$? $(tail -1 "$OUT/decode_8b_$q.err")"
done
P4K=$(seq -s, 1 4000)
for q in none fp8 int4; do
  qa=()
  [[ "$q" != none ]] && qa=(--quantize "$q")
  timeout 180 "$C/inferx" generate -m dummy:llama-3-8b --dtype bf16 "${qa[@]}" --device cuda --prompt-ids "$P4K" \
    -n 2 --temperature 0 --ignore-eos >/dev/null 2>"$OUT/prefill4k_8b_$q.err"
  note "prefill 4000 tokens 8B $q: rc=$? $(tail -1 "$OUT/prefill4k_8b_$q.err")"
done
(while sleep 1; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; done) >"$OUT/mem_70b_fp8.log" 2>&1 &
mon=$!
tv=()
[[ -x /usr/bin/time ]] && tv=(/usr/bin/time -v)  # host max RSS when available
"${tv[@]}" timeout 300 "$C/inferx" generate -m dummy:llama-3-70b --dtype bf16 --quantize fp8 --device cuda \
  --prompt-ids 1,2,3,4,5,6,7,8 -n 64 --temperature 0 --ignore-eos >/dev/null 2>"$OUT/decode_70b_fp8.err"
rc=$?
kill "$mon" 2>/dev/null
note "70B fp8: rc=$rc $(grep -E 'load .* s \|' "$OUT/decode_70b_fp8.err" | tail -1) | peak GPU MiB $(sort -n "$OUT/mem_70b_fp8.log" | tail -1) | host max RSS kB $(grep -o 'Maximum resident set size.*' "$OUT/decode_70b_fp8.err" | grep -o '[0-9]*$')"

echo "== summary"
printf '%s\n' "${summary[@]}"
