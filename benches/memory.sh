#!/usr/bin/env bash
# egressd's RSS on the side-by-side bench's config (benches/peers/egressd.yaml): idle after
# start, while wrk holds CONNS connections through it for 10 s, and 5, 10 and 20 s after wrk
# stopped, with the origins still up, with the upstream connections left open then (the pool
# closes surplus idle connections every 5 s, and jemalloc returns freed memory in about 1 s).
#
#   benches/memory.sh [BINARY] [CONNS=256]
#
# Needs nginx, wrk and openssl (benches/side_by_side.sh installs them), and `cargo build
# --release`. Loopback only; pinned like side_by_side.sh (load and origin on CPU 0, the proxy on
# CPU 1).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-$ROOT/target/release/egressd}
CONNS=${2:-256}
# shellcheck source=bench_env.sh
. "$ROOT/benches/bench_env.sh"
rss() {
  local up
  up=$(for port in $ORIGIN_PORTS; do ss -Htn state established "( dport = :$port )"; done | wc -l)
  echo "$(( $(ps -o rss= -p "$egressd") / 1024 )) MiB, $up upstream connections"
}
echo "idle after start: $(rss)"
taskset -c 0 wrk -t1 -c"$CONNS" -d10s "$EGRESSD_URL" >"$LOGS/memory-wrk.out" &
wrk=$!
sleep 5
echo "during c$CONNS: $(rss)"
wait "$wrk"
grep -E "Requests/sec" "$LOGS/memory-wrk.out" | sed 's/^/  wrk: /'
for after in 5 10 20; do
  sleep $((after - ${previous:-0}))
  previous=$after
  echo "$after s after: $(rss)"
done
