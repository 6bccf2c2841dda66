"""The ASGI application hypercorn serves in suite 08: every request gets 200 and a short body,
after its own body was read whole."""

BODY = b"hello over HTTP/2\n"


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    while (await receive()).get("more_body"):
        pass
    await send({
        "type": "http.response.start",
        "status": 200,
        "headers": [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(BODY))],
    })
    await send({"type": "http.response.body", "body": BODY})
