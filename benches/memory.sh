#!/usr/bin/env bash
# egressd's RSS on the side-by-side bench's config (../shared/bench/conf/egressd): idle after
# start, while wrk holds CONNS connections through it for 10 s, and AFTER seconds later with
# the origins still up (the upstream pool keeps its idle connections).
#
#   benches/memory.sh [BINARY] [CONNS=256] [AFTER=10]
#
# Needs nginx and wrk (../shared/bench/README.md), and `cargo build --release`. Loopback only;
# pinned like run.sh (load and origin on CPU 0, the proxy on CPU 1).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-$ROOT/target/release/egressd}
CONNS=${2:-256}
AFTER=${3:-10}
# shellcheck source=bench_env.sh
. "$ROOT/benches/bench_env.sh"
rss() { echo "$(( $(ps -o rss= -p "$egressd") / 1024 )) MiB"; }
echo "idle after start: $(rss)"
taskset -c 0 wrk -t1 -c"$CONNS" -d10s http://127.0.0.1:28400/ >"$B/logs/memory-wrk.out" &
wrk=$!
sleep 5
echo "during c$CONNS: $(rss)"
wait "$wrk"
grep -E "Requests/sec" "$B/logs/memory-wrk.out" | sed 's/^/  wrk: /'
sleep "$AFTER"
echo "${AFTER} s after: $(rss)"
