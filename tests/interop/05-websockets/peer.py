"""`websockets` echo server and client for suite 05, run with the suite's venv.

    peer.py server PORTS_FILE CERT KEY    # ws and wss on 127.0.0.1, ports written as JSON
    peer.py client URI [--ca CA] [--connect HOST:PORT] [--run LABEL]
    peer.py sut PORT_FILE                 # the plain echo server Autobahn|Testsuite tests

The client runs every exchange of the suite and prints one JSON object of what it observed:
per exchange the echoes' sha256 and types, fragment sizes, pongs, close codes and reasons,
handshake answers.
"""

import argparse
import asyncio
import hashlib
import json
import os
import random
import ssl
import string
import sys
from http import HTTPStatus

from websockets.asyncio.client import connect
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed, InvalidStatus

MAX_SIZE = 2 * 1024 * 1024  # above the largest message (1 MiB), on both ends
SIZES = [0, 125, 126, 65535, 65536, 1024 * 1024]
SUBPROTOCOLS = ["chat.v2", "chat.v1"]
# Request headers the server reports back (`cmd:headers`): the ones the client chose.
REPORTED = ["host", "origin", "x-interop", "sec-websocket-protocol", "sec-websocket-version"]


def text(size, seed):
    return "".join(random.Random(seed).choices(string.ascii_letters + " ", k=size))


def binary(size, seed):
    return random.Random(seed).randbytes(size)


def digest(message):
    data = message.encode() if isinstance(message, str) else message
    return {"type": "text" if isinstance(message, str) else "binary",
            "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


# -- server ------------------------------------------------------------------------------

closes = {}  # x-run header -> the close frames the server received on that run's connections


async def handler(ws):
    run = ws.request.headers.get("x-run", "")
    try:
        async for message in ws:
            if isinstance(message, str) and message.startswith("cmd:"):
                await command(ws, run, message[4:])
            else:
                await ws.send(message)
    except ConnectionClosed:
        pass
    finally:
        rcvd = ws.protocol.close_rcvd
        closes.setdefault(run, []).append(
            {"code": rcvd.code, "reason": rcvd.reason} if rcvd else None
        )


async def command(ws, run, cmd):
    name, _, arg = cmd.partition(":")
    if name == "headers":
        h = ws.request.headers
        await ws.send(json.dumps({k: h.get_all(k) for k in REPORTED}, sort_keys=True))
    elif name == "fragments":
        # One binary message sent as `count` frames of `size` bytes.
        count, size = map(int, arg.split(","))
        await ws.send([binary(size, f"fragment {i}") for i in range(count)])
    elif name == "ping":
        # The server pings; the client's library answers on its own.
        waiter = await ws.ping(b"server ping")
        await asyncio.wait_for(waiter, 10)
        await ws.send("pong received by the server")
    elif name == "close":
        await ws.close(int(arg), "server says bye")
    elif name == "closes":
        # The close frames of `count` earlier connections of run `key` (waits up to 5 s for
        # the last handlers to finish).
        key, count = arg.rsplit(",", 1)
        for _ in range(250):
            if len(closes.get(key, [])) >= int(count):
                break
            await asyncio.sleep(0.02)
        await ws.send(json.dumps(closes.get(key, [])))


async def process_request(connection, request):
    if request.path == "/forbidden":
        return connection.respond(HTTPStatus.FORBIDDEN, "no websockets here\n")
    return None


async def serve_both(ports_file, cert, key):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    options = dict(max_size=MAX_SIZE, ping_interval=None, subprotocols=SUBPROTOCOLS,
                   process_request=process_request)
    async with serve(handler, "127.0.0.1", 0, **options) as plain, \
            serve(handler, "127.0.0.1", 0, ssl=context, **options) as secure:
        ports = {"ws": plain.sockets[0].getsockname()[1], "wss": secure.sockets[0].getsockname()[1]}
        with open(ports_file + ".tmp", "w") as f:
            json.dump(ports, f)
        os.replace(ports_file + ".tmp", ports_file)
        await asyncio.Future()


async def sut(port_file):
    """The system under test of the Autobahn fuzzingclient: websockets' echo server as its
    own compliance setup runs it (every message echoed, messages up to 32 MiB, the default
    permessage-deflate, no keepalive pings of its own)."""

    async def echo(ws):
        try:
            async for message in ws:
                await ws.send(message)
        except ConnectionClosed:
            pass

    async with serve(echo, "127.0.0.1", 0, max_size=2**25, ping_interval=None) as server:
        with open(port_file + ".tmp", "w") as f:
            f.write(str(server.sockets[0].getsockname()[1]))
        os.replace(port_file + ".tmp", port_file)
        await asyncio.Future()


# -- client ------------------------------------------------------------------------------


def closed(ws):
    rcvd, sent = ws.protocol.close_rcvd, ws.protocol.close_sent
    return {
        "close received": {"code": rcvd.code, "reason": rcvd.reason} if rcvd else None,
        "close sent": {"code": sent.code, "reason": sent.reason} if sent else None,
    }


class Client:
    def __init__(self, uri, ca, address, run):
        self.uri, self.run = uri, run
        self.kwargs = dict(max_size=MAX_SIZE, ping_interval=None, proxy=None, open_timeout=20,
                           close_timeout=10, origin="http://interop.test",
                           subprotocols=["chat.v1", "chat.v2"],
                           additional_headers={"X-Interop": "yes", "X-Run": run})
        if ca:
            self.kwargs["ssl"] = ssl.create_default_context(cafile=ca)
        if address:
            # Through egressd: the TCP connection goes to egressd's listener while the URI
            # (so the Host header) names the upstream, `localhost:PORT`: egressd routes it
            # by the implicit route of the FQDN Backend for that port. websockets documents
            # `host`/`port` for exactly this ("only changes the destination of the TCP
            # connection ... the host name from uri is still used in the Host header").
            host, port = address.rsplit(":", 1)
            self.kwargs.update(host=host, port=int(port))
        self.results = {}

    def connect(self, path="/", **extra):
        return connect(self.uri.rstrip("/") + path, **{**self.kwargs, **extra})

    async def session(self, label, compression):
        """One connection: handshake, echoes of every size and type, fragments both ways,
        pings both ways, then a client close with 4000 and a reason."""
        r = self.results
        async with self.connect(compression=compression) as ws:
            r[f"{label}: handshake"] = {
                "status": ws.response.status_code,
                "subprotocol": ws.subprotocol,
                "extensions": ws.response.headers.get("Sec-WebSocket-Extensions"),
            }
            await ws.send("cmd:headers")
            r[f"{label}: request headers the server saw"] = json.loads(await ws.recv())
            for size in SIZES:
                for kind, make in [("text", text), ("binary", binary)]:
                    message = make(size, f"{kind} {size}")
                    await ws.send(message)
                    echo = await asyncio.wait_for(ws.recv(), 30)
                    r[f"{label}: echo {kind} {size} B"] = {
                        "echo": digest(echo), "same as sent": echo == message}
            unicode = "héllo wörld ✓ " * 1000
            await ws.send(unicode)
            echo = await ws.recv()
            r[f"{label}: echo multi-byte UTF-8 text"] = {"echo": digest(echo), "same as sent": echo == unicode}

            # Fragmented messages: the client sends one as 5 frames; the server sends one as
            # 4 frames, read frame by frame (the sizes show the frames arrived as sent).
            parts = [binary(1000, f"client fragment {i}") for i in range(5)]
            await ws.send(parts)
            echo = await ws.recv()
            r[f"{label}: fragmented binary message (5 frames) echoed"] = {
                "echo": digest(echo), "same as sent": echo == b"".join(parts)}
            parts = ["fragment ", "of ", "a text ", "message ✓"]
            await ws.send(parts)
            echo = await ws.recv()
            r[f"{label}: fragmented text message (4 frames) echoed"] = {
                "echo": digest(echo), "same as sent": echo == "".join(parts)}
            await ws.send("cmd:fragments:4,3000")
            frames = [digest(f) async for f in ws.recv_streaming()]
            r[f"{label}: server's fragmented message, frame by frame"] = frames

            pong = await ws.ping(b"client ping payload")
            await asyncio.wait_for(pong, 10)
            r[f"{label}: client ping answered by a pong"] = True
            await ws.send("cmd:ping")
            r[f"{label}: server ping answered by a pong"] = await asyncio.wait_for(ws.recv(), 10)

            await ws.close(4000, "client is done ✓")
            r[f"{label}: client closes with 4000 and a reason"] = closed(ws)

        async with self.connect(compression=compression) as ws:
            await ws.send("cmd:close:4001")
            try:
                await asyncio.wait_for(ws.recv(), 10)
                outcome = "no close"
            except ConnectionClosed as e:
                outcome = type(e).__name__
            r[f"{label}: server closes with 4001 and a reason"] = {"raised": outcome, **closed(ws)}

    async def all(self):
        await self.session("permessage-deflate", "deflate")
        await self.session("no compression", None)
        # What the server received of the clients' close frames, in order.
        async with self.connect() as ws:
            await ws.send(f"cmd:closes:{self.run},4")
            self.results["close frames the server received"] = json.loads(await ws.recv())
        try:
            async with self.connect("/forbidden"):
                outcome = {"status": 101}
        except InvalidStatus as e:
            outcome = {"status": e.response.status_code, "body": e.response.body.decode()}
        self.results["upgrade refused by the server with 403"] = outcome
        return self.results


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("server")
    s.add_argument("ports_file")
    s.add_argument("cert")
    s.add_argument("key")
    c = sub.add_parser("client")
    c.add_argument("uri")
    c.add_argument("--ca")
    c.add_argument("--connect")
    c.add_argument("--run", default="")
    sub.add_parser("sut").add_argument("port_file")
    args = p.parse_args()
    if args.mode == "sut":
        asyncio.run(sut(args.port_file))
    elif args.mode == "server":
        asyncio.run(serve_both(args.ports_file, args.cert, args.key))
    else:
        results = asyncio.run(Client(args.uri, args.ca, args.connect, args.run).all())
        json.dump(results, sys.stdout, sort_keys=True)


if __name__ == "__main__":
    main()
