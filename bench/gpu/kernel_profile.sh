#!/usr/bin/env bash
# Per-kernel GPU time of a slice of an inferx run, with Nsight Compute (the GPU image has ncu, not nsys):
#   bench/gpu/kernel_profile.sh NAME SKIP COUNT inferx-args...
# runs `inferx inferx-args` eagerly (INFERX_GRAPHS=0: each kernel its own launch), skips SKIP launches,
# times the next COUNT, and prints them summed per kernel (bench/gpu/ncu_summary.py). ncu serialises
# kernels, so overlap (PDL, graphs) is not seen: the figures are each kernel's own time.
set -uo pipefail
source "$(dirname "$0")/common.sh"
name=$1 skip=$2 count=$3
shift 3
find_ncu || exit 0
INFERX_GRAPHS=0 timeout "${PROFILE_TIMEOUT:-200}" "$NCU" --clock-control none --metrics gpu__time_duration.sum \
  --csv --print-units base --launch-skip "$skip" --launch-count "$count" "$C/inferx" "$@" \
  >"$OUT/ncu_$name.csv" 2>"$OUT/ncu_$name.err"
echo "== per-kernel GPU time: $name (ncu rc=$?, launches $skip..$((skip + count)))"
python3 "$(dirname "$0")/ncu_summary.py" "$OUT/ncu_$name.csv" "${PROFILE_TOP:-25}"
