"""The interop harness: third-party peers run direct and through egressd, results compared.

Every suite (a `suite_*.py` module next to this file) defines `run(h)`, which starts its peers
on 127.0.0.1 ephemeral ports, writes the egressd config of the suite from its checked-in
template (`<suite>/*.yaml`, `${NAME}` placeholders filled with those ports), and calls
`h.compare(name, direct, through)` for each result. A difference fails the suite with both
results printed. Everything started is stopped by PID when the suite ends, and every wait is
bounded.
"""

import json
import os
import signal
import socket
import string
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INTEROP = Path(__file__).resolve().parent
CACHE = ROOT / "target" / "interop"


class SuiteFailed(Exception):
    pass


def wait_for(what, check, timeout=30.0, interval=0.05):
    """Polls `check` until it returns something truthy, for at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SuiteFailed(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def port_open(port, host="127.0.0.1"):
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def free_port():
    """A port free right now (for peers that cannot report the one they bound)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Harness:
    def __init__(self, suite, egressd):
        self.suite = suite
        self.egressd_binary = egressd
        self.procs = []
        self.tmp = Path(tempfile.mkdtemp(prefix=f"interop-{suite}-"))
        self.failures = []
        self.checks = 0

    # -- processes -------------------------------------------------------------------------

    def spawn(self, name, argv, env=None, cwd=None, stdout=None):
        """Starts `argv`; its output goes to `<tmp>/<name>.log` unless `stdout` is given."""
        log = open(self.tmp / f"{name}.log", "wb")
        proc = subprocess.Popen(
            argv,
            stdout=stdout or log,
            stderr=log,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )
        proc.name = name
        proc.log_path = self.tmp / f"{name}.log"
        self.procs.append(proc)
        return proc

    def log_of(self, proc):
        try:
            return proc.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop_all(self):
        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    # -- TLS material ------------------------------------------------------------------------

    def localhost_certs(self):
        """`(ca, key, cert)`: a CA made here and a certificate for `localhost` it signed (egressd
        and direct clients verify against the CA), made once per suite with openssl."""
        d = self.tmp
        if (d / "cert.pem").exists():
            return d / "ca.pem", d / "key.pem", d / "cert.pem"
        run = lambda *args: subprocess.run(args, check=True, capture_output=True, timeout=60)
        run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=interop CA", "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))
        run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
            "-keyout", str(d / "key.pem"), "-out", str(d / "req.pem"))
        (d / "ext.cnf").write_text("subjectAltName=DNS:localhost\n")
        run("openssl", "x509", "-req", "-in", str(d / "req.pem"), "-CA", str(d / "ca.pem"),
            "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "1",
            "-extfile", str(d / "ext.cnf"), "-out", str(d / "cert.pem"))
        return d / "ca.pem", d / "key.pem", d / "cert.pem"

    # -- egressd ---------------------------------------------------------------------------

    def render(self, template, **values):
        """The suite's config template `<suite>/<template>` with `${NAME}` filled in, written
        to a fresh directory, validated by `egressd validate`; returns the directory."""
        text = (INTEROP / self.suite / template).read_text()
        rendered = string.Template(text).substitute({k: str(v) for k, v in values.items()})
        config = self.tmp / f"config-{template.replace('/', '-')}"
        config.mkdir()
        (config / "egressd.yaml").write_text(rendered)
        check = subprocess.run(
            [self.egressd_binary, "validate", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check.returncode != 0:
            raise SuiteFailed(f"egressd validate {template}:\n{check.stdout}{check.stderr}")
        return config

    def egressd(self, config_dir, name="egressd"):
        """Runs egressd on `config_dir`; returns an object with `.admin` and `.listener(key)`."""
        address_file = self.tmp / f"{name}-admin"
        proc = self.spawn(
            name,
            [
                self.egressd_binary,
                "run",
                "--config",
                str(config_dir),
                "--admin-address",
                "127.0.0.1:0",
                "--admin-address-file",
                str(address_file),
            ],
        )
        admin = wait_for(
            "egressd's admin address",
            lambda: address_file.exists() and address_file.read_text().strip(),
        )
        running = Egressd(proc, admin, self)
        wait_for("egressd ready", running.ready)
        return running

    # -- results ---------------------------------------------------------------------------

    def compare(self, name, direct, through):
        """Records one check: the same result direct and through egressd."""
        self.checks += 1
        if direct == through:
            print(f"  ok   {name}")
            return
        self.failures.append(name)
        print(f"  DIFF {name}")
        print(f"       direct:  {json.dumps(direct, sort_keys=True, default=str)[:2000]}")
        print(f"       through: {json.dumps(through, sort_keys=True, default=str)[:2000]}")

    def expect(self, name, ok, detail=""):
        """Records one check that has no direct counterpart (e.g. egressd's access log)."""
        self.checks += 1
        if ok:
            print(f"  ok   {name}")
            return
        self.failures.append(name)
        print(f"  FAIL {name}: {detail}")


class Egressd:
    def __init__(self, proc, admin, harness):
        self.proc = proc
        self.admin = admin
        self.harness = harness

    def get(self, path):
        with urllib.request.urlopen(f"http://{self.admin}{path}", timeout=5) as r:
            return r.read().decode()

    def ready(self):
        if self.proc.poll() is not None:
            raise SuiteFailed(f"egressd exited:\n{self.harness.log_of(self.proc)}")
        try:
            return self.get("/ready") is not None
        except OSError:
            return False

    def listener(self, key):
        """`(host, port)` of listener `namespace/gateway/listener` as `/status` reports it."""
        status = json.loads(self.get("/status"))
        for listener in status.get("listeners", []):
            if listener["name"] == key:
                host, port = listener["address"].rsplit(":", 1)
                return host, int(port)
        raise SuiteFailed(f"no listener {key} in /status")
