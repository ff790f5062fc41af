#!/usr/bin/env bash
# Real RDMA middleware on the drop-in (issue 30): UCX, Open MPI over UCX, libfabric's verbs
# provider, librpma, qperf and the rest of rdma-core's tools, unmodified Debian binaries and
# programs of ours (crates/remem-ibv/tests/middleware/), both ends through `remem run`, two
# (or four) processes on this machine.
#
# No root: run as root (CI), the script builds, then runs every program as an ordinary user
# (uid 65534) through setpriv; `remem run` makes the soft device visible to it
# (/dev/infiniband, /sys/class/infiniband) in a user and mount namespace of its own.
#
# Addresses: every program's default device is the host's, rxe0 on 127.0.0.1, shared
# (crates/remem-ibv/src/device.rs). Programs that exchange their addresses out of band (UCX,
# Open MPI, perftest, libfabric's datagram endpoints) need nothing more. A server that
# clients reach through the RDMA CM by an address (librpma, qperf -cm1, rdma_xserver) is at
# 127.0.0.1, or, as some runs here still do, on a named device
# (REMEM_IBV_DEVICES=rxe0=soft@127.0.19.N) whose address its clients are told.
#
# Every run is bounded by `timeout`; a server is ready once its TCP port listens or once the
# drop-in's librdmacm wrote "listening" to $REMEM_RDMACM_NOTIFY.
# Usage: bash .ci/middleware.sh
set -uo pipefail
cd "$(dirname "$0")/.."

need=(ucx_info ucx_perftest io_demo mpirun mpicc fi_info fi_pingpong qperf rdma_xserver rdma_xclient
      cmtime mckey ibv_asyncwatch ibv_devices gcc pkg-config ss setpriv)
for tool in "${need[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "middleware: $tool is missing (apt-get install ucx-utils openmpi-bin libopenmpi-dev libfabric-bin librpma-dev qperf rdmacm-utils ibverbs-utils iproute2 util-linux)"
    exit 1
  }
done

if [ "${1:-}" != --run ]; then
  cargo build --release --quiet -p remem-ibv -p remem-cli || exit 1
  bins=$(mktemp -d /tmp/remem-middleware.XXXXXX)
  chmod 755 "$bins"
  src=crates/remem-ibv/tests/middleware
  mpicc -O2 -Wall -Werror -o "$bins"/mpi_check $src/mpi_check.c || exit 1
  gcc -O2 -Wall -Wextra -Werror -o "$bins"/rpma_check $src/rpma_check.c \
    $(pkg-config --cflags --libs librpma) -libverbs || exit 1
  cp target/release/remem target/release/libremem_ibv.so "$bins"/
  if [ "$(id -u)" = 0 ]; then
    echo "middleware: running every program as uid 65534 (no root)"
    home=$(mktemp -d /tmp/remem-middleware-home.XXXXXX)
    chown 65534:65534 "$home"
    setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all \
      env HOME="$home" TMPDIR="$home" bash "$0" --run "$bins"
    rc=$?
    # UD multicast across network namespaces (two hosts joined by a veth pair, made here
    # as root; the programs still run as uid 65534): mckey receiver in one, sender in the
    # other, each on a soft device on its namespace's interface.
    if command -v ip >/dev/null 2>&1; then
      a=remem-mwa-$$ b=remem-mwb-$$
      ip netns add $a && ip netns add $b \
        && ip link add mwa$$ type veth peer name mwb$$ \
        && ip link set mwa$$ netns $a && ip link set mwb$$ netns $b \
        && ip -n $a addr add 10.87.0.1/24 dev mwa$$ && ip -n $b addr add 10.87.0.2/24 dev mwb$$ \
        && ip -n $a link set lo up && ip -n $b link set lo up \
        && ip -n $a link set mwa$$ up && ip -n $b link set mwb$$ up
      notify=$home/mckey-notify; : > "$notify"; chown 65534:65534 "$notify"
      ip netns exec $b env REMEM_IBV_DEVICES=rxe0=mwb$$ REMEM_RDMACM_NOTIFY="$notify" REMEM_IBV_LIB="$bins"/libremem_ibv.so \
        timeout 60 setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all env HOME="$home" \
        "$bins"/remem run -- mckey -m 239.77.0.2 -b 10.87.0.2 -C 20 > "$home"/mckey-recv.log 2>&1 &
      receiver=$!
      for _ in $(seq 400); do grep -q joined "$notify" && break; kill -0 $receiver 2>/dev/null || break; sleep 0.05; done
      ok=1
      ip netns exec $a env REMEM_IBV_DEVICES=rxe0=mwa$$ REMEM_IBV_LIB="$bins"/libremem_ibv.so \
        timeout 60 setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all env HOME="$home" \
        "$bins"/remem run -- mckey -m 239.77.0.2 -b 10.87.0.1 -s -C 20 > "$home"/mckey-send.log 2>&1 || ok=0
      wait $receiver || ok=0
      ip netns del $a; ip netns del $b
      if [ $ok = 1 ]; then
        echo "ok    mckey (UD multicast) across network namespaces (veth), uid 65534"
      else
        echo "FAIL  mckey (UD multicast) across network namespaces"
        tail -n 20 "$home"/mckey-recv.log "$home"/mckey-send.log
        rc=1
      fi
    fi
  else
    bash "$0" --run "$bins"
    rc=$?
  fi
  rm -rf "$bins" ${home:+"$home"}
  exit $rc
fi

bins=$2
remem=$bins/remem
export REMEM_IBV_LIB=$bins/libremem_ibv.so
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
failed=0
passed=0
port=18900
cm_n=0

listening() { ss -ltn | grep -q ":$1 "; }
pass() { passed=$((passed + 1)); echo "ok    $1"; }
fail() {
  failed=$((failed + 1)); echo "FAIL  $1"
  for f in "$logs"/server "$logs"/client "$logs"/server2; do
    show_log "$f" 30
  done
}
# wait_for PID CHECK... (.ci/lib.sh), at most 20 s here.
WAIT_FOR_SECONDS=20
. .ci/lib.sh
notified() { grep -q listening "$logs"/notify; }

echo "== the device, as programs look for it"
rm -f "$logs"/*
if timeout 60 "$remem" run -- sh -c 'test -c /dev/infiniband/uverbs0 && ibv_devices' > "$logs"/client 2>&1 \
   && grep -q rxe0 "$logs"/client; then pass "/dev/infiniband/uverbs0 and ibv_devices (uid $(id -u))"; else fail "/dev/infiniband/uverbs0 and ibv_devices (uid $(id -u))"; fi
if timeout 60 "$remem" run -- ucx_info -d > "$logs"/client 2>&1 \
   && grep -q "Memory domain: rxe0" "$logs"/client && grep -q "Transport: rc_verbs" "$logs"/client \
   && grep -q "Transport: ud_verbs" "$logs"/client; then pass "ucx_info -d lists rxe0 with rc_verbs and ud_verbs"; else fail "ucx_info -d lists rxe0 with rc_verbs and ud_verbs"; fi

echo "== UCX: ucx_perftest (UCT and UCP), the out-of-band exchange over TCP"
# uct LABEL ENV... -- ARGS...: ucx_perftest server and client (127.0.0.1) with ARGS.
perf_pair() {
  local label=$1; shift
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  port=$((port + 1))
  rm -f "$logs"/*
  env "${envs[@]}" timeout 120 "$remem" run -- ucx_perftest -p $port "$@" > "$logs"/server 2>&1 &
  local server=$!
  wait_for $server listening $port
  local ok=1
  env "${envs[@]}" timeout 120 "$remem" run -- ucx_perftest 127.0.0.1 -p $port "$@" > "$logs"/client 2>&1 || ok=0
  wait $server || ok=0
  grep -q '^Final:' "$logs"/client || ok=0
  if [ $ok = 1 ]; then pass "$label"; else fail "$label"; fi
}
for t in "am_lat -s 8" "am_lat -s 1024 -D zcopy" "put_lat -s 8" "put_bw -s 65536 -D zcopy" "get -s 65536 -D zcopy" \
         "add_lat" "fadd" "cswap"; do
  perf_pair "UCT $t over rc_verbs" -- -d rxe0:1 -x rc_verbs -t $t -n 2000
done
for t in "am_lat -s 8" "am_bw -s 1024 -D bcopy"; do
  perf_pair "UCT $t over ud_verbs" -- -d rxe0:1 -x ud_verbs -t $t -n 2000
done
for tls in rc_verbs,ud_verbs ud_verbs; do
  for t in "tag_lat -s 8" "tag_bw -s 1048576" "ucp_put_bw -s 65536" "ucp_get -s 65536"; do
    perf_pair "UCP $t (UCX_TLS=$tls)" UCX_TLS=$tls UCX_NET_DEVICES=rxe0:1 -- -t $t -n 1000
  done
done

echo "== UCX: UCP over the RDMA CM's sockaddr connection (io_demo, data checked)"
cm_n=$((cm_n + 2)); sip=127.0.19.$cm_n
port=$((port + 1))
rm -f "$logs"/*; : > "$logs"/notify
REMEM_IBV_DEVICES=rxe0=soft@$sip REMEM_RDMACM_NOTIFY="$logs"/notify UCX_SOCKADDR_TLS_PRIORITY=rdmacm \
  UCX_TLS=rc_verbs,ud_verbs timeout 120 "$remem" run -- io_demo -p $port -q -d 1024:65536 > "$logs"/server 2>&1 &
server=$!
wait_for $server notified
ok=1
UCX_SOCKADDR_TLS_PRIORITY=rdmacm UCX_TLS=rc_verbs,ud_verbs timeout 120 "$remem" run -- \
  io_demo -p $port -q -i 2000 -o read,write -d 1024:65536 $sip > "$logs"/client 2>&1 || ok=0
grep -q "Client exit with status 'OK'" "$logs"/client || ok=0
# The server serves until it is stopped; it listened through the drop-in's librdmacm.
grep -q "listening 0.0.0.0:$port" "$logs"/notify || ok=0
kill $server 2>/dev/null; wait $server 2>/dev/null
if [ $ok = 1 ]; then pass "io_demo: read and write, 2000 iterations, data checked (-q), rdmacm sockaddr"; else fail "io_demo: rdmacm sockaddr"; fi

echo "== Open MPI over UCX, verbs transports only (mpi_check: ping-pong 1 B..4 MiB, Allreduce, Alltoall, Put/Get)"
for np in 2 4; do
  rm -f "$logs"/*
  ok=1
  REMEM_IBV_STATS="$logs"/stats timeout 300 "$remem" run -- mpirun --oversubscribe -np $np \
    --mca pml ucx --mca osc ucx --mca btl self \
    -x UCX_TLS=self,rc_verbs,ud_verbs -x UCX_NET_DEVICES=rxe0:1 -x REMEM_IBV_STATS \
    "$bins"/mpi_check > "$logs"/client 2>&1 || ok=0
  grep -q "mpi_check: all checks passed on $np ranks" "$logs"/client || ok=0
  # The counters of each rank's rxe0 (the host's other devices, one per interface, are
  # listed and opened too, and a device opened twice writes a line each): every rank sent
  # and received over it.
  grep "device=rxe0 " "$logs"/stats 2>/dev/null | sort -u -t' ' -k1,1 > "$logs"/rxe0 || true
  ranks=$(grep -c "device=rxe0" "$logs"/rxe0 2>/dev/null || echo 0)
  low=$(awk '{for(i=1;i<=NF;i++){split($i,kv,"="); if(kv[1]=="rcvd_pkts"&&kv[2]<1000)n++}} END{print n+0}' "$logs"/rxe0 2>/dev/null)
  [ "$ranks" = "$np" ] && [ "$low" = 0 ] || ok=0
  echo "      soft-NIC counters per rank (rxe0): $(awk '{printf "%s %s %s; ", $1, $3, $4}' "$logs"/rxe0 2>/dev/null)"
  if [ $ok = 1 ]; then pass "mpirun -np $np mpi_check"; else fail "mpirun -np $np mpi_check"; fi
done

echo "== libfabric's verbs provider"
rm -f "$logs"/*
if timeout 60 "$remem" run -- fi_info -p verbs > "$logs"/client 2>&1 && grep -q "domain: rxe0" "$logs"/client; then
  pass "fi_info -p verbs"; else fail "fi_info -p verbs"; fi
fi_pair() {
  local label=$1; shift
  port=$((port + 1))
  rm -f "$logs"/*
  timeout 60 "$remem" run -- fi_pingpong -B $port "$@" > "$logs"/server 2>&1 &
  local server=$!
  wait_for $server listening $port
  local ok=1
  timeout 60 "$remem" run -- fi_pingpong -P $port "$@" 127.0.0.1 > "$logs"/client 2>&1 || ok=0
  wait $server || ok=0
  grep -Eq '^[0-9]+k? +[0-9]+ +=[0-9]+' "$logs"/client || ok=0
  if [ $ok = 1 ]; then pass "$label"; else fail "$label"; fi
}
fi_pair "fi_pingpong -p verbs -e dgram -c (data checked)" -p verbs -e dgram -I 200 -S all -c
fi_pair "fi_pingpong -p 'verbs;ofi_rxd' -e rdm -c (data checked)" -p "verbs;ofi_rxd" -e rdm -I 200 -c
# Connected endpoints on the host's NIC (issue 32): the verbs provider's listener binds
# 127.0.0.1 (rdma_bind_addr), the host device's address; the server names no address, the
# client the server's; then with the domain (the device) named on both sides (-d rxe0).
# ofi_rxm sizes its CQ by the universe size: FI_UNIVERSE_SIZE=16 keeps it within max_cqe
# (32767, rxe's).
fi_pair "fi_pingpong -p verbs -e msg -c (data checked)" -p verbs -e msg -I 200 -c
fi_pair "fi_pingpong -d rxe0 -p verbs -e msg -c (data checked)" -d rxe0 -p verbs -e msg -I 200 -c
export FI_UNIVERSE_SIZE=16
fi_pair "fi_pingpong -p 'verbs;ofi_rxm' -e rdm -c (data checked)" -p "verbs;ofi_rxm" -e rdm -I 200 -c
fi_pair "fi_pingpong -d rxe0 -p 'verbs;ofi_rxm' -e rdm -c (data checked)" -d rxe0 -p "verbs;ofi_rxm" -e rdm -I 200 -c
unset FI_UNIVERSE_SIZE

echo "== librpma: rpma_check (both sides judged)"
for sc in connect read read-pmem write flush atomic messages conns srq rcq; do
  cm_n=$((cm_n + 2)); sip=127.0.19.$cm_n
  port=$((port + 1))
  rm -f "$logs"/*; : > "$logs"/notify
  REMEM_IBV_DEVICES=rxe0=soft@$sip REMEM_RDMACM_NOTIFY="$logs"/notify \
    timeout 60 "$remem" run -- "$bins"/rpma_check server $sip $port $sc > "$logs"/server 2>&1 &
  server=$!
  wait_for $server notified
  ok=1
  timeout 60 "$remem" run -- "$bins"/rpma_check client $sip $port $sc > "$logs"/client 2>&1 || ok=0
  wait $server || ok=0
  if [ $ok = 1 ]; then pass "librpma $sc: $(tail -n1 "$logs"/client)"; else fail "librpma $sc"; fi
done

echo "== qperf over the RDMA CM (-cm1; qperf's UC and UD tests have no GID option and cannot address a RoCE device, kernel rxe's included)"
cm_n=$((cm_n + 2)); sip=127.0.19.$cm_n
port=$((port + 1))
rm -f "$logs"/*
REMEM_IBV_DEVICES=rxe0=soft@$sip timeout 300 "$remem" run -- qperf -lp $port > "$logs"/server 2>&1 &
server=$!
wait_for $server listening $port
for t in rc_bw rc_bi_bw rc_lat rc_rdma_read_bw rc_rdma_read_lat rc_rdma_write_bw rc_rdma_write_lat \
         rc_compare_swap_mr rc_fetch_add_mr; do
  rm -f "$logs"/client
  if timeout 60 "$remem" run -- qperf -lp $port $sip -cm1 -t 1 $t > "$logs"/client 2>&1 \
     && grep -Eq '(bw|latency|msg_rate) += ' "$logs"/client; then
    pass "qperf -cm1 $t: $(grep -E '(bw|latency|msg_rate) += ' "$logs"/client | head -n1 | tr -s ' ')"
  else
    fail "qperf -cm1 $t"
  fi
done
kill $server 2>/dev/null; wait $server 2>/dev/null

echo "== rdma-core's tools"
cm_pair() {
  local label=$1 stool=$2 ctool=$3; shift 3
  local sargs=() cargs=()
  cm_n=$((cm_n + 2))
  local sip=127.0.19.$cm_n
  while [ "$1" != :: ]; do sargs+=("${1//\{S\}/$sip}"); shift; done
  shift
  for a in "$@"; do cargs+=("${a//\{S\}/$sip}"); done
  rm -f "$logs"/*; : > "$logs"/notify
  REMEM_IBV_DEVICES=rxe0=soft@$sip REMEM_RDMACM_NOTIFY="$logs"/notify \
    timeout 60 "$remem" run -- "$stool" "${sargs[@]}" > "$logs"/server 2>&1 &
  local server=$!
  wait_for $server notified
  local ok=1
  timeout 60 "$remem" run -- "$ctool" "${cargs[@]}" > "$logs"/client 2>&1 || ok=0
  if [ -n "${serves_forever:-}" ]; then
    # A server that serves until it is stopped: the client's success is the test.
    kill $server 2>/dev/null; wait $server 2>/dev/null
  else
    wait $server || ok=0
  fi
  if [ -n "$expect" ] && ! grep -Eq "$expect" "$logs"/client; then ok=0; fi
  if [ $ok = 1 ]; then pass "$label"; else fail "$label"; fi
}
expect=''
serves_forever=''

port=$((port + 1))
cm_pair "rdma_xserver / rdma_xclient (RC)" rdma_xserver rdma_xclient -p $port :: -s {S} -p $port
port=$((port + 1))
# cmtime's server handles connections until it is stopped; its client times 20 of them.
expect='^disconnect +:'
serves_forever=1
cm_pair "cmtime -c 20" cmtime cmtime -b {S} -c 20 -p $port :: -s {S} -c 20 -p $port
expect=''
serves_forever=
# mckey (UD multicast): a receiver joins 239.77.0.1 on a device of its own; once it has
# joined ("joined" on the notify file), a sender on another device sends 20 datagrams to it.
joined() { grep -q joined "$logs"/notify; }
cm_n=$((cm_n + 2)); mrip=127.0.19.$cm_n; msip=127.0.19.$((cm_n + 1))
rm -f "$logs"/*; : > "$logs"/notify
REMEM_IBV_DEVICES=rxe0=soft@$mrip REMEM_RDMACM_NOTIFY="$logs"/notify \
  timeout 60 "$remem" run -- mckey -m 239.77.0.1 -b $mrip -C 20 > "$logs"/server 2>&1 &
server=$!
wait_for $server joined
ok=1
REMEM_IBV_DEVICES=rxe0=soft@$msip timeout 60 "$remem" run -- \
  mckey -m 239.77.0.1 -b $msip -s -C 20 > "$logs"/client 2>&1 || ok=0
wait $server || ok=0
if [ $ok = 1 ]; then pass "mckey (UD multicast)"; else fail "mckey (UD multicast)"; fi
rm -f "$logs"/*
if timeout 60 "$remem" run -- ibv_devices > "$logs"/client 2>&1 && grep -q rxe0 "$logs"/client; then
  pass "ibv_devices"; else fail "ibv_devices"; fi
# ibv_asyncwatch opens the device and waits for its asynchronous events for ever: it is
# running once it printed its event descriptor; then it is stopped.
rm -f "$logs"/*
timeout 60 "$remem" run -- stdbuf -oL ibv_asyncwatch -d rxe0 > "$logs"/client 2>&1 &
watcher=$!
asyncwatch_ready() { grep -q "async event FD" "$logs"/client; }
if wait_for $watcher asyncwatch_ready; then pass "ibv_asyncwatch -d rxe0: $(head -n1 "$logs"/client)"; else fail "ibv_asyncwatch -d rxe0"; fi
kill $watcher 2>/dev/null; wait $watcher 2>/dev/null

echo "middleware: $passed passed, $failed failed"
[ $failed = 0 ]
