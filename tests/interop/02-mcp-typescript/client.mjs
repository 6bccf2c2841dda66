// The official MCP TypeScript SDK's client against the reference "everything" server.
//
//   node client.mjs URL [PROXY] [SESSIONS]
//
// PROXY, when given, is egressd's listener: every request goes to it in absolute form
// (undici's ProxyAgent without tunnelling, what `http_proxy` does for other clients). SESSIONS sessions one
// after the other; in each: connect, list tools/resources/prompts, call echo, get-sum,
// get-tiny-image, get-annotated-message, get-structured-content and the long-running
// operation with progress, read a resource, get two prompts, an unknown tool, get-env (which
// instance answers: the suite gives each server INSTANCE=<name>), close (DELETE). Prints one
// JSON document of facts.
import { createHash } from "node:crypto";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ProxyAgent, fetch as undiciFetch } from "undici";

const [url, proxyArg, sessionsArg] = process.argv.slice(2);
const proxy = proxyArg && proxyArg !== "-" ? proxyArg : null;
const sessions = Number(sessionsArg || 1);
// proxyTunnel false: plain-HTTP requests go to the proxy in absolute form (undici would
// otherwise open a CONNECT tunnel for them too).
const dispatcher = proxy ? new ProxyAgent({ uri: proxy, proxyTunnel: false }) : undefined;
const seen = [];

// undici's fetch (through the proxy when given); records each answer's method and status.
const recordingFetch = async (input, init = {}) => {
  const response = await undiciFetch(input, dispatcher ? { ...init, dispatcher } : init);
  seen.push([init.method || "GET", response.status]);
  return response;
};

const sha256 = (s) => createHash("sha256").update(s).digest("hex");
const texts = (result) => result.content.filter((c) => c.type === "text").map((c) => c.text);

async function failed(step) {
  try {
    return await step();
  } catch (e) {
    const cause = e.cause ? ` (${e.cause.name}: ${e.cause.message})` : "";
    return { failed: `${e.name}: ${e.message}${cause}`, code: e.code };
  }
}

async function oneSession() {
  const out = {};
  const transport = new StreamableHTTPClientTransport(new URL(url), { fetch: recordingFetch });
  const client = new Client({ name: "egressd-interop", version: "1.0.0" }, { capabilities: {} });
  await client.connect(transport);
  out.server = client.getServerVersion();
  out.protocolVersion = transport.protocolVersion;
  out.sessionIdIssued = typeof transport.sessionId === "string";
  out.tools = await failed(async () => (await client.listTools()).tools.map((t) => t.name).sort());
  out.resources = await failed(async () =>
    (await client.listResources()).resources.map((r) => r.uri).sort());
  out.prompts = await failed(async () =>
    (await client.listPrompts()).prompts.map((p) => p.name).sort());
  const call = (name, args, options) =>
    failed(async () => {
      const result = await client.callTool({ name, arguments: args }, undefined, options);
      return { isError: !!result.isError, content: result.content, structured: result.structuredContent };
    });
  out.echo = await call("echo", { message: "hello through egressd" });
  out.sum = await call("get-sum", { a: 2, b: 40 });
  const image = await call("get-tiny-image", {});
  out.tinyImage = image.content
    ? image.content.map((c) => (c.type === "image" ? { type: c.type, mimeType: c.mimeType, sha256: sha256(c.data) } : c))
    : image;
  out.annotated = await call("get-annotated-message", { messageType: "success", includeImage: false });
  out.structured = await call("get-structured-content", { location: "Chicago" });

  // 5 progress notifications 0.4 s apart (duration 2 s): received spread over >= 60% of
  // the 1.6 s between the first and the last one (not buffered).
  const received = [];
  const long = await call(
    "trigger-long-running-operation",
    { duration: 2, steps: 5 },
    { onprogress: (p) => received.push([p.progress, p.total, performance.now()]), timeout: 60000 },
  );
  const span = received.length ? (received.at(-1)[2] - received[0][2]) / 1000 : 0;
  out.longRunning = {
    result: long,
    progress: received.map(([p, t]) => [p, t]),
    spreadAtLeast60PercentOfSent: span >= 0.6 * 1.6,
  };

  out.readResource = await failed(async () => {
    const r = await client.readResource({ uri: "demo://resource/static/document/features.md" });
    return r.contents.map((c) => ({ uri: c.uri, mimeType: c.mimeType, sha256: sha256(c.text) }));
  });
  out.simplePrompt = await failed(async () => (await client.getPrompt({ name: "simple-prompt" })).messages);
  out.argsPrompt = await failed(async () =>
    (await client.getPrompt({ name: "args-prompt", arguments: { city: "Paris", state: "Texas" } })).messages);
  out.unknownTool = await call("no-such-tool", {});
  const env = await call("get-env", {});
  const instance = env.content ? JSON.parse(texts(env)[0]).INSTANCE : null;
  const envAgain = await call("get-env", {});
  out.instance = instance;
  out.sameInstanceThroughout = !!envAgain.content && JSON.parse(texts(envAgain)[0]).INSTANCE === instance;

  out.terminate = await failed(async () => {
    await transport.terminateSession();
    return "ok";
  });
  await client.close();
  return out;
}

const results = [];
for (let i = 0; i < sessions; i++) {
  results.push(await failed(oneSession));
}
const statuses = {};
for (const [method, status] of seen) {
  statuses[`${method} ${status}`] = (statuses[`${method} ${status}`] || 0) + 1;
}
console.log(JSON.stringify({ sessions: results, statuses }));
