"""grpcio server and client for suite 04, run with the suite's venv (no protoc: generic
handlers and raw-bytes methods; the health service comes from grpcio-health-checking).

    peer.py server PORTS_FILE CERT KEY     # h2c and TLS ports on 127.0.0.1, written as JSON
    peer.py client TARGET [--ca CA] [--authority HOST:PORT] [--run LABEL] [--limited]

The client makes every call of the suite and prints one JSON object: per call its status
code, details, response sha256s, and initial/trailing metadata (transport headers dropped).
With `--limited`, only the calls of the rate-limit check: Unary three times, then other
methods (ServerStream, a health Check), then Unary once more.
"""

import argparse
import hashlib
import json
import os
import queue
import random
import sys
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

SERVICE = "interop.Echo"
MAX = 16 * 1024 * 1024  # above the largest message (8 MiB), on both ends
OPTIONS = [("grpc.max_send_message_length", MAX), ("grpc.max_receive_message_length", MAX)]
SIZES = {"0B": 0, "1KiB": 1024, "1MiB": 1024 * 1024, "8MiB": 8 * 1024 * 1024}
STREAM_MESSAGES = 3
TRAILER_BIN = b"\x00\x01\xfe\xff trailer"
# Non-ASCII and '%' in a status message: grpc-message is percent-encoded on the wire.
BAD_DETAILS = "name must not be empty: 100% ünïcode ✓"


def payload(size, seed):
    return random.Random(seed).randbytes(size)


def sha(data):
    return hashlib.sha256(data).hexdigest()


# -- server ------------------------------------------------------------------------------


class Echo:
    """The methods of interop.Echo; metadata steers them (x-count, x-size, x-fail-after...)."""

    def __init__(self):
        self.observed = {}  # call id -> what the server saw of that call
        self.lock = threading.Lock()

    @staticmethod
    def md(context):
        return dict(context.invocation_metadata())

    def answer_metadata(self, context):
        # Request metadata `x-echo-*` comes back in the initial metadata; custom trailers
        # (one text, one binary) go with the status.
        md = self.md(context)
        context.send_initial_metadata(
            [(k, v) for k, v in context.invocation_metadata() if k.startswith("x-echo-")]
        )
        context.set_trailing_metadata(
            [("x-trailer-text", "done " + md.get("x-call", "")), ("x-trailer-bin", TRAILER_BIN)]
        )

    def unary(self, request, context):
        self.answer_metadata(context)
        return request

    def server_stream(self, request, context):
        self.answer_metadata(context)
        md = self.md(context)
        count, size = int(md.get("x-count", "3")), int(md.get("x-size", "0"))
        fail_after = int(md.get("x-fail-after", "-1"))
        interval = int(md.get("x-interval-ms", "0")) / 1000
        for i in range(count):
            if i == fail_after:
                context.abort(grpc.StatusCode.ABORTED, f"stopped after {i} messages")
            yield payload(size, f"{size}/{i}")
            if interval:
                time.sleep(interval)
                if not context.is_active():
                    self.record(md, {"stream ended by the deadline": True})
                    return

    def client_stream(self, request_iterator, context):
        self.answer_metadata(context)
        digests = [sha(m) for m in request_iterator]
        return json.dumps(digests).encode()

    def bidi(self, request_iterator, context):
        self.answer_metadata(context)
        for message in request_iterator:
            yield message

    def fail(self, request, context):
        self.answer_metadata(context)
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, BAD_DETAILS)

    def slow(self, request, context):
        """Waits for the call to end (deadline or client cancel), at most 10 s, and records
        what it saw: whether the client's deadline reached it (grpc-timeout) and whether the
        call was ended before the handler answered."""
        md = self.md(context)
        remaining = context.time_remaining()
        deadline = time.monotonic() + 10
        while context.is_active() and time.monotonic() < deadline:
            time.sleep(0.02)
        self.record(
            md,
            {
                "deadline reached the server": remaining is not None and remaining < 10,
                "call ended before the answer": not context.is_active(),
            },
        )
        return b""

    def record(self, md, facts):
        with self.lock:
            self.observed[md.get("x-run", "") + "/" + md.get("x-call", "")] = facts

    def observe(self, request, context):
        """What the server recorded for call id `request` (waits up to 5 s for it)."""
        key = request.decode()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with self.lock:
                if key in self.observed:
                    return json.dumps(self.observed[key], sort_keys=True).encode()
            time.sleep(0.02)
        return b"null"


def serve(ports_file, cert, key):
    echo = Echo()
    # Raw bytes in and out: no protobuf messages, no generated code.
    ident = lambda b: b
    unary, stream_out = grpc.unary_unary_rpc_method_handler, grpc.unary_stream_rpc_method_handler
    stream_in, bidi = grpc.stream_unary_rpc_method_handler, grpc.stream_stream_rpc_method_handler
    handlers = {
        "Unary": unary(echo.unary, ident, ident),
        "ServerStream": stream_out(echo.server_stream, ident, ident),
        "ClientStream": stream_in(echo.client_stream, ident, ident),
        "Bidi": bidi(echo.bidi, ident, ident),
        "Fail": unary(echo.fail, ident, ident),
        "Slow": unary(echo.slow, ident, ident),
        "Observe": unary(echo.observe, ident, ident),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32), options=OPTIONS)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, handlers)])
    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set("interop.Down", health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    h2c = server.add_insecure_port("127.0.0.1:0")
    with open(cert, "rb") as c, open(key, "rb") as k:
        creds = grpc.ssl_server_credentials([(k.read(), c.read())])
    tls = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    with open(ports_file + ".tmp", "w") as f:
        json.dump({"h2c": h2c, "tls": tls}, f)
    os.replace(ports_file + ".tmp", ports_file)
    server.wait_for_termination()


# -- client ------------------------------------------------------------------------------

# Headers of the transport, not of the call: dropped from both sides' metadata before the
# comparison. `via` is one egressd adds (`via: 2 egressd` on every HTTP/2 response,
# docs/configuration.md "Requests on the way through"), and so is `date` (grpcio's server sends none); the others
# differ by stack and say nothing of the call. Every other key is compared.
TRANSPORT = {"date", "server", "user-agent", "grpc-accept-encoding", "content-type", "via"}


def metadata(md):
    if md is None:
        return None
    out = []
    for k, v in md:
        if k in TRANSPORT:
            continue
        out.append([k, v.hex() if isinstance(v, bytes) else v])
    return sorted(out)


def outcome(call, responses, error=None):
    source = error if error is not None else call
    return {
        "code": source.code().name,
        "details": source.details(),
        "responses": [sha(r) for r in responses],
        "sizes": [len(r) for r in responses],
        "initial metadata": metadata(source.initial_metadata()),
        "trailing metadata": metadata(source.trailing_metadata()),
    }


def request_md(name, run):
    return [
        ("x-call", name),
        ("x-echo-text", f"hello {name}"),
        ("x-echo-bin", b"\x00\xffbinary metadata\x80"),
        ("x-run", run),
    ]


class Client:
    def __init__(self, target, ca, authority, run):
        options = list(OPTIONS)
        if authority:
            # egressd routes by :authority: the channel connects to the listener and
            # names the upstream `localhost:PORT` (an FQDN Backend of the config).
            options.append(("grpc.default_authority", authority))
        if ca:
            with open(ca, "rb") as f:
                creds = grpc.ssl_channel_credentials(root_certificates=f.read())
            self.channel = grpc.secure_channel(target, creds, options=options)
        else:
            self.channel = grpc.insecure_channel(target, options=options)
        self.run = run
        self.results = {}

    def method(self, kind, name):
        ident = lambda b: b
        return getattr(self.channel, kind)(
            f"/{SERVICE}/{name}", request_serializer=ident, response_deserializer=ident
        )

    def unary(self, label, method, request, timeout=30, md=()):
        try:
            response, call = self.method("unary_unary", method).with_call(
                request, metadata=request_md(label, self.run) + list(md), timeout=timeout
            )
            result = outcome(call, [response])
        except grpc.RpcError as e:
            result = outcome(None, [], e)
        self.results[label] = result
        return result

    def server_stream(self, label, md, timeout=60, request=b""):
        call = self.method("unary_stream", "ServerStream")(
            request, metadata=request_md(label, self.run) + md, timeout=timeout
        )
        responses = []
        try:
            for r in call:
                responses.append(r)
        except grpc.RpcError as e:
            self.results[label] = outcome(None, responses, e)
            return self.results[label]
        self.results[label] = outcome(call, responses)
        return self.results[label]

    def client_stream(self, label, messages):
        try:
            response, call = self.method("stream_unary", "ClientStream").with_call(
                iter(messages), metadata=request_md(label, self.run), timeout=60
            )
            result = outcome(call, [response])
            result["server saw"] = json.loads(response)
        except grpc.RpcError as e:
            result = outcome(None, [], e)
        self.results[label] = result
        return result

    def bidi(self, label, messages, cancel_after=None):
        """Ping-pong: the next message is sent only once the previous echo came back, so a
        proxy that buffered a stream would hang here (bounded by the deadline)."""
        q = queue.Queue()
        done = object()

        def requests():
            while True:
                m = q.get()
                if m is done:
                    return
                yield m

        call = self.method("stream_stream", "Bidi")(
            requests(), metadata=request_md(label, self.run), timeout=60
        )
        responses = []
        q.put(messages[0])
        try:
            for r in call:
                responses.append(r)
                if cancel_after is not None and len(responses) == cancel_after:
                    call.cancel()
                    break
                if len(responses) < len(messages):
                    q.put(messages[len(responses)])
                else:
                    q.put(done)
        except grpc.RpcError as e:
            q.put(done)
            self.results[label] = outcome(None, responses, e)
            return self.results[label]
        q.put(done)
        self.results[label] = outcome(call, responses)
        return self.results[label]

    def observe(self, label):
        response, _ = self.method("unary_unary", "Observe").with_call(
            f"{self.run}/{label}".encode(), timeout=10)
        return json.loads(response)

    def health(self, service):
        stub = health_pb2_grpc.HealthStub(self.channel)
        try:
            r, call = stub.Check.with_call(
                health_pb2.HealthCheckRequest(service=service), timeout=10
            )
            return {
                "code": call.code().name,
                "status": health_pb2.HealthCheckResponse.ServingStatus.Name(r.status),
            }
        except grpc.RpcError as e:
            return {"code": e.code().name, "details": e.details()}


def client(args):
    c = Client(args.target, args.ca, args.authority, args.run)
    for size_name, size in SIZES.items():
        request = payload(size, f"request {size}")
        r = c.unary(f"unary {size_name}", "Unary", request)
        r["echo matches"] = r["responses"] == [sha(request)]
        c.server_stream(
            f"server-streaming {STREAM_MESSAGES} x {size_name}",
            [("x-count", str(STREAM_MESSAGES)), ("x-size", str(size))],
        )
        messages = [payload(size, f"client {size}/{i}") for i in range(STREAM_MESSAGES)]
        r = c.client_stream(f"client-streaming {STREAM_MESSAGES} x {size_name}", messages)
        r["all arrived"] = r.get("server saw") == [sha(m) for m in messages]
        r = c.bidi(f"bidi ping-pong {STREAM_MESSAGES} x {size_name}", messages)
        r["echo matches"] = r["responses"] == [sha(m) for m in messages]

    c.unary("status INVALID_ARGUMENT with details", "Fail", b"")
    c.server_stream(
        "status ABORTED after 2 streamed messages",
        [("x-count", "5"), ("x-size", "100"), ("x-fail-after", "2")],
    )
    c.unary("unknown method: UNIMPLEMENTED", "NoSuchMethod", b"x")

    # Deadlines. The client's own timer and egressd's grpc-timeout bound race each other,
    # so only the code is kept (details are whichever side spoke first).
    label = "deadline 500ms on a call the server never answers"
    r = c.unary(label, "Slow", b"", timeout=0.5)
    c.results[label] = {"code": r["code"], "server saw": c.observe(label)}
    label = "deadline 800ms mid-way through a stream of 20 x 100ms"
    r = c.server_stream(
        label, [("x-count", "20"), ("x-size", "10"), ("x-interval-ms", "100")], timeout=0.8
    )
    c.results[label] = {
        "code": r["code"],
        "some messages arrived before": 0 < len(r["responses"]) < 20,
        "server saw": c.observe(label),
    }
    label = "client cancels a bidi stream after 1 echo"
    r = c.bidi(label, [b"one", b"two", b"three"], cancel_after=1)
    c.results[label] = {"code": r["code"], "responses": r["responses"]}

    for service in ["", SERVICE, "interop.Down", "interop.Unknown"]:
        c.results[f"health Check {service!r}"] = c.health(service)
    c.channel.close()
    json.dump(c.results, sys.stdout, sort_keys=True)


def limited(args):
    """The rate-limit check's calls (egressd-rate-limit.yaml allows Unary twice an hour)."""
    c = Client(args.target, args.ca, args.authority, args.run)
    for i in range(1, 4):
        c.unary(f"Unary call {i}", "Unary", b"ping")
    c.server_stream("ServerStream after them", [("x-count", "2"), ("x-size", "10")])
    c.results["health Check '' after them"] = c.health("")
    c.unary("Unary call 4", "Unary", b"ping")
    c.channel.close()
    json.dump(c.results, sys.stdout, sort_keys=True)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("server")
    s.add_argument("ports_file")
    s.add_argument("cert")
    s.add_argument("key")
    c = sub.add_parser("client")
    c.add_argument("target")
    c.add_argument("--ca")
    c.add_argument("--authority")
    c.add_argument("--run", default="")
    c.add_argument("--limited", action="store_true")
    args = p.parse_args()
    if args.mode == "server":
        serve(args.ports_file, args.cert, args.key)
    elif args.limited:
        limited(args)
    else:
        client(args)


if __name__ == "__main__":
    main()
