#!/usr/bin/env bash
# Fuzzes one target for a given amount of CPU time, not wall time, so that a run
# shared with other work (a build, a second fuzzer) still gets its full hour:
#   scripts/fuzz-long.sh TARGET CPU_SECONDS [FUZZ_BUILD_DIR]
# The fuzzer runs at low priority from a copy of fuzz/corpus/TARGET plus whatever
# an earlier run of this script found (in fuzz-long/TARGET/, kept). When its user
# plus system time reaches CPU_SECONDS it is interrupted; libFuzzer prints its final
# statistics then. A summary line goes to fuzz-long/TARGET/summary.txt, any crasher
# to fuzz-long/TARGET/artifacts/ (add it to fuzz/corpus/TARGET by hand once fixed).
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: fuzz-long.sh TARGET CPU_SECONDS [FUZZ_BUILD_DIR]}
budget=${2:?usage: fuzz-long.sh TARGET CPU_SECONDS [FUZZ_BUILD_DIR]}
build=${3:-build-fuzz}
binary=$build/fuzz/${target}_fuzz
[ -x "$binary" ] || { echo "fuzz-long: $binary is not built (scripts/test.sh stage 3 builds it)" >&2; exit 2; }
[ -d "fuzz/corpus/$target" ] || { echo "fuzz-long: no seed corpus fuzz/corpus/$target" >&2; exit 2; }
out=fuzz-long/$target
mkdir -p "$out/corpus" "$out/artifacts"
cp -n fuzz/corpus/"$target"/* "$out/corpus/" 2>/dev/null || true
seeds=$(ls "$out/corpus" | wc -l)
log=$out/fuzz.log
started=$(date -u +%FT%TZ)
ticks=$(getconf CLK_TCK)
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} nice -n 19 "$binary" \
  -dict=fuzz/holdpoint.dict -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
  -artifact_prefix="$out/artifacts/" -max_total_time=$((budget * 20)) \
  "$out/corpus" > "$log" 2>&1 &
pid=$!
cpu=0
while kill -0 "$pid" 2>/dev/null; do
  sleep 5
  # Fields 14 and 15 of /proc/PID/stat: user and system time in clock ticks.
  read -r -a stat < "/proc/$pid/stat" 2>/dev/null || break
  cpu=$(( (stat[13] + stat[14]) / ticks ))
  if [ "$cpu" -ge "$budget" ]; then kill -INT "$pid"; break; fi
done
wait "$pid" || true
execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | awk '{print $2}')
last=$(grep -E '^#[0-9]+' "$log" | tail -1)
cov=$(grep -o 'cov: [0-9]*' <<<"$last" | awk '{print $2}')
ft=$(grep -o 'ft: [0-9]*' <<<"$last" | awk '{print $2}')
inputs=$(ls "$out/corpus" | wc -l)
crashes=$(ls "$out/artifacts" | wc -l)
line="$started $target cpu=${cpu}s execs=${execs:-?} cov=${cov:-?} ft=${ft:-?} corpus=${seeds}->${inputs} artifacts=${crashes}"
echo "$line" | tee -a "$out/summary.txt"
