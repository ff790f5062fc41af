# Helpers the CI lanes share (sourced from the repository root).

# wait_for PID CHECK...: until CHECK succeeds (every 50 ms) or PID is gone, at most
# WAIT_FOR_SECONDS (default 20) seconds; fails if CHECK never succeeded.
wait_for() {
  local pid=$1; shift
  for _ in $(seq $(( ${WAIT_FOR_SECONDS:-20} * 20 ))); do
    "$@" && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# show_log FILE [LINES]: what a failed program left in FILE — its first Rust panic, its
# first crash report (UCX's "Caught signal" with the faulting thread's backtrace, Open MPI's
# "Process received signal", a sanitizer's report), each with what follows it, then its
# last LINES (default 20) lines. A crash report is often far from the end of a log (the
# other ranks' and the launcher's messages follow it).
show_log() {
  local f=$1 n=${2:-20}
  [ -f "$f" ] || return 0
  echo "---- $(basename "$f")"
  grep -m1 -A3 panicked "$f" || true
  grep -m1 -B2 -A40 -E "Caught signal|Process received signal|AddressSanitizer|ERROR: LeakSanitizer" "$f" || true
  echo "---- $(basename "$f"): last $n lines"
  tail -n "$n" "$f"
}
