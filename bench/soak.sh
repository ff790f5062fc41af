#!/usr/bin/env bash
# Soak: mixed verified traffic between two soft devices for a long time under injected
# faults, reporting operations, errors and resident memory over time (not run in CI).
#
#   bench/soak.sh [SECONDS] [FAULTS]    (default: 600 "loss=0.001,dup=0.001,reorder=0.001,corrupt=0.0005,seed=3")
#
# Prints the example's JSON lines, then a summary: resident memory at the first and last
# report (growth), errors and data mismatches. Exits non-zero on a mismatch.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-600}
faults=${2:-loss=0.001,dup=0.001,reorder=0.001,corrupt=0.0005,seed=3}
cargo build --quiet --release -p remem --example soak
out=$(mktemp)
trap 'rm -f "$out"' EXIT
REMEM_SOFT_FAULTS="$faults" target/release/examples/soak "$secs" 10 | tee "$out"
first=$(head -1 "$out" | sed -n 's/.*"rss_bytes":\([0-9]*\).*/\1/p')
last=$(tail -1 "$out" | sed -n 's/.*"rss_bytes":\([0-9]*\).*/\1/p')
errors=$(tail -1 "$out" | sed -n 's/.*"errors":\([0-9]*\).*/\1/p')
mism=$(tail -1 "$out" | sed -n 's/.*"mismatches":\([0-9]*\).*/\1/p')
ops=$(tail -1 "$out" | sed -n 's/.*"ops":\([0-9]*\).*/\1/p')
echo "soak: ${secs}s under '$faults': $ops operations, $errors errors, $mism mismatches; resident $((first / 1048576)) MiB at the first report, $((last / 1048576)) MiB at the last"
[ "$mism" = 0 ]
