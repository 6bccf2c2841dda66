#!/usr/bin/env python3
"""A central egress gateway at scale: N Backends and N HTTPRoutes (benches/scale_config.py).

    benches/scale.py [--backends 10000] [--reloads 10] [--binary target/release/egressd]

Everything runs on loopback: two origins (`bench_origin` on 127.0.0.1:P and 127.0.0.2:P, the
two endpoints of every Backend), egressd with `--workers 1`, and h2load. Prints:

- `validate`: wall time and peak RSS of `egressd validate` on the config;
- `start`: time from exec until the config is loaded ("config loaded" logged), RSS then and
  3 s later (settled: the allocator has returned what loading used for a moment);
- `steady`: p50/p99 of a fixed-rate load through route `r-00000` (h2load `--rps`), alone;
- `reloads`: the same load again while SIGHUP is sent RELOADS times, one after the other; each
  reload's time from the signal until egressd logs "config loaded" for it, p50/p99 of the load
  meanwhile, RSS after every reload, and 3 s after the last one (settled).

Needs h2load (`apt-get install nghttp2-client`) and a release build with the example origin
(`cargo build --release --bin egressd --example bench_origin`).
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benches"))


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.002)
    sys.exit(f"timed out waiting for {what}")


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def rss_mib(pid):
    for line in read(f"/proc/{pid}/status").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_origin(binary, listen, work, name):
    addr_file = os.path.join(work, f"{name}.addr")
    proc = subprocess.Popen(
        [binary, "--listen", listen, "--body-size", "5", "--address-file", addr_file],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    addr = wait_for(lambda: read(addr_file).strip(), 10, f"origin on {listen}")
    return proc, int(addr.rsplit(":", 1)[1])


def percentiles(log_file):
    """p50 and p99 in ms from an h2load --log-file (third column: µs per request)."""
    times = sorted(
        int(line.split("\t")[2]) for line in read(log_file).splitlines() if line.count("\t") >= 2
    )
    if not times:
        return float("nan"), float("nan"), 0
    pick = lambda q: times[min(len(times) - 1, int(q * len(times)))] / 1000
    return pick(0.50), pick(0.99), len(times)


def load(port, seconds, log_file):
    """A steady load through route r-00000: 10 connections × 100 requests/s."""
    return subprocess.Popen(
        ["h2load", "--h1", "-c", "10", "--rps", "100", "-D", str(seconds),
         "-H", ":authority: b-00000.scale.test", "--log-file", log_file,
         f"http://127.0.0.1:{port}/"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", type=int, default=10_000)
    parser.add_argument("--reloads", type=int, default=10)
    parser.add_argument("--binary", default=os.path.join(ROOT, "target/release/egressd"))
    parser.add_argument(
        "--origin", default=os.path.join(ROOT, "target/release/examples/bench_origin")
    )
    args = parser.parse_args()
    if shutil.which("h2load") is None:
        sys.exit("needs h2load (apt-get install nghttp2-client)")
    import scale_config  # noqa: E402  (benches/ on the path above)

    work = tempfile.mkdtemp(prefix="egressd-scale.")
    procs = []
    try:
        origin, port = start_origin(args.origin, "127.0.0.1:0", work, "origin1")
        procs.append(origin)
        procs.append(start_origin(args.origin, f"127.0.0.2:{port}", work, "origin2")[0])
        config = os.path.join(work, "config")
        sys.argv = ["scale_config", "--backends", str(args.backends), "--port", str(port), config]
        with open(os.devnull, "w") as devnull:
            stdout, sys.stdout = sys.stdout, devnull
            try:
                scale_config.main()
            finally:
                sys.stdout = stdout

        started = time.monotonic()
        validate = subprocess.run(
            ["/usr/bin/time", "-f", "%M", args.binary, "validate", config],
            capture_output=True, text=True,
        )
        took = time.monotonic() - started
        peak = int(validate.stderr.strip().splitlines()[-1]) / 1024
        print(f"validate: {took:.2f} s, peak RSS {peak:.0f} MiB ({args.backends} Backends)")

        log = os.path.join(work, "egressd.log")
        admin_file = os.path.join(work, "admin.addr")
        started = time.monotonic()
        with open(log, "w") as log_out:
            egressd = subprocess.Popen(
                [args.binary, "run", "--config", config, "--workers", "1", "--no-watch",
                 "--admin-address", "127.0.0.1:0", "--admin-address-file", admin_file],
                stdout=log_out, stderr=subprocess.STDOUT,
            )
        procs.append(egressd)
        loaded = lambda n: read(log).count("config loaded") >= n
        wait_for(lambda: loaded(1), 120, "the first config")
        at_load = rss_mib(egressd.pid)
        took = time.monotonic() - started
        time.sleep(3)
        print(f"start: config loaded after {took:.2f} s, RSS {at_load:.0f} MiB, "
              f"settled {rss_mib(egressd.pid):.1f} MiB")
        status = subprocess.run(
            ["curl", "-s", f"http://{read(admin_file).strip()}/status"],
            capture_output=True, text=True,
        ).stdout
        proxy_port = int(status.split('"address": "127.0.0.1:', 1)[1].split('"', 1)[0])

        seconds = max(5, args.reloads)
        steady_log = os.path.join(work, "steady.log")
        load(proxy_port, seconds, steady_log).wait()
        p50, p99, n = percentiles(steady_log)
        print(f"steady: {n} requests, p50 {p50:.2f} ms, p99 {p99:.2f} ms")

        reload_log = os.path.join(work, "reloads.log")
        under_load = load(proxy_port, seconds, reload_log)
        times, rss = [], []
        for i in range(args.reloads):
            sent = time.monotonic()
            egressd.send_signal(signal.SIGHUP)
            wait_for(lambda: loaded(i + 2), 120, f"reload {i + 1}")
            times.append((time.monotonic() - sent) * 1000)
            rss.append(rss_mib(egressd.pid))
        under_load.wait()
        p50, p99, n = percentiles(reload_log)
        print("reloads: " + ", ".join(f"{t:.0f}" for t in sorted(times)) + " ms "
              f"(median {sorted(times)[len(times) // 2]:.0f})")
        time.sleep(3)
        print("RSS after each reload: " + ", ".join(f"{r:.0f}" for r in rss) + " MiB, "
              f"settled {rss_mib(egressd.pid):.1f} MiB")
        print(f"during reloads: {n} requests, p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
