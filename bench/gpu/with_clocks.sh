#!/usr/bin/env bash
# Runs a command while nvidia-smi samples the GPU's clocks, power and throttle reasons every 100 ms, then
# prints one summary line: does a long run (the 1000 x 1000/1000 offline bench) run at lower clocks than the
# short kernel benches? (Memory-bound kernels that are near their instruction limit, as the FP8 decode
# attention is, slow down with the SM clock.)
#   source bench/gpu/common.sh && bash bench/gpu/with_clocks.sh NAME command args...
# Writes $OUT/clocks_NAME.csv; the summary covers the samples where the GPU was busy (utilization >= 50%).
set -uo pipefail
source "$(dirname "$0")/common.sh"
name=$1
shift
csv="$OUT/clocks_$name.csv"
# Newer drivers name the throttle reasons "clocks_event_reasons"; older ones only "clocks_throttle_reasons".
reasons=clocks_event_reasons.active
nvidia-smi --query-gpu=$reasons --format=csv >/dev/null 2>&1 || reasons=clocks_throttle_reasons.active
nvidia-smi --query-gpu=timestamp,utilization.gpu,clocks.sm,clocks.mem,power.draw,temperature.gpu,$reasons \
  --format=csv,noheader,nounits -lms 100 >"$csv" 2>&1 &
smi=$!
"$@"
rc=$?
kill "$smi" 2>/dev/null
wait "$smi" 2>/dev/null
python3 - "$csv" "$name" <<'PY'
import sys, collections
rows = []
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split(',')]
    try:
        rows.append((float(f[1]), float(f[2]), float(f[3]), float(f[4]), float(f[5]), f[6]))
    except (ValueError, IndexError):
        pass
busy = [r for r in rows if r[0] >= 50]
if not busy:
    print(f"clocks {sys.argv[2]}: no busy samples ({len(rows)} samples)")
    sys.exit(0)
sm = sorted(r[1] for r in busy)
mean = lambda xs: sum(xs) / len(xs)
reasons = collections.Counter(r[5] for r in busy).most_common(3)
print(f"clocks {sys.argv[2]}: {len(busy)} busy samples of {len(rows)}; SM MHz mean {mean(sm):.0f} "
      f"p10 {sm[len(sm) // 10]:.0f} min {sm[0]:.0f}; mem MHz {mean([r[2] for r in busy]):.0f}; "
      f"power W mean {mean([r[3] for r in busy]):.0f} max {max(r[3] for r in busy):.0f}; "
      f"temp C max {max(r[4] for r in busy):.0f}; throttle reasons {reasons}")
PY
exit $rc
