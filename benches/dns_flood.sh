#!/usr/bin/env bash
# egressd's RSS under a flood of distinct names (docs/operations.md "Limits and hardening"):
# NAMES distinct hosts of a wildcard Backend, then of undeclared destinations under AllowAny,
# each name answered by a loopback DNS server, through a release build (one worker). Run once
# at egressd's default lookup rate (most new names get 503 dns_rate_limited) and once with
# the rate out of the way (every name resolved: the most each name can cost).
#
#   benches/dns_flood.sh [NAMES=100000] [CONNS=8]
#
# Loopback only; BUILD=0 reuses target/release.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NAMES=${1:-100000}
CONNS=${2:-8}
cd "$ROOT"
if [ "${BUILD:-1}" != 0 ]; then
  cargo build --release --locked --bin egressd --example dns_flood
fi
for mode in wildcard undeclared; do
  for rate in default 1000000; do
    echo "== $mode, maxLookupsPerSecond: $rate"
    args=(--egressd target/release/egressd --names "$NAMES" --conns "$CONNS" --mode "$mode")
    [ "$rate" = default ] || args+=(--lookups-per-second "$rate")
    target/release/examples/dns_flood "${args[@]}"
  done
done
