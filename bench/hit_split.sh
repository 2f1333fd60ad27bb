#!/usr/bin/env bash
# bench/hit_split.sh: where a hit's and a deferral's time goes, on this
# machine (a GPU's, or the simulated stack with SIM=1). Runs path_bench's
# BM_Hit and BM_Defer bare and under LAZYPIN_MODE=defer with one part of the
# path taken away at a time (the kernel watch's read: LAZYPIN_WATCH=hooks; the
# implicit wait: LAZYPIN_UNREGISTER_WAIT=0; the program's writes between
# calls: PATH_BENCH_NO_STAMP=1), then BM_Part (each call the path makes,
# alone) and watch_bench's Drain. Prints one table: median us per call.
#   bench/hit_split.sh [BIN_DIR] [LIB]      (defaults: dist/bin, dist/lib/liblazypin.so)
set -uo pipefail
bin=${1:-dist/bin}
lib=$(readlink -f "${2:-dist/lib/liblazypin.so}")
export LD_LIBRARY_PATH=$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
filter='BM_(Hit|Defer)/(4096|4194304|268435456|1073741824)'
reps=${REPS:-3}  # at least 2: medians come from the repetitions
tmp=$(mktemp -d)
run() {  # name, env...
  local name=$1; shift
  env "$@" "$bin/path_bench" --benchmark_filter="$filter" --benchmark_repetitions="$reps" \
    --benchmark_report_aggregates_only=true --benchmark_format=csv 2>/dev/null |
    awk -F, -v n="$name" '/_median"/ {gsub(/"/,"",$1); split($1, a, "/"); print n","a[1]"/"a[2]","$3}' >>"$tmp/rows"
}
pre=(LD_PRELOAD="$lib" LAZYPIN_MODE=defer LAZYPIN_SUMMARY=0 LAZYPIN_LOG="$tmp/l-%p.jsonl")
for i in $(seq "${ROUNDS:-2}"); do
  run bare
  run defer "${pre[@]}"
  run defer-watch=hooks "${pre[@]}" LAZYPIN_WATCH=hooks
  run defer-wait=0 "${pre[@]}" LAZYPIN_UNREGISTER_WAIT=0
  run defer-nostamp "${pre[@]}" PATH_BENCH_NO_STAMP=1
  run bare-nostamp PATH_BENCH_NO_STAMP=1
done
"$bin/path_bench" --benchmark_filter=BM_Part --benchmark_format=csv 2>/dev/null |
  awk -F, 'NR>1 {gsub(/"/,"",$1); gsub(/"/,"",$NF); printf "part %-40s %8.1f ns\n", $8, $4}' >"$tmp/parts"
"$bin/watch_bench" --benchmark_filter='Drain|BM_Watch$|Classify' 2>/dev/null | grep BM_ >"$tmp/watch"
python3 - "$tmp/rows" <<'PY'
import collections, statistics, sys
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, bench, us = line.strip().split(",")
    v[(bench, name)].append(float(us))
variants = []
for (_, n) in v:
    if n not in variants: variants.append(n)
benches = sorted({b for b, _ in v}, key=lambda b: (b.split("/")[0], int(b.split("/")[1])))
print("%-22s" % "us (median of rounds)" + "".join("%16s" % n for n in variants))
for b in benches:
    print("%-22s" % b + "".join("%16s" % ("%.2f" % statistics.median(v[(b, n)]) if v[(b, n)] else "-") for n in variants))
PY
cat "$tmp/parts" "$tmp/watch"
rm -rf "$tmp"
