"""websockets (Python): an echo server with a ws port and a wss port (certificate for
localhost from the suite's CA) and a client run four times: straight to each port, and
through egressd's listener with `Host: localhost:PORT` (plain ws to egressd, which originates
TLS to the wss port). The same observations direct and through egressd: the handshake
(status, subprotocol, permessage-deflate parameters), the request headers the server saw,
text and binary echoes of 0, 125, 126, 65535, 65536 B and 1 MiB (sha256, type), multi-byte
UTF-8, fragmented messages both ways (frame by frame from the server), pings both ways, a
client close with 4000 and a reason, a server close with 4001 and a reason, the close frames
the server received, a refused upgrade (403 and its body); with and without compression.
Peer code: peer.py."""

import json
import subprocess

from harness import CACHE, INTEROP, SuiteFailed, wait_for

PYTHON = CACHE / "05-websockets" / "venv" / "bin" / "python"
PEER = INTEROP / "05-websockets" / "peer.py"


def make_certs(h):
    """A CA and a certificate for localhost it signed (egressd and the direct client verify
    against the CA)."""
    d = h.tmp
    run = lambda *args: subprocess.run(args, check=True, capture_output=True, timeout=60)
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-subj", "/CN=interop CA", "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
        "-keyout", str(d / "key.pem"), "-out", str(d / "req.pem"))
    (d / "ext.cnf").write_text("subjectAltName=DNS:localhost\n")
    run("openssl", "x509", "-req", "-in", str(d / "req.pem"), "-CA", str(d / "ca.pem"),
        "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "1",
        "-extfile", str(d / "ext.cnf"), "-out", str(d / "cert.pem"))
    return d / "ca.pem", d / "key.pem", d / "cert.pem"


def client(uri, run, ca=None, connect=None):
    argv = [str(PYTHON), str(PEER), "client", uri, "--run", run]
    if ca:
        argv += ["--ca", str(ca)]
    if connect:
        argv += ["--connect", connect]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SuiteFailed(f"websockets client {run} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout)


def sane(h, scheme, r):
    """The direct run did what the peers were written to do."""
    wrong = {k: v for k, v in r.items() if isinstance(v, dict) and v.get("same as sent") is False}
    for mode in ["permessage-deflate", "no compression"]:
        handshake = r.get(f"{mode}: handshake", {})
        if handshake.get("status") != 101 or handshake.get("subprotocol") != "chat.v2":
            wrong[f"{mode}: handshake"] = handshake
        if (handshake.get("extensions") is not None) != (mode == "permessage-deflate"):
            wrong[f"{mode}: extensions"] = handshake
        frames = r.get(f"{mode}: server's fragmented message, frame by frame")
        # websockets sends a list as its items' frames, then an empty final frame (it cannot
        # tell the last item before the iterable ends).
        if [f["size"] for f in frames or []] != [3000] * 4 + [0]:
            wrong[f"{mode}: frames"] = frames
        for closer, code in [("client closes with 4000", 4000), ("server closes with 4001", 4001)]:
            c = r.get(f"{mode}: {closer} and a reason", {})
            if (c.get("close received") or {}).get("code") != code:
                wrong[f"{mode}: {closer}"] = c
    codes = [c and c["code"] for c in r.get("close frames the server received", [])]
    if codes[-4:] != [4000, 4001, 4000, 4001]:
        wrong["close frames the server received"] = codes
    if r.get("upgrade refused by the server with 403", {}).get("status") != 403:
        wrong["403"] = r.get("upgrade refused by the server with 403")
    h.expect(f"{scheme} direct: every exchange had its expected outcome", not wrong,
             json.dumps(wrong)[:2000])


def run(h):
    ca, key, cert = make_certs(h)
    ports_file = h.tmp / "ports.json"
    h.spawn("websockets-server", [str(PYTHON), str(PEER), "server", str(ports_file), str(cert), str(key)])
    ports = wait_for("the websockets server's ports",
                     lambda: ports_file.exists() and json.loads(ports_file.read_text()))

    config = h.render("egressd.yaml", WS_PORT=ports["ws"], WSS_PORT=ports["wss"], CA=ca)
    egressd = h.egressd(config)
    host, port = egressd.listener("default/sidecar/http")

    for scheme, ca_file in [("ws", None), ("wss", ca)]:
        authority = f"localhost:{ports[scheme]}"
        direct = client(f"{scheme}://{authority}/", f"{scheme}-direct", ca=ca_file)
        sane(h, scheme, direct)
        # Plain ws to egressd in both cases: for the wss port egressd originates the TLS.
        through = client(f"ws://{authority}/", f"{scheme}-egressd", connect=f"{host}:{port}")
        for label in sorted(set(direct) | set(through)):
            h.compare(f"{scheme}: {label}", direct.get(label), through.get(label))
