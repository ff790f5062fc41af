#!/usr/bin/env bash
# Bandwidth of `remem perf --loopback` (soft devices) under injected network faults, as a
# ratio to the fault-free run measured in the same invocation. The faults are injected by
# both soft NICs into every packet they send (REMEM_SOFT_FAULTS; see remem-soft's `faults`
# module): this kernel has no sch_netem, so `tc netem` is not available here.
#
#   bench/faults.sh [TEST] [SIZE] [SECONDS]     (default: write_bw 65536 2)
#
# Prints a markdown table (for BENCHMARKS.md) and one JSON line per profile on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
test=${1:-write_bw}
size=${2:-65536}
secs=${3:-2}
# Uses $REMEM_BIN if set (a built `remem`), else builds `cargo build --release -p remem-cli`.
if [ -n "${REMEM_BIN:-}" ]; then
  bin=$REMEM_BIN
else
  cargo build --quiet --release -p remem-cli
  bin=${CARGO_TARGET_DIR:-target}/release/remem
fi

run() { # fault spec ("" for none); prints the average bandwidth in MB/s (10^6)
  REMEM_SOFT_FAULTS="$1" timeout 300 "$bin" perf --loopback "$test" -s "$size" -D "$secs" --json \
    | tail -1 | sed -n 's/.*"bw_avg_mib_s":\([0-9.e+-]*\).*/\1/p' \
    | awk '{ printf "%f\n", $1 * 1048576 / 1e6 }'   # MiB/s (2^20) to MB/s (10^6)
}

base=$(run "")
echo "| fault (each direction) | $test ${size} B, MB/s | ratio to no fault |"
echo "|---|---|---|"
printf '| none | %.0f | 1.00 |\n' "$base"
# dup=1e-9: the injector on and practically no fault (its own cost; losses leave the other
# packets in their GSO batches, faulted packets are copied and sent alone).
for spec in dup=0.000000001 loss=0.001 loss=0.01 loss=0.05 dup=0.01 reorder=0.01 corrupt=0.01 delay_us=100; do
  bw=$(run "$spec,seed=1")
  printf '| %s | %.0f | %.3f |\n' "$spec" "$bw" "$(echo "$bw / $base" | bc -l)"
  echo "{\"fault\":\"$spec\",\"test\":\"$test\",\"size\":$size,\"bw_avg_MBps\":$bw,\"base_MBps\":$base}" >&2
done
