#!/usr/bin/env bash
# End-to-end benchmark of egressd: CPU time per proxied request on one core, the method of
# docs/design.md "Performance method". See benches/README.md for what it prints and how to read it.
#
# egressd runs with one worker pinned to PROXY_CPU; the origin (the `bench_origin` example,
# benches/origin/bench_origin.rs) and the load generator (wrk, h2load) share LOAD_CPU. For each
# scenario egressd is started afresh, warmed up, then loaded for DURATION seconds; the CPU time
# it used in that window (utime+stime from /proc/PID/stat) divided by the requests completed is
# the figure of merit, µs/req. The same load is also sent straight to the origin for
# reference. Everything binds and targets 127.0.0.1.
#
# Environment:
#   DURATION=10      seconds of measured load per scenario (QUICK=1: 3)
#   WARMUP=3         seconds of load before each measured window (QUICK=1: 1)
#   QUICK=1          short run for a smoke test
#   SCENARIOS="..."  subset of: h1-c50 h1-c256 h1-4k-c50 h2c-16x16 (default: all)
#   DIRECT=0         skip the direct-to-origin reference runs
#   BUILD=0          use the binaries already in target/release (no cargo build)
#   PROXY_CPU=0 LOAD_CPU=1   the cores to pin to
#   SMALL_BODY=5 LARGE_BODY=4096   origin body sizes in bytes
#   OUT=DIR          keep the raw load-generator outputs and logs in DIR
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ "${QUICK:-0}" == 1 ]]; then
  DURATION=${DURATION:-3}
  WARMUP=${WARMUP:-1}
else
  DURATION=${DURATION:-10}
  WARMUP=${WARMUP:-3}
fi
SCENARIOS=${SCENARIOS:-"h1-c50 h1-c256 h1-4k-c50 h2c-16x16"}
DIRECT=${DIRECT:-1}
BUILD=${BUILD:-1}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
SMALL_BODY=${SMALL_BODY:-5}
LARGE_BODY=${LARGE_BODY:-4096}
OUT=${OUT:-}

log() { printf '== %s\n' "$*" >&2; }
die() {
  printf 'e2e.sh: %s\n' "$*" >&2
  exit 1
}

# ---------------------------------------------------------------------------------------------
# Processes we start, stopped on any exit (normal, error, Ctrl-C).

WORK=$(mktemp -d "${TMPDIR:-/tmp}/egressd-e2e.XXXXXX")
PIDS=()

cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  if [[ -n "$OUT" ]]; then
    mkdir -p "$OUT" && cp -r "$WORK"/. "$OUT"/ && log "raw outputs kept in $OUT"
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
# The EXIT trap runs on these too once the script exits.
trap 'exit 130' INT
trap 'exit 143' TERM

forget_pid() {
  local pid=$1 kept=() p
  for p in "${PIDS[@]}"; do
    [[ "$p" == "$pid" ]] || kept+=("$p")
  done
  PIDS=("${kept[@]}")
}

# Waits until a file exists and is non-empty, or the process that should write it has died, or
# the deadline passes.
wait_for_file() {
  local file=$1 pid=$2 what=$3 deadline=$((SECONDS + 15))
  until [[ -s "$file" ]]; do
    kill -0 "$pid" 2>/dev/null || die "$what exited before it was ready (log: $(tail -5 "$WORK"/*.log 2>/dev/null))"
    ((SECONDS < deadline)) || die "$what not ready after 15 s"
    sleep 0.05
  done
}

# The bench must never send traffic off this machine.
require_loopback() {
  [[ "$1" =~ ^127\.0\.0\.1:[0-9]+$ ]] || die "refusing non-loopback address '$1'"
}

# ---------------------------------------------------------------------------------------------
# Tools

[[ "$(uname -s)" == Linux ]] || die "Linux only (reads /proc and uses taskset)"

need_tools() {
  local missing=() cmd pkg
  # command:package on Debian
  for pair in wrk:wrk h2load:nghttp2-client curl:curl taskset:util-linux getconf:libc-bin; do
    cmd=${pair%%:*}
    pkg=${pair#*:}
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
  done
  ((${#missing[@]} == 0)) && return 0
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    die "missing packages: ${missing[*]} (install them, or run as root on Debian/Ubuntu)"
  fi
}
need_tools
command -v cargo >/dev/null 2>&1 || die "cargo not found (install the Rust toolchain)"

taskset -c "$PROXY_CPU" true 2>/dev/null || die "cannot pin to CPU $PROXY_CPU (PROXY_CPU)"
taskset -c "$LOAD_CPU" true 2>/dev/null || die "cannot pin to CPU $LOAD_CPU (LOAD_CPU)"
[[ "$PROXY_CPU" != "$LOAD_CPU" ]] || die "PROXY_CPU and LOAD_CPU must differ"
TICKS=$(getconf CLK_TCK)

# ---------------------------------------------------------------------------------------------
# Build

# The tree being measured (with BUILD=0: the tree now, which may differ from the binaries').
rev=$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ "$rev" != unknown ]] && [[ -n "$(cd "$ROOT" && git status --porcelain 2>/dev/null)" ]]; then
  rev="$rev+dirty"
fi
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
EGRESSD=$TARGET_DIR/release/egressd
ORIGIN=$TARGET_DIR/release/examples/bench_origin
if [[ "$BUILD" == 1 ]]; then
  log "cargo build --release (egressd, bench_origin)"
  (cd "$ROOT" && cargo build --release --bin egressd --example bench_origin)
fi
[[ -x "$EGRESSD" && -x "$ORIGIN" ]] || die "binaries missing in $TARGET_DIR/release (run with BUILD=1)"

# ---------------------------------------------------------------------------------------------
# Origins: one per body size, on the load core, for the whole run.

start_origin() {
  local name=$1 size=$2
  taskset -c "$LOAD_CPU" "$ORIGIN" --listen 127.0.0.1:0 --body-size "$size" \
    --address-file "$WORK/$name.addr" >/dev/null 2>"$WORK/origin-$name.log" &
  PIDS+=($!)
  wait_for_file "$WORK/$name.addr" $! "origin $name"
  require_loopback "$(cat "$WORK/$name.addr")"
}
start_origin small "$SMALL_BODY"
start_origin large "$LARGE_BODY"
SMALL_ADDR=$(cat "$WORK/small.addr")
LARGE_ADDR=$(cat "$WORK/large.addr")

mkdir -p "$WORK/config"
sed -e "s/^\( *- number: \)[0-9]*\( *# @SMALL_PORT@\)\$/\1${SMALL_ADDR##*:}\2/" \
  -e "s/^\( *- number: \)[0-9]*\( *# @LARGE_PORT@\)\$/\1${LARGE_ADDR##*:}\2/" \
  "$ROOT/benches/config/egressd.yaml" >"$WORK/config/egressd.yaml"
for port in "${SMALL_ADDR##*:}" "${LARGE_ADDR##*:}"; do
  grep -q "number: $port " "$WORK/config/egressd.yaml" ||
    die "benches/config/egressd.yaml lost its @SMALL_PORT@/@LARGE_PORT@ markers"
done

# ---------------------------------------------------------------------------------------------
# egressd: started afresh for each scenario, so idle and peak RSS are per scenario.

PROXY_PID=
PROXY_ADDR=

start_proxy() {
  rm -f "$WORK/admin.addr"
  taskset -c "$PROXY_CPU" "$EGRESSD" --log-level warn run --config "$WORK/config" --workers 1 \
    --admin-address 127.0.0.1:0 --admin-address-file "$WORK/admin.addr" --no-watch \
    2>>"$WORK/egressd.log" &
  # taskset execs egressd, so this is egressd's own pid (checked below).
  PROXY_PID=$!
  PIDS+=("$PROXY_PID")
  wait_for_file "$WORK/admin.addr" "$PROXY_PID" egressd
  local admin deadline=$((SECONDS + 15))
  admin=$(cat "$WORK/admin.addr")
  require_loopback "$admin"
  until curl -fsS -o /dev/null "http://$admin/ready" 2>/dev/null; do
    kill -0 "$PROXY_PID" 2>/dev/null || die "egressd exited (log: $(tail -5 "$WORK/egressd.log"))"
    ((SECONDS < deadline)) || die "egressd not ready after 15 s"
    sleep 0.05
  done
  [[ "$(cat "/proc/$PROXY_PID/comm")" == egressd ]] || die "pid $PROXY_PID is not egressd"
  # /status lists {address, name} per listener; pick ours without depending on key order.
  PROXY_ADDR=$(curl -fsS "http://$admin/status" | tr -d ' \n' |
    grep -o '"listeners":\[[^]]*\]' | sed 's/},{/}\n{/g' | grep '"name":"default/bench/http"' |
    grep -o '"address":"[^"]*"' | cut -d'"' -f4)
  require_loopback "$PROXY_ADDR"
}

stop_proxy() {
  [[ -n "$PROXY_PID" ]] || return 0
  kill -TERM "$PROXY_PID" 2>/dev/null || true
  local deadline=$((SECONDS + 10))
  while kill -0 "$PROXY_PID" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.05; done
  kill -KILL "$PROXY_PID" 2>/dev/null || true
  wait "$PROXY_PID" 2>/dev/null || true
  forget_pid "$PROXY_PID"
  PROXY_PID=
}

# utime + stime of the whole process (all threads), in clock ticks. The command name in field 2
# may hold spaces, so count fields after its closing parenthesis.
cpu_ticks() {
  sed 's/^.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'
}

# VmRSS or VmHWM of a process, in MiB.
mem_mib() {
  awk -v k="$2:" '$1 == k { printf "%.1f", $2 / 1024 }' "/proc/$1/status"
}

# ---------------------------------------------------------------------------------------------
# Load generators. Each writes its raw output to a file and sets:
#   R_REQS (requests completed), R_RPS, R_P50, R_P99 (ms), R_ERRS (failed or non-2xx).

R_REQS=0 R_RPS=0 R_P50=- R_P99=- R_ERRS=0

# wrk prints latencies with a unit (us, ms, s); convert to ms.
wrk_ms() {
  awk -v pct="$1" '$1 == pct {
    v = $2; u = v; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", v)
    if (u == "us") v /= 1000; else if (u == "s") v *= 1000; else if (u == "m") v *= 60000
    printf "%.2f", v }' "$2"
}

run_wrk() { # addr host conns seconds outfile
  local addr=$1 host=$2 conns=$3 secs=$4 out=$5
  require_loopback "$addr"
  taskset -c "$LOAD_CPU" wrk -t 1 -c "$conns" -d "${secs}s" --latency -H "Host: $host" \
    "http://$addr/" >"$out" 2>&1 || die "wrk failed: $(tail -3 "$out")"
  R_REQS=$(awk '/ requests in / { print $1 }' "$out")
  R_RPS=$(awk '/^Requests\/sec:/ { printf "%.0f", $2 }' "$out")
  R_P50=$(wrk_ms 50% "$out")
  R_P99=$(wrk_ms 99% "$out")
  R_ERRS=$(awk '/^ *Non-2xx or 3xx responses:/ { n += $NF }
    /^ *Socket errors:/ { gsub(/,/, ""); n += $4 + $6 + $8 + $10 } END { print n + 0 }' "$out")
}

run_h2load() { # addr host conns streams seconds outfile
  local addr=$1 host=$2 conns=$3 streams=$4 secs=$5 out=$6
  require_loopback "$addr"
  # h2load reports no percentiles; its per-request log (start, status, µs) gives them.
  taskset -c "$LOAD_CPU" h2load -t 1 -c "$conns" -m "$streams" -D "$secs" \
    -H ":authority: $host" --log-file="$out.requests" "http://$addr/" >"$out" 2>&1 ||
    die "h2load failed: $(tail -3 "$out")"
  # requests: N total, N started, N done, N succeeded, N failed, N errored, N timeout
  R_REQS=$(awk '/^requests:/ { print $6 }' "$out")
  R_ERRS=$(awk '/^requests:/ { print $10 + $12 + $14 }' "$out")
  R_RPS=$(awk '/^finished in/ { printf "%.0f", $4 }' "$out")
  read -r R_P50 R_P99 < <(awk -F'\t' '$2 !~ /^2/ { next } { print $3 }' "$out.requests" | sort -n |
    awk '{ v[NR] = $1 } END {
      if (NR == 0) { print "- -"; exit }
      i50 = int(NR * 0.50); if (i50 < 1) i50 = 1
      i99 = int(NR * 0.99); if (i99 < 1) i99 = 1
      printf "%.2f %.2f\n", v[i50] / 1000, v[i99] / 1000 }')
  rm -f "$out.requests"
}

# ---------------------------------------------------------------------------------------------
# Scenarios

ROWS=()
row() { ROWS+=("$(printf '%-11s %-7s %8s %7s %7s %7s %5s %6s %6s %6s' "$@" | sed "s/ *\$//")"); }

# Sends the scenario's load to ADDR for SECS seconds; out file $2.
load() { # scenario addr secs outfile
  case $1 in
  h1-c50) run_wrk "$2" small.bench 50 "$3" "$4" ;;
  h1-c256) run_wrk "$2" small.bench 256 "$3" "$4" ;;
  h1-4k-c50) run_wrk "$2" large.bench 50 "$3" "$4" ;;
  h2c-16x16) run_h2load "$2" small.bench 16 16 "$3" "$4" ;;
  *) die "unknown scenario $1" ;;
  esac
}

origin_of() {
  case $1 in
  h1-4k-c50) echo "$LARGE_ADDR" ;;
  *) echo "$SMALL_ADDR" ;;
  esac
}

# Checks that the proxy serves the scenario before measuring it. Returns 1 if this build does
# not support it (so the row says so instead of printing garbage).
probe() { # scenario
  local out=$WORK/probe.out
  case $1 in
  h2c-*)
    taskset -c "$LOAD_CPU" h2load -n 4 -c 1 -m 2 -H ":authority: small.bench" \
      "http://$PROXY_ADDR/" >"$out" 2>&1 || true
    grep -q '^requests: 4 total, 4 started, 4 done, 4 succeeded' "$out"
    ;;
  h1-4k-*)
    [[ "$(curl -fsS -H 'Host: large.bench' "http://$PROXY_ADDR/" | wc -c)" == "$LARGE_BODY" ]] ||
      die "proxy does not serve large.bench"
    ;;
  *)
    [[ "$(curl -fsS -H 'Host: small.bench' "http://$PROXY_ADDR/" | wc -c)" == "$SMALL_BODY" ]] ||
      die "proxy does not serve small.bench"
    ;;
  esac
}

# Other work on either core skews both req/s and µs/req; the report shows the load average.
LOAD_BEFORE=$(cut -d' ' -f1 /proc/loadavg)
for sc in $SCENARIOS; do
  log "$sc: egressd (${WARMUP}s warm-up, ${DURATION}s measured)"
  start_proxy
  idle=$(mem_mib "$PROXY_PID" VmRSS)
  if ! probe "$sc"; then
    row "$sc" egressd "not supported by this build" "" "" "" "" "" "" ""
    stop_proxy
    continue
  fi
  load "$sc" "$PROXY_ADDR" "$WARMUP" "$WORK/$sc-warmup.out"
  t0=$(cpu_ticks "$PROXY_PID")
  load "$sc" "$PROXY_ADDR" "$DURATION" "$WORK/$sc-egressd.out"
  t1=$(cpu_ticks "$PROXY_PID")
  peak=$(mem_mib "$PROXY_PID" VmHWM)
  stop_proxy
  ((R_REQS > 0)) || die "$sc: no request completed (see $WORK/$sc-egressd.out)"
  us=$(awk -v t=$((t1 - t0)) -v hz="$TICKS" -v n="$R_REQS" 'BEGIN { printf "%.1f", t / hz * 1e6 / n }')
  cpu=$(awk -v t=$((t1 - t0)) -v hz="$TICKS" -v s="$DURATION" 'BEGIN { printf "%.0f", t / hz / s * 100 }')
  row "$sc" egressd "$R_RPS" "$R_P50" "$R_P99" "$us" "$cpu" "$idle" "$peak" "$R_ERRS"

  if [[ "$DIRECT" == 1 ]]; then
    case $sc in
    h2c-*) row "$sc" direct "n/a (origin is HTTP/1.1 only)" "" "" "" "" "" "" "" ;;
    *)
      log "$sc: direct to origin"
      load "$sc" "$(origin_of "$sc")" "$WARMUP" "$WORK/$sc-direct-warmup.out"
      load "$sc" "$(origin_of "$sc")" "$DURATION" "$WORK/$sc-direct.out"
      row "$sc" direct "$R_RPS" "$R_P50" "$R_P99" - - - - "$R_ERRS"
      ;;
    esac
  fi
done

# ---------------------------------------------------------------------------------------------
# Report

echo
echo "egressd e2e bench: $(date -u +%Y-%m-%dT%H:%MZ), rev $rev, $(nproc) CPUs" \
  "($(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)), egressd on CPU $PROXY_CPU," \
  "origin + load on CPU $LOAD_CPU, ${DURATION}s per run," \
  "load average $LOAD_BEFORE before, $(cut -d' ' -f1 /proc/loadavg) after"
echo "h1 = wrk -t1 --latency, body ${SMALL_BODY} B (4k: ${LARGE_BODY} B); h2c = h2load -t1 -c16 -m16, HTTP/1.1 upstream"
echo "µs/req = egressd CPU time (user+sys, all threads) in the window / requests completed; cpu% = of one core"
echo
printf '%-11s %-7s %8s %7s %7s %7s %5s %6s %6s %6s\n' scenario target req/s p50_ms p99_ms us/req cpu% \
  rss0MiB hwmMiB errors
for r in "${ROWS[@]}"; do
  printf '%s\n' "$r"
done
