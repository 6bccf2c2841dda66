"""curl with http_proxy (absolute-form) and https_proxy (CONNECT to a Passthrough Backend):
the same status, headers that matter and body bytes as direct, including a 5 MB download
whose tunnel access-log line carries its bytes. Then the same through an egressd that
requires proxy users (Proxy-Authorization: Basic from --proxy-user or the proxy URL): 407
without or with wrong credentials, the direct result with them."""

import hashlib
import json
import os
import ssl
import subprocess
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

from harness import SuiteFailed, wait_for

SIZE = 5 * 1024 * 1024

# `openssl passwd -5 -salt curlsuite curl-secret`: the users file of egressd-users.yaml.
USERS = "curl-user:$5$curlsuite$cI.whaEawLAgknSsdxpimlAGFY.g3gNpzRoqEXXvLWB\n"


def serve(directory, tls=None):
    """A threaded file server on 127.0.0.1 (ephemeral port), in this process."""

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(directory), **kwargs)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def curl(h, url, proxy_env=None, extra=()):
    """(status, body sha256, body size) of one curl download, with the proxy variables
    given (and every inherited one removed)."""
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(proxy_env or {})
    out = h.tmp / "body"
    result = subprocess.run(
        ["curl", "-sS", "--max-time", "60", "-o", str(out), "-w", "%{http_code}", *extra, url],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    if result.returncode != 0:
        return {"curl_exit": result.returncode, "stderr": result.stderr.strip()}
    body = out.read_bytes()
    return {
        "status": int(result.stdout),
        "sha256": hashlib.sha256(body).hexdigest(),
        "size": len(body),
    }


def run(h):
    files = h.tmp / "files"
    files.mkdir()
    (files / "big.bin").write_bytes(os.urandom(SIZE))
    (files / "small.txt").write_text("hello through the proxy\n")

    # A certificate for localhost from the suite's own CA, trusted only by this curl (--cacert).
    ca, key, cert = h.localhost_certs()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    plain = serve(files)
    secure = serve(files, tls=context)
    http_port, https_port = plain.server_address[1], secure.server_address[1]

    access_log = h.tmp / "access.log"
    config = h.render(
        "egressd.yaml", HTTP_PORT=http_port, HTTPS_PORT=https_port, ACCESS_LOG=access_log
    )
    egressd = h.egressd(config)
    host, port = egressd.listener("default/sidecar/http")
    proxy = f"http://{host}:{port}"

    for name, status in [("small.txt", 200), ("big.bin", 200), ("missing", 404)]:
        url = f"http://localhost:{http_port}/{name}"
        direct = curl(h, url)
        # The peers work at all: a broken setup must not compare equal to itself.
        h.expect(f"direct GET {name} is {status}", direct.get("status") == status, direct)
        h.compare(f"http_proxy GET {name}", direct, curl(h, url, {"http_proxy": proxy}))
    for name in ["small.txt", "big.bin"]:
        url = f"https://localhost:{https_port}/{name}"
        tls = ["--cacert", str(ca)]
        direct = curl(h, url, extra=tls)
        h.expect(f"direct HTTPS GET {name} is 200", direct.get("status") == 200, direct)
        h.compare(
            f"https_proxy GET {name}",
            direct,
            curl(h, url, {"https_proxy": proxy}, extra=tls),
        )

    # The 5 MB tunnel's access-log line: written when the tunnel closes, with its bytes.
    def tunnel_lines():
        if not access_log.exists():
            return None
        lines = [json.loads(l) for l in access_log.read_text().splitlines() if l.strip()]
        connects = [l for l in lines if l.get("method") == "CONNECT"]
        return connects if len(connects) >= 2 else None

    connects = wait_for("both CONNECT lines in the access log", tunnel_lines, timeout=10)
    big = max(connects, key=lambda l: l.get("bytes_out", 0))
    h.expect(
        "the 5 MB tunnel's access-log line has its bytes",
        big.get("bytes_out", 0) > SIZE and big.get("backend") == "default/files-https",
        json.dumps(big),
    )
    if not connects:
        raise SuiteFailed("no CONNECT line")

    proxy_users(h, http_port, https_port, ca)


def proxy_users(h, http_port, https_port, ca):
    """Basic proxy authentication as curl does it, for absolute-form requests and CONNECT."""
    users = h.tmp / "proxy-users"
    users.write_text(USERS)
    config = h.render(
        "egressd-users.yaml", HTTP_PORT=http_port, HTTPS_PORT=https_port, USERS_FILE=users
    )
    egressd = h.egressd(config, name="egressd-users")
    host, port = egressd.listener("default/sidecar/http")
    proxy = f"http://{host}:{port}"
    url = f"http://localhost:{http_port}/small.txt"
    direct = curl(h, url)
    refused = curl(h, url, {"http_proxy": proxy})
    h.expect("no credentials: 407", refused.get("status") == 407, refused)
    wrong = curl(h, url, {"http_proxy": proxy}, extra=["--proxy-user", "curl-user:nope"])
    h.expect("wrong password: 407", wrong.get("status") == 407, wrong)
    h.compare(
        "http_proxy GET with --proxy-user",
        direct,
        curl(h, url, {"http_proxy": proxy}, extra=["--proxy-user", "curl-user:curl-secret"]),
    )
    h.compare(
        "http_proxy GET with user:password in the proxy URL",
        direct,
        curl(h, url, {"http_proxy": f"http://curl-user:curl-secret@{host}:{port}"}),
    )
    tls = ["--cacert", str(ca)]
    secure = f"https://localhost:{https_port}/small.txt"
    direct_tls = curl(h, secure, extra=tls)
    h.compare(
        "https_proxy CONNECT with --proxy-user",
        direct_tls,
        curl(
            h,
            secure,
            {"https_proxy": proxy},
            extra=[*tls, "--proxy-user", "curl-user:curl-secret"],
        ),
    )
    tunnel_refused = curl(h, secure, {"https_proxy": proxy}, extra=tls)
    h.expect(
        "CONNECT without credentials fails (curl: 407 from the proxy)",
        "curl_exit" in tunnel_refused,
        tunnel_refused,
    )
