#!/usr/bin/env bash
# The drop-in libibverbs (crates/remem-ibv): unmodified Debian binaries from ibverbs-utils and
# perftest, both ends on the drop-in, two processes on loopback, through `remem run`.
# Every run is bounded by `timeout`; a server is ready once its TCP port listens.
# Usage: bash .ci/dropin.sh [--quick]   (--quick: defaults only, for a fast local check)
set -uo pipefail
cd "$(dirname "$0")/.."
quick=${1:-}
# show_log FILE [LINES] (.ci/lib.sh): a failed program's panic, crash report and last lines.
. .ci/lib.sh

for tool in ibv_devices ibv_rc_pingpong ib_write_bw ss; do
  command -v $tool >/dev/null 2>&1 || { echo "dropin: $tool is missing (apt-get install ibverbs-utils perftest iproute2)"; exit 1; }
done
cargo build --release --quiet -p remem-ibv -p remem-cli || exit 1
remem=$PWD/target/release/remem
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
failed=0
passed=0
port=18600

listening() { ss -ltn | grep -q ":$1 "; }

# pass LABEL / fail LABEL: count and report; a failure prints both sides' output.
pass() { passed=$((passed + 1)); echo "ok    $1"; }
fail() {
  failed=$((failed + 1)); echo "FAIL  $1"
  for f in "$logs"/server "$logs"/client; do
    show_log "$f" 30
  done
}

# single LABEL CMD...: one program on the drop-in; it must succeed and print its device.
single() {
  local label=$1; shift
  rm -f "$logs"/server "$logs"/client
  if timeout 60 "$remem" run -- "$@" > "$logs"/client 2>&1 && grep -q rxe0 "$logs"/client; then
    pass "$label"
  else
    fail "$label"
  fi
}

# pair LABEL TOOL ARGS...: TOOL ARGS as server, then TOOL ARGS 127.0.0.1 as client, on a port
# of their own; both must exit 0, and `expect` (a regex) must be in the client's output.
expect=''
pair() {
  local label=$1 tool=$2; shift 2
  port=$((port + 1))
  rm -f "$logs"/server "$logs"/client
  timeout 180 "$remem" run -- "$tool" -p $port "$@" > "$logs"/server 2>&1 &
  local server=$!
  for _ in $(seq 200); do
    listening $port && break
    kill -0 $server 2>/dev/null || break
    sleep 0.05
  done
  local ok=1
  timeout 180 "$remem" run -- "$tool" -p $port "$@" 127.0.0.1 > "$logs"/client 2>&1 || ok=0
  wait $server || ok=0
  if [ -n "$expect" ] && ! grep -Eq "$expect" "$logs"/client; then ok=0; fi
  if [ $ok = 1 ]; then pass "$label"; else fail "$label"; fi
}

echo "== ibverbs-utils"
single "ibv_devices" ibv_devices
single "ibv_devinfo -v" ibv_devinfo -v
expect='bytes in .* seconds'
# GID index 1 is the IPv4 one (rxe's layout, what scripts written for rxe name); index 0,
# the link-local default GID, works between two drop-in programs too.
pair "ibv_rc_pingpong -g 1" ibv_rc_pingpong -g 1
pair "ibv_rc_pingpong -g 0 (link-local)" ibv_rc_pingpong -g 0
pair "ibv_uc_pingpong -g 1" ibv_uc_pingpong -g 1
pair "ibv_ud_pingpong -g 1" ibv_ud_pingpong -g 1
pair "ibv_ud_pingpong -g 0 (link-local)" ibv_ud_pingpong -g 0
pair "ibv_srq_pingpong -g 1" ibv_srq_pingpong -g 1
pair "ibv_rc_pingpong -g 1 -e (completion events)" ibv_rc_pingpong -g 1 -e

echo "== perftest (both ends on the drop-in)"
# A result row: the message size followed by figures.
expect='^ *[0-9]+ +[0-9]+ +[0-9.]+'
common="-d rxe0 -x 1 -F"
for t in write_bw read_bw send_bw atomic_bw write_lat read_lat send_lat atomic_lat; do
  pair "ib_$t" ib_$t $common
  [ "$quick" = --quick ] && continue
  # perftest refuses -a for atomics ("Message size cannot be changed for Atomic tests").
  case $t in atomic_*) ;; *) pair "ib_$t -a" ib_$t $common -a -n 100 ;; esac
  pair "ib_$t --use_old_post_send" ib_$t $common --use_old_post_send -n 1000
  # Completion events: the peer's ACK reaches the waiting side before the answer does.
  case $t in send_lat) pair "ib_$t -e" ib_$t $common -e -n 1000 ;; esac
  case $t in *_bw)
    pair "ib_$t -q 4" ib_$t $common -q 4
    pair "ib_$t -b" ib_$t $common -b ;;
  esac
  # UC and UD deliver what arrives and a perftest SEND server waits for every message; a
  # sender that outruns its receiver loses messages (no flow control, as on a NIC), so the
  # unreliable SEND runs fit in the receive queue perftest posts up front.
  case $t in
    write_*) pair "ib_$t -c UC" ib_$t $common -c UC ;;
    send_bw) pair "ib_$t -c UC" ib_$t $common -c UC -n 200 -s 1024
             pair "ib_$t -c UD" ib_$t $common -c UD -n 200 ;;
    send_lat) pair "ib_$t -c UC" ib_$t $common -c UC
              pair "ib_$t -c UD" ib_$t $common -c UD ;;
  esac
done
[ "$quick" = --quick ] || pair "ib_send_bw -c UD -b" ib_send_bw $common -c UD -b -n 200

echo "== mixed: perftest on the drop-in against remem perf --perftest (remem's Rust API, soft@127.0.0.1), both ways"
# mixed LABEL SERVER... :: CLIENT...: as `pair`, but the two sides run different programs.
mixed() {
  local label=$1; shift
  local server=() client=()
  while [ "$1" != :: ]; do server+=("$1"); shift; done
  shift; client=("$@")
  port=$((port + 1))
  rm -f "$logs"/server "$logs"/client
  timeout 180 "${server[@]}" -p $port > "$logs"/server 2>&1 &
  local pid=$!
  for _ in $(seq 200); do
    listening $port && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.05
  done
  local ok=1
  timeout 180 "${client[@]}" -p $port 127.0.0.1 > "$logs"/client 2>&1 || ok=0
  wait $pid || ok=0
  grep -Eq "$expect" "$logs"/client || ok=0
  if [ $ok = 1 ]; then pass "$label"; else fail "$label"; fi
}
tests="write_bw read_bw send_bw atomic_bw write_lat read_lat send_lat atomic_lat"
[ "$quick" = --quick ] && tests="write_bw send_lat"
for t in $tests; do
  mixed "ib_$t (drop-in, client) against remem perf --perftest $t (server)" \
    "$remem" perf --perftest $t -d soft@127.0.0.1 -n 1000 :: "$remem" run -- ib_$t $common -n 1000
  mixed "remem perf --perftest $t (client) against ib_$t (drop-in, server)" \
    "$remem" run -- ib_$t $common -n 1000 :: "$remem" perf --perftest $t -d soft@127.0.0.1 -n 1000
done

echo "== RDMA CM: rdmacm-utils and perftest -R on the drop-in librdmacm (both ends), each on a soft device of its own"
# cm_pair LABEL TOOL SERVER-ARGS :: CLIENT-ARGS: the server on 127.0.18.N1, the client on
# 127.0.18.N2; {S} in the arguments is the server's address. The client starts once the
# server's rdma_listen returned (the drop-in writes a line to $REMEM_RDMACM_NOTIFY).
cm_n=0
cm_pair() {
  # TOOL may be SERVER-TOOL/CLIENT-TOOL.
  local label=$1 stool=${2%/*} ctool=${2#*/}; shift 2
  local sargs=() cargs=()
  cm_n=$((cm_n + 2))
  local sip=127.0.18.$cm_n cip=127.0.18.$((cm_n + 1))
  while [ "$1" != :: ]; do sargs+=("${1//\{S\}/$sip}"); shift; done
  shift
  for a in "$@"; do cargs+=("${a//\{S\}/$sip}"); done
  # perftest's -R pairs run again (up to 5 times) when the client lost perftest's own
  # listen race (it connects before the server's data listener exists and gets REJ 8;
  # perftest's retry of the connect then crashes): see rdmacm_tools.rs, lost_listen_race.
  local tries=1 attempt=1 ok
  case $label in *" -R"*) tries=5 ;; esac
  while :; do
    rm -f "$logs"/server "$logs"/client "$logs"/notify
    : > "$logs"/notify
    REMEM_IBV_DEVICES=rxe0=soft@$sip REMEM_RDMACM_NOTIFY="$logs"/notify \
      timeout 120 "$remem" run -- "$stool" "${sargs[@]}" > "$logs"/server 2>&1 &
    local server=$!
    for _ in $(seq 400); do
      grep -q listening "$logs"/notify && break
      kill -0 $server 2>/dev/null || break
      sleep 0.05
    done
    ok=1
    REMEM_IBV_DEVICES=rxe0=soft@$cip timeout 120 "$remem" run -- "$ctool" "${cargs[@]}" > "$logs"/client 2>&1 || ok=0
    if [ $ok = 0 ] && [ $attempt -lt $tries ] \
      && grep -q "RDMA_CM_EVENT_REJECTED; error: 8" "$logs"/client; then
      echo "      $label: attempt $attempt lost perftest's listen race; again"
      kill $server 2>/dev/null; wait $server 2>/dev/null
      attempt=$((attempt + 1))
      continue
    fi
    wait $server || ok=0
    break
  done
  if [ -n "$expect" ] && ! grep -Eq "$expect" "$logs"/client; then ok=0; fi
  if [ $ok = 1 ]; then pass "$label"; else fail "$label"; fi
}
if command -v rping >/dev/null 2>&1; then
  expect='ping data: rdma-ping-99'
  cm_pair "rping -C 100 -v" rping -s -a {S} -C 100 -v :: -c -a {S} -C 100 -v
  expect=''
  cm_pair "rdma_server / rdma_client" rdma_server/rdma_client -s {S} :: -s {S}
  cm_pair "ucmatose -c 4 -C 20" ucmatose -b {S} -c 4 -C 20 :: -s {S} -c 4 -C 20
  cm_pair "udaddy -c 2 -C 20" udaddy -b {S} -c 2 -C 20 :: -s {S} -c 2 -C 20
  expect='^ *[0-9]+ +[0-9]+ +[0-9.]+'
  cm_pair "ib_write_bw -R" ib_write_bw -R -d rxe0 -x 1 -F -n 200 :: -R -d rxe0 -x 1 -F -n 200 {S}
  cm_pair "ib_send_bw -R" ib_send_bw -R -d rxe0 -x 1 -F -n 200 :: -R -d rxe0 -x 1 -F -n 200 {S}
  cm_pair "ib_read_lat -R" ib_read_lat -R -d rxe0 -x 1 -F -n 200 :: -R -d rxe0 -x 1 -F -n 200 {S}
else
  fail "rdmacm-utils is missing (apt-get install rdmacm-utils)"
fi

if [ "$quick" != --quick ]; then
  echo "== remem-ibverbs (the rdma-core provider) over the drop-in: the provider conformance suite through the C ABI"
  if cargo build --release --quiet -p remem-ibverbs --example conformance; then
    rm -f "$logs"/server "$logs"/client
    if timeout 600 "$remem" run -- target/release/examples/conformance local rxe0 > "$logs"/client 2>&1; then
      pass "conformance local rxe0 (remem-ibverbs over the drop-in)"
    else
      fail "conformance local rxe0 (remem-ibverbs over the drop-in)"
    fi
  else
    fail "building remem-ibverbs' conformance example"
  fi
fi

echo "dropin: $passed passed, $failed failed"
[ $failed = 0 ]
