#!/usr/bin/env bash
# HTTPS interception against an HTTPS listener (docs/performance.md "HTTPS interception"):
# egressd's CPU time per new connection and per request on an open connection, for a client
# that reaches one TLS origin
#
#   listener   over an egressd Gateway listener with `protocol: HTTPS` (TLS to egressd, then
#              GET / for origin.bench.local), and
#   intercept  through `CONNECT origin.bench.local:443` on an HTTP listener, intercepted
#              (`tlsInterception`): TLS inside the tunnel with egressd's leaf for the host,
#              then the same GET /;
#   intercept-new-host
#              the same with a new host per connection (hN.bench.local), so every connection
#              waits for a leaf to be minted (the cache never hits).
#
# Both go to the same route and Backend: the origin of benches/peers/ (nginx, HTTPS on three
# ports, chain and name verified), over egressd's pooled upstream connections. Both present a
# chain of two ECDSA P-256 certificates (leaf and CA) and offer the same ALPN; the client is the
# same (benches/interception_client.py: Python's ssl, TLS 1.3, ALPN http/1.1, no resumption).
#
#   benches/interception.sh                 # 3 reps: 20,000 new connections and 100,000
#                                           # keep-alive requests per path and rep (~6 min)
#   REPS=1 NEW=3000 REQUESTS=20000 benches/interception.sh   # a quick look
#   BUILD=0 benches/interception.sh         # reuse target/release/egressd
#   PERF=1 benches/interception.sh          # then `perf record` egressd over one more run of
#                                           # new connections per path (perf/PATH.txt)
#
# Layout on 2 cores, as benches/side_by_side.sh: egressd with one worker alone on PROXY_CPU (1);
# the client (THREADS threads, default 4) and the origin on LOAD_CPU (0). Each (rep, path) runs
# 500 connections of warm-up (the leaf of origin.bench.local is minted then, the upstream pool
# fills), then the measured load; egressd's utime + stime (/proc/PID/stat, every thread) over
# it, divided by the connections or requests, is the figure: µs/op. Medians over reps.
#
# Output: OUT (default target/side-by-side/interception/<time>/): results.tsv (one row per
# run), summary.txt (medians and ratios, and a few of egressd's counters: upstream
# connections opened, leaves minted), perf/ with PERF=1.
#
# Needs nginx, curl, openssl, python3 (apt-get installs nginx-light when missing and run as
# root). Everything listens on and connects to 127.0.0.1 only; every process started is stopped
# by its pid at exit.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/target/release/egressd}
LOAD_CPU=${LOAD_CPU:-0}
PROXY_CPU=${PROXY_CPU:-1}
REPS=${REPS:-3}
NEW=${NEW:-20000}
REQUESTS=${REQUESTS:-100000}
THREADS=${THREADS:-4}
BUILD=${BUILD:-1}
PERF=${PERF:-0}
WARMUP=500

log() { printf '[interception] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

if ! command -v nginx >/dev/null; then
  [ "$(id -u)" = 0 ] || die "nginx is missing (apt-get install nginx-light)"
  apt-get install -y -qq nginx-light >/dev/null
fi
if [ "$BUILD" = 1 ]; then
  log "cargo build --release --all-features --locked"
  (cd "$ROOT" && cargo build --release --all-features --locked --bin egressd)
fi
[ -x "$BIN" ] || die "no egressd binary at $BIN"

# shellcheck source=peers/peers.sh
. "$ROOT/benches/peers/peers.sh"
OUT=${OUT:-$WORK/interception/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
peers_prepare
trap peers_stop_all EXIT
peer_start origin "$LOAD_CPU"

# The interception CA (a new one each run), the listener's chain (the origin's certificate,
# which names origin.bench.local, and the bench CA after it: two certificates, as the
# interception leaf and its CA), and what the client trusts: both CAs.
ICP=$RUN/interception
mkdir -p "$ICP"
"$BIN" ca init "$ICP/ca" >/dev/null
cat "$CERTS/origin.crt" "$CERTS/ca.crt" >"$ICP/listener.pem"
cat "$CERTS/ca.crt" "$ICP/ca/ca.crt" >"$ICP/trust.pem"
PROXY_PORT=${PORT[EGRESSD_H1]} HTTPS_PORT=${PORT[EGRESSD_TLS]}
cat >"$ICP/egressd.yaml" <<EOF
apiVersion: egressd.dev/v1alpha1
kind: ProxyConfig
metadata: {name: egressd}
spec:
  admin: {address: "127.0.0.1:${PORT[EGRESSD_ADMIN]}"}
  accessLog: {enabled: false}
  drain: {timeout: 1s}
  tlsInterception:
    ca: {certificateFile: $ICP/ca/ca.crt, privateKeyFile: $ICP/ca/ca.key}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: bench}
spec:
  listeners:
  - {name: proxy, address: 127.0.0.1, port: $PROXY_PORT, protocol: HTTP}
  - name: https
    address: 127.0.0.1
    port: $HTTPS_PORT
    protocol: HTTPS
    tls:
      certificateFiles: [{certificateFile: $ICP/listener.pem, privateKeyFile: $CERTS/origin.key}]
---
# Both listeners: requests for the host on the HTTPS listener, and CONNECT host:443 (an
# HTTPRoute's host) on the HTTP one, intercepted.
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: origin}
spec:
  parentRefs: [{name: bench, sectionName: proxy}, {name: bench, sectionName: https}]
  hostnames: [origin.bench.local, "*.bench.local"]
  rules:
  - backendRefs: [{group: egressd.dev, kind: Backend, name: origin-tls}]
---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata: {name: origin-tls}
spec:
  destination:
    type: IP
    ip:
      endpoints:
      - {address: 127.0.0.1, port: ${PORT[ORIGIN_TLS_1]}}
      - {address: 127.0.0.1, port: ${PORT[ORIGIN_TLS_2]}}
      - {address: 127.0.0.1, port: ${PORT[ORIGIN_TLS_3]}}
    ports: [{number: ${PORT[ORIGIN_TLS_1]}}]
  protocol: HTTP11
  tls:
    mode: Simple
    sni: origin.bench.local
    validation:
      hostname: origin.bench.local
      caCertificateFiles: [$CERTS/ca.crt]
EOF
"$BIN" validate "$ICP" >"$LOGS/interception-validate.out" 2>&1 ||
  die "the config is invalid: $(cat "$LOGS/interception-validate.out")"
taskset -c "$PROXY_CPU" "$BIN" run --workers 1 --no-watch --config "$ICP" >"$LOGS/egressd.out" 2>&1 &
PID[egressd]=$!
egressd=${PID[egressd]}
peer_wait "https://origin.bench.local:$HTTPS_PORT/" --cacert "$ICP/trust.pem" \
  --resolve "origin.bench.local:$HTTPS_PORT:127.0.0.1"
peer_wait "https://origin.bench.local/" --cacert "$ICP/trust.pem" --proxy "http://127.0.0.1:$PROXY_PORT"
log "egressd $egressd on CPU $PROXY_CPU; client and origin on CPU $LOAD_CPU; out: $OUT"

client() { # PATH KIND COUNT [HOST_OFFSET]
  taskset -c "$LOAD_CPU" python3 "$ROOT/benches/interception_client.py" --pid "$egressd" \
    --path "$1" --kind "$2" --count "$3" --threads "$THREADS" --host-offset "${4:-0}" \
    --proxy-port "$PROXY_PORT" --https-port "$HTTPS_PORT" --cafile "$ICP/trust.pem"
}

printf 'rep\tpath\tkind\tcount\tseconds\tops_per_s\tegressd_cpu_s\tus_per_op\n' >"$OUT/results.tsv"
next_host=0 # hN.bench.local never used before: every one is minted
run() { # REP PATH KIND COUNT
  local rep=$1 path=$2 kind=$3 count=$4 line
  client "$path" "$kind" "$WARMUP" "$next_host" >/dev/null
  next_host=$((next_host + WARMUP))
  line=$(client "$path" "$kind" "$count" "$next_host")
  next_host=$((next_host + count))
  printf '%s\t%s\n' "$rep" "$line" | tee -a "$OUT/results.tsv" >&2
}

paths=(listener intercept intercept-new-host)
for rep in $(seq "$REPS"); do
  # The order turns by one each rep, so no path always runs first.
  for i in 0 1 2; do
    path=${paths[$(((i + rep - 1) % 3))]}
    run "$rep" "$path" new "$NEW"
  done
  for path in listener intercept; do
    [ "$rep" = 2 ] && path=$([ "$path" = listener ] && echo intercept || echo listener)
    run "$rep" "$path" keepalive "$REQUESTS"
  done
done

# Sanity: the upstream connections were pooled (a few opened for all the requests), and a leaf
# was minted for each new host (and one for origin.bench.local).
curl -fsS "http://127.0.0.1:${PORT[EGRESSD_ADMIN]}/metrics" |
  grep -E '^egressd_(upstream_connections_opened|interception_leaves_minted_total|intercepted_tunnels_total|interception_handshake_failures_total)' \
  >"$OUT/metrics.txt" || true

# Profiles, after the measured runs (perf's sampling costs egressd CPU time): one more run of
# new connections per path, not counted.
if [ "$PERF" = 1 ]; then
  mkdir -p "$OUT/perf"
  for path in "${paths[@]}"; do
    perf record -q -p "$egressd" -o "$OUT/perf/$path.data" 2>/dev/null &
    perf_pid=$!
    client "$path" new "$NEW" "$next_host" >/dev/null
    next_host=$((next_host + NEW))
    kill -INT "$perf_pid"
    wait "$perf_pid" || true
    perf report -i "$OUT/perf/$path.data" --stdio --percent-limit 0.5 \
      --sort dso,symbol >"$OUT/perf/$path.txt" 2>/dev/null || true
  done
  log "profiles: $OUT/perf/*.txt"
fi

python3 - "$OUT/results.tsv" >"$OUT/summary.txt" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
med = {}
for kind in ("new", "keepalive"):
    for path in ("listener", "intercept", "intercept-new-host"):
        runs = [r for r in rows if r["path"] == path and r["kind"] == kind]
        if runs:
            us = statistics.median(float(r["us_per_op"]) for r in runs)
            ops = statistics.median(float(r["ops_per_s"]) for r in runs)
            med[path, kind] = us
            print(f"{kind:9} {path:18} {us:8.1f} µs/op (runs: {', '.join(r['us_per_op'] for r in runs)}), {ops:.0f} op/s")
for kind, target in (("new", "≤ 1.3"), ("keepalive", "≈ 1")):
    base = med.get(("listener", kind))
    for path in ("intercept", "intercept-new-host"):
        if base and (path, kind) in med:
            print(f"{kind}: {path} / listener = {med[path, kind] / base:.2f} (target {target})")
EOF
cat "$OUT/metrics.txt" >>"$OUT/summary.txt"
cat "$OUT/summary.txt"
