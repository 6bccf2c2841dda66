// Preloaded into the conformance runner (`node --import`) when it runs through egressd:
// every fetch (Node's own and undici's) goes to $INTEROP_HTTP_PROXY, plain-HTTP requests in
// absolute form as `http_proxy` clients send them. (Node's NODE_USE_ENV_PROXY would tunnel
// them with CONNECT instead, which egressd answers for TCP ports only.)
import { ProxyAgent, setGlobalDispatcher } from "undici";

setGlobalDispatcher(new ProxyAgent({ uri: process.env.INTEROP_HTTP_PROXY, proxyTunnel: false }));
