#!/usr/bin/env bash
# The consumer's cost of record's live reports: the recorder's CPU per
# event (meta.json's recorder_cpu_ns / events) recording the same workload
# with and without `--interval 1s`, alternated, in one run.
#   sudo bench/live_report_cost.sh [ROUNDS] [PAIRS] [CAPTURE]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
PAIRS=${2:-2000000}
CAPTURE=${3:-preload}
MEMLEAK=${MEMLEAK:-target/release/memleak}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -pthread -o "$work/alloc_pairs" bench/alloc_pairs.c
per_event() {
    python3 -c 'import json,sys; m=json.load(open(sys.argv[1]+"/meta.json"))
n=sum(m["counters"]["events"].values()); print("%.1f" % (m["recorder_cpu_ns"]/n))' "$1"
}
for round in $(seq "$ROUNDS"); do
    for mode in plain live; do
        extra=()
        [ "$mode" = live ] && extra=(--interval 1s)
        "$MEMLEAK" record -q --capture "$CAPTURE" "${extra[@]}" -o "$work/t" --force \
            -- "$work/alloc_pairs" "$PAIRS" >/dev/null
        echo "$mode $round $(per_event "$work/t")"
    done
done | python3 -c '
import statistics, sys
runs = {}
for line in sys.stdin:
    mode, _, ns = line.split()
    runs.setdefault(mode, []).append(float(ns))
for mode, v in runs.items():
    print(f"{mode}: recorder CPU per event {statistics.median(v):.1f} ns (min {min(v):.1f}, max {max(v):.1f}, {len(v)} runs)")
'
