#!/usr/bin/env bash
# User and kernel CPU time per request, separately, of nginx, HAProxy and egressd on the
# side-by-side bench's configs (../shared/bench/conf), each on its own (CPU 1) in turn with wrk
# on CPU 0, repeated REPS times interleaved. The kernel's share moves by ±2 µs/req between runs
# on this shared VM (it is where the host's noise lands); the user share repeats to ~0.2 µs, so
# it is what tells a user-space change of a few percent apart — `instructions.sh` counts the
# same thing exactly but only for egressd.
#
#   benches/cpu_split.sh [REPS=3] [CONNS=50]
#   benches/cpu_split.sh 3 h2c          # HTTP/2 cleartext downstream, h2load 16 connections × 16
#   BIN=/tmp/egressd-before WHO=egressd benches/cpu_split.sh 3 50   # one binary, no peers
#
# Needs nginx, haproxy, wrk and h2load (../shared/bench/README.md) and `cargo build --release`. Loopback
# only; pinned like run.sh.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
REPS=${1:-3}
CONNS=${2:-50}
BIN=${BIN:-$ROOT/target/release/egressd}
WHO=${WHO:-nginx haproxy egressd}
BENCH=${BENCH:-$ROOT/../shared/bench}
B=/tmp/bench
mkdir -p "$B/logs" "$B/www" "$B/run"
"$BENCH/gen-certs.sh" >/dev/null
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true' EXIT
taskset -c 0 nginx -p "$B/" -c "$BENCH/conf/origin-nginx.conf" >"$B/logs/split-origin.out" 2>&1 &
pids+=($!)

# "utime stime" in clock ticks of a process and its direct children (nginx's worker).
ticks() {
  local u=0 s=0 p
  for p in "$1" $(pgrep -P "$1" || true); do
    read -r pu ps < <(awk '{print $14, $15}' "/proc/$p/stat" 2>/dev/null || echo "0 0")
    u=$((u + pu)) s=$((s + ps))
  done
  echo "$u $s"
}
hz=$(getconf CLK_TCK)
for _ in $(seq "$REPS"); do
  for who in $WHO; do
    case $who in
      nginx) url=http://127.0.0.1:28100/ h2=http://127.0.0.1:28110/; cmd=(nginx -p "$B/" -c "$BENCH/conf/nginx-proxy.conf") ;;
      haproxy) url=http://127.0.0.1:28200/ h2=http://127.0.0.1:28210/; cmd=(haproxy -db -f "$BENCH/conf/haproxy.cfg") ;;
      egressd) url=http://127.0.0.1:28400/ h2=$url; cmd=("$BIN" run --workers 1 --no-watch --config "$BENCH/conf/egressd") ;;
      *) echo "unknown target $who" >&2; exit 2 ;;
    esac
    taskset -c 1 "${cmd[@]}" >"$B/logs/split-$who.out" 2>&1 &
    pid=$!
    for _ in $(seq 100); do curl -fsS -o /dev/null "$url" 2>/dev/null && break; sleep 0.05; done
    if [ "$CONNS" = h2c ]; then
      load() { taskset -c 0 h2load -t1 -c16 -m16 -D "$1" "$h2" 2>&1; }
    else
      load() { taskset -c 0 wrk -t1 -c"$CONNS" -d"$1"s "$url" 2>&1; }
    fi
    load 2 >/dev/null
    read -r u0 s0 < <(ticks "$pid")
    out=$(load 8)
    read -r u1 s1 < <(ticks "$pid")
    n=$(awk '/requests in/{print $1} /^requests:/{print $8}' <<<"$out")
    awk -v who="$who" -v c="$CONNS" -v n="$n" -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v hz="$hz" 'BEGIN {
      us = 1e6 / hz / n
      printf "%-8s c%-4s user %5.2f  kernel %5.2f  total %5.2f µs/req  %6.0f req/s\n", who, c, u * us, s * us, (u + s) * us, n / 8 }'
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  done
done
