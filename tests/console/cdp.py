"""A Chrome DevTools Protocol session over --remote-debugging-pipe, with the standard library
only: Chromium reads commands from fd 3 and writes replies and events to fd 4, each a JSON
message ended by a NUL byte. Enough to load a page, run script in it, click like a person
(real input events, which give the page the user activation the clipboard asks for) and watch
its network requests.
"""

import json
import os
import select
import subprocess
import time


class CdpError(Exception):
    pass


class Browser:
    def __init__(self, binary, profile):
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def fds():
            # Chromium expects its end of the pipes at exactly 3 and 4.
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        argv = [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", f"--user-data-dir={profile}", "--remote-debugging-pipe",
                "--window-size=1280,1600"]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, preexec_fn=fds, pass_fds=(3, 4))
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._next = 0
        self._buffer = b""
        self.events = []
        self.session = None

    def close(self):
        try:
            self.send("Browser.close", session=False, timeout=10)
        except (CdpError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_chrome, self._from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass

    def _read_message(self, deadline):
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CdpError("no message from Chromium in time")
            ready, _, _ = select.select([self._from_chrome], [], [], left)
            if ready:
                chunk = os.read(self._from_chrome, 65536)
                if not chunk:
                    raise CdpError("Chromium closed its pipe")
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method, params=None, session=True, timeout=30):
        """Sends one command and returns its result; events that arrive meanwhile are kept."""
        self._next += 1
        message = {"id": self._next, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise CdpError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def pump(self, seconds):
        """Collects the events of the next `seconds`."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                reply = self._read_message(deadline)
            except CdpError:
                return
            if "method" in reply:
                self.events.append(reply)

    def open(self, url):
        """A new page at `url`, attached: later commands go to it."""
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        self.send("Page.enable")
        self.send("Network.enable")
        self.send("Page.navigate", {"url": url})

    def evaluate(self, expression, await_promise=False):
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": await_promise, "userGesture": False})
        if "exceptionDetails" in result:
            raise CdpError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression, timeout=30):
        """Polls `expression` until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise CdpError(f"not true within {timeout}s: {expression}")
            self.pump(0.1)

    def click(self, selector_expression):
        """A person's click (pointer events) in the middle of the element the expression
        finds, scrolled into view first."""
        box = self.evaluate(f"""(() => {{
            const e = {selector_expression};
            if (!e) return null;
            e.scrollIntoView({{block: "center"}});
            const r = e.getBoundingClientRect();
            return {{x: r.left + r.width / 2, y: r.top + r.height / 2}};
        }})()""")
        if not box:
            raise CdpError(f"nothing to click: {selector_expression}")
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {"type": kind, "x": box["x"], "y": box["y"],
                                                   "button": "left", "clickCount": 1})

    def requests_to(self, path):
        """How many requests for `path` the page has sent so far (events collected)."""
        return sum(1 for e in self.events
                   if e["method"] == "Network.requestWillBeSent"
                   and e["params"]["request"]["url"].split("?", 1)[0].endswith(path))
