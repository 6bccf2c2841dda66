// The egressd admin console. Polls the admin JSON (/status, /endpoints, /blocked, /metrics)
// every few seconds and renders it. Everything shown comes from the config or from traffic,
// so the DOM is built with createElement and textContent only: text is never parsed as HTML.
"use strict";
(function () {
  const POLL_MS = 3000;
  const RATE_WINDOW_MS = 60000;
  const PORTS_PER_PAGE = 25;
  const YAML_OPEN = 3; // refused destinations whose Backend YAML shows unfolded
  const BLOCKED_SHOWN = 100;

  let paused = false;
  let page = 0;
  let timer = null;
  let last = null; // the latest data, to re-render on filter or page changes
  const samples = []; // {t, endpoints: Map(key -> totalRequests), backends: Map(name -> {errors})}
  let protocols = { generation: -1, byListener: new Map() };
  const problems = { ejected: 0, failing: 0, ports: 0 }; // counted over every port, filter or not

  // -- DOM helpers: text only ---------------------------------------------------------------

  function el(tag, cls, ...children) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    for (const c of children) {
      if (c === null || c === undefined || c === false) continue;
      // Only nodes made here are nodes; any value from the JSON becomes text.
      e.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  function label(text, cls) {
    return el("span", "label " + cls, text);
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
    return node;
  }

  function byId(id) {
    return document.getElementById(id);
  }

  function seconds(ms) {
    if (ms === null || ms === undefined) return "";
    const s = Math.ceil(ms / 1000);
    return s >= 120 ? Math.floor(s / 60) + "m" + (s % 60) + "s" : s + "s";
  }

  // -- fetching -------------------------------------------------------------------------------

  async function getJson(path) {
    const r = await fetch(path, { cache: "no-store" });
    if (!r.ok) throw new Error(path + ": HTTP " + r.status);
    return r.json();
  }

  async function getText(path) {
    const r = await fetch(path, { cache: "no-store" });
    if (!r.ok) throw new Error(path + ": HTTP " + r.status);
    return r.text();
  }

  async function poll() {
    timer = null;
    try {
      const [status, endpoints, blocked, metrics] = await Promise.all([
        getJson("/status"),
        getJson("/endpoints"),
        getJson("/blocked"),
        getText("/metrics").catch(() => ""),
      ]);
      if (protocols.generation !== status.generation) {
        protocols = { generation: status.generation, byListener: await listenerProtocols() };
      }
      sample(endpoints, metrics);
      last = { status, endpoints, blocked };
      render();
      byId("updated").textContent = "updated " + new Date().toLocaleTimeString();
    } catch (e) {
      const s = clear(byId("summary"));
      s.appendChild(label("ADMIN UNREACHABLE", "bad"));
      s.appendChild(document.createTextNode(" " + e.message));
    }
    schedule();
  }

  function schedule() {
    if (!paused && timer === null) timer = setTimeout(poll, POLL_MS);
  }

  // Listener protocols are in the config, not in /status: read /config once per generation.
  async function listenerProtocols() {
    const out = new Map();
    try {
      const config = await getJson("/config");
      const objects = Array.isArray(config) ? config : config.objects || config.gateways || [];
      for (const o of objects) {
        if (!o || o.kind !== "Gateway" || !o.spec) continue;
        const ns = (o.metadata && o.metadata.namespace) || "default";
        const name = o.metadata && o.metadata.name;
        for (const l of o.spec.listeners || []) out.set(ns + "/" + name + "/" + l.name, l.protocol);
      }
    } catch (e) {
      // Without /config the protocol column stays empty.
    }
    return out;
  }

  // -- rates: successive polls diffed ---------------------------------------------------------

  function endpointKey(port, e) {
    return port.backend + "\u0000" + port.port + "\u0000" + (port.host || "") + "\u0000" + e.address;
  }

  // `egressd_upstream_responses_total{backend,class="5xx"}` plus connect failures and failures
  // after connecting (resets, timeouts, protocol errors), per Backend.
  function backendErrors(metrics) {
    const out = new Map();
    const re = /^egressd_upstream_(responses|connect_failures|failures)_total\{(.*)\} ([0-9.eE+]+)$/;
    for (const line of metrics.split("\n")) {
      const m = re.exec(line);
      if (!m) continue;
      const labels = parseLabels(m[2]);
      if (m[1] === "responses" && labels.class !== "5xx") continue;
      out.set(labels.backend, (out.get(labels.backend) || 0) + Number(m[3]));
    }
    return out;
  }

  function parseLabels(s) {
    const out = {};
    const re = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
    let m;
    while ((m = re.exec(s)) !== null) out[m[1]] = m[2].replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
    return out;
  }

  function sample(endpoints, metrics) {
    const now = Date.now();
    const eps = new Map();
    for (const port of endpoints.backends || []) {
      for (const e of port.endpoints || []) eps.set(endpointKey(port, e), e.totalRequests || 0);
    }
    samples.push({ t: now, endpoints: eps, errors: backendErrors(metrics) });
    while (samples.length > 2 && now - samples[1].t >= RATE_WINDOW_MS) samples.shift();
  }

  // Requests per second of one endpoint over the window (null before two polls).
  function endpointRate(port, e) {
    if (samples.length < 2) return null;
    const first = samples[0], newest = samples[samples.length - 1];
    const before = first.endpoints.get(endpointKey(port, e));
    const now = newest.endpoints.get(endpointKey(port, e));
    if (before === undefined || now === undefined || now < before) return null;
    return (now - before) / ((newest.t - first.t) / 1000);
  }

  // Requests and errors of a Backend over the window.
  function backendWindow(name, ports) {
    if (samples.length < 2) return null;
    const first = samples[0], newest = samples[samples.length - 1];
    let requests = 0;
    for (const port of ports) {
      for (const e of port.endpoints || []) {
        const k = endpointKey(port, e);
        const a = first.endpoints.get(k), b = newest.endpoints.get(k);
        if (a !== undefined && b !== undefined && b >= a) requests += b - a;
      }
    }
    const errors = Math.max(0, (newest.errors.get(name) || 0) - (first.errors.get(name) || 0));
    return { requests, errors };
  }

  // -- health ---------------------------------------------------------------------------------

  function renderHealth(status) {
    const r = status.lastReload || {};
    const summary = clear(byId("summary"));
    summary.appendChild(status.ready ? label("READY", "ok") : label("NOT READY", "bad"));
    if (status.draining) summary.appendChild(label("DRAINING", "warn"));
    summary.appendChild(document.createTextNode(
      " generation " + status.generation + " · v" + status.version));

    const box = clear(byId("reload"));
    const head = el("p");
    if (r.result === "failure") {
      head.appendChild(label("RELOAD REJECTED", "bad"));
      head.appendChild(document.createTextNode(
        " at " + r.time + (r.cause ? " (" + r.cause + ")" : "") +
        (status.generation > 0
          ? " — still serving generation " + status.generation
          : " — no config serving")));
    } else if (r.result === "success") {
      head.appendChild(label("CONFIG OK", "ok"));
      head.appendChild(document.createTextNode(
        " generation " + status.generation + " loaded at " + r.time +
        (r.cause ? " (" + r.cause + ")" : "") +
        (r.durationMs !== undefined ? " in " + r.durationMs + " ms" : "") +
        " · " + r.succeeded + " reloads succeeded, " + r.failed + " rejected"));
    } else {
      head.appendChild(label("NO CONFIG YET", "warn"));
    }
    box.appendChild(head);
    const diagnostics = r.diagnostics || [];
    if (diagnostics.length > 0) {
      const list = el("ul", "errors");
      const sorted = diagnostics.slice().sort((a, b) => (a.severity === "error" ? 0 : 1) - (b.severity === "error" ? 0 : 1));
      for (const d of sorted) list.appendChild(diagnostic(d));
      box.appendChild(list);
    } else if (r.result === "failure") {
      const list = el("ul", "errors");
      for (const m of r.messages || []) list.appendChild(el("li", "mono", m));
      box.appendChild(list);
    }

    const tbody = clear(byId("listeners").tBodies[0]);
    for (const l of status.listeners || []) {
      tbody.appendChild(el("tr", null, el("td", "mono", l.name), el("td", "mono", l.address),
        el("td", null, protocols.byListener.get(l.name) || "")));
    }
  }

  function diagnostic(d) {
    const error = d.severity === "error";
    const li = el("li");
    li.appendChild(label(error ? "ERROR" : String(d.severity || "").toUpperCase(), error ? "bad" : "warn"));
    li.appendChild(document.createTextNode(" "));
    li.appendChild(el("span", "position mono", d.file + ":" + d.line + ":" + d.column));
    li.appendChild(document.createTextNode(": " + d.message));
    if (d.object) {
      li.appendChild(el("div", "muted", "object: " + d.object.kind + " " + d.object.namespace + "/" +
        d.object.name + (d.field ? " · field " + d.field : "")));
    } else if (d.field) {
      li.appendChild(el("div", "muted", "field " + d.field));
    }
    if (d.hint) li.appendChild(el("div", null, "hint: " + d.hint));
    return li;
  }

  // -- Backends -------------------------------------------------------------------------------

  // How bad an endpoint looks (higher first) and the label that says so.
  function endpointState(port, e) {
    if (e.health === "ejected") {
      const j = e.ejection || {};
      return { rank: 4, label: label("EJECTED", "bad"),
        detail: "ejected, " + seconds(j.remainingMs) + " left" + (j.lastReason ? " (" + j.lastReason + ")" : "") +
          (j.ejections ? ", ejection #" + j.ejections : "") };
    }
    if (e.health === "unhealthy") {
      const a = e.activeHealth || {};
      return { rank: 3, label: label("FAILING CHECKS", "bad"),
        detail: "active checks failing" + (a.consecutiveFailures ? " ×" + a.consecutiveFailures : "") +
          (a.lastFailure ? ": " + a.lastFailure : "") };
    }
    if (e.effectiveWeight !== undefined && e.effectiveWeight < e.weight) {
      return { rank: 1, label: label("SLOW START", "warn"),
        detail: "slow start: weight " + Number(e.effectiveWeight.toFixed(2)) + " of " + e.weight +
          ", ready for " + seconds(e.readyForMs) };
    }
    return { rank: 0, label: label("HEALTHY", "ok"), detail: e.lastFailure ? "last failure: " + e.lastFailure.detail : "" };
  }

  function breakerUse(b) {
    const pairs = [["conn", b.connections, b.maxConnections], ["req", b.parallelRequests, b.maxParallelRequests],
      ["pending", b.pendingRequests, b.maxPendingRequests]];
    let worst = 0;
    const parts = [];
    for (const [name, used, max] of pairs) {
      parts.push(name + " " + used + "/" + (max === null || max === undefined ? "∞" : max));
      if (max) worst = Math.max(worst, used / max);
    }
    return { text: parts.join(" · "), worst };
  }

  function portView(port, windows) {
    const eps = (port.endpoints || []).map((e) => ({ e, state: endpointState(port, e), rate: endpointRate(port, e) }));
    eps.sort((a, b) => b.state.rank - a.state.rank || a.e.address.localeCompare(b.e.address));
    const breaker = breakerUse(port.circuitBreaker || {});
    const win = windows.get(port.backend);
    const errorShare = win && win.requests > 0 ? Math.min(1, win.errors / win.requests) : win && win.errors > 0 ? 1 : 0;
    let rank = eps.reduce((m, x) => Math.max(m, x.state.rank), 0);
    const labels = [];
    // A wildcard Backend's port has no endpoints of its own: its hosts follow as entries.
    const wildcard = port.wildcardHosts !== null && port.wildcardHosts !== undefined;
    if (eps.length === 0 && !wildcard) { rank = Math.max(rank, 4); labels.push(label("NO ENDPOINTS", "bad")); }
    for (const x of eps) if (x.state.rank >= 3) { labels.push(x.state.label.cloneNode(true)); break; }
    if (breaker.worst >= 1) { rank = Math.max(rank, 3); labels.push(label("BREAKER FULL", "bad")); }
    else if (breaker.worst >= 0.8) { rank = Math.max(rank, 2); labels.push(label("BREAKER NEAR LIMIT", "warn")); }
    if (errorShare >= 0.05) { rank = Math.max(rank, 2); labels.push(label("ERRORS", "bad")); }
    if (labels.length === 0) labels.push(rank === 1 ? label("SLOW START", "warn") : label("OK", "ok"));
    let rate = null;
    for (const x of eps) if (x.rate !== null) rate = (rate || 0) + x.rate;
    const active = eps.reduce((s, x) => s + (x.e.activeRequests || 0), 0);
    const text = [port.backend, String(port.port), port.host || "", port.lastError || ""]
      .concat(eps.map((x) => x.e.address + " " + x.state.label.textContent)).join(" ").toLowerCase();
    return { port, eps, breaker, win, errorShare, rank, labels, rate, active, text };
  }

  function renderBackends(endpoints) {
    const byBackend = new Map();
    for (const p of endpoints.backends || []) {
      if (!byBackend.has(p.backend)) byBackend.set(p.backend, []);
      byBackend.get(p.backend).push(p);
    }
    const windows = new Map();
    for (const [name, ports] of byBackend) windows.set(name, backendWindow(name, ports));
    let views = (endpoints.backends || []).map((p) => portView(p, windows));
    views.sort((a, b) => b.rank - a.rank || a.port.backend.localeCompare(b.port.backend) || a.port.port - b.port.port
      || (a.port.host || "").localeCompare(b.port.host || ""));

    problems.ejected = 0;
    problems.failing = 0;
    problems.ports = 0;
    for (const v of views) {
      if (v.rank >= 2) problems.ports += 1;
      for (const x of v.eps) {
        if (x.e.health === "ejected") problems.ejected += 1;
        else if (x.e.health === "unhealthy") problems.failing += 1;
      }
    }
    const filter = byId("filter").value.trim().toLowerCase();
    if (filter) views = views.filter((v) => v.text.includes(filter));
    const pages = Math.max(1, Math.ceil(views.length / PORTS_PER_PAGE));
    page = Math.min(page, pages - 1);
    renderPager(views.length, pages);

    const tbody = clear(byId("backends").tBodies[0]);
    for (const v of views.slice(page * PORTS_PER_PAGE, (page + 1) * PORTS_PER_PAGE)) {
      const state = el("td");
      for (const l of v.labels) { state.appendChild(l); state.appendChild(document.createTextNode(" ")); }
      // "—" until two polls have been diffed, and while nothing was sent: "0 of 0" says nothing.
      const errors = !v.win || (v.win.requests === 0 && v.win.errors === 0) ? "—"
        : v.win.errors + " of " + v.win.requests + (v.win.requests > 0 ? " (" + (v.errorShare * 100).toFixed(1) + "%)" : "");
      // A port's only endpoint shares the port's row.
      const alone = v.eps.length === 1 && !v.port.lastError ? v.eps[0] : null;
      const wildcard = v.port.wildcardHosts !== null && v.port.wildcardHosts !== undefined
        ? ", " + v.port.wildcardHosts + " wildcard hosts" : "";
      tbody.appendChild(el("tr", "port", state,
        el("td", "mono", v.port.backend + " : " + v.port.port + (v.port.host ? " (" + v.port.host + ")" : "")),
        alone ? el("td", "mono", alone.e.address)
          : el("td", "muted", v.eps.length + " endpoint" + (v.eps.length === 1 ? "" : "s") + wildcard),
        el("td", v.port.lastError ? "bad" : null,
          v.port.lastError ? "DNS: " + v.port.lastError : alone ? alone.state.detail : ""),
        el("td", null, String(v.active)),
        el("td", null, v.rate === null ? "—" : v.rate.toFixed(2)),
        el("td", v.errorShare >= 0.05 ? "bad" : null, errors),
        el("td", v.breaker.worst >= 0.8 ? "bad mono" : "mono", v.breaker.text)));
      for (const x of alone ? [] : v.eps) {
        tbody.appendChild(el("tr", null, el("td", null, x.state.label), el("td"),
          el("td", "mono", x.e.address), el("td", null, x.state.detail),
          el("td", null, String(x.e.activeRequests || 0)),
          el("td", null, x.rate === null ? "—" : x.rate.toFixed(2)), el("td"), el("td")));
      }
    }
    if (views.length === 0) {
      tbody.appendChild(el("tr", null, el("td", "muted", filter ? "nothing matches the filter" : "no Backends")));
    }
  }

  function renderPager(count, pages) {
    const pager = clear(byId("pager"));
    pager.appendChild(document.createTextNode(count + " Backend port" + (count === 1 ? "" : "s")));
    if (pages <= 1) return;
    const prev = el("button", null, "‹ prev");
    prev.type = "button";
    prev.disabled = page === 0;
    prev.addEventListener("click", () => { page -= 1; render(); });
    const next = el("button", null, "next ›");
    next.type = "button";
    next.disabled = page >= pages - 1;
    next.addEventListener("click", () => { page += 1; render(); });
    pager.appendChild(document.createTextNode(" · page " + (page + 1) + " of " + pages + " "));
    pager.appendChild(prev);
    pager.appendChild(next);
  }

  // -- refused destinations ---------------------------------------------------------------------

  const ACTIONS = {
    blocked: ["BLOCKED", "bad"],
    audited: ["AUDITED", "warn"],
    client_denied: ["CLIENT DENIED", "bad"],
    would_deny: ["WOULD DENY", "warn"],
  };

  function renderBlocked(blocked) {
    const box = clear(byId("blocked"));
    const list = blocked.blocked || [];
    if (list.length === 0) {
      box.appendChild(el("p", "muted", "nothing refused"));
      return;
    }
    let shown = 0;
    for (const b of list.slice(0, BLOCKED_SHOWN)) {
      const [text, cls] = ACTIONS[b.action] || [String(b.action).toUpperCase(), "warn"];
      const entry = el("div", "entry");
      entry.appendChild(el("div", null, label(text, cls), " ", el("span", "mono", b.host + ":" + b.port),
        " via " + b.via + " · " + b.count + "× · first " + b.firstSeen + " · last " + b.lastSeen));
      if (b.client !== null && b.client !== undefined) {
        entry.appendChild(el("div", null, "client ", el("span", "mono", b.client), " · policy ",
          el("span", "mono", b.policy || "clientPolicy.default")));
      }
      if (b.backend) {
        const pre = el("pre", null, b.backend);
        const copy = el("button", null, "Copy Backend YAML");
        copy.type = "button";
        copy.addEventListener("click", () => copyText(b.backend, pre, copy));
        const details = el("details", null, el("summary", null, "Backend that allows it "), pre);
        details.open = shown < YAML_OPEN;
        details.firstChild.appendChild(copy);
        entry.appendChild(details);
      }
      shown += 1;
      box.appendChild(entry);
    }
    if (list.length > BLOCKED_SHOWN) {
      box.appendChild(el("p", "muted", (list.length - BLOCKED_SHOWN) + " more in /blocked"));
    }
  }

  function copyText(text, pre, button) {
    const done = () => { button.textContent = "Copied"; setTimeout(() => { button.textContent = "Copy Backend YAML"; }, 1500); };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, () => selectText(pre));
    } else {
      selectText(pre);
    }
  }

  // Without the clipboard API (plain http to a non-loopback address): select it for Ctrl-C.
  function selectText(node) {
    const range = document.createRange();
    range.selectNodeContents(node);
    const sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
  }

  // -- wiring ---------------------------------------------------------------------------------

  // Each rate limit rule's use against its limit (local rules: what this process counted in
  // the last period; the busiest value of a Distinct rule), and Redis's health.
  function renderLimits(status) {
    const policies = status.rateLimits || [];
    const section = byId("limits");
    section.hidden = policies.length === 0 && !status.redis;
    const redis = clear(byId("redis"));
    if (status.redis) {
      const state = status.redis.state;
      redis.appendChild(label("REDIS " + state.toUpperCase(), state === "up" ? "ok" : state === "down" ? "bad" : "warn"));
      redis.appendChild(document.createTextNode(" " + status.redis.address +
        (status.redis.lastError ? " — " + status.redis.lastError : "")));
    }
    const tbody = clear(byId("ratelimits").tBodies[0]);
    for (const p of policies) {
      for (const r of p.rules || []) {
        const units = { 1: "second", 60: "minute", 3600: "hour", 86400: "day" };
        const period = units[r.periodSeconds] || r.periodSeconds + "s";
        let used = "— (in Redis)";
        if (r.used !== undefined) used = String(r.used);
        if (r.usedMax !== undefined) used = r.usedMax + " (busiest of " + r.distinctValues + " values)";
        const full = (r.used !== undefined ? r.used : r.usedMax) >= r.requests;
        tbody.appendChild(el("tr", null,
          el("td", "mono", p.policy, p.mode === "Report" ? " " : null, p.mode === "Report" ? label("REPORT", "warn") : null),
          el("td", "mono", p.scope),
          el("td", "mono", r.name),
          el("td", null, r.counts),
          el("td", full ? "bad" : null, used),
          el("td", null, r.requests + " per " + period)));
      }
    }
  }

  function render() {
    if (!last) return;
    renderHealth(last.status);
    renderLimits(last.status);
    renderBackends(last.endpoints);
    renderBlocked(last.blocked);
    renderProblems(last.status, last.blocked);
  }

  // One line under the header: what needs a look, with the section it is in.
  function renderProblems(status, blocked) {
    const line = clear(byId("problems"));
    // Counted as the section below lists them: refusals, and what a Report policy or
    // AuditOnly let through, so the line and the rows agree.
    const list = blocked.blocked || [];
    const refused = list.filter((b) => b.action === "blocked" || b.action === "client_denied").length;
    const reported = list.length - refused;
    const parts = [];
    if (!status.ready) parts.push(status.draining ? "draining" : "not ready");
    if ((status.lastReload || {}).result === "failure") parts.push("last reload rejected");
    if (problems.ejected) parts.push(problems.ejected + " endpoint" + (problems.ejected === 1 ? "" : "s") + " ejected");
    if (problems.failing) parts.push(problems.failing + " endpoint" + (problems.failing === 1 ? "" : "s") + " failing active checks");
    if (status.redis && status.redis.state === "down") parts.push("rate limit Redis down");
    if (problems.ports) parts.push(problems.ports + " Backend port" + (problems.ports === 1 ? "" : "s") + " with problems");
    if (refused) parts.push(refused + " refused destination" + (refused === 1 ? "" : "s"));
    if (reported) parts.push(reported + " destination" + (reported === 1 ? "" : "s") + " let through but reported");
    line.appendChild(parts.length ? label("ATTENTION", "warn") : label("ALL CLEAR", "ok"));
    line.appendChild(document.createTextNode(" " + (parts.length ? parts.join(" · ") : "no ejected endpoints, no refusals")));
  }

  function start() {
    const pause = byId("pause");
    pause.addEventListener("click", () => {
      paused = !paused;
      pause.textContent = paused ? "Resume" : "Pause";
      if (paused && timer !== null) { clearTimeout(timer); timer = null; }
      if (!paused) poll();
    });
    // The filter lives in the URL's fragment too (`/#filter=ledger`): a view to link to.
    const filter = byId("filter");
    const hash = /^#filter=(.*)$/.exec(window.location.hash);
    if (hash) {
      try { filter.value = decodeURIComponent(hash[1]); } catch (e) { filter.value = hash[1]; }
    }
    filter.addEventListener("input", () => {
      page = 0;
      history.replaceState(null, "", filter.value ? "#filter=" + encodeURIComponent(filter.value) : "#");
      render();
    });
    poll();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
