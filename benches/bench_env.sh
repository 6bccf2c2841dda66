# Sourced by benches/memory.sh and benches/profile.sh: the side-by-side bench's origin
# (../shared/bench/conf/origin-nginx.conf, CPU 0) and egressd on its config
# (../shared/bench/conf/egressd, CPU 1, one worker), both stopped at exit. Sets $egressd to
# egressd's pid once it answers on 127.0.0.1:28400. Needs ROOT and BIN.
BENCH=${BENCH:-$ROOT/../shared/bench}
B=/tmp/bench
mkdir -p "$B/logs" "$B/www" "$B/run"
"$BENCH/gen-certs.sh" >/dev/null
[ -s "$B/www/4k.bin" ] || head -c 4096 /dev/urandom >"$B/www/4k.bin"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true' EXIT
taskset -c 0 nginx -p "$B/" -c "$BENCH/conf/origin-nginx.conf" >"$B/logs/bench-origin.out" 2>&1 &
pids+=($!)
taskset -c 1 "$BIN" run --workers 1 --no-watch --config "$BENCH/conf/egressd" >"$B/logs/bench-egressd.out" 2>&1 &
egressd=$!
pids+=($egressd)
for _ in $(seq 100); do
  curl -fsS -o /dev/null http://127.0.0.1:28400/ 2>/dev/null && break
  sleep 0.1
done
