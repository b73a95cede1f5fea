#!/usr/bin/env bash
# Nsight Compute's detailed sections (speed of light, warp stall reasons, scheduler, occupancy, memory) for
# launches of the kernels whose name matches a regex (one unless LAUNCH_COUNT says more), in an inferx run:
#   bench/gpu/ncu_detail.sh NAME KERNEL_REGEX SKIP inferx-args...
# (SKIP: launches of the matching kernel to skip first, past warm-up; LAUNCH_COUNT, default 1: how many
# consecutive launches to profile from there.) Eager launches (INFERX_GRAPHS=0).
# Writes $OUT/ncu_detail_NAME.txt and prints its stall-reason and throughput lines.
set -uo pipefail
source "$(dirname "$0")/common.sh"
name=$1 regex=$2 skip=$3
shift 3
find_ncu || exit 0
INFERX_GRAPHS=0 timeout "${PROFILE_TIMEOUT:-200}" "$NCU" --clock-control none -k "regex:$regex" \
  --launch-skip "$skip" --launch-count "${LAUNCH_COUNT:-1}" --section SpeedOfLight --section WarpStateStats \
  --section SchedulerStats \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
  --print-units base "$C/inferx" "$@" >"$OUT/ncu_detail_$name.txt" 2>"$OUT/ncu_detail_$name.err"
echo "== ncu detail: $name (rc=$?)"
grep -E 'Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Block Limit|Grid Size|Stall|issue_stalled' \
  "$OUT/ncu_detail_$name.txt" | sed 's/  */ /g' | grep -v ' 0$' | head -60
