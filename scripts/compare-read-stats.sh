#!/bin/bash
# Times `sluice read FILE --stats --threads 1` on core 0 for two builds of sluice, side by side,
# alternating which goes first, and fails if their outputs differ.
# Usage: scripts/compare-read-stats.sh BASELINE_BINARY CANDIDATE_BINARY FILE ROUNDS [read options]
set -euo pipefail
baseline=$1; candidate=$2; file=$3; rounds=$4; shift 4
out=$(mktemp -d)
for round in $(seq 1 "$rounds"); do
  if [ $((round % 2)) -eq 0 ]; then order="candidate baseline"; else order="baseline candidate"; fi
  for side in $order; do
    binary=$baseline; [ "$side" = candidate ] && binary=$candidate
    start=$(date +%s.%N)
    taskset -c 0 "$binary" read "$file" --stats --threads 1 "$@" > "$out/$side.json"
    end=$(date +%s.%N)
    echo "$round $side $(echo "$end - $start" | bc)"
  done
  cmp -s "$out/baseline.json" "$out/candidate.json" || { echo "outputs differ in round $round" >&2; exit 1; }
done
