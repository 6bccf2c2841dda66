#!/usr/bin/env python3
"""The load of benches/interception.sh: TLS clients (Python's ssl, OpenSSL) that reach one
origin through egressd either over an HTTPS listener or through an intercepted CONNECT
tunnel, and egressd's CPU time (utime + stime of /proc/PID/stat, every thread, the blocking
pool's included) over the run.

    interception_client.py --pid PID --path PATH --kind KIND --count N [--threads T] ...

PATH:
  listener     TLS to egressd's HTTPS listener (SNI origin.bench.local), then the request
  intercept    CONNECT origin.bench.local:443 on the HTTP listener, TLS inside the tunnel
               (egressd's leaf for the host, cached after the first), then the request
  intercept-new-host
               the same to a new host each time (hN.bench.local: every leaf minted)
KIND:
  new          N new connections: connect (+ CONNECT), full TLS handshake (no resumption),
               one GET /, read the answer, close
  keepalive    T connections opened first, then N GET / spread over them (not counted in the
               setup), each answer read before the next request

Prints one tab-separated line: path kind count seconds ops_per_s egressd_cpu_s us_per_op.
Loopback only: every address is 127.0.0.1.
"""

import argparse
import os
import socket
import ssl
import sys
import threading
import time

HOST = "origin.bench.local"


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of stat(5); fields[0] here is field 3.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_head(sock, buf):
    """Reads until the end of a response head: (head, the bytes after it)."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {buf!r}")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    return head, rest


def get(sock, host, buf=b""):
    """GET / on an open connection; the answer's body read whole. Returns the leftover bytes."""
    sock.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    head, rest = read_head(sock, buf)
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"answer: {head[:200]!r}")
    length = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if length is None:
        raise RuntimeError(f"no content-length: {head!r}")
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed in the body")
        rest += chunk
    return rest[length:]


def open_connection(args, ctx, host):
    if args.path == "listener":
        raw = socket.create_connection(("127.0.0.1", args.https_port))
    else:
        raw = socket.create_connection(("127.0.0.1", args.proxy_port))
        raw.sendall(f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n".encode())
        head, rest = read_head(raw, b"")
        if not head.startswith(b"HTTP/1.1 200") or rest:
            raise RuntimeError(f"CONNECT {host}: {head[:300]!r}")
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return ctx.wrap_socket(raw, server_hostname=host)


def host_for(args, i):
    return f"h{i}.bench.local" if args.path == "intercept-new-host" else HOST


def run_new(args, ctx, start, count, errors):
    for i in range(start, start + count):
        host = host_for(args, args.host_offset + i)
        try:
            conn = open_connection(args, ctx, host)
            get(conn, host)
            conn.close()
        except Exception as e:  # counted, the run goes on
            errors.append(f"{host}: {e}")


def run_keepalive(conn, count, errors):
    buf = b""
    try:
        for _ in range(count):
            buf = get(conn, HOST, buf)
    except Exception as e:
        errors.append(str(e))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--path", choices=["listener", "intercept", "intercept-new-host"], required=True)
    p.add_argument("--kind", choices=["new", "keepalive"], required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--proxy-port", type=int, required=True)
    p.add_argument("--https-port", type=int, required=True)
    p.add_argument("--cafile", required=True, help="the bench CA and egressd's interception CA")
    p.add_argument("--host-offset", type=int, default=0, help="first N of hN.bench.local")
    args = p.parse_args()

    ctx = ssl.create_default_context(cafile=args.cafile)
    ctx.set_alpn_protocols(["http/1.1"])
    errors = []
    per_thread = args.count // args.threads
    count = per_thread * args.threads
    if args.kind == "new":
        threads = [
            threading.Thread(target=run_new, args=(args, ctx, t * per_thread, per_thread, errors))
            for t in range(args.threads)
        ]
    else:
        conns = [open_connection(args, ctx, HOST) for _ in range(args.threads)]
        for conn in conns:  # the connections are up and routed before the clock starts
            get(conn, HOST)
        threads = [threading.Thread(target=run_keepalive, args=(c, per_thread, errors)) for c in conns]
    cpu0, t0 = cpu_seconds(args.pid), time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu1, t1 = cpu_seconds(args.pid), time.monotonic()
    if errors:
        print(f"{len(errors)} errors, e.g. {errors[:3]}", file=sys.stderr)
        sys.exit(1)
    secs, cpu = t1 - t0, cpu1 - cpu0
    print(f"{args.path}\t{args.kind}\t{count}\t{secs:.2f}\t{count / secs:.0f}\t{cpu:.2f}\t{cpu / count * 1e6:.1f}")


if __name__ == "__main__":
    main()
