#!/usr/bin/env bash
# Deterministic A/B measure of egressd's user-space cost: instructions per proxied request,
# counted by valgrind's callgrind (repeatable whatever else the machine is doing, unlike CPU
# time on this shared 2-core box). Two runs with N1 and N2 requests (h2load --h1, 50
# connections, 5-byte responses) are subtracted, so start-up and connection set-up cancel out.
#
#   benches/instructions.sh [EGRESSD_BINARY...]     # default: target/release/egressd
#   N1=2000 N2=12000 benches/instructions.sh /tmp/egressd-before target/release/egressd
#   KEEP=/tmp/cg benches/instructions.sh    # also keeps each run's callgrind.out in /tmp/cg
#                                             # (then: callgrind_annotate --inclusive=yes FILE)
#   EXTRA=policy.yaml benches/instructions.sh   # adds the file's documents to the config
#                                             # (e.g. an EgressPolicy covering `origin`)
#   PROXY_EXTRA='  rateLimit: {...}' benches/instructions.sh   # lines added to the
#                                             # ProxyConfig's spec (benches/ratelimit.sh)
#
# Kernel time (the larger part of the wall-clock figure, see benches/README.md) is not counted.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
N1=${N1:-2000}
N2=${N2:-12000}
BINARIES=("$@")
[[ ${#BINARIES[@]} -gt 0 ]] || BINARIES=("$ROOT/target/release/egressd")

for tool in valgrind h2load curl; do
  if ! command -v "$tool" >/dev/null; then
    apt-get update -qq && apt-get install -y -qq valgrind nghttp2-client curl >/dev/null
    break
  fi
done
[[ -x "$ROOT/target/release/examples/bench_origin" ]] || (cd "$ROOT" && cargo build --release --example bench_origin)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/egressd-instr.XXXXXX")
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

"$ROOT/target/release/examples/bench_origin" --listen 127.0.0.1:0 --body-size 5 --address-file "$WORK/origin.addr" >/dev/null 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do [[ -s "$WORK/origin.addr" ]] && break; sleep 0.05; done
ORIGIN_PORT=$(cut -d: -f2 "$WORK/origin.addr")

mkdir -p "$WORK/config"
cat > "$WORK/config/egressd.yaml" <<YAML
apiVersion: egressd.dev/v1alpha1
kind: ProxyConfig
metadata: {name: egressd}
spec:
  accessLog: {enabled: false}
${PROXY_EXTRA:-}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  listeners: [{name: http, address: 127.0.0.1, port: 0, protocol: HTTP}]
---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata: {name: origin}
spec:
  destination: {type: IP, ip: {endpoints: [{address: 127.0.0.1}]}, ports: [{number: $ORIGIN_PORT}]}
  protocol: HTTP11
  tls: {mode: InsecureDisable}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: small}
spec:
  hostnames: [small.bench]
  rules: [{backendRefs: [{name: origin}]}]
YAML
if [[ -n "${EXTRA:-}" ]]; then
  { echo "---"; cat "$EXTRA"; } >> "$WORK/config/egressd.yaml"
fi

# Total instructions of one egressd run that serves $2 requests.
count() {
  local binary=$1 n=$2 out="$WORK/cg.out" port=""
  rm -f "$out" "$WORK/admin.addr"
  valgrind --tool=callgrind --callgrind-out-file="$out" "$binary" run --config "$WORK/config" \
    --workers 1 --no-watch --admin-address 127.0.0.1:0 --admin-address-file "$WORK/admin.addr" \
    >/dev/null 2>"$WORK/valgrind.log" &
  local pid=$!
  PIDS+=("$pid")
  for _ in $(seq 1 600); do
    if [[ -s "$WORK/admin.addr" ]]; then
      port=$(curl -s "http://$(cat "$WORK/admin.addr")/status" | grep -o '"address": *"127.0.0.1:[0-9]*"' | head -1 | grep -o '[0-9]*"$' | tr -d '"') || true
      [[ -n "$port" ]] && break
    fi
    sleep 0.1
  done
  [[ -n "$port" ]] || { echo "egressd did not start under valgrind" >&2; exit 1; }
  h2load --h1 -n "$n" -c 50 -H ':authority: small.bench' "http://127.0.0.1:$port/" >"$WORK/h2load.txt" 2>&1
  grep -q "$n succeeded" "$WORK/h2load.txt" || { cat "$WORK/h2load.txt" >&2; exit 1; }
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  if [[ -n "${KEEP:-}" ]]; then
    mkdir -p "$KEEP" && cp "$out" "$KEEP/callgrind$(echo "$binary" | tr / _).$n.out"
  fi
  # No early exit in awk: callgrind_annotate would die of SIGPIPE and fail the pipeline.
  callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done {gsub(",", "", $1); print $1; done = 1}'
}

for binary in "${BINARIES[@]}"; do
  a=$(count "$binary" "$N1")
  b=$(count "$binary" "$N2")
  echo "$binary: $(( (b - a) / (N2 - N1) )) instructions/request (user space, h1, 50 connections)"
done
