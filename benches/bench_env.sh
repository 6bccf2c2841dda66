# shellcheck shell=bash
# Sourced by benches/memory.sh and benches/profile.sh: the origin of benches/peers/
# (origin-nginx.conf, CPU 0) and egressd on benches/peers/egressd.yaml (CPU 1, one worker), the
# configs benches/side_by_side.sh uses, both stopped at exit. Once egressd answers, sets
# $egressd to its pid, $EGRESSD_URL to its HTTP/1.1 and h2c listener and $ORIGIN_PORTS to the
# origin's three HTTP/1.1 ports (egressd's endpoints). Needs ROOT and BIN.
# shellcheck source=peers/peers.sh
. "$ROOT/benches/peers/peers.sh"
peers_prepare
trap peers_stop_all EXIT
peer_start origin 0
peer_start egressd 1
egressd=${PID[egressd]}
EGRESSD_URL=http://127.0.0.1:${PORT[EGRESSD_H1]}/
ORIGIN_PORTS="${PORT[ORIGIN_H1_1]} ${PORT[ORIGIN_H1_2]} ${PORT[ORIGIN_H1_3]}"
peer_wait "$EGRESSD_URL"
