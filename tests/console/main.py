"""The console in headless Chromium, asserted on what a person would see.

Starts egressd (its own binary, `--no-watch`) on a config with 1,006 Backends: `shop` has two
endpoints, one of which refuses connections, so outlier detection ejects it; `checked` fails
its active checks; `warming` is in slow start; `flaky` answers 500 to half its requests; a
Report EgressPolicy would deny the test's client `search`; 1,000 more nobody uses. A request for
an undeclared host is refused (RegistryOnly), and a config file quoting markup in a key is
added and SIGHUP sent, so the reload is rejected. Then `chromium --dump-dom` renders `/` and
the DOM is checked: the rejected reload with its error at file:line:column and the markup as
text, the ejected endpoint above every healthy one, the problems in order, rates, paging and
the filter, the blocked host with its Backend YAML, and no CSP violation or script error in
Chromium's log. A screenshot is kept at target/console/console.png. Then the page is driven
over the DevTools protocol (cdp.py): Copy puts the YAML on the clipboard, Pause stops polling,
Resume starts it.
"""

import html
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Event, Thread

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "interop"))
from harness import Harness, SuiteFailed, wait_for  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cdp  # noqa: E402

OUT = ROOT / "target" / "console"
HOSTILE = "<img src=x onerror=alert(1)>"


class Hello(BaseHTTPRequestHandler):
    """200 `hello`; 500 for paths under /fail."""

    def do_GET(self):
        body = b"hello\n"
        self.send_response(500 if self.path.startswith("/fail") else 200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def backend(name, addresses, port, extra=""):
    endpoints = ", ".join(f"{{address: {a}}}" for a in addresses)
    return f"""---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata: {{name: {name}}}
spec:
  destination:
    type: IP
    ip: {{endpoints: [{endpoints}]}}
    ports: [{{number: {port}}}]
  tls: {{mode: InsecureDisable}}
{extra}"""


def route(host, name):
    return f"""---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}}}
spec:
  hostnames: [{host}]
  rules: [{{backendRefs: [{{name: {name}}}]}}]
"""


def config(port):
    head = """apiVersion: egressd.dev/v1alpha1
kind: ProxyConfig
metadata: {name: egressd}
spec:
  accessLog: {enabled: false}
  # Nothing listens on port 1: Redis is down, and the page says so.
  rateLimit: {redis: {address: "127.0.0.1:1"}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  listeners:
  - {name: http, address: 127.0.0.1, port: 0, protocol: HTTP}
"""
    # 127.0.0.2 is loopback too, but nothing listens there: connect refused, a gateway error.
    shop = backend("shop", ["127.0.0.1", "127.0.0.2"], port, """  trafficPolicy:
    retry: {numRetries: 0}
    healthCheck:
      passive: {interval: 100ms, consecutiveGatewayErrors: 2, baseEjectionTime: 600s, maxEjectionPercent: 50}
""")
    # Only clients in 10.99/16 may reach search, in Report mode: 127.0.0.1 gets through and is
    # listed as would_deny.
    policy = """---
apiVersion: egressd.dev/v1alpha1
kind: EgressPolicy
metadata: {name: search-clients}
spec:
  mode: Report
  clients: {cidrs: ["10.99.0.0/16"]}
  to: {backendRefs: [{name: search}]}
"""
    # An endpoint failing its active checks (the upstream answers /fail with 500), and one
    # ramping up in slow start for ten minutes.
    checked = backend("checked", ["127.0.0.1"], port, """  trafficPolicy:
    healthCheck:
      active: {type: HTTP, interval: 100ms, timeout: 1s, unhealthyThreshold: 1, http: {path: /fail}}
""")
    warming = backend("warming", ["127.0.0.1"], port, """  trafficPolicy:
    loadBalancer: {type: LeastRequest, slowStart: {window: 600s}}
""")
    # A wildcard Backend: each host a client names is a row of its own (`*.localhost` names
    # resolve to loopback without a DNS server).
    wild = f"""---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata: {{name: wild}}
spec:
  destination:
    type: FQDN
    fqdn: {{hostname: "*.apps.localhost"}}
    ports: [{{number: {port}}}]
  tls: {{mode: InsecureDisable}}
"""
    # Many healthy Backends nobody uses: the page pages them, problems still on top.
    filler = "".join(backend(f"api-{i:04}", ["127.0.0.1"], port) for i in range(FILLER))
    return (head + shop + route("shop.example", "shop")
            + backend("flaky", ["127.0.0.1"], port) + route("flaky.example", "flaky")
            + backend("ledger", ["127.0.0.1"], port, LEDGER_LIMITS) + route("ledger.example", "ledger")
            + backend("search", ["127.0.0.1"], port) + route("search.example", "search")
            + checked + warming + policy + wild + filler)


# ledger's rate limits: a local rule the traffic below uses, and a global one Redis (down)
# cannot decide on (failureMode Open: requests pass).
LEDGER_LIMITS = """  trafficPolicy:
    rateLimit:
      local: {rules: [{name: ledger-per-hour, limit: {requests: 100000, unit: Hour}}]}
      global: {rules: [{name: ledger-everywhere, limit: {requests: 600, unit: Minute}}]}
"""

FILLER = 1000
# The rows of the Backends table: shop, flaky, ledger, search, checked, warming, the filler,
# and the wildcard Backend's port with its one host.
PORTS = FILLER + 8


# The rejected file: a key quoting markup, on line 7, column 3.
BROKEN = f"""apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata: {{name: broken}}
spec:
  destination:
    type: FQDN
  "{HOSTILE}": true
"""
BROKEN_POSITION = "broken.yaml:7:3"


def send(listener, host, path="/"):
    req = urllib.request.Request(f"http://{listener[0]}:{listener[1]}{path}", headers={"Host": host})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError as e:
        return str(e)


def chromium(*args):
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if not binary:
        raise SuiteFailed("chromium is not installed (tests/console/run installs it with apt-get)")
    profile = tempfile.mkdtemp(prefix="console-chromium-")
    argv = [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", f"--user-data-dir={profile}", "--virtual-time-budget=8000",
            "--enable-logging=stderr", "--v=0", *args]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    shutil.rmtree(profile, ignore_errors=True)
    if out.returncode != 0:
        raise SuiteFailed(f"chromium exited {out.returncode}:\n{out.stderr[-3000:]}")
    return out.stdout, out.stderr


def visible_text(dom):
    """The DOM's text, tags removed, entities decoded, whitespace squeezed."""
    body = dom.split("<body", 1)[-1]
    text = re.sub(r"<[^>]*>", " ", body)
    return re.sub(r"\s+", " ", html.unescape(text))


def run(h):
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    Thread(target=upstream.serve_forever, daemon=True).start()
    port = upstream.server_address[1]

    conf = h.tmp / "config"
    conf.mkdir()
    (conf / "egressd.yaml").write_text(config(port))
    check = subprocess.run([h.egressd_binary, "validate", str(conf)], capture_output=True, text=True, timeout=60)
    if check.returncode != 0:
        raise SuiteFailed(f"egressd validate:\n{check.stdout}{check.stderr}")
    address_file = h.tmp / "admin"
    proc = h.spawn("egressd", [h.egressd_binary, "run", "--config", str(conf), "--no-watch",
                               "--admin-address", "127.0.0.1:0", "--admin-address-file", str(address_file)])
    admin = wait_for("egressd's admin address", lambda: address_file.exists() and address_file.read_text().strip())

    def get(path):
        with urllib.request.urlopen(f"http://{admin}{path}", timeout=5) as r:
            return r.read().decode()

    def ready():
        if proc.poll() is not None:
            raise SuiteFailed(f"egressd exited:\n{h.log_of(proc)}")
        try:
            return get("/ready")
        except OSError:
            return None

    wait_for("egressd ready", ready)
    status = json.loads(get("/status"))
    host, lport = next(l["address"] for l in status["listeners"] if l["name"] == "default/gw/http").rsplit(":", 1)
    listener = (host, int(lport))

    # Traffic: shop until its dead endpoint is ejected; the others a few times.
    def shop_ejected():
        for _ in range(4):
            send(listener, "shop.example")
        ports = json.loads(get("/endpoints"))["backends"]
        shop = next(p for p in ports if p["backend"].endswith("/shop"))
        return any(e["health"] == "ejected" for e in shop["endpoints"])

    wait_for("shop's dead endpoint ejected", shop_ejected, timeout=30, interval=0.2)

    def checked_failing():
        ports = json.loads(get("/endpoints"))["backends"]
        checked = next(p for p in ports if p["backend"].endswith("/checked"))
        return checked["endpoints"][0]["health"] == "unhealthy"

    wait_for("checked's endpoint failing its active checks", checked_failing, timeout=30, interval=0.2)
    h.expect("ledger answers", send(listener, "ledger.example") == 200)
    h.expect("search answers (Report mode lets the client through)", send(listener, "search.example") == 200)
    h.expect("flaky answers 500 on /fail", send(listener, "flaky.example", "/fail") == 500)
    h.expect("an undeclared host is refused", send(listener, "blocked.example.com") == 403)
    h.expect("a wildcard Backend's host answers", send(listener, f"orders.apps.localhost:{port}") == 200)
    # Markup as a Host is no host name: 400 before anything records it, so it never reaches
    # /blocked (the page is checked below for config text that does quote markup).
    h.expect("a Host of markup is refused with 400", send(listener, HOSTILE) == 400)
    h.expect("and is not recorded in /blocked", HOSTILE not in get("/blocked"))

    # A rejected reload.
    (conf / "broken.yaml").write_text(BROKEN)
    os.kill(proc.pid, signal.SIGHUP)
    wait_for("the reload rejected",
             lambda: json.loads(get("/status"))["lastReload"]["result"] == "failure")

    # Curl still gets text.
    h.expect("curl gets the text index", "/status" in get("/"))

    # Traffic while the browser polls, so that it has rates to show: flaky fails 1 in 2.
    stop = Event()

    def traffic():
        while not stop.is_set():
            send(listener, "ledger.example")
            send(listener, "flaky.example", "/fail")
            send(listener, "flaky.example")
            stop.wait(0.05)

    sender = Thread(target=traffic, daemon=True)
    sender.start()
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        started = time.monotonic()
        dom, log = chromium("--dump-dom", f"http://{admin}/")
        took = time.monotonic() - started
        (OUT / "console.html").write_text(dom)
        filtered, _ = chromium("--dump-dom", f"http://{admin}/#filter=api-0999")
        wild_rows, _ = chromium("--dump-dom", f"http://{admin}/#filter=default/wild")
        chromium(f"--screenshot={OUT / 'console.png'}", "--window-size=1280,1600", f"http://{admin}/")
    finally:
        stop.set()
        sender.join(timeout=10)
    text = visible_text(dom)
    print(f"  (chromium rendered {PORTS} Backend ports in {took:.1f}s)")

    h.expect("the page rendered (not stuck loading)", "loading…" not in text and "READY" in text, text[:300])
    h.expect("the rejected reload is shown", "RELOAD REJECTED" in text, text[:500])
    h.expect("it says what still serves", "still serving generation 1" in text, text[:500])
    h.expect(f"the error at {BROKEN_POSITION}", BROKEN_POSITION in text,
             re.findall(r"broken\.yaml:\d+:\d+", text))
    h.expect("the markup in the error is text", HOSTILE in text and html.escape(HOSTILE, quote=False) in dom,
             "not found as text")
    h.expect("and no element was made from it", "<img" not in dom.lower(), "an <img> is in the DOM")
    h.expect("the listener with its address and protocol",
             f"default/gw/http {host}:{lport} HTTP" in text, text[:800])
    backends = text.split("Backends", 1)[-1].split("Refused destinations", 1)[0]
    first_ejected = backends.find("EJECTED")
    first_healthy = backends.find("HEALTHY")
    h.expect("an endpoint is EJECTED, with its time left and reason",
             first_ejected >= 0 and re.search(r"ejected, \d+m\d+s left \(consecutive_gateway_errors\)", backends),
             backends[:600])
    h.expect("the ejected endpoint is above every healthy one",
             0 <= first_ejected < first_healthy and backends.find("127.0.0.2:") < backends.find("default/api-0000"),
             backends[:600])
    h.expect("an endpoint failing active checks, under the ejected one",
             re.search(r"FAILING CHECKS default/checked : \d+ 127\.0\.0\.1:\d+ active checks failing", backends)
             and first_ejected < backends.find("FAILING CHECKS"), backends[:1500])
    h.expect("an endpoint in slow start, above the OK ones",
             re.search(r"SLOW START default/warming : \d+ .*slow start: weight [\d.]+ of \d+, ready for \d+s", backends)
             and backends.find("SLOW START") < backends.find("OK default/"), backends[:1500])
    h.expect("a Backend with failing requests shows ERRORS, under the ejection and above the OK ones",
             0 <= first_ejected < backends.find("ERRORS default/flaky") < backends.find("OK default/"),
             backends[:1500])
    flaky = re.search(r"default/flaky : \d+ .*? \d+ (\d+\.\d\d) (\d+) of (\d+) \(", backends)
    h.expect("with a request rate and errors measured over successive polls",
             flaky and float(flaky.group(1)) > 0 and 0 < int(flaky.group(2)) <= int(flaky.group(3)),
             backends[:1500])
    h.expect("a line on top says what needs a look",
             re.search(r"ATTENTION last reload rejected · 1 endpoint ejected · 1 endpoint failing active checks · rate limit Redis down · 3 Backend ports with problems · 1 refused destination · 1 destination let through but reported", text),
             text[:300])
    limits = text.split("Rate limits", 1)[-1].split("Backends", 1)[0]
    h.expect("Redis of the global rate limits is shown down, with its error",
             re.search(r"REDIS DOWN 127\.0\.0\.1:1 — \S", limits), limits[:400])
    h.expect("each rate limit rule with its use against its limit",
             re.search(r"Backend default/ledger backend default/ledger ledger-per-hour local ([1-9]\d*) 100000 per hour", limits)
             and "ledger-everywhere global — (in Redis) 600 per minute" in limits, limits[:600])
    h.expect("a port nothing was sent to shows no error count (not \"0 of 0\")",
             re.search(r"OK default/api-0000 : \d+ 127\.0\.0\.1:\d+ 0 [\d.]+ — conn", backends)
             and " 0 of 0" not in backends, backends[:1500])
    h.expect(f"{PORTS} Backend ports, paged", f"{PORTS} Backend ports · page 1 of" in text, backends[:300])
    wild = visible_text(wild_rows).split("Backends", 1)[-1].split("Refused destinations", 1)[0]
    h.expect("a wildcard Backend's host is a row of its own, under its port, which is no problem",
             re.search(rf"OK default/wild : {port} 0 endpoints, 1 wildcard hosts .*"
                       rf"OK default/wild : {port} \(orders\.apps\.localhost\) 127\.0\.0\.1:{port}", wild)
             and "NO ENDPOINTS" not in wild, wild[:600])
    h.expect("the client a Report policy would deny, with the policy",
             re.search(r"WOULD DENY search\.example:\d+ .* client 127\.0\.0\.1 · policy \S*search-clients", text),
             text[-2500:])
    h.expect("the blocked host is listed", "BLOCKED blocked.example.com:80" in text, text[-1500:])
    h.expect("with the Backend YAML to paste and a copy button",
             "hostname: blocked.example.com" in text and "Copy Backend YAML" in text, text[-1500:])
    csp = [line for line in log.splitlines() if "Content Security Policy" in line or "Uncaught" in line]
    h.expect("no script error and nothing the CSP had to refuse", not csp, "\n".join(csp[:5]))
    rows = visible_text(filtered).split("Backends", 1)[-1].split("Refused destinations", 1)[0]
    h.expect("the filter from the URL (#filter=api-0999) leaves that one Backend",
             re.search(r"\b1 Backend port(?!s)", rows) and "default/api-0999" in rows and "default/shop" not in rows, rows[:400])
    h.expect("while the line on top still counts every port",
             "1 endpoint ejected" in visible_text(filtered).split("Backends", 1)[0], visible_text(filtered)[:300])
    size = (OUT / "console.png").stat().st_size
    h.expect("a screenshot was taken", size > 10000, f"{size} bytes")
    interact(h, admin)
    upstream.shutdown()


def interact(h, admin):
    """What --dump-dom cannot do: click. Pause stops the polling; Copy (while paused, so no
    re-render replaces the button) puts the Backend YAML on the clipboard; Resume polls again."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    profile = tempfile.mkdtemp(prefix="console-cdp-")
    browser = cdp.Browser(binary, profile)
    try:
        origin = f"http://{admin}"
        browser.send("Browser.grantPermissions", {
            "origin": origin, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]},
            session=False)
        browser.open(origin + "/")
        browser.wait_for("document.body && document.body.innerText.includes('Copy Backend YAML')")

        # Pause: the page sends nothing for two poll periods (and renders nothing anew, so the
        # buttons below stay the ones clicked).
        browser.pump(0.5)
        browser.click("document.getElementById('pause')")
        label = browser.wait_for("document.getElementById('pause').textContent === 'Resume' && 'Resume'")
        before = browser.requests_to("/status")
        browser.pump(2 * 3.0 + 1.0)
        during = browser.requests_to("/status") - before
        h.expect("Pause stops the polling (the button then says Resume)",
                 label == "Resume" and during == 0, f"{during} polls of /status while paused")

        first_copy = ("[...document.querySelectorAll('button')]"
                      ".find(b => b.textContent === 'Copy Backend YAML')")
        yaml = browser.evaluate(f"{first_copy}.closest('details').querySelector('pre').textContent")
        browser.click(first_copy)
        copied = browser.wait_for("[...document.querySelectorAll('button')]"
                                  ".some(b => b.textContent === 'Copied')", timeout=10)
        clipboard = browser.evaluate("navigator.clipboard.readText()", await_promise=True)
        h.expect("Copy puts the Backend YAML on the clipboard and says so",
                 copied and yaml and clipboard == yaml and "kind: Backend" in clipboard,
                 f"clipboard {clipboard!r}, shown {yaml!r}")

        browser.click("document.getElementById('pause')")
        deadline = time.monotonic() + 5
        while browser.requests_to("/status") == before + during and time.monotonic() < deadline:
            browser.pump(0.1)
        h.expect("Resume polls again at once",
                 browser.requests_to("/status") > before + during
                 and browser.evaluate("document.getElementById('pause').textContent") == "Pause",
                 "no /status request after Resume")
    except cdp.CdpError as e:
        h.expect("the page could be driven over the DevTools protocol", False, str(e))
    finally:
        browser.close()
        shutil.rmtree(profile, ignore_errors=True)


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "target" / "debug" / "egressd")
    h = Harness("console", str(Path(binary).resolve()))
    print("== console (headless Chromium)")
    try:
        run(h)
    except SuiteFailed as e:
        h.failures.append(str(e))
        print(f"  FAIL {e}")
    finally:
        h.stop_all()
    if h.failures:
        print(f"console: {len(h.failures)} of {h.checks} checks failed; page and screenshot in {OUT}, "
              f"egressd's log in {h.tmp}")
        sys.exit(1)
    print(f"console: {h.checks} checks passed; screenshot {OUT / 'console.png'}")


if __name__ == "__main__":
    main()
