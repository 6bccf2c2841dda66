"""HTTP/2 upstreams under concurrency (issue #31 point 9): h2load, 10 connections x 10 streams,
2,000 requests, direct and through egressd, against hypercorn (the Python MCP and gRPC
ecosystem's server), nghttpd and a grpcio server, each over h2c and TLS. Every request must
succeed through egressd as it does direct: all 2,000 done with 2xx, and for gRPC (where a
failure is a 200 with a `grpc-status` h2load does not read) the server must have answered
all 2,000 calls itself. Throughput both ways is printed (req/s, and through egressd as a
share of direct) and never asserted: it depends on the machine and what else runs on it.

hypercorn ends a connection after 1,000 requests (`keep_alive_max_requests`) with a GOAWAY
naming every stream it had taken, and never answers the ones still in flight: egressd's HTTP/2
connections carry at most 1,000 streams each by default (`http2.maxRequestsPerConnection`),
so that cap is never met. Before that, 100-200 of the 2,000 got 502 `upstream_reset`."""

import json
import re
import shutil
import struct
import subprocess

from harness import CACHE, INTEROP, free_port, port_open, wait_for

HERE = INTEROP / "08-h2-upstreams"
VENV = CACHE / "08-h2-upstreams" / "venv" / "bin"
NGHTTPD = shutil.which("nghttpd") or "/usr/sbin/nghttpd"
REQUESTS, CONNECTIONS, STREAMS = 2000, 10, 10


def h2load(url, authority=None, extra=()):
    """The outcome of one load run: requests done/succeeded, status classes, req/s."""
    argv = ["h2load", "-n", str(REQUESTS), "-c", str(CONNECTIONS), "-m", str(STREAMS), *extra]
    if authority:
        argv += ["-H", f":authority: {authority}"]
    out = subprocess.run([*argv, url], capture_output=True, text=True, timeout=300).stdout
    requests = re.search(r"^requests: .*$", out, re.M)
    statuses = re.search(r"^status codes: .*$", out, re.M)
    rate = re.search(r"^finished in .*?, ([\d.]+) req/s", out, re.M)
    return {
        "requests": requests.group(0) if requests else out[-500:],
        "status codes": statuses.group(0) if statuses else None,
        "req/s": float(rate.group(1)) if rate else 0.0,
    }


def outcome(run):
    return {k: v for k, v in run.items() if k != "req/s"}


def all_ok(run):
    return (f"{REQUESTS} succeeded" in run["requests"]
            and f"status codes: {REQUESTS} 2xx" in (run["status codes"] or ""))


def grpc_served(port):
    out = subprocess.run([str(VENV / "python"), str(HERE / "grpc_peer.py"), "served",
                          f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60)
    return int(out.stdout) if out.returncode == 0 else f"failed: {out.stderr[-500:]}"


def start_peers(h):
    """hypercorn, nghttpd and the grpcio server, each with an h2c and a TLS port."""
    ca, key, cert = h.localhost_certs()
    ports = {"HYPERCORN_H2C": free_port(), "HYPERCORN_TLS": free_port(),
             "NGHTTPD_H2C": free_port(), "NGHTTPD_TLS": free_port()}
    h.spawn("hypercorn", [str(VENV / "hypercorn"), "--certfile", str(cert), "--keyfile", str(key),
                          "--bind", f"127.0.0.1:{ports['HYPERCORN_TLS']}",
                          "--insecure-bind", f"127.0.0.1:{ports['HYPERCORN_H2C']}", "app:app"],
            cwd=HERE)
    files = h.tmp / "files"
    files.mkdir()
    (files / "index.html").write_text("hello over HTTP/2\n")
    h.spawn("nghttpd-h2c", [NGHTTPD, "--no-tls", "-a", "127.0.0.1", "-d", str(files),
                            str(ports["NGHTTPD_H2C"])])
    h.spawn("nghttpd-tls", [NGHTTPD, "-a", "127.0.0.1", "-d", str(files),
                            str(ports["NGHTTPD_TLS"]), str(key), str(cert)])
    ports_file = h.tmp / "grpc-ports.json"
    h.spawn("grpc-server", [str(VENV / "python"), str(HERE / "grpc_peer.py"), "server",
                            str(ports_file), str(cert), str(key)])
    grpc_ports = wait_for("the grpc server's ports",
                          lambda: ports_file.exists() and json.loads(ports_file.read_text()))
    ports.update(GRPC_H2C=grpc_ports["h2c"], GRPC_TLS=grpc_ports["tls"])
    wait_for("the peers listening", lambda: all(port_open(p) for p in ports.values()))
    return ports, ca


def run(h):
    ports, ca = start_peers(h)
    egressd = h.egressd(h.render("egressd.yaml", CA=ca, **ports))
    host, port = egressd.listener("default/sidecar/http")
    proxy = f"http://{host}:{port}"
    # One gRPC call, 10 bytes, in its length-prefixed frame (gRPC over HTTP/2, "Length-Prefixed-Message").
    message = b"hello grpc"
    body = h.tmp / "grpc-request.bin"
    body.write_bytes(b"\x00" + struct.pack(">I", len(message)) + message)
    grpc = ("-d", str(body), "-H", "content-type: application/grpc", "-H", "te: trailers")
    cases = [
        ("hypercorn h2c", "http", "HYPERCORN_H2C", "/", ()),
        ("hypercorn TLS", "https", "HYPERCORN_TLS", "/", ()),
        ("nghttpd h2c", "http", "NGHTTPD_H2C", "/index.html", ()),
        ("nghttpd TLS", "https", "NGHTTPD_TLS", "/index.html", ()),
        ("grpcio h2c", "http", "GRPC_H2C", "/bench.Echo/Unary", grpc),
        ("grpcio TLS", "https", "GRPC_TLS", "/bench.Echo/Unary", grpc),
    ]
    rates = []
    for name, scheme, key, path, extra in cases:
        authority = f"localhost:{ports[key]}"
        served_before = grpc_served(ports["GRPC_H2C"]) if extra else 0
        direct = h2load(f"{scheme}://{authority}{path}", extra=extra)
        served_direct = grpc_served(ports["GRPC_H2C"]) if extra else 0
        through = h2load(f"{proxy}{path}", authority, extra=extra)
        # The peers work at all: a broken setup must not compare equal to itself.
        h.expect(f"{name} direct: all {REQUESTS} succeeded with 2xx", all_ok(direct), direct)
        h.expect(f"{name} through egressd: all {REQUESTS} succeeded with 2xx", all_ok(through), through)
        h.compare(f"{name}: h2load {REQUESTS} requests x {CONNECTIONS} connections x {STREAMS} streams",
                  outcome(direct), outcome(through))
        if extra:
            served_through = grpc_served(ports["GRPC_H2C"])
            h.compare(f"{name}: calls the grpcio server answered",
                      {"calls": REQUESTS}, {"calls": served_through - served_direct})
            h.expect(f"{name} direct: the grpcio server answered every call",
                     served_direct - served_before == REQUESTS, served_direct)
        rates.append((name, direct["req/s"], through["req/s"]))
    print("  throughput, h2load 2000 requests x 10 connections x 10 streams (not asserted):")
    for name, direct, through in rates:
        share = f"{100 * through / direct:.0f}%" if direct else "-"
        print(f"    {name:14} direct {direct:9.0f} req/s   through egressd {through:9.0f} req/s   {share}")
