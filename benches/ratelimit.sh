#!/usr/bin/env bash
# What a rate limit costs per request, in instructions (benches/instructions.sh: callgrind,
# h2load --h1, 50 connections), in one run of three configs of the same binary:
#
#   - no limit;
#   - a local rule on the Backend (one counter, never reached);
#   - a global rule (Redis on loopback, started here from Debian's redis-server; one script
#     call per request, never reached).
#
#   benches/ratelimit.sh [EGRESSD_BINARY]     # default: target/release/egressd
#
# The numbers go in docs/performance.md ("Rate limits").
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BINARY=${1:-$ROOT/target/release/egressd}
command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server >/dev/null; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/egressd-rl.XXXXXX")
REDIS_PID=""
cleanup() {
  [[ -n "$REDIS_PID" ]] && kill "$REDIS_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# Redis on a free loopback port.
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" >/dev/null &
REDIS_PID=$!
for _ in $(seq 1 100); do
  python3 -c "import socket; socket.create_connection(('127.0.0.1',$PORT)).close()" 2>/dev/null && break
  sleep 0.05
done

policy() {
  cat > "$WORK/$1.yaml" <<YAML
apiVersion: egressd.dev/v1alpha1
kind: BackendTrafficPolicy
metadata: {name: bench-$1}
spec:
  targetRefs: [{group: egressd.dev, kind: Backend, name: origin}]
  rateLimit: {$1: {rules: [{name: never-reached, limit: {requests: 4000000000, unit: Second}}]}}
YAML
}
policy local
policy global

echo "== no limit"
"$ROOT/benches/instructions.sh" "$BINARY"
echo "== a local limit"
EXTRA="$WORK/local.yaml" "$ROOT/benches/instructions.sh" "$BINARY"
echo "== a global limit (Redis on loopback)"
PROXY_EXTRA="  rateLimit: {redis: {address: \"127.0.0.1:$PORT\", timeout: 1s}}" \
  EXTRA="$WORK/global.yaml" "$ROOT/benches/instructions.sh" "$BINARY"
