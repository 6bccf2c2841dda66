#!/usr/bin/env bash
# User and kernel CPU time per request, separately, of nginx, HAProxy and egressd on the
# side-by-side bench's configs (benches/peers/), each on its own (CPU 1) in turn with wrk
# on CPU 0, repeated REPS times interleaved. The kernel's share moves by ±2 µs/req between runs
# on this shared VM (it is where the host's noise lands); the user share repeats to ~0.2 µs, so
# it is what tells a user-space change of a few percent apart — `instructions.sh` counts the
# same thing exactly but only for egressd.
#
#   benches/cpu_split.sh [REPS=3] [CONNS=50]
#   benches/cpu_split.sh 3 h2c          # HTTP/2 cleartext downstream, h2load 16 connections × 16
#   BIN=/tmp/egressd-before WHO=egressd benches/cpu_split.sh 3 50   # one binary, no peers
#
# Needs nginx, haproxy, wrk, h2load and openssl (benches/side_by_side.sh installs them) and
# `cargo build --release`. Loopback only; pinned like side_by_side.sh.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
REPS=${1:-3}
CONNS=${2:-50}
BIN=${BIN:-$ROOT/target/release/egressd}
WHO=${WHO:-nginx haproxy egressd}
# shellcheck source=peers/peers.sh
. "$ROOT/benches/peers/peers.sh"
peers_prepare
trap peers_stop_all EXIT
peer_start origin 0

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
      nginx) url=http://127.0.0.1:${PORT[NGINX_H1]}/ h2=http://127.0.0.1:${PORT[NGINX_H2C]}/ ;;
      haproxy) url=http://127.0.0.1:${PORT[HAPROXY_H1]}/ h2=http://127.0.0.1:${PORT[HAPROXY_H2C]}/ ;;
      egressd) url=http://127.0.0.1:${PORT[EGRESSD_H1]}/ h2=$url ;;
      *) echo "unknown target $who" >&2; exit 2 ;;
    esac
    peer_start "$who" 1
    pid=${PID[$who]}
    peer_wait "$url"
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
    peer_stop "$who"
  done
done
