#!/usr/bin/env bash
# Per-kernel GPU time at serving batch sizes (8B shape, bf16 vs FP8 weights + FP8 KV), after stage.sh:
#   tar -xzf gpu-carry-z/carry.tgz && OUT=... bash bench/gpu/profile_b256.sh
# dec256: decode-only steps of 256 sequences at ~1k context (prefill done in 16k-token steps first);
# mix2048: the served pattern, 2048-token steps of prefill chunks plus the running decodes.
# BATCH (default 256) sequences, MIX_TOKENS (default 2048) tokens per mixed step, INPUT_LEN (default 1024).
set -uo pipefail
D="$(dirname "$0")"
export INFERX_GEMM_TUNE=0  # no tuning launches in the skipped range
for q in ${QUANTS:-bf16 fp8}; do
  qa=()
  [[ "$q" != bf16 ]] && qa=(--quantize "$q" --kv-cache-dtype fp8)
  common=(bench offline -m dummy:llama-3-8b --dtype bf16 "${qa[@]}" --device cuda --max-batch-size "${BATCH:-256}"
    --num-prompts "${BATCH:-256}" --input-len "${INPUT_LEN:-1024}" --output-len 48 --max-model-len 4096 --warmup 0 --no-progress)
  skip=${DEC_SKIP:-9000}
  [[ "$q" != bf16 ]] && skip=${DEC_SKIP_Q:-14000}  # more launches per prefill step (quantize, epilogue)
  [[ "${MIX_ONLY:-0}" == 1 ]] || bash "$D/kernel_profile.sh" "dec${BATCH:-256}_$q" "$skip" "${DEC_COUNT:-700}" "${common[@]}" \
    --max-num-batched-tokens 16384
  bash "$D/kernel_profile.sh" "mix${MIX_TOKENS:-2048}_$q" "${MIX_SKIP:-20000}" "${MIX_COUNT:-700}" "${common[@]}" \
    --max-num-batched-tokens "${MIX_TOKENS:-2048}"
done
