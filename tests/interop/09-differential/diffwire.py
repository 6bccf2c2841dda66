"""The wire side of the differential suite: a recording origin and a raw client.

`Origin` is a threaded raw-socket HTTP/1.1 server on 127.0.0.1 (ephemeral port). For every
request a proxy forwards it records the request line, the header fields in order, the body
bytes as framed by the proxy (Content-Length or chunked) and the trailers; it answers the
first request of each connection (the response chosen by the request's `x-respond` field, see
`RESPONSES`) with `Connection: close`, then reads and records whatever else the proxy sends
on that connection until the proxy closes it: a request smuggled inside another one shows up
there as a request of its own.

`exchange` writes a scenario's bytes to a proxy on a new connection and reads what comes back
(until the proxy closes the connection, or is silent once the responses expected are
complete, or is silent for long before that); `parse_responses` splits it into responses.
"""

import select
import socket
import threading
import time

WAIT = 2.0  # seconds of silence before a complete response: the proxy is taken to be waiting
GRACE = 0.3  # seconds of silence after the responses expected: nothing more is coming
HEAD_LIMIT = 1 << 20

RESPONSES = {
    "default": [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"],
    "304-cl": [
        b'HTTP/1.1 304 Not Modified\r\nContent-Length: 1234\r\nETag: "v1"\r\n'
        b"Connection: close\r\n\r\n"
    ],
    "reason-non-ascii": [
        b"HTTP/1.1 200 Bien re\xe7u\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    ],
    "reason-custom": [
        b"HTTP/1.1 200 Fine Thanks\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    ],
    "103": [
        b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
    ],
    "100-unsolicited": [
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
    ],
    "trailers": [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: x-announced\r\n"
        b"Connection: close\r\n\r\n2\r\nok\r\n0\r\nx-announced: a\r\nx-unannounced: b\r\n\r\n"
    ],
    "obs-fold": [
        b"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    ],
    "space-colon": [
        b"HTTP/1.1 200 OK\r\nX-Space : v\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    ],
    "two-cl": [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok!"
    ],
    "cl-te": [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n"
        b"Connection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    ],
    "http10-no-length": [b"HTTP/1.0 200 OK\r\n\r\nuntil close"],  # ends with the write side
    "hop": [
        b"HTTP/1.1 200 OK\r\nConnection: close, x-resp-hop\r\nX-Resp-Hop: 1\r\n"
        b"Keep-Alive: timeout=5\r\nContent-Length: 2\r\n\r\nok"
    ],
}


UNTIL_CLOSE = {"http10-no-length"}


class Incomplete(Exception):
    """The peer closed (or went silent) in the middle of a message."""


class Reader:
    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def _fill(self):
        if self.sock is None:
            raise Incomplete()
        try:
            data = self.sock.recv(65536)
        except (socket.timeout, OSError):
            data = b""
        if not data:
            raise Incomplete()
        self.buf += data

    def until(self, mark, limit=HEAD_LIMIT):
        while mark not in self.buf:
            if len(self.buf) > limit:
                raise Incomplete()
            self._fill()
        i = self.buf.index(mark) + len(mark)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def exact(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def at_eof(self):
        if self.buf:
            return False
        try:
            self._fill()
            return False
        except Incomplete:
            return True


def split_head(head):
    """(start line, [(name, value)]) of a head without its final CRLF CRLF."""
    lines = head.split(b"\r\n")
    fields = []
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        fields.append((name.decode("latin-1"), value.strip(b" \t").decode("latin-1")))
    return lines[0].decode("latin-1"), fields


def values(fields, name):
    return [v for n, v in fields if n.lower() == name]


def read_chunked(reader, rec):
    """Reads a chunked body into `rec` (body, chunk lines, trailers)."""
    while True:
        line = reader.until(b"\r\n")[:-2]
        rec["chunk_lines"].append(line.decode("latin-1"))
        size = int(line.split(b";")[0].strip(), 16)
        if size == 0:
            break
        rec["body"] += reader.exact(size)
        if reader.exact(2) != b"\r\n":
            rec["error"] = "chunk data not followed by CRLF"
            return
    while True:
        line = reader.until(b"\r\n")[:-2]
        if not line:
            return
        name, _, value = line.partition(b":")
        rec["trailers"].append((name.decode("latin-1"), value.strip().decode("latin-1")))


def read_request(reader, sock, answer_expect):
    """One request from `reader` as a record, or None at a clean end of the connection."""
    if reader.at_eof():
        return None
    rec = {"line": "", "fields": [], "body": b"", "chunk_lines": [], "trailers": [], "error": None}
    try:
        line, fields = split_head(reader.until(b"\r\n\r\n")[:-4])
        rec["line"], rec["fields"] = line, fields
        if answer_expect and [v for v in values(fields, "expect") if v.lower() == "100-continue"]:
            sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        codings = ",".join(values(fields, "transfer-encoding")).lower()
        lengths = values(fields, "content-length")
        if codings.strip():
            if codings.split(",")[-1].strip() == "chunked":
                read_chunked(reader, rec)
            else:
                rec["error"] = "framed by a transfer coding other than chunked"
        elif lengths:
            if len(set(lengths)) > 1 or not lengths[0].isdigit():
                rec["error"] = f"unusable Content-Length {lengths}"
            else:
                rec["body"] = reader.exact(int(lengths[0]))
    except Incomplete:
        rec["error"] = "incomplete: the proxy stopped in the middle of the request"
        rec["body"] += reader.buf
    except ValueError:
        rec["error"] = "bad chunk size line"
    return rec


class Origin:
    """The recording origin; `reset()` before a scenario, `records()` after it, once `idle()`."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.seen = []
        self.conns = {}  # socket -> "fresh" (nothing received yet) or "busy"
        threading.Thread(target=self._accept, daemon=True).start()

    def reset(self):
        with self.lock:
            self.seen = []

    def records(self):
        with self.lock:
            return list(self.seen)

    def idle(self):
        """True when nothing a proxy sent is still to be read: no connection waits to be
        accepted, none is being read, and the fresh ones (a proxy's pool may open one and not
        use it) have nothing pending in the kernel."""
        with self.lock:
            if select.select([self.sock], [], [], 0)[0]:
                return False
            for conn, state in self.conns.items():
                if state == "busy":
                    return False
                try:
                    conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                    return False  # bytes, or the end, not read yet
                except BlockingIOError:
                    continue
                except OSError:
                    return False
            return True

    def _accept(self):
        while True:
            select.select([self.sock], [], [])
            with self.lock:
                try:
                    conn, _ = self.sock.accept()
                except BlockingIOError:
                    continue
                except OSError:
                    return
                conn.setblocking(True)
                self.conns[conn] = "fresh"
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        reader = Reader(conn)
        answered = False
        try:
            # A connection a proxy keeps in its pool may wait long for its first request.
            select.select([conn], [], [], 3600)
            with self.lock:
                self.conns[conn] = "busy"
            conn.settimeout(5)
            while True:
                rec = read_request(reader, conn, answer_expect=not answered)
                if rec is None:
                    break
                with self.lock:
                    self.seen.append(rec)
                if rec["error"]:
                    break
                if not answered:
                    answered = True
                    self._respond(conn, rec)
        except OSError:
            pass
        finally:
            conn.close()
            with self.lock:
                del self.conns[conn]

    def _respond(self, conn, rec):
        choice = (values(rec["fields"], "x-respond") or ["default"])[0]
        parts = RESPONSES.get(choice, RESPONSES["default"])
        head_only = rec["line"].startswith("HEAD ")
        for part in parts:
            if head_only and part.startswith(b"HTTP/1.1 200"):
                part = part[: part.index(b"\r\n\r\n") + 4]
            conn.sendall(part)
        if choice in UNTIL_CLOSE:
            conn.shutdown(socket.SHUT_WR)


def exchange(port, data, finals=1, expect_100=False, head_request=False):
    """Writes `data` to 127.0.0.1:`port` and reads what comes back (see `_read`). With
    `expect_100` the body (after the head) waits until the proxy has answered something or
    WAIT has passed, and is not sent at all after a final response (curl's way). Returns the
    bytes read and whether the proxy ended the connection."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    got = b""
    try:
        if expect_100:
            head, body = data.split(b"\r\n\r\n", 1)
            sock.sendall(head + b"\r\n\r\n")
            got, ended = _read(sock, finals, head_request, first_head_only=True)
            if ended or (got and not got.startswith(b"HTTP/1.1 1")):
                more, ended = (b"", ended) if ended else _read(sock, finals, head_request, got)
                return got + more, ended
            sock.sendall(body)
        else:
            sock.sendall(data)
        more, ended = _read(sock, finals, head_request, got)
        return got + more, ended
    except OSError:
        return got, True
    finally:
        sock.close()


def _read(sock, finals, head_request, before=b"", first_head_only=False):
    """Reads until the proxy closes the connection; or, once `finals` final responses are
    complete, until GRACE passes without a byte (anything more would be a response to a
    request the client did not send); or, before that, until WAIT passes without a byte.
    Returns (bytes read, whether the connection ended)."""
    data = b""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        responses, rest = parse_responses(before + data, head_request)
        finished = [r for r in responses if r[1] >= 200 and r[6]]
        done = rest == b"" and len(finished) >= finals
        if done and "close" in ",".join(values(finished[-1][3], "connection")).lower():
            return data, False  # the proxy said so: nothing more is coming
        if first_head_only and b"\r\n\r\n" in data:
            return data, False
        sock.settimeout(GRACE if done else WAIT)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            return data, False
        except OSError:
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def parse_responses(data, head_request=False, ended=False):
    """[(version, code, reason bytes, fields, body, trailers, complete)] and any bytes that
    are not (the start of) a response, from what a client read (a body without a length is
    complete when the connection has `ended`)."""
    out = []
    while data:
        end = data.find(b"\r\n\r\n")
        if end < 0 or not data.startswith(b"HTTP/"):
            return out, data
        head, data = data[:end], data[end + 4 :]
        first = head.split(b"\r\n", 1)[0]
        version, _, rest = first.partition(b" ")
        code, _, reason = rest.partition(b" ")
        _, fields = split_head(head)
        try:
            code = int(code)
        except ValueError:
            return out, head + data
        body, trailers, complete = b"", [], True
        if 100 <= code < 200 or head_request or code in (204, 304):
            pass
        elif "chunked" in ",".join(values(fields, "transfer-encoding")).lower():
            reader = Reader(None)
            reader.buf = data
            rec = {"body": b"", "chunk_lines": [], "trailers": [], "error": None}
            try:
                read_chunked(reader, rec)
            except (Incomplete, ValueError):
                complete = False
            body, trailers, data = rec["body"], rec["trailers"], reader.buf
        elif values(fields, "content-length"):
            try:
                n = int(values(fields, "content-length")[0])
            except ValueError:
                n = len(data) + 1
            complete = len(data) >= n
            body, data = data[:n], data[n:]
        else:
            body, data, complete = data, b"", ended
        out.append((version.decode("latin-1"), code, reason, fields, body, trailers, complete))
        if not complete:
            break
    return out, b""
