"""The official MCP Python SDK (mcp 2.3.0), client and server, direct and through egressd.

Two instances of the SDK's Streamable HTTP server with an event store (mcp_server.py) behind
one route, in two configurations: two Backends weighted 50/50 (egressd-two-backends.yaml),
and one Backend whose two IP endpoints have their own ports
(egressd-one-backend-two-ports.yaml). The SDK's client opens 12 sessions at once, direct to
one instance and through egressd (its HTTP proxy), and in each: lists tools, counts 1..5 on
a per-session counter (affinity), reads a resource, gets spaced progress notifications
(received spread over at least 60% of the span they were sent over: not buffered), has a
call's event stream closed by the server half-way and resumes it with `Last-Event-ID`
(every event arrives, the resuming GET reaches the issuing instance), gets notifications of
no request on the standalone GET stream, gets the SDK's errors, and ends with DELETE (seen
by the issuing instance; the session id then gets the server's 404). The servers' own
records (/stats, by the server's session ids) say which instance saw what.

The 2026-07-28 stateless protocol (the SDK's `server/discover` negotiation): the same
answers, and through egressd requests are balanced over both instances. The legacy HTTP+SSE
transport (the SDK's SSE server and `sse_client`) through a `transport: SSE` Backend of two
instances (egressd-legacy-sse.yaml): every message POST reaches the instance holding its
stream.

A rate limit on one tool (egressd-rate-limit.yaml: 3 `tools/call`s of `add` an hour on a
Backend of instance A): in one session, direct every call of `add` is answered; through
egressd calls 1..3 are answered as direct, the 4th raises the SDK's `MCPError` with code
-32029, a message starting "egressd: rate limited by " and `data.retryAfter` (seconds), and
then another tool (`whoami`) and `tools/list` are answered as direct, every POST got HTTP 200
(or the SDK's 202) as direct, and egressd's /metrics count 3 `allowed` and 1 `limited`.
"""

import json
import re
import signal
import subprocess
import urllib.request

from harness import CACHE, INTEROP, SuiteFailed, port_open, wait_for

HERE = INTEROP / "01-mcp-python"
PYTHON = CACHE / "01-mcp-python" / "venv" / "bin" / "python"
SESSIONS = 12  # over 50/50 weights all on one Backend has p = 1/2048
LEGACY_SESSIONS = 4
HOST = "mcp.interop.test"
LEGACY_HOST = "legacy.interop.test"
RATE_LIMIT = 3  # calls of `add` an hour, egressd-rate-limit.yaml


def start_server(h, name, transport):
    """mcp_server.py NAME TRANSPORT; returns its port (printed once listening)."""
    proc = h.spawn(f"server-{name}", [str(PYTHON), str(HERE / "mcp_server.py"), name, transport])

    def port():
        if proc.poll() is not None:
            raise SuiteFailed(f"server {name} exited:\n{h.log_of(proc)}")
        found = re.search(r"^PORT (\d+)$", h.log_of(proc), re.M)
        return found and port_open(int(found.group(1))) and int(found.group(1))

    return wait_for(f"server {name} listening", port)


def stats(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as r:
        return json.loads(r.read())


def client(mode, url, proxy=None, n=0):
    """mcp_client.py's facts (one JSON document)."""
    argv = [str(PYTHON), str(HERE / "mcp_client.py"), mode, url, proxy or "-"]
    if n:
        argv.append(str(n))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SuiteFailed(f"mcp_client.py {mode} {url} {proxy}: exit {done.returncode}\n"
                          f"{done.stderr[-4000:]}")
    return json.loads(done.stdout)


def session_facts(s, instances):
    """What the servers saw of session `s` (its instance and the server's id from whoami)."""
    if s.get("instance") not in instances:
        return {"whoami said which instance": False}
    sid, mine = s["server_session"], instances[s["instance"]]
    others = [v for k, v in instances.items() if k != s["instance"]]
    return {
        "issued by the instance that answers it": sid in mine["issued"],
        "GET stream opened on it": sid in mine["gets"],
        "resumed with Last-Event-ID on it": sid in mine["resumes"],
        "DELETE reached it and was answered 200": [sid, 200] in mine["deletes"],
        "no request of it reached another instance": all(sid not in o["seen"] for o in others),
    }


def sorted_json(items):
    return sorted(items, key=lambda x: json.dumps(x, sort_keys=True))


def aspects(run, instances):
    """The per-session facts to compare, aspect by aspect (order of sessions dropped)."""
    sessions = run["sessions"]
    pick = lambda f: sorted_json([f(s) for s in sessions])
    return {
        "session ran and ended without error": pick(lambda s: s.get("session")),
        "protocol version and tools/list": pick(
            lambda s: [s.get("protocol_version"), s.get("tools")]
        ),
        "per-session counter counts 1..5 on one instance": pick(
            lambda s: [s.get("counts"), s.get("same_instance_throughout")]
        ),
        "tool result and resource read": pick(lambda s: [s.get("add"), s.get("resource")]),
        "progress notifications spread over time (not buffered)": pick(lambda s: s.get("progress")),
        "stream closed by the server half-way, resumed with Last-Event-ID": pick(
            lambda s: s.get("resumption")
        ),
        "notifications on the standalone GET stream": pick(
            lambda s: [s.get("announce"), s.get("get_stream_notifications")]
        ),
        "errors (failing tool, unknown tool, unknown resource)": pick(lambda s: s.get("errors")),
        "DELETE at the end, then the session id gets 404": pick(
            lambda s: [s.get("delete_statuses"), s.get("after_delete_status")]
        ),
        "what the servers saw of each session": pick(lambda s: session_facts(s, instances)),
    }


def legacy_aspects(run, instances):
    sessions = run["sessions"]
    pick = lambda f: sorted_json([f(s) for s in sessions])

    def facts(s):
        if s.get("instance") not in instances:
            return {"whoami said which instance": False}
        sid = s["server_session"]
        return {
            "its POSTs reached the instance holding its stream": sid
            in instances[s["instance"]]["sse_posts"],
            "no POST of it reached another instance": all(
                sid not in v["sse_posts"] for k, v in instances.items() if k != s["instance"]
            ),
        }

    return {
        "session ran and ended without error": pick(lambda s: s.get("session")),
        "protocol version and tools/list": pick(
            lambda s: [s.get("protocol_version"), s.get("tools")]
        ),
        "per-session counter counts 1..5 on one instance": pick(
            lambda s: [s.get("counts"), s.get("same_instance_throughout")]
        ),
        "tool result and progress notifications": pick(
            lambda s: [s.get("add"), s.get("progress_values")]
        ),
        "errors (failing tool, unknown tool)": pick(lambda s: s.get("errors")),
        "what the servers saw of each session": pick(facts),
    }


def decisions(egressd, rule):
    """egressd_ratelimit_decisions_total of `rule` by decision, from the admin /metrics."""
    found = {}
    for line in egressd.get("/metrics").splitlines():
        m = re.match(r'egressd_ratelimit_decisions_total\{(.*)\} (\S+)$', line)
        if m and f'rule="{rule}"' in m.group(1):
            decision = re.search(r'decision="([^"]*)"', m.group(1)).group(1)
            found[decision] = found.get(decision, 0) + float(m.group(2))
    return found


def rate_limited_tool(h, port):
    """One tool limited to RATE_LIMIT calls (egressd-rate-limit.yaml): the same session direct
    (no limit: every call answered) and through egressd."""
    url, calls = f"http://127.0.0.1:{port}/mcp", RATE_LIMIT + 1
    direct = client("limited", url, n=calls)
    h.expect(f"direct: {calls} calls of add answered, then whoami and tools/list",
             direct.get("calls") == [{"result": str(i + 1)} for i in range(1, calls + 1)]
             and direct.get("other tool") == {"isError": False, "instance": "A"}
             and "add" in direct.get("tools", []) and direct.get("session") == "ended",
             direct)
    config = h.render("egressd-rate-limit.yaml", PORT_A=port, LIMIT=RATE_LIMIT)
    egressd = h.egressd(config, name="egressd-rate-limit")
    host, listener = egressd.listener("default/sidecar/http")
    through = client("limited", f"http://{HOST}/mcp", f"http://{host}:{listener}", n=calls)
    got = through.get("calls") or []
    h.compare(f"rate-limit: calls 1..{RATE_LIMIT} of add answered",
              direct["calls"][:RATE_LIMIT], got[:RATE_LIMIT])
    refused = got[RATE_LIMIT] if len(got) > RATE_LIMIT else {}
    retry = (refused.get("data") or {}).get("retryAfter")
    h.expect(f"rate-limit: call {calls} of add: the SDK raises MCPError -32029 "
             "'egressd: rate limited by ...' with data.retryAfter",
             refused.get("raised") == "MCPError" and refused.get("code") == -32029
             and str(refused.get("message")).startswith("egressd: rate limited by ")
             and isinstance(retry, int) and 0 < retry <= 2 * 3600,
             refused)
    for name in ["other tool", "tools", "session", "post_statuses"]:
        label = {"other tool": "another tool (whoami) still answered in the session",
                 "tools": "tools/list still answered",
                 "session": "the session ends without error",
                 "post_statuses": "HTTP statuses of the POSTs (the refused call's is 200)"}[name]
        h.compare(f"rate-limit: {label}", direct.get(name), through.get(name))
    counted = {k: v for k, v in decisions(egressd, "add-calls").items() if v}
    h.expect(f"rate-limit: /metrics: {RATE_LIMIT} allowed, 1 limited",
             counted == {"allowed": RATE_LIMIT, "limited": 1}, counted)
    stop(egressd)


def stop(egressd):
    egressd.proc.send_signal(signal.SIGTERM)
    egressd.proc.wait(timeout=30)


def run(h):
    ports = {"A": start_server(h, "A", "streamable"), "B": start_server(h, "B", "streamable")}
    legacy_ports = {"L1": start_server(h, "L1", "sse"), "L2": start_server(h, "L2", "sse")}
    every = lambda p: {name: stats(port) for name, port in p.items()}

    # -- direct: the SDK's client to instance A ---------------------------------------------
    direct = client("sessions", f"http://127.0.0.1:{ports['A']}/mcp", n=SESSIONS)
    direct_aspects = aspects(direct, every(ports))
    # The peers work at all: a broken setup must not compare equal to itself.
    ss = direct["sessions"]
    h.expect("direct: every session counts 1..5", all(s.get("counts") == list("12345") for s in ss),
             [s.get("counts") for s in ss])
    h.expect("direct: progress received spread over time",
             all(s.get("progress", {}).get("values") == [1, 2, 3, 4, 5, 6]
                 and all(s["progress"].values()) for s in ss),
             [s.get("progress") for s in ss])
    h.expect("direct: resumed stream delivers all 6 events and the answer",
             all(s.get("resumption") == {"values": [1, 2, 3, 4, 5, 6],
                                         "answer": {"steps": 6, "closed_mid_way": True}}
                 for s in ss),
             [s.get("resumption") for s in ss])
    h.expect("direct: 3 notifications on the GET stream",
             all(len(s.get("get_stream_notifications", [])) == 3 for s in ss),
             [s.get("get_stream_notifications") for s in ss])
    h.expect("direct: DELETE 200, then 404",
             all(s.get("delete_statuses") == [200] and s.get("after_delete_status") == 404
                 for s in ss),
             [(s.get("delete_statuses"), s.get("after_delete_status")) for s in ss])
    h.expect("direct: the server saw every session's GET, resumption and DELETE",
             all(all(f.values()) for f in direct_aspects["what the servers saw of each session"]),
             direct_aspects["what the servers saw of each session"])

    before = every(ports)
    direct_stateless = client("stateless", f"http://127.0.0.1:{ports['A']}/mcp")
    after = every(ports)
    h.expect("direct: the SDK negotiates 2026-07-28 (stateless, no session id)",
             direct_stateless.get("protocol_version") == "2026-07-28"
             and direct_stateless.get("session_ids_issued") == []
             and after["A"]["stateless_posts"] > before["A"]["stateless_posts"],
             direct_stateless)
    direct_instances = direct_stateless.pop("instances", None)

    direct_legacy = client("legacy", f"http://127.0.0.1:{legacy_ports['L1']}/sse",
                           n=LEGACY_SESSIONS)
    direct_legacy_aspects = legacy_aspects(direct_legacy, every(legacy_ports))
    h.expect("direct legacy SSE: every session counts 1..5",
             all(s.get("counts") == list("12345") for s in direct_legacy["sessions"]),
             direct_legacy)

    # -- through egressd, in both configurations -------------------------------------------
    for template in ["egressd-two-backends.yaml", "egressd-one-backend-two-ports.yaml"]:
        label = template.removeprefix("egressd-").removesuffix(".yaml")
        config = h.render(template, PORT_A=ports["A"], PORT_B=ports["B"])
        egressd = h.egressd(config, name=f"egressd-{label}")
        host, port = egressd.listener("default/sidecar/http")
        proxy = f"http://{host}:{port}"

        through = client("sessions", f"http://{HOST}/mcp", proxy, n=SESSIONS)
        for name, value in aspects(through, every(ports)).items():
            h.compare(f"{label}: {name}", direct_aspects[name], value)
        h.expect(f"{label}: sessions were issued by both instances",
                 {s.get("instance") for s in through["sessions"]} == {"A", "B"},
                 [s.get("instance") for s in through["sessions"]])

        before = every(ports)
        stateless = client("stateless", f"http://{HOST}/mcp", proxy)
        after = every(ports)
        instances = stateless.pop("instances", None)
        h.compare(f"{label}: 2026-07-28 stateless answers", direct_stateless, stateless)
        h.expect(f"{label}: 2026-07-28 requests balanced over both instances",
                 instances == ["A", "B"]
                 and all(after[i]["stateless_posts"] > before[i]["stateless_posts"] for i in ports),
                 {"whoami answered by": instances, "direct": direct_instances})
        stop(egressd)

    # -- the legacy HTTP+SSE transport -----------------------------------------------------
    config = h.render("egressd-legacy-sse.yaml", PORT_A=legacy_ports["L1"],
                      PORT_B=legacy_ports["L2"])
    egressd = h.egressd(config, name="egressd-legacy-sse")
    host, port = egressd.listener("default/sidecar/http")
    before = every(legacy_ports)
    legacy = client("legacy", f"http://{LEGACY_HOST}/sse", f"http://{host}:{port}",
                    n=LEGACY_SESSIONS)
    after = every(legacy_ports)
    for name, value in legacy_aspects(legacy, after).items():
        h.compare(f"legacy-sse: {name}", direct_legacy_aspects[name], value)
    h.expect("legacy-sse: streams on both instances",
             all(after[i]["sse_streams"] > before[i]["sse_streams"] for i in legacy_ports),
             {i: after[i]["sse_streams"] - before[i]["sse_streams"] for i in legacy_ports})
    stop(egressd)

    # -- a rate limit on one tool ----------------------------------------------------------
    rate_limited_tool(h, ports["A"])
