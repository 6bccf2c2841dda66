"""grpcio (Python, no protoc): one server with an h2c port and a TLS port (certificate for
localhost from the suite's CA), and a client run four times: straight to each port, and
through egressd's listener naming each in `:authority` (Backends `protocol: GRPC`, the TLS one
`Simple` with the CA). Per call the same status code, details, response messages (sha256),
initial and trailing metadata (including a `-bin` key): unary, server-streaming,
client-streaming and bidi ping-pong calls of 0 B, 1 KiB, 1 MiB and 8 MiB messages;
INVALID_ARGUMENT with non-ASCII details, ABORTED after two streamed messages, UNIMPLEMENTED;
DEADLINE_EXCEEDED for a call and mid-stream, seen by the client and by the server (the
deadline reached it and ended the call); a client cancel; the standard health service
(`""`, a service, a NOT_SERVING one, an unknown one: NOT_FOUND).

Then a rate limit, in a second egressd (egressd-rate-limit.yaml: `/interop.Echo/Unary` twice
an hour on the h2c Backend), and the same calls direct (all OK there): through egressd Unary
calls 1 and 2 are answered as direct, call 3 gets RESOURCE_EXHAUSTED with details saying
"rate limited" and `retry-after` and `x-egressd-error: rate_limited` in its trailing
metadata, ServerStream and a health Check after it are answered as direct, and Unary call 4
is still RESOURCE_EXHAUSTED. Peer code: peer.py."""

import json
import subprocess

from harness import CACHE, INTEROP, SuiteFailed, wait_for

PYTHON = CACHE / "04-grpcio" / "venv" / "bin" / "python"
PEER = INTEROP / "04-grpcio" / "peer.py"

# What the direct run must show, so that a broken peer cannot compare equal to itself.
EXPECTED_CODES = {
    "status INVALID_ARGUMENT with details": "INVALID_ARGUMENT",
    "status ABORTED after 2 streamed messages": "ABORTED",
    "unknown method: UNIMPLEMENTED": "UNIMPLEMENTED",
    "deadline 500ms on a call the server never answers": "DEADLINE_EXCEEDED",
    "deadline 800ms mid-way through a stream of 20 x 100ms": "DEADLINE_EXCEEDED",
    "client cancels a bidi stream after 1 echo": "CANCELLED",
    "health Check 'interop.Unknown'": "NOT_FOUND",
}
CALLS = 4 * 4 + len(EXPECTED_CODES) + 3  # sizes x call kinds, the above, 3 healthy Checks


def client(target, run, ca=None, authority=None, limited=False):
    argv = [str(PYTHON), str(PEER), "client", target, "--run", run]
    if limited:
        argv.append("--limited")
    if ca:
        argv += ["--ca", str(ca)]
    if authority:
        argv += ["--authority", authority]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SuiteFailed(f"grpc client {run} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout)


def sane(h, scheme, results):
    """The direct run did what the server was written to do."""
    h.expect(f"{scheme} direct: all {CALLS} calls made", len(results) == CALLS, sorted(results))
    wrong = {}
    for label, r in results.items():
        want = EXPECTED_CODES.get(label, "OK")
        ok = r.get("code") == want
        ok = ok and r.get("echo matches", True) and r.get("all arrived", True)
        if label.startswith("health Check") and want == "OK":
            ok = ok and r.get("status") == ("NOT_SERVING" if "Down" in label else "SERVING")
        if label.startswith("deadline"):
            ok = ok and all(r["server saw"].values()) and r.get("some messages arrived before", True)
        if not ok:
            wrong[label] = r
    h.expect(f"{scheme} direct: every call had its expected outcome", not wrong, json.dumps(wrong)[:2000])


def run(h):
    ca, key, cert = h.localhost_certs()
    ports_file = h.tmp / "ports.json"
    h.spawn("grpc-server", [str(PYTHON), str(PEER), "server", str(ports_file), str(cert), str(key)])
    ports = wait_for("the grpc server's ports", lambda: ports_file.exists() and json.loads(ports_file.read_text()))

    config = h.render("egressd.yaml", H2C_PORT=ports["h2c"], TLS_PORT=ports["tls"], CA=ca)
    egressd = h.egressd(config)
    host, port = egressd.listener("default/sidecar/http")

    for scheme, upstream_port, tls_ca in [("h2c", ports["h2c"], None), ("tls", ports["tls"], ca)]:
        authority = f"localhost:{upstream_port}"
        direct = client(authority, f"{scheme}-direct", ca=tls_ca)
        sane(h, scheme, direct)
        through = client(f"{host}:{port}", f"{scheme}-egressd", authority=authority)
        for label in sorted(set(direct) | set(through)):
            h.compare(f"{scheme}: {label}", direct.get(label), through.get(label))

    rate_limited_method(h, ports["h2c"])


def rate_limited_method(h, h2c_port):
    """Unary limited to 2 calls an hour by a second egressd (egressd-rate-limit.yaml)."""
    authority = f"localhost:{h2c_port}"
    direct = client(authority, "limited-direct", limited=True)
    h.expect("rate-limit direct: every call OK (no limit without egressd)",
             len(direct) == 6 and all(r.get("code") == "OK" for r in direct.values()), direct)
    config = h.render("egressd-rate-limit.yaml", H2C_PORT=h2c_port)
    egressd = h.egressd(config, name="egressd-rate-limit")
    host, port = egressd.listener("default/sidecar/http")
    through = client(f"{host}:{port}", "limited-egressd", authority=authority, limited=True)
    for label in ["Unary call 1", "Unary call 2", "ServerStream after them",
                  "health Check '' after them"]:
        h.compare(f"rate-limit: {label}", direct.get(label), through.get(label))
    for label in ["Unary call 3", "Unary call 4"]:
        r = through.get(label) or {}
        trailers = dict(r.get("trailing metadata") or [])
        h.expect(f"rate-limit: {label}: RESOURCE_EXHAUSTED, details say 'rate limited', "
                 "retry-after and x-egressd-error in the trailing metadata",
                 r.get("code") == "RESOURCE_EXHAUSTED"
                 and "rate limited" in (r.get("details") or "")
                 and trailers.get("retry-after", "").isdigit()
                 and trailers.get("x-egressd-error") == "rate_limited",
                 r)
