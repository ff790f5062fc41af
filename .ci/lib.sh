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
