"""The official MCP Python SDK's client (`mcp.Client`) driving mcp_server.py, for the suite.

    mcp_client.py sessions  URL [PROXY] [N]   # N stateful Streamable HTTP sessions at once
    mcp_client.py stateless URL [PROXY]       # the 2026-07-28 protocol (server/discover)
    mcp_client.py legacy    URL [PROXY] [N]   # N sessions over the legacy HTTP+SSE transport
    mcp_client.py limited   URL [PROXY] [N]   # N calls of `add` in one session, then others

PROXY, when given, is egressd's listener (`http://127.0.0.1:PORT`): the SDK's HTTP client
then sends every request to it in absolute form, as with `http_proxy`. Prints one JSON
document of facts: results, counter sequences, progress values, notifications, statuses,
and, for the suite to check against the servers' /stats, each session's instance and the
server's own session id (which whoami reveals).
"""

import json
import sys
import time

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

MODE, URL = sys.argv[1], sys.argv[2]
PROXY = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != "-" else None
N = int(sys.argv[4]) if len(sys.argv) > 4 else 6
TIMEOUT = httpx2.Timeout(30.0, read=300.0)  # the SDK's defaults


def http_client(seen=None, **kwargs):
    """The SDK's default HTTP client (its timeouts), through PROXY when given; records
    (method, status, Mcp-Session-Id) of every answer in `seen`."""

    async def record(response):
        if seen is not None:
            seen.append(
                (response.request.method, response.status_code, response.headers.get("mcp-session-id"))
            )

    kwargs.setdefault("timeout", TIMEOUT)
    return httpx2.AsyncClient(
        proxy=PROXY, trust_env=False, event_hooks={"response": [record]}, **kwargs
    )


def text(result):
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def error_of(call):
    """What a call that should fail gives: an isError result or a JSON-RPC error code."""
    try:
        result = await call
    except MCPError as e:
        return {"error_code": e.code}
    return {"isError": bool(result.is_error), "text": text(result)}


async def timed_progress(client, tool, args):
    """Calls `tool` with a progress callback; (result, [(progress, received at)])."""
    received = []

    async def on_progress(progress, total, message):
        received.append((progress, time.monotonic()))

    result = await client.call_tool(tool, args, progress_callback=on_progress)
    return result, received


def failure(e):
    """An exception as a fact: its innermost type and message."""
    while isinstance(e, BaseExceptionGroup):
        e = e.exceptions[0]
    return {"failed": f"{type(e).__name__}: {e}"}


async def attempt(out, key, step):
    """out[key] = await step(), or the failure: one broken step does not hide the others."""
    try:
        out[key] = await step()
    except Exception as e:
        out[key] = failure(e)


async def one_session(index, results):
    seen = []
    notifications = []
    out = {}

    async def on_message(message):
        if isinstance(message, types.ServerNotification) and not isinstance(
            message, types.ProgressNotification
        ):
            notifications.append(message.method)

    async def whoami(client):
        return json.loads(text(await client.call_tool("whoami")))

    async def session(client):
        out["protocol_version"] = client.protocol_version

        async def tools():
            return sorted(t.name for t in (await client.list_tools()).tools)

        await attempt(out, "tools", tools)
        await attempt(out, "whoami", lambda: whoami(client))

        async def counts():
            return [text(await client.call_tool("count")) for _ in range(5)]

        await attempt(out, "counts", counts)
        await attempt(out, "whoami again", lambda: whoami(client))
        out["same_instance_throughout"] = out["whoami"] == out["whoami again"]

        async def add():
            return text(await client.call_tool("add", {"a": 20, "b": 22}))

        await attempt(out, "add", add)

        async def resource():
            return [c.text for c in (await client.read_resource("interop://greeting")).contents]

        await attempt(out, "resource", resource)

        # Progress spaced over time: received spread like sent (not buffered).
        async def progress():
            result, received = await timed_progress(
                client, "progress", {"steps": 6, "interval": 0.2}
            )
            answer = json.loads(text(result))
            span = received[-1][1] - received[0][1] if received else 0.0
            return {
                "values": [p for p, _ in received],
                "sent_span_over_0.5s": answer["sent_span"] >= 0.5,
                "received_spread_at_least_60%_of_sent": span >= 0.6 * answer["sent_span"],
            }

        await attempt(out, "progress", progress)

        # A stream the server closes half-way, resumed with Last-Event-ID.
        async def resumption():
            result, received = await timed_progress(client, "interrupted", {"steps": 6})
            return {"values": [p for p, _ in received], "answer": json.loads(text(result))}

        await attempt(out, "resumption", resumption)

        # Notifications of no request, on the standalone GET stream.
        async def announce():
            return text(await client.call_tool("announce"))

        await attempt(out, "announce", announce)
        with anyio.move_on_after(10):
            while len(notifications) < 3:
                await anyio.sleep(0.02)
        out["get_stream_notifications"] = sorted(notifications)

        out["errors"] = {
            "failing tool": await error_of(client.call_tool("fail")),
            "unknown tool": await error_of(client.call_tool("no_such_tool")),
            "unknown resource": await error_of(client.read_resource("interop://missing")),
        }

    async with http_client(seen) as http:
        transport = streamable_http_client(URL, http_client=http)
        try:
            async with Client(
                transport, mode="legacy", message_handler=on_message, read_timeout_seconds=60
            ) as client:
                await session(client)
        except Exception as e:
            out["session"] = failure(e)
        # The Client has ended the session (DELETE); the session id now gets the server's 404.
        issued = next((s for m, _, s in seen if m == "POST" and s), None)
        out["delete_statuses"] = [status for m, status, _ in seen if m == "DELETE"]
        if issued:
            late = await http.post(
                URL,
                headers={
                    "mcp-session-id": issued,
                    "mcp-protocol-version": out.get("protocol_version", ""),
                    "accept": "application/json, text/event-stream",
                    "content-type": "application/json",
                },
                content=json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}),
            )
            out["after_delete_status"] = late.status_code
    who = out.get("whoami") or {}
    out["instance"], out["server_session"] = who.get("instance"), who.get("session")
    results[index] = out


async def sessions():
    results = [None] * N
    async with anyio.create_task_group() as tg:
        for i in range(N):
            tg.start_soon(one_session, i, results)
    return {"sessions": results}


async def stateless():
    try:
        return await stateless_facts()
    except Exception as e:
        return failure(e)


async def stateless_facts():
    seen = []
    async with http_client(seen) as http:
        transport = streamable_http_client(URL, http_client=http)
        async with Client(transport, mode="auto", read_timeout_seconds=60) as client:
            out = {"protocol_version": client.protocol_version}
            out["tools"] = sorted(t.name for t in (await client.list_tools()).tools)
            instances = [
                json.loads(text(await client.call_tool("whoami")))["instance"] for _ in range(16)
            ]
            adds = [text(await client.call_tool("add", {"a": i, "b": i})) for i in range(16)]
            out["adds"] = adds
            result, received = await timed_progress(
                client, "progress", {"steps": 4, "interval": 0.2}
            )
            out["progress_values"] = [p for p, _ in received]
            out["errors"] = {
                "failing tool": await error_of(client.call_tool("fail")),
                "unknown tool": await error_of(client.call_tool("no_such_tool")),
            }
            out["instances"] = sorted(set(instances))
    out["session_ids_issued"] = sorted({s for _, _, s in seen if s})
    out["statuses"] = sorted({status for _, status, _ in seen})
    return out


async def legacy_session(index, results):
    try:
        results[index] = await legacy_session_facts()
    except Exception as e:
        results[index] = {"session": failure(e)}


async def legacy_session_facts():
    def factory(headers=None, timeout=None, auth=None):
        return http_client(headers=headers, timeout=timeout or TIMEOUT)

    async with Client(
        sse_client(URL, httpx_client_factory=factory), mode="legacy", read_timeout_seconds=60
    ) as client:
        out = {"protocol_version": client.protocol_version}
        out["tools"] = sorted(t.name for t in (await client.list_tools()).tools)
        who = json.loads(text(await client.call_tool("whoami")))
        out["counts"] = [text(await client.call_tool("count")) for _ in range(5)]
        again = json.loads(text(await client.call_tool("whoami")))
        out["same_instance_throughout"] = who == again
        out["add"] = text(await client.call_tool("add", {"a": 1, "b": 2}))
        result, received = await timed_progress(client, "progress", {"steps": 4, "interval": 0.2})
        out["progress_values"] = [p for p, _ in received]
        out["errors"] = {
            "failing tool": await error_of(client.call_tool("fail")),
            "unknown tool": await error_of(client.call_tool("no_such_tool")),
        }
        out["instance"], out["server_session"] = who["instance"], who["session"]
    return out


async def legacy():
    results = [None] * N
    async with anyio.create_task_group() as tg:
        for i in range(N):
            tg.start_soon(legacy_session, i, results)
    return {"sessions": results}


async def limited():
    """One stateful session: N calls of `add` (each one's result, or the error the SDK raised:
    its type, code, message and data), then another tool, then tools/list; and the HTTP status
    of every POST (a JSON-RPC error still comes in a 200)."""
    seen = []
    out = {}

    async def call(i):
        try:
            return {"result": text(await client.call_tool("add", {"a": i, "b": 1}))}
        except MCPError as e:
            return {"raised": type(e).__name__, "code": e.code, "message": e.message,
                    "data": e.data}

    async with http_client(seen) as http:
        transport = streamable_http_client(URL, http_client=http)
        try:
            async with Client(transport, mode="legacy", read_timeout_seconds=60) as client:
                out["calls"] = [await call(i) for i in range(1, N + 1)]
                await attempt(out, "other tool", lambda: client.call_tool("whoami"))
                if isinstance(out["other tool"], types.CallToolResult):
                    who = json.loads(text(out["other tool"]))
                    out["other tool"] = {"isError": bool(out["other tool"].is_error),
                                         "instance": who["instance"]}

                async def tools():
                    return sorted(t.name for t in (await client.list_tools()).tools)

                await attempt(out, "tools", tools)
            out["session"] = "ended"
        except Exception as e:
            out["session"] = failure(e)
    out["post_statuses"] = sorted({status for m, status, _ in seen if m == "POST"})
    return out


async def main():
    mode = {"sessions": sessions, "stateless": stateless, "legacy": legacy,
            "limited": limited}[MODE]
    with anyio.fail_after(240):
        print(json.dumps(await mode(), sort_keys=True))


anyio.run(main)
