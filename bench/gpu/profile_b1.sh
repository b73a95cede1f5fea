#!/usr/bin/env bash
# Per-kernel GPU time of batch-1 decode at 1k context (8B shape), per weight format, after stage.sh:
#   tar -xzf gpu-carry-z/carry.tgz && OUT=... bash bench/gpu/profile_b1.sh
# One 1000-token prefill (~300 launches) is skipped, then ~2 decode steps are timed (ncu, eager: each
# kernel's own time; overlap under graphs + PDL is not seen). QUANTS overrides the formats.
set -uo pipefail
D="$(dirname "$0")"
export INFERX_GEMM_TUNE=0
for q in ${QUANTS:-bf16 fp8:lm_head int4:lm_head}; do
  qa=()
  [[ "$q" != bf16 ]] && qa=(--quantize "$q")
  bash "$D/kernel_profile.sh" "b1_${q//:/_}" "${B1_SKIP:-1200}" "${B1_COUNT:-600}" bench offline \
    -m dummy:llama-3-8b --dtype bf16 "${qa[@]}" --device cuda --max-batch-size 1 --num-prompts 1 \
    --input-len 1000 --output-len 12 --max-model-len 2048 --warmup 0 --no-progress
done
