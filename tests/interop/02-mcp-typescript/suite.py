"""The official MCP TypeScript SDK (@modelcontextprotocol/sdk 1.32.2) as the client of the
reference "everything" server (@modelcontextprotocol/server-everything 2026.8.31, Streamable
HTTP), direct and through egressd. Two server instances as one Backend with two endpoint
ports (egressd.yaml); four sessions, one after the other, each: connect, list tools,
resources and prompts, call echo, get-sum, get-tiny-image, get-annotated-message,
get-structured-content and the long-running operation (progress notifications received
spread over time, not buffered), read a resource, get two prompts, an unknown tool, close
with DELETE. The same answers through egressd as direct; through egressd the sessions land
on both instances and each stays on its own (get-env names the instance)."""

import json
import re
import shutil
import subprocess

from harness import CACHE, INTEROP, SuiteFailed, port_open, wait_for

HERE = INTEROP / "02-mcp-typescript"
ROOT = CACHE / "02-mcp-typescript"
EVERYTHING = ROOT / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
SESSIONS = 4
HOST = "everything.interop.test"


def start_everything(h, name):
    """The everything server's CLI in streamable HTTP mode on 127.0.0.1 (bind-loopback.mjs),
    INSTANCE=<name> in its environment; returns its port."""
    proc = h.spawn(
        f"everything-{name}",
        ["node", "--import", "./bind-loopback.mjs", str(EVERYTHING), "streamableHttp"],
        env={"PORT": "0", "INSTANCE": name},
        cwd=ROOT,
    )

    def port():
        if proc.poll() is not None:
            raise SuiteFailed(f"everything {name} exited:\n{h.log_of(proc)}")
        found = re.search(r"^PORT (\d+)$", h.log_of(proc), re.M)
        return found and port_open(int(found.group(1))) and int(found.group(1))

    return wait_for(f"everything {name} listening", port)


def client(url, proxy=None):
    done = subprocess.run(
        ["node", "client.mjs", url, proxy or "-", str(SESSIONS)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    if done.returncode != 0:
        raise SuiteFailed(f"client.mjs {url} {proxy}: exit {done.returncode}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)


ASPECTS = {
    "session ran and closed without error": ["failed", "code"],
    "connect: server info, protocol version, session id issued": ["server", "protocolVersion", "sessionIdIssued"],
    "tools/list, resources/list, prompts/list": ["tools", "resources", "prompts"],
    "echo, get-sum": ["echo", "sum"],
    "get-tiny-image, get-annotated-message, get-structured-content": ["tinyImage", "annotated", "structured"],
    "long-running operation: progress spread over time, result": ["longRunning"],
    "resources/read": ["readResource"],
    "prompts/get (simple, with arguments)": ["simplePrompt", "argsPrompt"],
    "unknown tool": ["unknownTool"],
    "session stays on one instance, DELETE at close": ["sameInstanceThroughout", "terminate"],
}


def aspects(run):
    sessions = run["sessions"]
    out = {
        name: sorted(
            (json.dumps([s.get(k) for k in keys], sort_keys=True) for s in sessions)
        )
        for name, keys in ASPECTS.items()
    }
    out["HTTP answers by method and status"] = run["statuses"]
    return out


def run(h):
    for script in ["client.mjs", "bind-loopback.mjs"]:
        shutil.copy(HERE / script, ROOT / script)  # next to node_modules, for imports
    ports = {"A": start_everything(h, "A"), "B": start_everything(h, "B")}

    direct = client(f"http://127.0.0.1:{ports['A']}/mcp")
    ss = direct["sessions"]
    # The peers work at all: a broken setup must not compare equal to itself.
    h.expect("direct: echo and get-sum answer",
             all(s.get("echo", {}).get("content") == [{"type": "text", "text": "Echo: hello through egressd"}]
                 and "42" in json.dumps(s.get("sum")) for s in ss), ss)
    h.expect("direct: 5 progress notifications spread over time",
             all(len(s["longRunning"]["progress"]) == 5 and s["longRunning"]["spreadAtLeast60PercentOfSent"]
                 for s in ss if "longRunning" in s) and all("longRunning" in s for s in ss),
             [s.get("longRunning") for s in ss])
    h.expect("direct: every session ends with DELETE on instance A",
             all(s.get("terminate") == "ok" and s.get("instance") == "A" and s.get("sameInstanceThroughout")
                 for s in ss), ss)

    config = h.render("egressd.yaml", PORT_A=ports["A"], PORT_B=ports["B"])
    egressd = h.egressd(config)
    host, port = egressd.listener("default/sidecar/http")
    through = client(f"http://{HOST}/mcp", f"http://{host}:{port}")
    want = aspects(direct)
    for name, value in aspects(through).items():
        h.compare(name, want[name], value)
    h.expect("through egressd: sessions on both instances",
             {s.get("instance") for s in through["sessions"]} == {"A", "B"},
             [s.get("instance") for s in through["sessions"]])
