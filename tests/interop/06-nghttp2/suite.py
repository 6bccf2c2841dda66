"""nghttp2: `nghttpd` upstream over h2c and TLS, `nghttp` and `h2load` clients. The same
statuses, bodies and load-test outcome (requests done, succeeded, status classes) through
egressd as direct."""

import hashlib
import os
import re
import shutil
import subprocess

from harness import free_port, port_open, wait_for

NGHTTPD = shutil.which("nghttpd") or "/usr/sbin/nghttpd"


def nghttp(url, authority=None):
    """(status, body sha256, size) of one GET with nghttp."""
    extra = ["-H", f":authority: {authority}"] if authority else []
    head = subprocess.run(["nghttp", "-n", "-v", *extra, url],
                          capture_output=True, text=True, timeout=60)
    status = re.search(r":status: (\d+)", head.stdout)
    body = subprocess.run(["nghttp", *extra, url], capture_output=True, timeout=60).stdout
    return {
        "status": int(status.group(1)) if status else None,
        "sha256": hashlib.sha256(body).hexdigest(),
        "size": len(body),
    }


def h2load(url, authority=None):
    """The outcome lines of a load run: requests done/succeeded/failed, status classes."""
    extra = ["-H", f":authority: {authority}"] if authority else []
    out = subprocess.run(["h2load", "-n", "2000", "-c", "4", "-m", "10", *extra, url],
                         capture_output=True, text=True, timeout=120).stdout
    requests = re.search(r"^requests: .*$", out, re.M)
    statuses = re.search(r"^status codes: .*$", out, re.M)
    return {
        "requests": requests.group(0) if requests else out[-500:],
        "status codes": statuses.group(0) if statuses else None,
    }


def run(h):
    files = h.tmp / "files"
    files.mkdir()
    (files / "big.bin").write_bytes(os.urandom(3 * 1024 * 1024))
    (files / "small.txt").write_text("hello over HTTP/2\n")
    ca, key, cert = h.localhost_certs()
    h2c_port, tls_port = free_port(), free_port()
    h.spawn("nghttpd-h2c", [NGHTTPD, "--no-tls", "-a", "127.0.0.1", "-d", str(files), str(h2c_port)])
    h.spawn("nghttpd-tls", [NGHTTPD, "-a", "127.0.0.1", "-d", str(files), str(tls_port), str(key), str(cert)])
    wait_for("nghttpd listening", lambda: port_open(h2c_port) and port_open(tls_port))

    config = h.render("egressd.yaml", H2C_PORT=h2c_port, TLS_PORT=tls_port, CA=ca)
    egressd = h.egressd(config)
    host, port = egressd.listener("default/sidecar/http")
    proxy = f"http://{host}:{port}"

    for scheme, upstream_port in [("http", h2c_port), ("https", tls_port)]:
        authority = f"localhost:{upstream_port}"
        for name, status in [("small.txt", 200), ("big.bin", 200), ("missing", 404)]:
            direct = nghttp(f"{scheme}://{authority}/{name}")
            # The peers work at all: a broken setup must not compare equal to itself.
            h.expect(f"nghttp {scheme} direct GET {name} is {status}", direct["status"] == status, direct)
            h.compare(
                f"nghttp {scheme} upstream GET {name}",
                direct,
                nghttp(f"{proxy}/{name}", authority),
            )
        direct = h2load(f"{scheme}://{authority}/small.txt")
        h.expect(f"h2load {scheme} direct: all 2000 succeeded", "2000 succeeded" in direct["requests"], direct)
        h.compare(
            f"h2load {scheme} upstream 2000 requests x 4 connections x 10 streams",
            direct,
            h2load(f"{proxy}/small.txt", authority),
        )
