"""Suite 10's Python peers, run by the suite on target/interop/10-interception/venv:

    peer.py http LIBRARY BASE CA [PROXY]          # requests, httpx or httpx-h2 (http2=True):
                                                  # one session of requests to BASE (https://)
    peer.py ws URI CA [PROXY]                     # a websockets client session
    peer.py ws-server PORT_FILE CERT KEY          # a wss echo server on 127.0.0.1
    peer.py mcp URL CA [PROXY]                    # the MCP Python SDK's client, both modes
    peer.py mcp-server PORT_FILE CERT KEY         # the SDK's server over TLS, two ports

CA is the only certificate the client trusts (the upstream's own CA direct, egressd's
interception CA through egressd). PROXY, when given, is egressd's listener, passed to the
library's own proxy setting (`proxies=`, `proxy=`): the client sends `CONNECT localhost:PORT`
and runs its TLS inside. Proxy variables of the environment are cleared first and NO_PROXY set
empty, so nothing is skipped for `localhost` and a run without PROXY is really direct. Clients
print one JSON document of facts; servers write their ports to PORT_FILE once listening.
"""

import asyncio
import hashlib
import json
import os
import random
import socket
import ssl
import sys

for _name in list(os.environ):
    if _name.lower().endswith("_proxy"):
        del os.environ[_name]
os.environ["NO_PROXY"] = os.environ["no_proxy"] = ""


def sha(data):
    return hashlib.sha256(data).hexdigest()


def blob(size, seed):
    return random.Random(seed).randbytes(size)


# -- requests and httpx ----------------------------------------------------------------------

# (method, path, body): the same sequence for both libraries, on one connection (keep-alive).
SEQUENCE = [
    ("GET", "/hello?lang=en&n=1", None),
    ("POST", "/items", json.dumps({"name": "widget", "count": 3}).encode()),
    ("PUT", "/items/7", blob(64 * 1024, 7)),
    ("GET", "/big", None),
    ("GET", "/missing", None),
    ("DELETE", "/items/7", None),
]


def response_facts(status, headers, body):
    kind = headers.get("content-type", "")
    facts = {"status": status, "content-type": kind}
    if kind.startswith("application/json"):
        facts["json"] = json.loads(body)
    else:
        facts["sha256"], facts["size"] = sha(body), len(body)
    return facts


def with_requests(base, ca, proxy):
    import requests

    out, versions = [], set()
    with requests.Session() as s:
        s.trust_env = False
        proxies = {"https": proxy, "http": proxy} if proxy else None
        for method, path, body in SEQUENCE:
            try:
                r = s.request(method, base + path, data=body, verify=ca, proxies=proxies,
                              timeout=30)
                out.append(response_facts(r.status_code, r.headers, r.content))
                versions.add({10: "HTTP/1.0", 11: "HTTP/1.1"}.get(r.raw.version))
            except requests.exceptions.RequestException as e:
                out.append({"failed": type(e).__name__, "detail": str(e)[:300]})
    return {"responses": out, "versions": sorted(versions)}


def with_httpx(base, ca, proxy, http2=False):
    import httpx

    out, versions = [], set()
    context = ssl.create_default_context(cafile=ca)
    with httpx.Client(proxy=proxy, verify=context, trust_env=False, timeout=30,
                      http2=http2) as c:
        for method, path, body in SEQUENCE:
            try:
                r = c.request(method, base + path, content=body)
                out.append(response_facts(r.status_code, r.headers, r.content))
                versions.add(r.http_version)
            except httpx.HTTPError as e:
                out.append({"failed": type(e).__name__, "detail": str(e)[:300]})
    return {"responses": out, "versions": sorted(versions)}


# -- websockets ------------------------------------------------------------------------------

async def ws_client(uri, ca, proxy):
    try:
        return await ws_session(uri, ca, proxy)
    except Exception as e:  # a failed run is a fact to compare
        return {"failed": f"{type(e).__name__}: {e}"[:300]}


async def ws_session(uri, ca, proxy):
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    context = ssl.create_default_context(cafile=ca)
    out = {}
    async with connect(uri, ssl=context, proxy=proxy, subprotocols=["chat.v2"],
                       max_size=None, open_timeout=30) as ws:
        out["handshake"] = {
            "status": ws.response.status_code,
            "subprotocol": ws.subprotocol,
            "extensions": ws.response.headers.get("Sec-WebSocket-Extensions"),
        }
        out["what the server saw"] = json.loads(await ws.recv())
        echoes = []
        for message in ["hello", "h\u00e9llo w\u00f6rld \u2603", blob(0, 0), blob(125, 1),
                        blob(65536, 2), blob(1 << 20, 3), "x" * 70000]:
            await ws.send(message)
            back = await ws.recv()
            data = back.encode() if isinstance(back, str) else back
            sent = message.encode() if isinstance(message, str) else message
            echoes.append({"type": type(back).__name__, "size": len(data),
                           "same as sent": data == sent and type(back) is type(message)})
        out["echoes"] = echoes
        await ws.send(["frag", "mented ", "message"])
        out["fragmented"] = await ws.recv()
        out["ping answered"] = await asyncio.wait_for(await ws.ping(b"p"), 10) is not None
        await ws.send("close 4001")
        try:
            await ws.recv()
        except ConnectionClosed as e:
            out["server closed"] = {"code": e.rcvd.code, "reason": e.rcvd.reason}
    return out


async def ws_server(port_file, cert, key):
    from websockets.asyncio.server import serve

    async def echo(ws):
        request = ws.request
        await ws.send(json.dumps({"path": request.path,
                                  "host": request.headers.get("Host"),
                                  "subprotocol": ws.subprotocol}))
        async for message in ws:
            if message == "close 4001":
                await ws.close(4001, "server says bye")
                return
            await ws.send(message)

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    async with serve(echo, "127.0.0.1", 0, ssl=context, subprotocols=["chat.v2"],
                     max_size=None) as server:
        port = server.sockets[0].getsockname()[1]
        with open(port_file + ".tmp", "w") as f:
            json.dump({"wss": port}, f)
        os.rename(port_file + ".tmp", port_file)
        await asyncio.Future()


# -- the MCP Python SDK ----------------------------------------------------------------------

DENIED = "launch_codes"


async def mcp_client(url, ca, proxy):
    import httpx2
    import mcp_types as types
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError

    context = ssl.create_default_context(cafile=ca)

    def text(result):
        return "".join(c.text for c in result.content if isinstance(c, types.TextContent))

    async def call(client, name, args=None):
        try:
            result = await client.call_tool(name, args or {})
        except MCPError as e:
            return {"error_code": e.code}
        return {"isError": bool(result.is_error), "text": text(result)}

    async def session(mode):
        statuses = []

        async def record(response):
            statuses.append([response.request.method, response.status_code])

        timeout = httpx2.Timeout(30.0, read=300.0)  # the SDK's defaults
        async with httpx2.AsyncClient(proxy=proxy, verify=context, trust_env=False,
                                      timeout=timeout,
                                      event_hooks={"response": [record]}) as http:
            async with Client(streamable_http_client(url, http_client=http), mode=mode,
                              read_timeout_seconds=60) as client:
                out = {"protocol_version": client.protocol_version}
                out["tools/list"] = sorted(t.name for t in (await client.list_tools()).tools)
                out["add"] = await call(client, "add", {"a": 20, "b": 22})
                out["echo"] = await call(client, "echo", {"text": "intercepted? \u00e9"})
                out[DENIED] = await call(client, DENIED)
                out["unknown tool"] = await call(client, "no_such_tool")
        out["http statuses"] = sorted({tuple(s) for s in statuses})
        return out

    facts = {}
    for mode in ["legacy", "auto"]:
        try:
            facts[mode] = await session(mode)
        except Exception as e:  # a failed run is a fact to compare, with its innermost cause
            while isinstance(e, BaseExceptionGroup):
                e = e.exceptions[0]
            facts[mode] = {"failed": f"{type(e).__name__}: {e}"[:300]}
    return facts


def mcp_server(port_file, cert, key):
    import uvicorn
    from mcp.server.mcpserver import MCPServer
    from mcp.server.transport_security import TransportSecuritySettings

    server = MCPServer("interop-interception")

    @server.tool()
    def add(a: int, b: int) -> int:
        return a + b

    @server.tool()
    def echo(text: str) -> str:
        return text

    @server.tool(name=DENIED)
    def launch_codes() -> str:
        # The suite counts these lines: a call egressd denies must never get here.
        print(f"CALLED {DENIED}", file=sys.stderr, flush=True)
        return "0000"

    # egressd forwards Host unchanged (localhost:PORT), but keep the SDK's Host check out of it.
    app = server.streamable_http_app(
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False)
    )
    sockets = []
    for _ in range(2):  # two ports: one Backend without a tool policy, one with
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", ssl_certfile=cert,
                            ssl_keyfile=key)
    server_ = uvicorn.Server(config)

    async def main():
        task = asyncio.create_task(server_.serve(sockets=sockets))
        while not server_.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.02)
        with open(port_file + ".tmp", "w") as f:
            json.dump({"open": sockets[0].getsockname()[1],
                       "policy": sockets[1].getsockname()[1]}, f)
        os.rename(port_file + ".tmp", port_file)
        await task

    asyncio.run(main())


def main(argv):
    command, proxy = argv[0], None
    if command == "http":
        library, base, ca = argv[1:4]
        proxy = argv[4] if len(argv) > 4 else None
        run = {"requests": with_requests, "httpx": with_httpx,
               "httpx-h2": lambda *a: with_httpx(*a, http2=True)}[library]
        print(json.dumps(run(base, ca, proxy), sort_keys=True))
    elif command == "ws":
        uri, ca = argv[1:3]
        proxy = argv[3] if len(argv) > 3 else None
        print(json.dumps(asyncio.run(ws_client(uri, ca, proxy)), sort_keys=True))
    elif command == "ws-server":
        asyncio.run(ws_server(*argv[1:4]))
    elif command == "mcp":
        url, ca = argv[1:3]
        proxy = argv[3] if len(argv) > 3 else None
        print(json.dumps(asyncio.run(mcp_client(url, ca, proxy)), sort_keys=True))
    elif command == "mcp-server":
        mcp_server(*argv[1:4])
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main(sys.argv[1:])
