#!/usr/bin/env bash
# egressd's RSS on the side-by-side bench's config (../shared/bench/conf/egressd): idle after
# start, while wrk holds CONNS connections through it for 10 s, and 5, 10 and 20 s after wrk
# stopped, with the origins still up, with the upstream connections left open then (the pool
# closes surplus idle connections every 5 s, and jemalloc returns freed memory in about 1 s).
#
#   benches/memory.sh [BINARY] [CONNS=256]
#
# Needs nginx and wrk (../shared/bench/README.md), and `cargo build --release`. Loopback only;
# pinned like run.sh (load and origin on CPU 0, the proxy on CPU 1).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-$ROOT/target/release/egressd}
CONNS=${2:-256}
# shellcheck source=bench_env.sh
. "$ROOT/benches/bench_env.sh"
rss() {
  local up
  up=$(ss -Htn state established '( dport = :18080 )' | wc -l)
  echo "$(( $(ps -o rss= -p "$egressd") / 1024 )) MiB, $up upstream connections"
}
echo "idle after start: $(rss)"
taskset -c 0 wrk -t1 -c"$CONNS" -d10s http://127.0.0.1:28400/ >"$B/logs/memory-wrk.out" &
wrk=$!
sleep 5
echo "during c$CONNS: $(rss)"
wait "$wrk"
grep -E "Requests/sec" "$B/logs/memory-wrk.out" | sed 's/^/  wrk: /'
for after in 5 10 20; do
  sleep $((after - ${previous:-0}))
  previous=$after
  echo "$after s after: $(rss)"
done
