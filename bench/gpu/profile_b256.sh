#!/usr/bin/env bash
# Per-kernel GPU time at serving batch sizes (8B shape, bf16 vs FP8 weights + FP8 KV), after stage.sh:
#   tar -xzf gpu-carry-z/carry.tgz && OUT=... bash bench/gpu/profile_b256.sh
# dec256: decode-only steps of 256 sequences at ~1k context (prefill done in 16k-token steps first);
# mix2048: the served pattern, 2048-token steps of prefill chunks plus the running decodes.
set -uo pipefail
D="$(dirname "$0")"
export INFERX_GEMM_TUNE=0  # no tuning launches in the skipped range
for q in ${QUANTS:-bf16 fp8}; do
  qa=()
  [[ "$q" != bf16 ]] && qa=(--quantize "$q" --kv-cache-dtype fp8)
  common=(bench offline -m dummy:llama-3-8b --dtype bf16 "${qa[@]}" --device cuda --max-batch-size 256
    --num-prompts 256 --input-len 1024 --output-len 48 --max-model-len 4096 --warmup 0 --no-progress)
  skip=${DEC_SKIP:-9000}
  [[ "$q" != bf16 ]] && skip=${DEC_SKIP_Q:-14000}  # more launches per prefill step (quantize, epilogue)
  [[ "${MIX_ONLY:-0}" == 1 ]] || bash "$D/kernel_profile.sh" "dec256_$q" "$skip" "${DEC_COUNT:-700}" "${common[@]}" \
    --max-num-batched-tokens 16384
  bash "$D/kernel_profile.sh" "mix2048_$q" "${MIX_SKIP:-20000}" "${MIX_COUNT:-700}" "${common[@]}" \
    --max-num-batched-tokens 2048
done
