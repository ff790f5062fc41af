#!/usr/bin/env bash
# The verified workload between two processes in two network namespaces joined by a veth
# pair (created here, removed on exit), under each fault profile. The faults are injected
# by both soft NICs (REMEM_SOFT_FAULTS): this kernel has no sch_netem for `tc netem`.
# Prints one JSON line per profile; fails if any run fails verification or does not end.
# Needs root and iproute2.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --release -p remem --example verified_peer
bin=$(pwd)/target/release/examples/verified_peer
a=remem-fa-$$
b=remem-fb-$$
cleanup() {
  ip netns del "$a" 2>/dev/null || true
  ip netns del "$b" 2>/dev/null || true
}
trap cleanup EXIT
ip netns add "$a"
ip netns add "$b"
ip link add "va$$" type veth peer name "vb$$"
ip link set "va$$" netns "$a"
ip link set "vb$$" netns "$b"
ip -n "$a" addr add 10.88.0.1/24 dev "va$$"
ip -n "$b" addr add 10.88.0.2/24 dev "vb$$"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "va$$" up
ip -n "$b" link set "vb$$" up

for spec in none loss=0.001 loss=0.01 loss=0.05 dup=0.01 reorder=0.01 corrupt=0.01 delay_us=200; do
  faults=$spec
  [ "$spec" = none ] && faults=
  # The server prints the address it listens on once it does: read that line, no sleep.
  exec {srv}< <(REMEM_SOFT_FAULTS="$faults,seed=11" timeout 120 \
    ip netns exec "$b" "$bin" serve soft@10.88.0.2:4791 10.88.0.2:18600)
  server=$!
  read -r -u "$srv" line
  case $line in listening*) ;; *) echo "server did not start: $line"; exit 1 ;; esac
  result=$(REMEM_SOFT_FAULTS="$faults,seed=12" timeout 120 \
    ip netns exec "$a" "$bin" run soft@10.88.0.1:4791 10.88.0.2:18600 150)
  echo "{\"fault\":\"$spec\",${result#\{}"
  exec {srv}<&-
  wait "$server" || { echo "the server failed under $spec"; exit 1; }
done
