"""HTTPS interception (docs/interception.md): third-party clients keep their https:// and
wss:// URLs and use egressd as their HTTPS proxy; each runs twice, straight to the upstream
(trusting the upstream's own CA, made by the harness) and through egressd (trusting only the
interception CA, made by `egressd ca init`), and the results must be the same. The upstreams
are real servers for `localhost` on 127.0.0.1 ephemeral ports; egressd's Backends originate
TLS to them, verified against their CA (egressd.yaml).

- Python `requests` and `httpx` (HTTP/1.1, and HTTP/2 with `http2=True`: egressd offers h2 in
  the intercepted handshake): GET with a query, POST, a 64 KiB PUT, a 1 MiB download, a 404
  and a DELETE in one session; egressd's access log has each as an `"intercepted": true` line
  with its method, path and status, and the upstream saw the Backend's injected `x-api-key` on
  every request through egressd and on none direct.
- The MCP Python SDK's client (httpx2 with `proxy=` and `verify=`) against the SDK's server over
  TLS, in both its modes (initialize handshake; 2026-07-28 discovery): tools/list and
  tools/call the same; through a Backend whose tool policy denies `launch_codes` the tool is
  missing from tools/list and its call fails with -32602, never reaching the server.
- `websockets` to a wss:// echo server (the library's own `proxy=`): the handshake, what the
  server saw, echoes of 0 B to 1 MiB, a fragmented message, a ping, the server's close code.
- Node's fetch with undici's EnvHttpProxyAgent (HTTP_PROXY/HTTPS_PROXY): an http:// Backend
  (InsecureDisable), which undici reaches by `CONNECT` too, served as plain HTTP inside the
  tunnel; and the https:// one with NODE_EXTRA_CA_CERTS.
- `pip download` (pip 23.2.1, the venv's) of a wheel made here from a static "simple" index
  served over TLS: the same file (sha256), and the index requests in the access log.
- `requests` trusting only the upstream's CA fails through egressd (it refuses egressd's
  certificate) and succeeds direct; egressd counts it in
  `egressd_interception_handshake_failures_total{reason}`.
"""

import base64
import hashlib
import json
import os
import random
import re
import shutil
import ssl
import subprocess
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer

from harness import CACHE, INTEROP, SuiteFailed, wait_for

HERE = INTEROP / "10-interception"
PEER = HERE / "peer.py"
PYTHON = CACHE / "10-interception" / "venv" / "bin" / "python"
NODE_DIR = CACHE / "10-interception" / "node"
API_KEY = "k-7f3a-interop-secret"
DENIED = "launch_codes"
WHEEL = "interop_tiny-1.0.0-py3-none-any.whl"
# peer.py's SEQUENCE, as the upstream answers it and egressd's access log names it.
SEQUENCE = [("GET", "/hello?lang=en&n=1", 200), ("POST", "/items", 201),
            ("PUT", "/items/7", 200), ("GET", "/big", 200), ("GET", "/missing", 404),
            ("DELETE", "/items/7", 200)]
UNDICI = [("GET", "/hello?from=undici", 200), ("POST", "/items", 201),
          ("PUT", "/items/9", 200), ("GET", "/missing", 404)]


# -- upstreams in this process -----------------------------------------------------------------

class Echo(BaseHTTPRequestHandler):
    """Answers with what it was asked (JSON), /big with 1 MiB, /missing with 404; records
    (method, path, x-api-key) of every request in `server.seen`."""

    protocol_version = "HTTP/1.1"
    BIG = random.Random(1).randbytes(1 << 20)

    def log_message(self, *args):
        pass

    def body(self):
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                chunk = self.rfile.read(size + 2)[:size]
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return data
                data += chunk
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def answer(self):
        body = self.body()
        self.server.seen.append((self.command, self.path, self.headers.get("x-api-key")))
        if self.path.startswith("/missing"):
            status, kind, out = 404, "text/plain", b"no such thing\n"
        elif self.path == "/big":
            status, kind, out = 200, "application/octet-stream", self.BIG
        else:
            status, kind = (201 if self.command == "POST" else 200), "application/json"
            out = json.dumps({
                "method": self.command,
                "path": self.path,
                "host": self.headers.get("host"),
                "content-type": self.headers.get("content-type"),
                "body sha256": hashlib.sha256(body).hexdigest(),
                "body size": len(body),
            }, sort_keys=True).encode()
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_DELETE = answer


def serve(handler, tls=None):
    """A threaded server on 127.0.0.1 (ephemeral port) in this process, TLS when given."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.seen = []
    if tls:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def package_index(root):
    """A static PEP 503 index of one wheel made here: simple/interop-tiny/ and packages/."""
    files = {
        "interop_tiny/__init__.py": b"VALUE = 42\n",
        "interop_tiny-1.0.0.dist-info/METADATA":
            b"Metadata-Version: 2.1\nName: interop-tiny\nVersion: 1.0.0\n"
            b"Summary: a wheel the interop suite serves\n",
        "interop_tiny-1.0.0.dist-info/WHEEL":
            b"Wheel-Version: 1.0\nGenerator: egressd-interop\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n",
    }
    digest = lambda d: base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode()
    record = "".join(f"{n},sha256={digest(d)},{len(d)}\n" for n, d in files.items())
    files["interop_tiny-1.0.0.dist-info/RECORD"] = (
        record + "interop_tiny-1.0.0.dist-info/RECORD,,\n"
    ).encode()
    (root / "packages").mkdir(parents=True)
    (root / "simple" / "interop-tiny").mkdir(parents=True)
    with zipfile.ZipFile(root / "packages" / WHEEL, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0)), data)
    wheel_sha = hashlib.sha256((root / "packages" / WHEEL).read_bytes()).hexdigest()
    (root / "simple" / "index.html").write_text(
        '<!DOCTYPE html><html><body><a href="interop-tiny/">interop-tiny</a></body></html>\n')
    (root / "simple" / "interop-tiny" / "index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="../../packages/{WHEEL}#sha256={wheel_sha}">'
        f"{WHEEL}</a></body></html>\n")
    return wheel_sha


def index_handler(root):
    class Index(SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args):
            pass

    return Index


# -- clients -------------------------------------------------------------------------------

# Trust settings a machine may export (they would override a client's own `--cert`: requests,
# and so pip, prefers REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE to the session's `verify`).
TRUST_VARIABLES = {"NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE",
                   "SSL_CERT_DIR"}


def clean_env(extra=None):
    """The environment without proxy variables, trust variables or PIP_* settings; NO_PROXY
    empty (nothing skips the proxy for localhost); then `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.lower().endswith("_proxy") and k not in TRUST_VARIABLES
           and not k.startswith("PIP_")}
    env.update({"NO_PROXY": "", "no_proxy": ""}, **(extra or {}))
    return env


def peer(*args):
    """peer.py's facts (one JSON document)."""
    argv = [str(PYTHON), str(PEER), *map(str, args)]
    done = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        raise SuiteFailed(f"peer.py {' '.join(map(str, args))}: exit {done.returncode}\n"
                          f"{done.stderr[-4000:]}")
    return json.loads(done.stdout)


def node_fetch(bases, ca, proxy=None):
    env = {"NODE_EXTRA_CA_CERTS": str(ca)}
    if proxy:
        env.update({"HTTP_PROXY": proxy, "HTTPS_PROXY": proxy,
                    "http_proxy": proxy, "https_proxy": proxy})
    done = subprocess.run(["node", "fetch.mjs", *bases], cwd=NODE_DIR, env=clean_env(env),
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise SuiteFailed(f"node fetch.mjs: exit {done.returncode}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)


def pip_download(h, index_port, ca, label, proxy=None):
    """`pip download` of interop-tiny from the TLS index: pip's exit and the files it wrote."""
    dest = h.tmp / f"pip-{label}"
    argv = [str(PYTHON), "-m", "pip", "download", "--isolated", "--no-deps", "--no-cache-dir",
            "--disable-pip-version-check", "--retries", "0", "--index-url",
            f"https://localhost:{index_port}/simple/", "--cert", str(ca), "-d", str(dest)]
    if proxy:
        argv += ["--proxy", proxy]
    done = subprocess.run([*argv, "interop-tiny==1.0.0"], env=clean_env(), capture_output=True,
                          text=True, timeout=120)
    files = sorted(
        [p.name, hashlib.sha256(p.read_bytes()).hexdigest()] for p in dest.glob("*")
    ) if dest.exists() else []
    return {"exit": done.returncode, "files": files,
            **({"stderr": done.stderr[-1500:]} if done.returncode else {})}


# -- egressd's records ---------------------------------------------------------------------

def log_records(path):
    """The access log's lines (JSON), but a last one still being written."""
    records = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            records.append(json.loads(line))
        except ValueError:
            pass
    return records


def access_lines(path, backend):
    """Access-log lines of `backend` as (method, path, status, intercepted); the log's path
    has no query."""
    lines = log_records(path)
    return [(l.get("method"), l.get("path"), l.get("status"), l.get("intercepted", False))
            for l in lines if l.get("backend") == f"default/{backend}"]


def logged(h, access_log, name, backend, before, expected):
    """Check: after `before` lines of `backend`, the access log has `expected` lines
    (method, path, status), each intercepted. Waits (bounded) for the writer."""
    want = [(m, p.split("?")[0], s, True) for m, p, s in expected]
    try:
        wait_for(f"{name}: access log", lambda: len(access_lines(access_log, backend)) >=
                 before + len(want), timeout=10)
    except SuiteFailed:
        pass
    got = access_lines(access_log, backend)[before:]
    h.expect(name, sorted(got) == sorted(want), {"logged": got, "expected": want})


def counters(egressd, name, label):
    """The counter `name` from egressd's /metrics, by the value of `label`."""
    out = {}
    for line in egressd.get("/metrics").splitlines():
        found = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if found:
            value = re.search(rf'{label}="([^"]*)"', found.group(1))
            out[value.group(1) if value else found.group(1)] = float(found.group(2))
    return out


def handshake_failures(egressd):
    return counters(egressd, "egressd_interception_handshake_failures_total", "reason")


def tunnels(egressd):
    """egressd_intercepted_tunnels_total by tls ("true": intercepted TLS; "false": plaintext)."""
    return counters(egressd, "egressd_intercepted_tunnels_total", "tls")


def wait_port_file(h, proc, path):
    def ports():
        if proc.poll() is not None:
            raise SuiteFailed(f"{proc.name} exited:\n{h.log_of(proc)}")
        return path.exists() and json.loads(path.read_text())

    return wait_for(f"{proc.name}'s ports", ports)


# -- the scenarios -------------------------------------------------------------------------

def http_libraries(h, w):
    base = f"https://localhost:{w['api'].server_address[1]}"
    seen = w["api"].seen
    statuses = [s for _, _, s in SEQUENCE]
    for library in ["requests", "httpx", "httpx-h2"]:
        mark = len(seen)
        direct = peer("http", library, base, w["ca"])
        direct_keys = [k for _, _, k in seen[mark:]]
        h.expect(f"{library} direct: statuses as the upstream answers, over HTTP/1.1",
                 [r.get("status") for r in direct["responses"]] == statuses
                 and direct["versions"] == ["HTTP/1.1"], direct)
        before = len(access_lines(w["log"], "api"))
        mark = len(seen)
        through = peer("http", library, base, w["egressd_ca"], w["proxy"])
        through_keys = [k for _, _, k in seen[mark:]]
        h.compare(f"{library} through HTTPS_PROXY: GET, POST, PUT 64 KiB, GET 1 MiB, 404, "
                  "DELETE (status, content-type, body)", direct["responses"],
                  through["responses"])
        # egressd offers h2 in the intercepted handshake (the upstream speaks HTTP/1.1 only).
        version = "HTTP/2" if library.endswith("h2") else "HTTP/1.1"
        h.expect(f"{library} through egressd: {version} inside the tunnel",
                 through["versions"] == [version], through["versions"])
        h.expect(f"{library}: the upstream saw the injected x-api-key only through egressd",
                 direct_keys == [None] * len(SEQUENCE)
                 and through_keys == [API_KEY] * len(SEQUENCE),
                 {"direct": direct_keys, "through": through_keys})
        logged(h, w["log"], f"{library}: access log has each request, \"intercepted\": true",
               "api", before, SEQUENCE)


def untrusted(h, w):
    """A client that trusts only the upstream's CA: egressd's certificate is refused."""
    base = f"https://localhost:{w['api'].server_address[1]}"
    direct = peer("http", "requests", base, w["ca"])
    h.expect("requests trusting only the upstream's CA: direct works",
             [r.get("status") for r in direct["responses"]] == [s for _, _, s in SEQUENCE],
             direct)
    before = handshake_failures(w["egressd"])
    mark = len(w["api"].seen)
    through = peer("http", "requests", base, w["ca"], w["proxy"])
    h.expect("requests trusting only the upstream's CA: fails through egressd (SSLError)",
             all(r.get("failed") == "SSLError" for r in through["responses"]), through)
    h.expect("... and nothing of it reached the upstream", len(w["api"].seen) == mark,
             w["api"].seen[mark:])
    rose = lambda: {r: v - before.get(r, 0) for r, v in handshake_failures(w["egressd"]).items()
                    if v > before.get(r, 0)}
    try:
        wait_for("the handshake-failure counter", rose, timeout=10)
    except SuiteFailed:
        pass
    increase = rose()
    h.expect("egressd_interception_handshake_failures_total{reason=\"unknown_ca\"} rose by one "
             "per refused connection", increase == {"unknown_ca": len(SEQUENCE)},
             {"increase": increase, "before": before})


def mcp(h, w):
    ports = w["mcp"]
    server = w["mcp_server"]
    calls = lambda: h.log_of(server).count(f"CALLED {DENIED}")
    url = lambda port: f"https://localhost:{port}/mcp"
    direct = peer("mcp", url(ports["open"]), w["ca"])
    every = sorted(["add", "echo", DENIED])
    for mode, facts in direct.items():
        h.expect(f"MCP direct ({mode}): tools/list and every call answered",
                 facts.get("tools/list") == every and facts.get("add", {}).get("text") == "42"
                 and facts.get(DENIED, {}).get("text") == "0000", facts)
    through = peer("mcp", url(ports["open"]), w["egressd_ca"], w["proxy"])
    for mode in direct:
        h.compare(f"MCP SDK ({mode}) through HTTPS_PROXY: tools/list, tools/call, errors, HTTP "
                  "statuses", direct[mode], through.get(mode))

    direct = peer("mcp", url(ports["policy"]), w["ca"])
    before = calls()
    through = peer("mcp", url(ports["policy"]), w["egressd_ca"], w["proxy"])
    for mode in direct:
        d, t = direct[mode], through.get(mode, {})
        h.compare(f"MCP SDK ({mode}), Backend denying {DENIED}: allowed tools answer the same",
                  [d.get(k) for k in ["protocol_version", "add", "echo", "unknown tool"]],
                  [t.get(k) for k in ["protocol_version", "add", "echo", "unknown tool"]])
        h.expect(f"MCP SDK ({mode}): {DENIED} works direct, but through egressd is not listed "
                 "and its call is refused with -32602",
                 d.get(DENIED, {}).get("text") == "0000"
                 and t.get("tools/list") == ["add", "echo"]
                 and t.get(DENIED) == {"error_code": -32602},
                 {"direct": d, "through": t})
    h.expect(f"MCP: no {DENIED} call reached the server through egressd", calls() == before,
             calls() - before)
    def denied_lines():
        return [l for l in log_records(w["log"]) if l.get("backend") == "default/mcp-policy"
                and l.get("mcp_tool") == DENIED]

    try:
        wait_for("the denied calls in the access log", lambda: len(denied_lines()) >= 2,
                 timeout=10)
    except SuiteFailed:
        pass
    denied = denied_lines()
    h.expect("MCP: the access log has the denied calls, intercepted, error mcp_tool_denied",
             len(denied) == 2 and all(l.get("intercepted") and l.get("error") == "mcp_tool_denied"
                                      for l in denied), denied)


def websockets(h, w):
    uri = f"wss://localhost:{w['wss']}/chat?room=1"
    direct = peer("ws", uri, w["ca"])
    h.expect("websockets direct: 101, chat.v2, every echo the same as sent, server closes 4001",
             direct.get("handshake", {}).get("status") == 101
             and direct["handshake"].get("subprotocol") == "chat.v2"
             and all(e["same as sent"] for e in direct.get("echoes", []))
             and direct.get("server closed", {}).get("code") == 4001, direct)
    through = peer("ws", uri, w["egressd_ca"], w["proxy"])
    h.compare("websockets wss:// through proxy=: handshake, request seen, echoes 0 B..1 MiB, "
              "fragments, ping, close", direct, through)


def undici(h, w):
    plain = f"http://localhost:{w['plain'].server_address[1]}"
    secure = f"https://localhost:{w['api'].server_address[1]}"
    mark = len(w["plain"].seen)
    direct = node_fetch([plain, secure], w["ca"])
    direct_keys = [k for _, _, k in w["plain"].seen[mark:]]
    h.expect("undici direct: statuses as the upstream answers",
             all([r.get("status") for r in rs] == [s for _, _, s in UNDICI]
                 for rs in direct.values()), direct)
    before = {b: len(access_lines(w["log"], b)) for b in ["plain", "api"]}
    tunnels_before = tunnels(w["egressd"])
    mark = len(w["plain"].seen)
    through = node_fetch([plain, secure], w["egressd_ca"], w["proxy"])
    tunnels_after = tunnels(w["egressd"])
    through_keys = [k for _, _, k in w["plain"].seen[mark:]]
    for key in direct:
        h.compare(f"undici EnvHttpProxyAgent {key}: GET, POST, PUT 256 KiB, 404",
                  direct[key], through.get(key))
    h.expect("undici http://: the upstream saw the injected x-api-key only through egressd",
             direct_keys == [None] * len(UNDICI) and through_keys == [API_KEY] * len(UNDICI),
             {"direct": direct_keys, "through": through_keys})
    logged(h, w["log"], "undici http:// (CONNECT to a plaintext port): access log, intercepted",
           "plain", before["plain"], UNDICI)
    logged(h, w["log"], "undici https://: access log, intercepted", "api", before["api"], UNDICI)
    opened = {k: v - tunnels_before.get(k, 0) for k, v in tunnels_after.items()}
    h.expect("undici: egressd_intercepted_tunnels_total rose for tls=\"false\" (http://) and "
             "tls=\"true\" (https://)", opened.get("false", 0) >= 1 and opened.get("true", 0) >= 1,
             {"before": tunnels_before, "after": tunnels_after})


def pip(h, w):
    port = w["index"].server_address[1]
    direct = pip_download(h, port, w["ca"], "direct")
    h.expect("pip download direct: the wheel, its sha256 as the index says",
             direct == {"exit": 0, "files": [[WHEEL, w["wheel_sha"]]]}, direct)
    before = len(access_lines(w["log"], "index"))
    through = pip_download(h, port, w["egressd_ca"], "through", w["proxy"])
    h.compare("pip download --proxy: the same wheel (sha256)", direct, through)
    logged(h, w["log"], "pip download: the index requests in the access log, intercepted",
           "index", before,
           [("GET", "/simple/interop-tiny/", 200), ("GET", f"/packages/{WHEEL}", 200)])


def world(h):
    """The upstreams, both CAs and egressd: what the scenarios share."""
    ca, key, cert = h.localhost_certs()
    ca_dir = h.tmp / "interception-ca"
    made = subprocess.run([h.egressd_binary, "ca", "init", str(ca_dir)], capture_output=True,
                          text=True, timeout=60)
    if made.returncode != 0:
        raise SuiteFailed(f"egressd ca init: {made.stdout}{made.stderr}")
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    index_root = h.tmp / "index"
    w = {"ca": ca, "egressd_ca": ca_dir / "ca.crt", "log": h.tmp / "access.log",
         "wheel_sha": package_index(index_root)}
    w["api"], w["plain"] = serve(Echo, tls), serve(Echo)
    w["index"] = serve(index_handler(index_root), tls)

    ws_ports = h.tmp / "ws-ports.json"
    ws_server = h.spawn("ws-server", [str(PYTHON), str(PEER), "ws-server", str(ws_ports),
                                      str(cert), str(key)])
    mcp_ports = h.tmp / "mcp-ports.json"
    w["mcp_server"] = h.spawn("mcp-server", [str(PYTHON), str(PEER), "mcp-server",
                                             str(mcp_ports), str(cert), str(key)])
    w["wss"] = wait_port_file(h, ws_server, ws_ports)["wss"]
    w["mcp"] = wait_port_file(h, w["mcp_server"], mcp_ports)
    shutil.copy(HERE / "fetch.mjs", NODE_DIR / "fetch.mjs")  # next to node_modules

    key_file = h.tmp / "api-key"
    key_file.write_text(API_KEY)
    config = h.render(
        "egressd.yaml", ACCESS_LOG=w["log"], CA_DIR=ca_dir, UPSTREAM_CA=ca,
        API_KEY_FILE=key_file, API_PORT=w["api"].server_address[1],
        PLAIN_PORT=w["plain"].server_address[1], INDEX_PORT=w["index"].server_address[1],
        WSS_PORT=w["wss"], MCP_OPEN_PORT=w["mcp"]["open"], MCP_POLICY_PORT=w["mcp"]["policy"],
    )
    w["egressd"] = h.egressd(config)
    host, port = w["egressd"].listener("default/sidecar/http")
    w["proxy"] = f"http://{host}:{port}"
    return w


def run(h):
    w = world(h)
    http_libraries(h, w)
    mcp(h, w)
    websockets(h, w)
    undici(h, w)
    pip(h, w)
    untrusted(h, w)
