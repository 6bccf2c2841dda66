// undici's fetch with EnvHttpProxyAgent as the global dispatcher, the way a Node app honours
// HTTP_PROXY / HTTPS_PROXY / NO_PROXY (the suite sets them, or clears them for a direct run).
// Through a proxy undici tunnels every request, http:// ones included: `CONNECT host:port`.
//
//   node fetch.mjs BASE_URL...
//
// For each base URL: a GET with a query, a POST with a JSON body, a 256 KiB PUT and a 404, on
// keep-alive connections. https:// URLs are verified against the built-in roots plus
// NODE_EXTRA_CA_CERTS. Prints one JSON document of facts.
import { createHash } from "node:crypto";
import { EnvHttpProxyAgent, fetch, setGlobalDispatcher } from "undici";

setGlobalDispatcher(new EnvHttpProxyAgent());

const sha = (bytes) => createHash("sha256").update(bytes).digest("hex");
const big = new Uint8Array(256 * 1024).map((_, i) => (i * 31 + 7) % 251);
const requests = [
  ["GET", "/hello?from=undici", undefined],
  ["POST", "/items", JSON.stringify({ name: "node", count: 2 })],
  ["PUT", "/items/9", big],
  ["GET", "/missing", undefined],
];

const facts = {};
for (const base of process.argv.slice(2)) {
  const results = [];
  for (const [method, path, body] of requests) {
    try {
      const response = await fetch(base + path, { method, body });
      const kind = response.headers.get("content-type") || "";
      const bytes = new Uint8Array(await response.arrayBuffer());
      const fact = { status: response.status, "content-type": kind };
      if (kind.startsWith("application/json")) {
        fact.json = JSON.parse(new TextDecoder().decode(bytes));
      } else {
        fact.sha256 = sha(bytes);
        fact.size = bytes.length;
      }
      results.push(fact);
    } catch (e) {
      results.push({ failed: `${e.name}: ${e.cause ? e.cause.code || e.cause.message : e.message}` });
    }
  }
  facts[base.replace(/:\d+$/, ":PORT")] = results;
}
console.log(JSON.stringify(facts));
