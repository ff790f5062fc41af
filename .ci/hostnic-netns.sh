#!/usr/bin/env bash
# Two hosts as network namespaces (issue 32): hosts A (10.77.0.1) and B (10.77.0.2), joined
# by a veth pair whose ends are both named hn0. On each host every process uses THE SAME
# soft device, the host's, on the namespace's address and UDP port 4791 (io/host: one
# SO_REUSEPORT group per address and port, steered by QPN slot; the registry is per network
# namespace, so each namespace has a device of its own).
#
# 1. Four processes per host, all talking across at once, four pairs:
#      ib_write_bw     (perftest on the drop-in)      server A, client B
#      ib_send_bw      (perftest on the drop-in)      server B, client A
#      verified_peer   (the async API, RDMA CM)       server A, client B, every op checked
#      remem perf write_bw -R --verify (raw provider) server B, client A, data checked
#    each judged by its exit status and its result line; each host's registry must list 4
#    members at once (the table the device's members share). The RDMA CM (connection
#    requests steered to the listening process by service ID) is exercised by the async API
#    and remem perf -R; perftest's -R is not used here: its client connects right after its
#    handshake with the server, racing the server's second rdma_listen, and its retry after
#    the REJ (invalid service ID) uses the nodes it has just freed (perftest 4.5-0.17,
#    rdma_cm_client_connection), so it crashes whenever it loses that race.
# 2. Open MPI over UCX, 4 ranks per host across both (mpirun in A; the ranks in B are
#    started by its rsh launcher through an agent that enters B), UCX on rc_verbs and
#    ud_verbs only (no tcp, no shared memory): mpi_check checks every byte; each rank's soft
#    device (REMEM_IBV_STATS) received packets, 4 ranks ran in each namespace, and the
#    device's host_members counter reached 4 on each host.
#
# Needs root (namespaces), iproute2, perftest, openmpi-bin + libopenmpi-dev, ucx.
# Usage: bash .ci/hostnic-netns.sh [--release]   (builds what it runs: remem-ibv, remem-cli,
# remem's verified_peer example, in the debug profile unless --release)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

profile=debug
cargo_flags=()
if [ "${1:-}" = --release ]; then profile=release; cargo_flags=(--release); fi
for tool in ip ss ib_write_bw ib_send_bw mpirun mpicc ucx_info; do
  command -v $tool >/dev/null 2>&1 || {
    echo "hostnic-netns: $tool is missing (apt-get install iproute2 perftest openmpi-bin libopenmpi-dev ucx-utils)"
    exit 1
  }
done
[ "$(id -u)" = 0 ] || { echo "hostnic-netns: needs root (network namespaces)"; exit 1; }

timeout 900 cargo build --quiet "${cargo_flags[@]}" -p remem-ibv -p remem-cli
timeout 900 cargo build --quiet "${cargo_flags[@]}" -p remem --example verified_peer
target=${CARGO_TARGET_DIR:-target}
target=$(cd "$target/$profile" && pwd)
remem=$target/remem
peer=$target/examples/verified_peer
export REMEM_IBV_LIB=$target/libremem_ibv.so

work=$(mktemp -d /tmp/remem-hostnic-netns.XXXXXX)
# The host devices' registries live here (not /dev/shm), removed with it.
export REMEM_HOST_DIR=$work/host
mkdir -m 700 "$REMEM_HOST_DIR"
a=remem-hna-$$
b=remem-hnb-$$
pids=()
cleanup() {
  set +e
  # Our background programs: `timeout` passes the signal on to its program; a few seconds
  # for them to end, then whatever still runs in our namespaces (an MPI daemon, a rank) is
  # ours and is killed.
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  for _ in $(seq 50); do
    running=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && running=1; done
    [ $running = 0 ] && break
    sleep 0.1
  done
  for ns in "$a" "$b"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
  done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  ip netns del "$a" 2>/dev/null
  ip netns del "$b" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
# A signal ends the script through its EXIT trap.
trap 'exit 130' INT TERM HUP

ip netns add "$a"
ip netns add "$b"
ip link add "hna$$" type veth peer name "hnb$$"
ip link set "hna$$" netns "$a"
ip link set "hnb$$" netns "$b"
# Both ends named hn0: one REMEM_IBV_DEVICES (rxe0=hn0) names each host's device.
ip -n "$a" link set "hna$$" name hn0
ip -n "$b" link set "hnb$$" name hn0
ip -n "$a" addr add 10.77.0.1/24 dev hn0
ip -n "$b" addr add 10.77.0.2/24 dev hn0
for ns in "$a" "$b"; do
  ip -n "$ns" link set lo up
  ip -n "$ns" link set hn0 up
done
ipa=10.77.0.1
ipb=10.77.0.2
export REMEM_IBV_DEVICES=rxe0=hn0

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok    $1"; }
fail() {
  failed=$((failed + 1)); echo "FAIL  $1"
  shift
  for f in "$@"; do show_log "$f"; done
  return 0
}
# The registry's table of the host device at ADDR in namespace NS: its members (lines `m`).
members() {
  local ino
  ino=$(stat -L -c %i "/run/netns/$1")
  grep -c '^m ' "$REMEM_HOST_DIR/remem-0/net$ino/$2-4791/table" 2>/dev/null || true
}
# wait_for PID CHECK... (.ci/lib.sh), at most 60 s here.
WAIT_FOR_SECONDS=60
. .ci/lib.sh
listens() { ip netns exec "$1" ss -ltn | grep -q ":$2 "; }
has() { grep -q "$2" "$1" 2>/dev/null; }
# in NS LOG CMD...: CMD in namespace NS, bounded, output to LOG, in the background; $! is it.
in_ns() {
  local ns=$1 log=$2; shift 2
  ip netns exec "$ns" timeout 120 "$@" > "$log" 2>&1 &
  pids+=($!)
}
perftest_line='^ *65536 +[0-9]+ +[0-9.]+ +[0-9.]+'

echo "== four processes per host on one device (port 4791), four pairs across at once"
l=$work/logs
mkdir "$l"
secs=5
# The servers, and what says each is ready: perftest and remem perf listen on their TCP
# ports; verified_peer prints "listening". perftest's GID 1 is the device's IPv4 RoCE v2 GID.
in_ns "$a" "$l"/wbw.server "$remem" run -- ib_write_bw -d rxe0 -x 1 -F -p 19001 -D $secs
wbw_s=$!
in_ns "$b" "$l"/sbw.server "$remem" run -- ib_send_bw -d rxe0 -x 1 -F -p 19002 -D $secs
sbw_s=$!
in_ns "$a" "$l"/api.server "$peer" serve-cm soft@$ipa $ipa:19003
api_s=$!
in_ns "$b" "$l"/perf.server "$remem" perf write_bw -R --verify -d soft@$ipb -p 19004 -D $secs --json
perf_s=$!
ready=1
wait_for $wbw_s listens "$a" 19001 || ready=0
wait_for $sbw_s listens "$b" 19002 || ready=0
wait_for $api_s has "$l"/api.server listening || ready=0
wait_for $perf_s listens "$b" 19004 || ready=0
if [ $ready = 0 ]; then
  fail "the servers did not start" "$l"/wbw.server "$l"/sbw.server "$l"/api.server "$l"/perf.server
  exit 1
fi
echo "      servers ready: host A's device has $(members "$a" $ipa) members, host B's $(members "$b" $ipb)"
# The clients that run for $secs seconds, then (once A's device has its 4 members and B's
# the 3 so far) the async API's client, while they still run.
in_ns "$b" "$l"/wbw.client "$remem" run -- ib_write_bw -d rxe0 -x 1 -F -p 19001 -D $secs $ipa
wbw_c=$!
in_ns "$a" "$l"/sbw.client "$remem" run -- ib_send_bw -d rxe0 -x 1 -F -p 19002 -D $secs $ipb
sbw_c=$!
in_ns "$a" "$l"/perf.client "$remem" perf write_bw -R --verify -d soft@$ipa -p 19004 -D $secs --json $ipb
perf_c=$!
four_and_three() { [ "$(members "$a" $ipa)" = 4 ] && [ "$(members "$b" $ipb)" = 3 ]; }
wait_for $sbw_c four_and_three || true
max_a=$(members "$a" $ipa)
in_ns "$b" "$l"/api.client "$peer" run-cm soft@$ipb $ipa:19003 1000
api_c=$!
# Host B's device: 4 members once the async API's client joined (the others still run).
four_b() { [ "$(members "$b" $ipb)" = 4 ]; }
wait_for $api_c four_b || true
max_b=$(members "$b" $ipb)
for v in wbw_s wbw_c sbw_s sbw_c api_s api_c perf_s perf_c; do
  rc=0; wait "${!v}" || rc=$?
  printf -v "${v}_rc" %s $rc
done
pids=()

if [ "$wbw_s_rc$wbw_c_rc" = 00 ] && grep -Eq "$perftest_line" "$l"/wbw.server && grep -Eq "$perftest_line" "$l"/wbw.client; then
  pass "ib_write_bw -D $secs: server on host A, client on host B: $(grep -E "$perftest_line" "$l"/wbw.client | tr -s ' ' | sed 's/^ //')"
else
  fail "ib_write_bw across (server rc $wbw_s_rc, client rc $wbw_c_rc)" "$l"/wbw.server "$l"/wbw.client
fi
if [ "$sbw_s_rc$sbw_c_rc" = 00 ] && grep -Eq "$perftest_line" "$l"/sbw.server && grep -Eq "$perftest_line" "$l"/sbw.client; then
  pass "ib_send_bw -D $secs: server on host B, client on host A: $(grep -E "$perftest_line" "$l"/sbw.client | tr -s ' ' | sed 's/^ //')"
else
  fail "ib_send_bw across (server rc $sbw_s_rc, client rc $sbw_c_rc)" "$l"/sbw.server "$l"/sbw.client
fi
if [ "$api_s_rc$api_c_rc" = 00 ] && grep -q '"verified":true' "$l"/api.client; then
  pass "async API (verified_peer, RDMA CM): server on host A, client on host B: $(grep '"verified"' "$l"/api.client)"
else
  fail "async API (verified_peer) across (server rc $api_s_rc, client rc $api_c_rc)" "$l"/api.server "$l"/api.client
fi
if [ "$perf_s_rc$perf_c_rc" = 00 ] && grep -q '"verified":true' "$l"/perf.client; then
  pass "remem perf write_bw -R --verify -D $secs: server on host B, client on host A: $(grep -o '"bw_avg_mib_s":[0-9.]*' "$l"/perf.client)"
else
  fail "remem perf write_bw -R --verify across (server rc $perf_s_rc, client rc $perf_c_rc)" "$l"/perf.server "$l"/perf.client
fi
if [ "$max_a" = 4 ] && [ "$max_b" = 4 ]; then
  pass "one device per host: 4 processes at once on $ipa:4791 (host A) and on $ipb:4791 (host B)"
else
  fail "one device per host: members seen at once: host A $max_a, host B $max_b (want 4 and 4)"
fi

echo "== Open MPI over UCX (rc_verbs, ud_verbs), 4 ranks on each host, mpi_check (every byte checked)"
mpicc -O2 -Wall -Werror -o "$work"/mpi_check crates/remem-ibv/tests/middleware/mpi_check.c
# Open MPI's rsh launcher starts its daemon on host B through this agent instead of ssh:
# it enters B's namespace (and the drop-in's view of /dev/infiniband and /sys, which
# `ip netns exec` remounts) and runs the daemon's command line as a remote shell would.
cat > "$work"/agent <<EOF
#!/bin/sh
host=\$1; shift
[ "\$host" = $ipb ] || { echo "agent: unknown host \$host" >&2; exit 1; }
exec ip netns exec $b "$remem" run -- sh -c "\$*"
EOF
chmod 755 "$work"/agent
# Each rank notes its pid and network namespace, then becomes mpi_check.
stats=$work/stats
ranks=$work/ranks
mpi_ok=1
REMEM_IBV_STATS=$stats ip netns exec "$a" timeout 300 "$remem" run -- \
  mpirun --allow-run-as-root --host $ipa:4,$ipb:4 -np 8 \
  --mca plm_rsh_agent "$work"/agent --mca oob_tcp_if_include 10.77.0.0/24 \
  --mca pml ucx --mca osc ucx --mca btl self \
  -x UCX_TLS=self,rc_verbs,ud_verbs -x UCX_NET_DEVICES=rxe0:1 \
  sh -c 'echo "$$ $OMPI_COMM_WORLD_RANK $(readlink /proc/self/ns/net)" >> '"$ranks"'; exec '"$work"'/mpi_check' \
  > "$l"/mpi 2>&1 &
# In the background and waited for: a signal to this script is handled at once.
pids=($!)
wait "${pids[0]}" || mpi_ok=0
pids=()
grep -q "mpi_check: all checks passed on 8 ranks" "$l"/mpi || mpi_ok=0
# Ranks per namespace, and each rank's device counters: what it received came over its soft
# NIC (UCX_TLS has no tcp and no shared memory; pml ucx and btl self only).
ns_a=$(ip netns exec "$a" readlink /proc/self/ns/net)
ns_b=$(ip netns exec "$b" readlink /proc/self/ns/net)
in_a=$(awk -v n="$ns_a" '$3 == n' "$ranks" 2>/dev/null | wc -l)
in_b=$(awk -v n="$ns_b" '$3 == n' "$ranks" 2>/dev/null | wc -l)
[ "$in_a" = 4 ] && [ "$in_b" = 4 ] || mpi_ok=0
counted=0
summary=""
# host_members as each rank last saw it (at its ibv_close_device in MPI_Finalize, after
# Open MPI's closing fence: the first rank of a host to close still sees all four).
most_a=0
most_b=0
while read -r pid rank ns; do
  line=$(grep "^pid=$pid device=rxe0 " "$stats" 2>/dev/null | head -n1 || true)
  rcvd=$(sed -n 's/.* rcvd_pkts=\([0-9]*\).*/\1/p' <<<"$line")
  members=$(sed -n 's/.* host_members=\([0-9]*\).*/\1/p' <<<"$line")
  fwd=$(sed -n 's/.* host_forwarded_out=\([0-9]*\).*/\1/p' <<<"$line")
  lost=$(sed -n 's/.* host_forward_failed=\([0-9]*\).*/\1/p' <<<"$line")
  host=A; [ "$ns" = "$ns_b" ] && host=B
  summary="$summary rank $rank@$host rcvd_pkts=${rcvd:-none} host_members=${members:-none} forwarded=${fwd:-none} forward_failed=${lost:-none};"
  if [ -n "$members" ]; then
    if [ $host = A ] && [ "$members" -gt $most_a ]; then most_a=$members; fi
    if [ $host = B ] && [ "$members" -gt $most_b ]; then most_b=$members; fi
  fi
  # Rank 0's ping-pong alone sends each rank about 50 MiB: over 12,000 packets even at
  # the largest MTU (4096), about 50,000 at the default 1024.
  [ -n "$rcvd" ] && [ "$rcvd" -ge 10000 ] && counted=$((counted + 1))
done < <(sort -k2 -n "$ranks" 2>/dev/null)
[ "$counted" = 8 ] || mpi_ok=0
[ $most_a = 4 ] && [ $most_b = 4 ] || mpi_ok=0
echo "      ranks: $in_a on host A, $in_b on host B; soft-NIC counters:$summary"
echo "      one device per host: at most $most_a members seen on host A's, $most_b on host B's"
if [ $mpi_ok = 1 ]; then
  pass "mpirun -np 8 (4 per host, one device each) mpi_check over UCX rc_verbs/ud_verbs across the hosts: all checks passed"
else
  fail "mpirun -np 8 (4 per host) mpi_check across the hosts" "$l"/mpi
fi

echo "hostnic-netns: $passed passed, $failed failed ($(( $(date +%s) - start )) s)"
[ $failed = 0 ]
