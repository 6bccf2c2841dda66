#!/usr/bin/env bash
# CPU flame graphs of egressd under the side-by-side bench's loads (benches/side_by_side.sh, on
# its configs in benches/peers/), one per scenario: h1 hello at 50 and 256 connections (wrk) and h2c 16x16 streams (h2load).
#
#   benches/profile.sh [OUT_DIR=benches/profiles] [BINARY]
#
# Needs perf (Debian `linux-perf`), inferno (`cargo install inferno`), nginx, wrk, h2load, and
# `cargo build --release` (line tables are on in the release profile). Samples egressd only, at
# 499 Hz with DWARF call graphs, for 8 s of each load; loopback only, pinned like side_by_side.sh.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$ROOT/benches/profiles}
BIN=${2:-$ROOT/target/release/egressd}
mkdir -p "$OUT"
# shellcheck source=bench_env.sh
. "$ROOT/benches/bench_env.sh"
profile() { # NAME LOAD...
  local name=$1; shift
  taskset -c 0 "$@" >"$LOGS/profile-$name.load" 2>&1 &
  local load=$!
  sleep 1 # past the load's connection set-up
  perf record -q -F 499 --call-graph dwarf,32768 -p "$egressd" -o "$WORK/profile-$name.data" -- sleep 8 2>/dev/null
  wait "$load"
  perf script -i "$WORK/profile-$name.data" 2>/dev/null | inferno-collapse-perf >"$WORK/profile-$name.folded"
  inferno-flamegraph --minwidth 2 --title "egressd, $name" <"$WORK/profile-$name.folded" >"$OUT/$name.svg"
  echo "$name: $OUT/$name.svg ($(wc -l <"$WORK/profile-$name.folded") stacks)"
}
profile h1-hello-c50 wrk -t1 -c50 -d10s "$EGRESSD_URL"
profile h1-hello-c256 wrk -t1 -c256 -d10s "$EGRESSD_URL"
profile h2c-hello h2load -t1 -c16 -m16 -D10 "$EGRESSD_URL"
