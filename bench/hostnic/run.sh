#!/usr/bin/env bash
# Measures, on this machine, now, what it costs for the processes of one host to share one UDP
# port (RoCEv2's 4791), for issue 32's design (docs/host-nic.md):
#   - one pair's 64 B ping-pong round trip (median, p99) and one-way 64 B datagram rate, for
#     today's per-process ports (base), option 0 (SO_REUSEPORT group + classic BPF steering by
#     the BTH destination QPN), 2a (a leader forwarding over AF_UNIX datagrams) and 2b (a
#     leader forwarding through shared-memory rings + eventfd); each alone and with 8 busy
#     processes on the same port/group/leader;
#   - option 0 at a member's death (SIGKILL in a group of 4: index moves, stale and rewritten
#     programs, the death seen through a pidfd);
#   - multicast to a group: every member gets it, whatever the program;
#   - privileges: the classic BPF attach and CM MAD steering as an unprivileged user; eBPF
#     (REUSEPORT_SOCKARRAY map, SK_REUSEPORT and SOCKET_FILTER programs) as that user and as
#     root; a second UID joining the group; process_vm_writev between two processes of a user.
# Prints one JSON object per line. Loopback only; every run is bounded (the whole < 3 minutes).
# ROUNDS=n: rounds of the pair measurements (default 3, about 30 s each).
# Needs a C compiler. Run as root to include the checks that need two UIDs (setpriv drops to
# nobody for the unprivileged ones); as an ordinary user those run as that user.
# Usage: bash bench/hostnic/run.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
chmod 755 "$dir"
if ! cc -O2 -o "$dir/steer" "$here/steer.c"; then
  echo '{"bench":"hostnic","error":"could not build steer.c"}'
  exit 1
fi
steer=$dir/steer
port=$((20000 + RANDOM % 20000))
next() { port=$((port + 20)); }

echo "{\"bench\":\"hostnic\",\"test\":\"host\",\"kernel\":\"$(uname -r)\",\"cpus\":$(nproc),\"loadavg\":\"$(cut -d' ' -f1-3 /proc/loadavg)\",\"date\":\"$(date -u +%FT%TZ)\"}"

if [ "$(id -u)" = 0 ]; then
  unpriv=(setpriv --reuid=65534 --regid=65534 --clear-groups)
else
  unpriv=()
fi
timeout 20 "${unpriv[@]}" "$steer" cbpf $port || echo '{"bench":"hostnic","test":"cbpf_steering","error":"failed"}'
next
timeout 20 "${unpriv[@]}" "$steer" mcast $port || echo '{"bench":"hostnic","test":"multicast_to_group","error":"failed"}'
next
timeout 20 "${unpriv[@]}" "$steer" ebpf || echo '{"bench":"hostnic","test":"ebpf","error":"failed"}'
[ "$(id -u)" = 0 ] && { timeout 20 "$steer" ebpf || echo '{"bench":"hostnic","test":"ebpf","error":"failed"}'; }
if [ "$(id -u)" = 0 ]; then
  timeout 20 "$steer" uid $port 65534 || echo '{"bench":"hostnic","test":"uid_join","error":"failed"}'
  next
else
  echo '{"bench":"hostnic","test":"uid_join","skipped":"needs root to make a second UID"}'
fi
timeout 20 "${unpriv[@]}" "$steer" pvm || echo '{"bench":"hostnic","test":"process_vm_writev","error":"failed"}'
timeout 30 "$steer" death $port || echo '{"bench":"hostnic","test":"death","error":"failed"}'
next

# the pair: ROUNDS rounds (default 3), options interleaved within each, so a drift of the
# machine's load spreads over all of them; each line says its round (compare medians)
for round in $(seq 1 "${ROUNDS:-3}"); do
  for load in 0 8; do
    for test in lat rate; do
      for opt in base reuseport unix ring; do
        { timeout 40 "$steer" $test $opt $load $port \
          || echo "{\"bench\":\"hostnic\",\"test\":\"$test\",\"option\":\"$opt\",\"busy_procs\":$load,\"error\":\"failed or timed out\"}"; } \
          | sed "s/^{/{\"round\":$round,/"
        next
        [ $port -gt 64000 ] && port=$((20000 + RANDOM % 20000))
      done
    done
  done
done
# the same latency with every process of the run on CPU 0 (taskset): the scheduler's choice of
# one CPU or two for the pair (which alone moves the round trip between ~15 and ~50 us on this
# VM) taken out; what is left is the path's own cost (syscalls, context switches)
if command -v taskset >/dev/null; then
  for round in $(seq 1 "${ROUNDS:-3}"); do
    for opt in base reuseport unix ring; do
      { timeout 40 taskset -c 0 "$steer" lat $opt 0 $port \
        || echo "{\"bench\":\"hostnic\",\"test\":\"lat\",\"option\":\"$opt\",\"busy_procs\":0,\"error\":\"failed or timed out\"}"; } \
        | sed "s/^{/{\"round\":$round,\"pinned\":\"cpu0\",/"
      next
    done
  done
fi
echo "{\"bench\":\"hostnic\",\"test\":\"host_after\",\"loadavg\":\"$(cut -d' ' -f1-3 /proc/loadavg)\",\"date\":\"$(date -u +%FT%TZ)\"}"
