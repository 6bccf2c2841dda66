"""The scenarios of the differential suite: raw HTTP/1.1 bytes, the same for every proxy.

`{HOST}` in a scenario's bytes stands for `localhost:<the origin's port>`: every request is in
origin-form with that `Host` unless the scenario is about the target's form, which is what a
client of a reverse proxy sends and what egressd routes by. Every request ends its connection
(`Connection: close`) unless the scenario is about keep-alive, so that a proxy that keeps it
open after all is seen ("open" in a verdict).

`watch` names request fields whose values (as the origin received them) go into the verdict,
beyond `Host`, `Content-Length` and `Transfer-Encoding`; `+added` lists the names of fields
the proxy added, `+chunks` the chunk-size lines. `rwatch` names response fields the client's
verdict shows, beyond the status codes; `+reason` the reason phrase, `+body` the body,
`+trailers` the trailer fields, `+version` the status line's version.
"""

H = b"Host: {HOST}\r\n"
C = b"Connection: close\r\n"
CHUNKED = b"5\r\nhello\r\n0\r\n\r\n"


class Case:
    def __init__(self, name, raw, about, watch=(), rwatch=(), expect_100=False, head=False,
                 finals=1):
        self.name = name
        self.finals = finals
        self.raw = raw
        self.about = about
        self.watch = watch
        self.rwatch = rwatch
        self.expect_100 = expect_100
        self.head = head


def get(target=b"/a", extra=b"", version=b"HTTP/1.1", method=b"GET", host=H):
    return method + b" " + target + b" " + version + b"\r\n" + host + extra + C + b"\r\n"


def post(extra, body, target=b"/a", version=b"HTTP/1.1"):
    return b"POST " + target + b" " + version + b"\r\n" + H + extra + C + b"\r\n" + body


def respond(name, extra=b"", target=b"/a", method=b"GET"):
    return get(target, b"X-Respond: " + name + b"\r\n" + extra, method=method)


FRAMING = [
    Case("post-content-length", post(b"Content-Length: 5\r\n", b"hello"), "baseline"),
    Case("post-chunked", post(b"Transfer-Encoding: chunked\r\n", CHUNKED), "baseline"),
    Case(
        "pipelined-two-requests",
        b"GET /1 HTTP/1.1\r\n" + H + b"\r\n" + get(b"/2"),
        "RFC 9112 §9.3.2: pipelined requests answered in order",
        finals=2,
    ),
    Case(
        "cl-and-te",
        post(b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", CHUNKED),
        "RFC 9112 §6.3 (3): Transfer-Encoding overrides Content-Length; may be rejected, "
        "else the connection closes after the response",
    ),
    Case(
        "te-cl-smuggled-request",
        b"POST /a HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\nContent-Length: 40\r\n\r\n"
        b"0\r\n\r\n" + get(b"/smuggled"),
        "RFC 9112 §6.3 (3): a request framed both ways must not leave a second request to the "
        "next hop's reading of Content-Length",
    ),
    Case(
        "te-gzip-chunked",
        post(b"Transfer-Encoding: gzip, chunked\r\n", CHUNKED),
        "RFC 9112 §6.1: a coding the server does not implement: 501",
    ),
    Case(
        "te-chunked-then-gzip",
        post(b"Transfer-Encoding: chunked, gzip\r\n", CHUNKED),
        "RFC 9112 §6.3 (4): chunked not last in a request: 400",
    ),
    Case(
        "te-two-fields-gzip-chunked",
        post(b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n", CHUNKED),
        "RFC 9110 §5.3: two field lines are one list, `gzip, chunked`",
    ),
    Case(
        "te-chunked-chunked",
        post(b"Transfer-Encoding: chunked, chunked\r\n", CHUNKED),
        "RFC 9112 §7: chunked must not be applied twice",
    ),
    Case(
        "te-identity",
        post(b"Transfer-Encoding: identity\r\n", b"hello"),
        "RFC 9112 §6.1: identity is no longer a registered coding: 501",
    ),
    Case(
        "te-uppercase",
        post(b"Transfer-Encoding: CHUNKED\r\n", CHUNKED),
        "RFC 9112 §7: coding names are case-insensitive",
    ),
    Case(
        "te-xchunked",
        post(b"Transfer-Encoding: xchunked\r\n", CHUNKED),
        "RFC 9112 §6.1: an unknown coding: 501",
    ),
    Case(
        "te-vertical-tab",
        post(b"Transfer-Encoding:\x0bchunked\r\n", CHUNKED),
        "RFC 9110 §5.5: VT is not field whitespace; the coding is `\\x0bchunked`",
    ),
    Case(
        "te-space-before-colon",
        post(b"Transfer-Encoding : chunked\r\n", CHUNKED),
        "RFC 9112 §5.1: whitespace between name and colon: 400",
    ),
    Case(
        "te-in-http10",
        post(b"Transfer-Encoding: chunked\r\n", CHUNKED, version=b"HTTP/1.0"),
        "RFC 9112 §6.1: Transfer-Encoding in HTTP/1.0 means faulty framing; close after",
    ),
    Case(
        "cl-twice-same",
        post(b"Content-Length: 5\r\nContent-Length: 5\r\n", b"hello"),
        "RFC 9110 §8.6: identical values may be taken as one",
    ),
    Case(
        "cl-twice-different",
        post(b"Content-Length: 5\r\nContent-Length: 6\r\n", b"hello!"),
        "RFC 9112 §6.3 (5): differing lengths: 400",
    ),
    Case(
        "cl-list",
        post(b"Content-Length: 5, 5\r\n", b"hello"),
        "RFC 9110 §8.6: a list of identical values may be taken as one",
    ),
    Case(
        "cl-plus-sign",
        post(b"Content-Length: +5\r\n", b"hello"),
        "RFC 9110 §8.6: Content-Length = 1*DIGIT: 400",
    ),
    Case(
        "cl-overflow",
        post(b"Content-Length: 99999999999999999999999\r\n", b"hello"),
        "RFC 9110 §8.6: a length that does not fit: 400",
    ),
    Case(
        "get-with-body",
        get(extra=b"Content-Length: 5\r\n") + b"hello",
        "RFC 9110 §9.3.1: a GET body has no meaning but is framed as any other",
    ),
    Case(
        "chunk-extension",
        post(b"Transfer-Encoding: chunked\r\n", b"5;name=value\r\nhello\r\n0\r\n\r\n"),
        "RFC 9112 §7.1.1: unrecognised chunk extensions are ignored",
        watch=("+chunks",),
    ),
    Case(
        "chunk-size-not-hex",
        post(b"Transfer-Encoding: chunked\r\n", b"5x\r\nhello\r\n0\r\n\r\n"),
        "RFC 9112 §7.1: chunk-size = 1*HEXDIG: 400",
    ),
    Case(
        "chunk-size-overflow",
        post(b"Transfer-Encoding: chunked\r\n", b"10000000000000005\r\nhello\r\n0\r\n\r\n"),
        "RFC 9112 §7.1: a size that does not fit must be refused, not truncated",
    ),
    Case(
        "chunk-data-without-crlf",
        post(b"Transfer-Encoding: chunked\r\n", b"5\r\nhelloXX0\r\n\r\n"),
        "RFC 9112 §7.1: chunk-data CRLF: 400",
    ),
    Case(
        "chunk-bare-lf",
        post(b"Transfer-Encoding: chunked\r\n", b"5\nhello\n0\n\n"),
        "RFC 9112 §7.1: chunk lines end in CRLF (the bare-LF leniency of §2.2 is for the head)",
    ),
]

HEADERS = [
    Case(
        "obs-fold",
        get(extra=b"X-Fold: a\r\n b\r\n"),
        "RFC 9112 §5.2: obs-fold: 400, or replaced by SP",
        watch=("x-fold",),
    ),
    Case(
        "space-before-colon",
        get(extra=b"X-Test : 1\r\n"),
        "RFC 9112 §5.1: whitespace between name and colon: 400",
    ),
    Case(
        "bare-lf-head",
        get().replace(b"\r\n", b"\n"),
        "RFC 9112 §2.2: a recipient may take a bare LF as a line end",
    ),
    Case(
        "bare-cr-in-value",
        get(extra=b"X-Cr: a\rb\r\n"),
        "RFC 9112 §2.2: a bare CR is invalid, or replaced by SP",
        watch=("x-cr",),
    ),
    Case(
        "nul-in-value",
        get(extra=b"X-Nul: a\x00b\r\n"),
        "RFC 9110 §5.5: NUL in a field value: reject",
    ),
    Case(
        "bad-char-in-name",
        get(extra=b"X@Y: 1\r\n"),
        "RFC 9110 §5.1: a field name is a token: 400",
    ),
    Case(
        "whitespace-before-first-field",
        b"GET /a HTTP/1.1\r\n X-Lead: 1\r\n" + H + C + b"\r\n",
        "RFC 9112 §2.2: reject, or ignore the whitespace-preceded line",
        watch=("x-lead",),
    ),
]

TARGETS = [
    Case("get-origin-form", get(), "baseline", watch=("+added",)),
    Case(
        "absolute-form",
        get(b"http://{HOST}/a"),
        "RFC 9112 §3.2.2: absolute-form taken by a server",
    ),
    Case(
        "absolute-form-host-mismatch",
        get(b"http://{HOST}/a", host=b"Host: other.test\r\n"),
        "RFC 9112 §3.2.2: Host is replaced by the target's authority",
    ),
    Case(
        "authority-form-get",
        get(b"{HOST}"),
        "RFC 9112 §3.2.3: authority-form is for CONNECT only",
    ),
    Case("asterisk-get", get(b"*"), "RFC 9112 §3.2.4: asterisk-form is for OPTIONS only"),
    Case(
        "options-asterisk",
        get(b"*", method=b"OPTIONS"),
        "RFC 9112 §3.2.4: OPTIONS * reaches the server as is",
    ),
    Case(
        "fragment",
        get(b"/a#frag"),
        "RFC 9112 §3.2: a request target has no fragment",
    ),
    Case(
        "percent-encoded-path",
        get(b"/a%20b/%7Euser/%41"),
        "RFC 3986 §6.2.2.2: unreserved characters may be decoded, others kept",
    ),
    Case(
        "encoded-slash",
        get(b"/a%2fb"),
        "RFC 3986 §2.2: %2F is data, not a separator",
    ),
    Case(
        "dot-segments",
        get(b"/a/../b/./c"),
        "RFC 3986 §5.2.4: dot segments",
    ),
    Case(
        "non-ascii-in-path",
        get(b"/caf\xc3\xa9"),
        "RFC 9112 §3.2, RFC 3986 §2: a target is ASCII: 400",
    ),
    Case(
        "space-in-target",
        b"GET /a b HTTP/1.1\r\n" + H + C + b"\r\n",
        "RFC 9112 §3: three parts separated by single spaces: 400",
    ),
    Case(
        "quote-in-query",
        get(b'/q?a="x"'),
        "RFC 3986 §3.4: `\"` is not allowed in a query",
    ),
]

VERSIONS_METHODS = [
    Case(
        "http10-with-host",
        get(version=b"HTTP/1.0"),
        "RFC 9110 §2.5: answered with the server's own version",
        rwatch=("+version",),
    ),
    Case(
        "http10-without-host",
        get(version=b"HTTP/1.0", host=b""),
        "RFC 9112 §3.2: an HTTP/1.0 request may lack Host",
    ),
    Case(
        "http12",
        get(version=b"HTTP/1.2"),
        "RFC 9110 §2.5: a higher minor version is taken as the highest one spoken",
    ),
    Case(
        "http20-text",
        get(version=b"HTTP/2.0"),
        "RFC 9110 §15.6.6: a major version not supported: 505",
    ),
    Case(
        "lowercase-version",
        get(version=b"http/1.1"),
        "RFC 9112 §2.3: HTTP-name is case-sensitive: 400",
    ),
    Case(
        "connect-to-reverse-listener",
        b"CONNECT {HOST} HTTP/1.1\r\n" + H + C + b"\r\n",
        "RFC 9110 §9.3.6: CONNECT is a proxy's to accept or refuse",
    ),
    Case(
        "trace-max-forwards-zero",
        get(extra=b"Max-Forwards: 0\r\n", method=b"TRACE"),
        "RFC 9110 §7.6.2: Max-Forwards 0: the proxy answers, it does not forward",
        watch=("max-forwards",),
    ),
    Case(
        "options-max-forwards",
        get(extra=b"Max-Forwards: 3\r\n", method=b"OPTIONS"),
        "RFC 9110 §7.6.2: an intermediary decrements Max-Forwards of OPTIONS before forwarding",
        watch=("max-forwards",),
    ),
    Case("unknown-method", get(method=b"PURGE"), "RFC 9110 §9.1: methods are extensible"),
    Case(
        "lowercase-method",
        get(method=b"get"),
        "RFC 9110 §9.1: methods are case-sensitive; `get` is not GET",
    ),
    Case(
        "expect-100-continue",
        post(b"Content-Length: 5\r\nExpect: 100-continue\r\n", b"hello"),
        "RFC 9110 §10.1.1: a proxy may answer 100 itself or forward the expectation",
        watch=("expect",),
        expect_100=True,
    ),
    Case(
        "expect-unknown",
        post(b"Content-Length: 5\r\nExpect: teapot\r\n", b"hello"),
        "RFC 9110 §10.1.1: an expectation not understood may be answered 417",
        watch=("expect",),
    ),
    Case(
        "expect-100-with-empty-body",
        get(extra=b"Content-Length: 0\r\nExpect: 100-continue\r\n"),
        "RFC 9110 §10.1.1: nothing to continue to",
        watch=("expect",),
    ),
]

HOP_HOST = [
    Case(
        "connection-named-field",
        get(extra=b"Connection: x-hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\n"
            b"Proxy-Connection: keep-alive\r\n"),
        "RFC 9110 §7.6.1: fields named in Connection, and Keep-Alive, are not forwarded",
        watch=("connection", "x-hop", "keep-alive", "proxy-connection"),
    ),
    Case(
        "connection-names-content-length",
        post(b"Connection: content-length\r\nContent-Length: 5\r\n", b"hello"),
        "RFC 9110 §7.6.1: a framing field named in Connection must not unframe the body",
    ),
    Case(
        "te-trailers",
        get(extra=b"TE: trailers\r\nConnection: TE\r\n"),
        "RFC 9110 §10.1.4: TE is hop-by-hop; a proxy may send its own",
        watch=("te",),
    ),
    Case(
        "upgrade-without-connection",
        get(extra=b"Upgrade: foo\r\n"),
        "RFC 9110 §7.8: Upgrade is only meaningful when named in Connection",
        watch=("upgrade",),
    ),
    Case("host-missing", get(host=b""), "RFC 9112 §3.2: an HTTP/1.1 request without Host: 400"),
    Case("host-twice", get(extra=b"Host: other.test\r\n"), "RFC 9112 §3.2: two Host fields: 400"),
    Case(
        "host-with-userinfo",
        get(host=b"Host: user@{HOST}\r\n"),
        "RFC 9110 §7.2: Host has no userinfo: 400",
    ),
    Case(
        "host-empty",
        get(host=b"Host: \r\n"),
        "RFC 9112 §3.2: an empty Host for an origin-form target is invalid",
    ),
]

TRAILERS_RESPONSES = [
    Case(
        "request-trailer-announced",
        post(
            b"Transfer-Encoding: chunked\r\nTrailer: x-t\r\n",
            b"5\r\nhello\r\n0\r\nx-t: 1\r\n\r\n",
        ),
        "RFC 9110 §6.5: a proxy forwards trailer fields",
    ),
    Case(
        "request-trailer-unannounced",
        post(b"Transfer-Encoding: chunked\r\n", b"5\r\nhello\r\n0\r\nx-t: 1\r\n\r\n"),
        "RFC 9110 §6.5: a proxy forwards trailer fields, announced or not",
    ),
    Case(
        "response-trailers",
        respond(b"trailers", b"TE: trailers\r\n"),
        "RFC 9110 §6.5: a proxy forwards trailer fields, announced or not",
        rwatch=("+trailers", "+body"),
    ),
    Case(
        "response-304-content-length",
        respond(b"304-cl", b'If-None-Match: "v1"\r\n'),
        "RFC 9110 §8.6: a 304 may carry the representation's Content-Length",
        rwatch=("content-length",),
    ),
    Case(
        "response-reason-non-ascii",
        respond(b"reason-non-ascii"),
        "RFC 9112 §4: the reason phrase may carry obs-text; a client ignores it",
        rwatch=("+reason",),
    ),
    Case(
        "response-reason-custom",
        respond(b"reason-custom"),
        "RFC 9112 §4: the reason phrase is the server's",
        rwatch=("+reason",),
    ),
    Case(
        "response-103-early-hints",
        respond(b"103"),
        "RFC 9110 §15.2: a proxy forwards 1xx responses",
    ),
    Case(
        "response-100-unsolicited",
        respond(b"100-unsolicited"),
        "RFC 9110 §15.2.1: a 100 nobody expected; a client can discard it",
    ),
    Case(
        "response-obs-fold",
        respond(b"obs-fold"),
        "RFC 9112 §5.2: a proxy replaces obs-fold by SP or answers 502",
        rwatch=("x-folded",),
    ),
    Case(
        "response-space-before-colon",
        respond(b"space-colon"),
        "RFC 9112 §5.1: a proxy removes the whitespace before forwarding",
        rwatch=("x-space", "x-space "),
    ),
    Case(
        "response-two-content-lengths",
        respond(b"two-cl"),
        "RFC 9112 §6.3 (5): a response with differing lengths is an error (502)",
    ),
    Case(
        "response-cl-and-te",
        respond(b"cl-te"),
        "RFC 9112 §6.3 (3): Transfer-Encoding wins; Content-Length removed",
        rwatch=("content-length", "+body"),
    ),
    Case(
        "response-http10-until-close",
        respond(b"http10-no-length"),
        "RFC 9112 §6.3 (8): a body delimited by the connection's end",
        rwatch=("+body",),
    ),
    Case(
        "response-connection-named-field",
        respond(b"hop"),
        "RFC 9110 §7.6.1: fields named in Connection are not forwarded",
        rwatch=("x-resp-hop", "keep-alive"),
    ),
    Case(
        "head-content-length",
        respond(b"default", method=b"HEAD"),
        "RFC 9110 §9.3.2: HEAD's Content-Length is the GET's, and no body follows",
        rwatch=("content-length", "+body"),
        head=True,
    ),
]

SIZES = [
    Case(
        "field-50k",
        get(extra=b"X-Big: " + b"a" * 50_000 + b"\r\n"),
        "RFC 9110 §5.4: a server may refuse large fields (431)",
    ),
    Case(
        "field-100k",
        get(extra=b"X-Big: " + b"a" * 100_000 + b"\r\n"),
        "RFC 6585 §5: 431 for fields too large",
    ),
    Case(
        "fields-150",
        get(extra=b"".join(b"X-F%d: %d\r\n" % (i, i) for i in range(150))),
        "RFC 6585 §5: 431 for too many fields",
    ),
    Case(
        "target-10k",
        get(b"/" + b"p" * 10_000),
        "RFC 9112 §3: 414 for a target too long",
    ),
]

CASES = FRAMING + HEADERS + TARGETS + VERSIONS_METHODS + HOP_HOST + TRAILERS_RESPONSES + SIZES
