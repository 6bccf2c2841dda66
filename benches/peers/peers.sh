# shellcheck shell=bash
# Sourced by the bench scripts that run the origin and the proxies of benches/peers/
# (side_by_side.sh, cpu_split.sh, and memory.sh and profile.sh through bench_env.sh).
# Needs ROOT (the repository); uses BIN (egressd) and ENVOY_BIN when they start those.
#
#   peers_prepare        the bench CA and origin certificate (made once, kept in WORK/certs),
#                        the 4 KiB file, a free 127.0.0.1 port for every name of PORT_NAMES
#                        (PORT[NAME]), and every template rendered into RUN
#   peer_start NAME CPU  start origin, nginx, haproxy, envoy or egressd pinned to CPU; its pid
#                        is PID[NAME], its output LOGS/NAME.out
#   peer_stop NAME       stop one by its pid; peers_stop_all: every one started (set it as the
#                        caller's EXIT trap)
#   peer_wait URL        wait up to 10 s for URL to answer 200
#   pid_tree PID         PID and its children (nginx: master and worker)
#
# Directories: WORK (default target/side-by-side), RUN (rendered configs, pid files, nginx's
# temporary files), LOGS, CERTS. Everything listens on 127.0.0.1 only.

WORK=${WORK:-$ROOT/target/side-by-side}
RUN=$WORK/run
LOGS=$WORK/logs
CERTS=$WORK/certs
PEERS=$ROOT/benches/peers
PORT_NAMES=(ORIGIN_H1_1 ORIGIN_H1_2 ORIGIN_H1_3 ORIGIN_H2C ORIGIN_TLS_1 ORIGIN_TLS_2 ORIGIN_TLS_3
  NGINX_H1 NGINX_H2C NGINX_TLS HAPROXY_H1 HAPROXY_H2C HAPROXY_TLS
  ENVOY_H1 ENVOY_TLS ENVOY_ADMIN EGRESSD_H1 EGRESSD_TLS EGRESSD_ADMIN)
declare -A PORT=()
declare -A PID=()

peers_prepare() {
  mkdir -p "$RUN" "$LOGS" "$CERTS" "$WORK/www"
  rm -rf "${RUN:?}"/*
  # A throwaway CA and the origin's certificate (ECDSA P-256, for origin.bench.local and
  # 127.0.0.1): the proxies verify the chain and the name when they originate TLS.
  if ! [ -s "$CERTS/ca.crt" ] || ! [ -s "$CERTS/origin.crt" ] || ! [ -s "$CERTS/origin.key" ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
      -subj "/CN=egressd bench CA" -keyout "$CERTS/ca.key" -out "$CERTS/ca.crt" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
      -subj "/CN=origin.bench.local" -keyout "$CERTS/origin.key" -out "$CERTS/origin.csr" 2>/dev/null
    printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature" \
      "extendedKeyUsage=serverAuth" "subjectAltName=DNS:origin.bench.local,IP:127.0.0.1" >"$CERTS/origin.ext"
    openssl x509 -req -in "$CERTS/origin.csr" -CA "$CERTS/ca.crt" -CAkey "$CERTS/ca.key" \
      -CAcreateserial -days 825 -extfile "$CERTS/origin.ext" -out "$CERTS/origin.crt" 2>/dev/null
    openssl verify -CAfile "$CERTS/ca.crt" "$CERTS/origin.crt" >/dev/null
  fi
  [ -s "$WORK/www/4k.bin" ] || head -c 4096 /dev/urandom >"$WORK/www/4k.bin"

  # Ports the kernel picks (all bound at once, so they differ), released just before the
  # servers bind them.
  local ports i
  read -r -a ports < <(python3 -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
' ${#PORT_NAMES[@]})
  local subst=(-e "s|@WORK@|$WORK|g")
  for i in "${!PORT_NAMES[@]}"; do
    PORT[${PORT_NAMES[$i]}]=${ports[$i]}
    subst+=(-e "s|@${PORT_NAMES[$i]}@|${ports[$i]}|g")
  done
  local template dest
  mkdir -p "$RUN/egressd"
  for template in origin-nginx.conf:origin.conf nginx.conf:nginx.conf haproxy.cfg:haproxy.cfg \
    envoy.yaml:envoy.yaml egressd.yaml:egressd/egressd.yaml; do
    dest=$RUN/${template#*:}
    sed "${subst[@]}" "$PEERS/${template%%:*}" >"$dest"
    if grep -v '^[[:space:]]*#' "$dest" | grep -q '@[A-Z0-9_]*@'; then
      echo "benches/peers/${template%%:*}: a placeholder peers.sh does not fill" >&2
      return 1
    fi
  done
}

peer_start() { # NAME CPU
  local name=$1 cpu=$2 cmd
  case $name in
    origin | nginx) cmd=(nginx -p "$RUN/" -e "$LOGS/$name.error.log" -c "$RUN/$name.conf") ;;
    haproxy) cmd=(haproxy -db -f "$RUN/haproxy.cfg") ;;
    envoy) cmd=("$ENVOY_BIN" --concurrency 1 --disable-hot-restart --log-level warn -c "$RUN/envoy.yaml") ;;
    egressd) cmd=("$BIN" run --workers 1 --no-watch --config "$RUN/egressd") ;;
    *) echo "peer_start: unknown peer $name" >&2; return 2 ;;
  esac
  taskset -c "$cpu" "${cmd[@]}" >"$LOGS/$name.out" 2>&1 &
  PID[$name]=$!
}

peer_stop() { # NAME: SIGTERM, then SIGKILL after 5 s
  local name=$1 pid=${PID[$1]:-}
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "warning: $name ($pid) still running 5 s after SIGTERM, SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
  unset "PID[$name]"
}

peers_stop_all() {
  local name
  for name in "${!PID[@]}"; do kill -TERM "${PID[$name]}" 2>/dev/null || true; done
  for name in "${!PID[@]}"; do peer_stop "$name"; done
}

peer_wait() { # URL [curl arguments]
  local url=$1
  shift
  for _ in $(seq 100); do
    curl -fsS -o /dev/null "$@" "$url" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "no answer from $url (logs in $LOGS)" >&2
  return 1
}

pid_tree() { echo "$1"; pgrep -P "$1" 2>/dev/null || true; }
