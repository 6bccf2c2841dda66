"""The official MCP Python SDK's server (MCPServer), as people run it, for the interop suite.

    mcp_server.py NAME streamable     # Streamable HTTP on /mcp, with an event store
    mcp_server.py NAME sse            # the legacy HTTP+SSE transport: GET /sse, POST /messages/

Binds 127.0.0.1 on an ephemeral port and prints `PORT <n>` once listening. Grown from
tests/fixtures/python/mcp_reference_server.py (same event store) with tools that exercise
what a proxy can break: a per-session counter, spaced progress notifications, a call whose
event stream the server closes half-way (`close_sse_stream`: the client must resume with
`Last-Event-ID`), notifications sent on the standalone GET stream, failures.

`GET /stats` (plain HTTP, for the suite, never proxied) tells what this instance saw, by the
server's own session ids: sessions issued, DELETEs, GET streams, resumptions (GETs with
`Last-Event-ID`), 2026-07-28 (stateless) POSTs, legacy SSE streams and message POSTs.
"""

import asyncio
import contextvars
import json
import socket
import sys
import time

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import GET_STREAM_KEY, EventMessage, EventStore
from mcp.server.transport_security import TransportSecuritySettings

NAME, TRANSPORT = sys.argv[1], sys.argv[2]


# The SDK names a call's event stream by its JSON-RPC request id, which is the same in every
# session (each client counts from 0): a store shared by all sessions must tell them apart.
# Events are stored by a session's server task (started while its `initialize` POST is
# served, so it inherits the context variable set there, a holder filled in once the session
# id is issued) or while a request of the session is served (the variable set from its
# Mcp-Session-Id).
SESSION = contextvars.ContextVar("session", default=[None])


class MemoryEventStore(EventStore):
    """Every event kept in memory, as in the SDK's example store, streams kept per session."""

    def __init__(self):
        self.events = []  # (event id, (session tag, stream id), message)

    async def store_event(self, stream_id, message):
        event_id = str(len(self.events) + 1)
        self.events.append((event_id, (SESSION.get()[0], stream_id), message))
        return event_id

    async def replay_events_after(self, last_event_id, send_callback):
        ids = [e[0] for e in self.events]
        if last_event_id not in ids:
            return None
        start = ids.index(last_event_id)
        stream = self.events[start][1]
        for event_id, stream_of, message in self.events[start + 1 :]:
            if stream_of == stream and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream[1]


stats = {
    "instance": NAME,
    "issued": [],  # session ids this instance answered `initialize` with
    "deletes": [],  # [session id, status] of each DELETE
    "gets": [],  # session ids of GET streams opened without Last-Event-ID
    "resumes": [],  # session ids of GETs carrying Last-Event-ID
    "stateless_posts": 0,  # POSTs with MCP-Protocol-Version 2026-07-28
    "sse_streams": 0,  # legacy transport: GET /sse
    "sse_posts": [],  # legacy transport: session_id of each message POST
    "seen": [],  # every session id any request named (Mcp-Session-Id)
}
counters = {}

server = MCPServer("interop-python")


def session_of(ctx: Context):
    """The server's own session id of this request (None for stateless requests)."""
    request = ctx.request_context.request
    if request is None:
        return None
    if TRANSPORT == "sse":
        return request.query_params.get("session_id")
    return request.headers.get("mcp-session-id")


@server.tool()
def whoami(ctx: Context) -> str:
    """Which instance answers, and the server's id of the session."""
    return json.dumps({"instance": NAME, "session": session_of(ctx)})


@server.tool()
def count(ctx: Context) -> str:
    """A counter of this session: 1, 2, 3, ... on the instance that holds the session."""
    key = session_of(ctx)
    counters[key] = counters.get(key, 0) + 1
    return str(counters[key])


@server.tool()
def add(a: int, b: int) -> int:
    return a + b


@server.tool()
async def progress(steps: int, interval: float, ctx: Context) -> str:
    """`steps` progress notifications `interval` seconds apart; answers the span between
    the first and the last one as sent (the client compares it with what it received)."""
    sent = []
    for i in range(1, steps + 1):
        if i > 1:
            await asyncio.sleep(interval)
        await ctx.report_progress(i, steps, f"step {i}")
        sent.append(time.monotonic())
    return json.dumps({"steps": steps, "sent_span": sent[-1] - sent[0]})


@server.tool()
async def interrupted(steps: int, ctx: Context) -> str:
    """Half the progress notifications, then the server closes this call's event stream
    (`close_sse_stream`), then the rest and the answer: they reach the client only if it
    resumes the stream with `Last-Event-ID` (on the instance that stored the events)."""
    closable = ctx.request_context.close_sse_stream is not None
    for i in range(1, steps + 1):
        if i == steps // 2 + 1:
            await ctx.close_sse_stream()
            await asyncio.sleep(0.5)  # the rest is sent while the client is away
        await ctx.report_progress(i, steps, f"step {i}")
        await asyncio.sleep(0.05)
    return json.dumps({"steps": steps, "closed_mid_way": closable})


@server.tool()
async def announce(ctx: Context) -> str:
    """Three notifications that belong to no request: they travel on the session's
    standalone GET stream (waited for, at most 10 s, so they are not dropped)."""
    manager = server._lowlevel_server._session_manager
    transport = manager._server_instances.get(session_of(ctx))
    deadline = time.monotonic() + 10
    while transport is not None and GET_STREAM_KEY not in transport._request_streams:
        if time.monotonic() > deadline:
            return "no GET stream"
        await asyncio.sleep(0.02)
    await ctx.session.send_resource_list_changed()
    await ctx.session.send_tool_list_changed()
    await ctx.session.send_log_message("info", {"from": "announce"}, logger="interop")
    return "announced"


@server.tool()
def fail() -> str:
    """A tool that fails: MCP answers with an `isError` result."""
    raise ValueError("deliberate failure")


@server.resource("interop://greeting")
def greeting() -> str:
    return "hello from the Python SDK"


# Reached through egressd under a test hostname: no DNS-rebinding Host check.
security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
if TRANSPORT == "sse":
    mcp_app = server.sse_app(transport_security=security)
else:
    # retry 200 ms: the client comes back soon after the server closes a stream.
    mcp_app = server.streamable_http_app(
        event_store=MemoryEventStore(), retry_interval=200, transport_security=security
    )


def header(scope, name):
    return next((v.decode() for k, v in scope["headers"] if k == name), None)


async def app(scope, receive, send):
    if scope["type"] != "http":
        await mcp_app(scope, receive, send)
        return
    method, path = scope["method"], scope["path"]
    if path == "/stats":
        body = json.dumps(stats).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})
        return
    session = header(scope, b"mcp-session-id")
    if session and session not in stats["seen"]:
        stats["seen"].append(session)
    if path == "/sse" and method == "GET":
        stats["sse_streams"] += 1
    elif path.startswith("/messages") and method == "POST":
        query = dict(p.split("=", 1) for p in scope["query_string"].decode().split("&") if "=" in p)
        stats["sse_posts"].append(query.get("session_id"))
    elif method == "GET" and session:
        key = "resumes" if header(scope, b"last-event-id") else "gets"
        stats[key].append(session)
    elif method == "POST" and header(scope, b"mcp-protocol-version") == "2026-07-28":
        stats["stateless_posts"] += 1
    holder = [session]
    SESSION.set(holder)

    async def watching_send(message):
        if message["type"] == "http.response.start":
            issued = next(
                (v.decode() for k, v in message.get("headers", []) if k.lower() == b"mcp-session-id"),
                None,
            )
            if method == "POST" and not session and issued:
                stats["issued"].append(issued)
                holder[0] = issued
            if method == "DELETE":
                stats["deletes"].append([session, message["status"]])
        await send(message)

    await mcp_app(scope, receive, watching_send)


sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", 0))
print(f"PORT {sock.getsockname()[1]}", flush=True)
config = uvicorn.Config(app, log_level="warning", lifespan="on")
uvicorn.Server(config).run(sockets=[sock])
