// sparkctl dashboard: reads and acts through the daemon's own API (under /ui/api), live from its
// event stream. Data is only ever set as text (never as HTML), so nothing a stack name or a log
// line holds can run here.
"use strict";

// The owner's session: a login URL sends the browser here with it in the address's fragment; it
// moves to this origin's storage (this port's alone, unlike a cookie) and out of the address.
const SESSION = "sparkctl-session";
if (location.hash.startsWith("#session=")) {
  localStorage.setItem(SESSION, decodeURIComponent(location.hash.slice("#session=".length)));
  history.replaceState(null, "", location.pathname + location.search);
}
const TOKEN = localStorage.getItem(SESSION) || "";
const COLORS = ["#0b5cad", "#b35900", "#6e3a9e", "#1a7f37", "#a40e26", "#0a7b83"];
const $ = (id) => document.getElementById(id);
let desired = { stacks: [], aliases: {}, parked: {}, routes: {} };
let stackNames = [];  // every stack the daemon knows: what an alias can switch to
let lastCounts = null;
if (!TOKEN) $("action-error").textContent = "Read-only: to act from this page, run `sparkctl dashboard` on the Spark and open the URL it prints.";

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else if (key === "style") node.style.cssText = value;  // CSSOM: allowed by the page's CSP, unlike style=""
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("aria") || key === "for") node.setAttribute(key.replace(/[A-Z]/g, (c) => "-" + c.toLowerCase()), value);
    else node[key] = value;
  }
  for (const child of children) node.append(child);
  return node;
}

async function api(path) {
  const reply = await fetch("/ui/api" + path, { credentials: "same-origin" });
  if (!reply.ok) throw new Error(`${path}: ${reply.status}`);
  return reply.json();
}

// A state-changing action: the daemon streams its events (NDJSON) and ends with its outcome (or,
// for a report, answers with one JSON object).
async function act(path, body, onEvent = () => {}) {
  const reply = await fetch("/ui/api" + path, {
    method: "POST", credentials: "same-origin",  // the API key, as HTTP Basic; the session goes in the header
    headers: { "Content-Type": "application/json", "X-Sparkctl-Token": TOKEN }, body: JSON.stringify(body),
  });
  if (!reply.ok) {
    const problem = await reply.json().catch(() => ({}));
    throw new Error(problem.error?.message || `${path}: ${reply.status}`);
  }
  const reader = reply.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "", last = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, end).trim();
      buffer = buffer.slice(end + 1);
      if (line) { last = JSON.parse(line); onEvent(last); }
    }
  }
  if (buffer.trim()) { last = JSON.parse(buffer); onEvent(last); }  // a plain JSON answer
  return last;
}

function ago(seconds) {
  if (seconds == null) return "";
  if (seconds < 90) return `${seconds} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function renderMemory(memory) {
  const bar = $("memory"), legend = $("memory-legend");
  bar.replaceChildren();
  legend.replaceChildren();
  let used = 0;
  Object.entries(memory.held).sort().forEach(([stack, share], i) => {
    const parked = memory.parked[stack] ? ` parked (level ${memory.parked[stack]})` : " awake";
    const color = COLORS[i % COLORS.length];
    used += share;
    bar.append(el("span", { title: `${stack}: ${(share * 100).toFixed(0)} %${parked}`,
      style: `width:${share * 100}%;background:${color}${memory.parked[stack] ? ";opacity:.45" : ""}` }));
    legend.append(el("li", {}, el("span", { class: "swatch", style: `background:${color}` }),
      `${stack} ${(share * 100).toFixed(0)} %${parked}`));
  });
  bar.append(el("span", { class: "free", style: `width:${Math.max(0, 1 - used) * 100}%` }));
  bar.append(el("span", { class: "ceiling", title: `ceiling ${(memory.ceiling * 100).toFixed(0)} %`,
    style: `left:${memory.ceiling * 100}%` }));
  legend.append(el("li", {}, `free ${(Math.max(0, 1 - used) * 100).toFixed(0)} %`),
    el("li", {}, `ceiling ${(memory.ceiling * 100).toFixed(0)} %`));
  bar.setAttribute("aria-label", `memory: ${(used * 100).toFixed(0)} % held, ceiling ${(memory.ceiling * 100).toFixed(0)} %`);
}

function actionButton(label, stack, path, body) {
  return el("button", { type: "button", textContent: label, ariaLabel: `${label} ${stack}`, onclick: async (event) => {
    const button = event.currentTarget;
    button.disabled = true;
    $("action-error").textContent = "";
    try {
      const outcome = await act(path, body);
      if (outcome && outcome.ok === false) $("action-error").textContent = `${label} ${stack}: ${outcome.error}`;
    } catch (e) {
      $("action-error").textContent = `${label} ${stack}: ${e.message}`;
    } finally {
      button.disabled = false;
      refresh();
    }
  } });
}

// A deploy's phases as offsets from its start: "resolving 0.0 s, pulling 0.2 s, ... running 14.1 s".
function timeline(deployment) {
  if (!deployment) return "";
  return deployment.transitions.map(([phase, at]) => `${phase} ${(at - deployment.started).toFixed(1)} s`).join(", ");
}

function renderStacks(status, deployments) {
  const body = $("stacks").tBodies[0];
  body.replaceChildren();
  for (const row of status.stacks) {
    const actions = el("td");
    if (row.state === "running" && row.parked == null) {
      actions.append(actionButton("park", row.stack, "/v1/park", { stack: row.stack, how: "auto" }),
        actionButton("down", row.stack, "/v1/down", { stack: row.stack }));
    } else if (row.parked != null) {
      actions.append(actionButton("wake", row.stack, "/v1/wake", { stack: row.stack }),
        actionButton("down", row.stack, "/v1/down", { stack: row.stack }));
    } else {
      actions.append(actionButton("up", row.stack, "/v1/up", { stack: row.stack }));
    }
    body.append(el("tr", { dataset: { stack: row.stack } },
      el("th", { scope: "row", textContent: row.stack }),
      el("td", {}, el("span", { textContent: row.phase, class: row.failed ? "bad" : "" }), el("br"),
        el("small", { class: "timeline", textContent: timeline(deployments.find((d) => d.stack === row.stack)) })),
      el("td", { textContent: row.endpoint || "" }),
      el("td", {}, row.image || "", el("br"), el("small", { textContent: row.digest ? row.digest.slice(0, 19) : "" }),
        el("br"), el("span", { textContent: row.verdict || "", class: (row.verdict || "").startsWith("blacklisted") ? "bad" : "" }),
        el("br"), el("small", { textContent: row.quality ? `quality: ${row.quality}` : "", class: (row.quality || "").includes(": fail: ") ? "quality bad" : "quality" })),
      el("td", { textContent: ago(row.uptime_s) }),
      el("td", { textContent: `${row.restarts ?? 0}${row.recent_failures ? ` (${row.recent_failures} recent failures)` : ""}` }),
      el("td", { textContent: row.kv ? row.kv.summary : "" }),
      el("td", { class: "acceptance", textContent: row.acceptance != null ? `${(row.acceptance * 100).toFixed(0)} %` : "" }),
      actions));
  }
}

function progressLine(event) {
  if (event.kind === "phase") return `${event.stack}: ${event.phase}${event.detail ? ` (${event.detail})` : ""}`;
  if (event.kind === "progress") return `${event.stack}: ${event.task} ${event.done}/${event.total}`;
  if (event.kind === "note") return `${event.stack}: ${event.text}`;
  if (event.kind === "died") return `${event.stack} died: ${event.cause}${event.oom ? " (out of memory)" : ""}`;
  if (event.kind === "restarting") return `${event.stack}: restarting`;
  if (event.kind === "failed") return `${event.stack} failed: ${event.reason}`;
  if (event.kind === "realiased") return `${event.alias} -> ${event.stack}: ${event.reason}`;
  if (event.kind === "prefetching") return `${event.stack}: prefetching, ${event.why}`;
  if (event.kind === "removed") return `removed ${event.container}: ${event.reason}`;
  if (event.kind === "finished") return `${event.stack}: action done`;
  if (event.kind === "outcome" && event.result === undefined && event.error !== undefined) {
    return `${event.stack}: ${event.ok ? "settled" : `failed: ${event.error}`}`;
  }
  if (event.kind === "outcome") {
    if (!event.ok) return `failed: ${event.error}`;
    const r = event.result || {};
    const held = r.held_requests != null ? `, ${r.held_requests} requests held` : "";
    return `done: ${r.alias ?? ""} -> ${r.stack ?? event.stack}${r.mode ? ` (${r.mode})` : ""}${held}`;
  }
  return JSON.stringify(event);
}

function renderAliases() {
  const list = $("aliases");
  list.replaceChildren();
  const names = new Set([...Object.keys(desired.aliases), ...Object.keys(desired.routes || {})]);
  for (const alias of [...names].sort()) {
    const rules = (desired.routes || {})[alias];
    if (rules) {
      const text = rules.map((r) => r.up_to != null ? `up to ${r.up_to} tokens -> ${r.stack}` : `the rest -> ${r.stack}`);
      list.append(el("li", {}, el("strong", { textContent: alias }), ` routed: ${text.join("; ")}`));
      continue;
    }
    const id = `switch-${alias}`;
    const select = el("select", { id });
    for (const name of stackNames) select.append(el("option", { value: name, textContent: name, selected: name === desired.aliases[alias] }));
    const button = el("button", { type: "button", textContent: "switch", ariaLabel: `switch ${alias}`, onclick: async () => {
      const progress = $("switch-progress");
      progress.replaceChildren(el("li", { textContent: `switch ${alias} -> ${select.value}` }));
      button.disabled = true;
      try {
        const outcome = await act("/v1/switch", { alias, stack: select.value },
          (event) => progress.append(el("li", { textContent: progressLine(event), class: event.kind === "outcome" ? (event.ok ? "ok" : "bad") : "" })));
        if (!outcome) progress.append(el("li", { textContent: "the stream ended without an outcome", class: "bad" }));
      } catch (e) {
        progress.append(el("li", { textContent: `refused: ${e.message}`, class: "bad" }));
      } finally {
        button.disabled = false;
        refresh();
      }
    } });
    list.append(el("li", { dataset: { alias } }, el("strong", { textContent: alias }), " -> ",
      el("span", { class: "target", textContent: desired.aliases[alias] }), " ",
      el("label", { for: id, textContent: "to" }), " ", select, button));
  }
}

function renderHistory(history) {
  const items = [
    ...history.switches.map((s) => [s.at, `switch ${s.alias}: ${s.from ?? "-"} -> ${s.to}${s.mode ? ` (${s.mode})` : ""}: `
      + (s.ok === false ? `rolled back: ${s.error}` : s.ok ? "done" : "under way")
      + (s.timings?.total_s != null ? ` in ${s.timings.total_s.toFixed(1)} s` : "")]),
    ...history.events.map((e) => [e.at, `${e.stack}: ${e.kind} ${e.detail ?? ""}`]),
    ...history.deployments.map((d) => [d.started, `deploy ${d.stack}: ${d.phase}${d.error ? ` (${d.error})` : ""}`]),
    ...history.bans.map((b) => [b.date ? Date.parse(b.date) / 1000 : 0, `ban ${b.ref}: ${b.reason}`]),
  ].sort((a, b) => b[0] - a[0]).slice(0, 30);
  $("history").replaceChildren(...items.map(([at, text]) => el("li", {},
    el("time", { textContent: at ? new Date(at * 1000).toLocaleTimeString() : "" }), ` ${text}`)));
}

// Engine throughput over the last minutes, from two readings of each engine's counters a tick apart.
let latest = null;  // the daemon's time series (/v1/series): the last sample's figures per stack
const CHARTS = ["tps", "ttft", "requests", "memory"];

function engineCells(stack) {
  const figures = latest && latest.stacks[stack];
  const last = (values) => figures ? values[values.length - 1] : null;
  const tps = last(figures ? figures.tps : []), ttft = last(figures ? figures.ttft_p50_ms : []);
  return [el("td", { class: "tps", textContent: tps != null ? tps.toFixed(1) : "" }),
    el("td", { class: "ttft", textContent: ttft != null ? `${ttft.toFixed(0)} ms` : "" })];
}

function refreshCharts() {  // drawn by the daemon: each image is asked for again, never cached
  for (const name of CHARTS) $(`chart-${name}`).src = `/ui/api/v1/chart?name=${name}&at=${Date.now()}`;
}

function renderGateway(text) {
  const counts = { at: performance.now(), served: {}, errors: {}, inFlight: {}, queued: {}, held: 0 };
  for (const line of text.split("\n")) {
    const m = line.match(/^(sparkctl_gateway_\w+)\{([^}]*)\} (\S+)$/);
    if (!m) continue;
    const labels = Object.fromEntries([...m[2].matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
    const value = Number(m[3]);
    if (m[1] === "sparkctl_gateway_requests_total") {
      counts.served[labels.stack] = (counts.served[labels.stack] || 0) + value;
      if (Number(labels.status) >= 500) counts.errors[labels.stack] = (counts.errors[labels.stack] || 0) + value;
    } else if (m[1] === "sparkctl_gateway_in_flight") counts.inFlight[labels.stack] = value;
    else if (m[1] === "sparkctl_gateway_queued") counts.queued[labels.stack] = value;
    else if (m[1] === "sparkctl_gateway_held") counts.held += value;
  }
  const seconds = lastCounts ? (counts.at - lastCounts.at) / 1000 : 0;
  const stacks = [...new Set([...Object.keys(counts.served), ...Object.keys(counts.inFlight), ...Object.keys(latest ? latest.stacks : {})])].sort();
  $("gateway").tBodies[0].replaceChildren(...stacks.map((stack) => {
    const rate = seconds > 0 ? ((counts.served[stack] || 0) - (lastCounts.served[stack] || 0)) / seconds : 0;
    return el("tr", { dataset: { stack } }, el("th", { scope: "row", textContent: stack }),
      el("td", { class: "rate", textContent: rate.toFixed(1) }), el("td", { textContent: String(counts.inFlight[stack] || 0) }),
      el("td", { textContent: String(counts.queued[stack] || 0) }),
      el("td", { class: "answered", textContent: String(counts.served[stack] || 0) }),
      el("td", { textContent: String(counts.errors[stack] || 0) }), ...engineCells(stack));
  }));
  $("held").textContent = counts.held ? `${counts.held} requests held by a switch` : "";
  lastCounts = counts;
}

// --- reports: the stored runs (Compare writes a report of the chosen ones) and written reports ---
function renderRuns(runs) {
  const chosen = new Set([...document.querySelectorAll("#runs input:checked")].map((box) => box.value));
  $("runs").replaceChildren(...runs.map((run) => {
    const id = `run-${run.id}`;
    return el("li", {}, el("input", { type: "checkbox", id, value: String(run.id), checked: chosen.has(String(run.id)) }),
      el("label", { for: id, textContent: ` run ${run.id}: ${run.stack} (${run.profile}, ${run.rows} rows${run.verdict ? `, ${run.verdict}` : ""})` }));
  }));
}

function renderReports(reports) {
  $("reports").replaceChildren(...reports.map((r) => el("li", {}, el("button", {
    type: "button", textContent: `${r.id} (${r.file})`, ariaLabel: `open report ${r.id}`,
    onclick: () => openReport(r.id, r.file) }))));
}

function fileUrl(report, path) {
  return `/ui/api/v1/report-file?report=${encodeURIComponent(report)}&path=${encodeURIComponent(path)}`;
}

// Markdown as the reports write it (headings, tables, images, lists, code, paragraphs), built as
// elements with text only.
function inline(text) {
  const out = document.createDocumentFragment();
  for (const part of text.split(/(`[^`]+`|\*\*[^*]+\*\*)/)) {
    if (part.startsWith("`") && part.endsWith("`") && part.length > 1) out.append(el("code", { textContent: part.slice(1, -1) }));
    else if (part.startsWith("**") && part.endsWith("**") && part.length > 3) out.append(el("strong", { textContent: part.slice(2, -2) }));
    else out.append(part.replace(/\[([^\]]*)\]\([^)]*\)/g, "$1"));
  }
  return out;
}

function markdown(text, report) {
  const root = document.createDocumentFragment();
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    let m;
    if (line.startsWith("```")) {
      const code = [];
      while (++i < lines.length && !lines[i].startsWith("```")) code.push(lines[i]);
      root.append(el("pre", { textContent: code.join("\n") }));
    } else if ((m = line.match(/^(#{1,4}) (.*)$/))) {
      root.append(el(`h${Math.min(6, m[1].length + 2)}`, {}, inline(m[2])));
    } else if ((m = line.match(/^!\[([^\]]*)\]\(([^)]+)\)/))) {
      root.append(el("img", { alt: m[1] || m[2], src: fileUrl(report, m[2]) }));
    } else if (line.startsWith("|")) {
      const rows = [];
      for (; i < lines.length && lines[i].startsWith("|"); i++) rows.push(lines[i]);
      i--;
      const cells = (row) => row.replace(/^\||\|$/g, "").split("|").map((c) => c.trim());
      const table = el("table", {}, el("thead", {}, el("tr", {}, ...cells(rows[0]).map((c) => el("th", { scope: "col" }, inline(c))))));
      table.append(el("tbody", {}, ...rows.slice(2).map((row) => el("tr", {}, ...cells(row).map((c) => el("td", {}, inline(c)))))));
      root.append(el("div", { class: "scroll", tabIndex: 0, role: "region", ariaLabel: "report table" }, table));
    } else if ((m = line.match(/^\s*[-*] (.*)$/))) {
      const items = [];
      for (; i < lines.length && (m = lines[i].match(/^\s*[-*] (.*)$/)); i++) items.push(el("li", {}, inline(m[1])));
      i--;
      root.append(el("ul", {}, ...items));
    } else if (line.trim()) {
      root.append(el("p", {}, inline(line)));
    }
  }
  return root;
}

async function openReport(report, file) {
  const reply = await fetch(fileUrl(report, file), { credentials: "same-origin" });
  const view = $("report");
  if (!reply.ok) { view.replaceChildren(el("p", { class: "bad", textContent: `cannot read ${report}: ${reply.status}` })); return; }
  view.replaceChildren(el("p", {}, el("strong", { textContent: report })), markdown(await reply.text(), report));
  view.dataset.report = report;
}

$("compare").addEventListener("click", async (event) => {
  const runs = [...document.querySelectorAll("#runs input:checked")].map((box) => Number(box.value));
  if (!runs.length) {
    $("report").replaceChildren(el("p", { class: "bad", textContent: "choose the runs to compare first" }));
    return;
  }
  const button = event.currentTarget;
  button.disabled = true;
  $("report").replaceChildren(el("p", { textContent: `writing a report of runs ${runs.join(", ")}…` }));
  try {
    const written = await act("/v1/report", { runs });
    await refresh();
    await openReport(written.id, written.file);
  } catch (e) {
    $("report").replaceChildren(el("p", { class: "bad", textContent: `compare: ${e.message}` }));
  } finally {
    button.disabled = false;
  }
});

let refreshing = null;
async function refresh() {
  if (refreshing) return refreshing;
  refreshing = (async () => {
    try {
      const [status, wanted, history, runs, reports] = await Promise.all([api("/v1/status"), api("/v1/desired"),
        api("/v1/history"), api("/v1/runs"), api("/v1/reports")]);
      desired = wanted;
      stackNames = status.catalog;
      const running = status.stacks.map((r) => r.stack).sort();
      $("instance").textContent = `instance ${status.instance}`;
      renderMemory(status.memory);
      renderStacks(status, history.deployments);
      renderAliases();
      renderHistory(history);
      renderRuns(runs.runs);
      renderReports(reports.reports);
      const chosen = $("log-stack").value;
      $("log-stack").replaceChildren(el("option", { value: "", textContent: "(choose a stack)" }),
        ...running.map((n) => el("option", { value: n, textContent: n, selected: n === chosen })));
    } catch (e) {
      $("live").textContent = `cannot read the daemon: ${e.message}`;
    } finally {
      refreshing = null;
    }
  })();
  return refreshing;
}

let pending = null;
function soon() {  // events come in bursts (a deploy's phases): one refresh per burst
  if (!pending) pending = setTimeout(() => { pending = null; refresh(); }, 150);
}

let logStream = null;
$("log-stack").addEventListener("change", (event) => {
  if (logStream) logStream.close();
  const out = $("logs");
  out.textContent = "";
  const stack = event.target.value;
  if (!stack) return;
  logStream = new EventSource(`/ui/api/v1/logs?stack=${encodeURIComponent(stack)}&tail=200`);
  logStream.onmessage = (message) => {
    out.append(JSON.parse(message.data).line + "\n");
    while (out.childNodes.length > 2000) out.firstChild.remove();
    out.scrollTop = out.scrollHeight;
  };
});

// The fetch streams of deploys and pulls under way, each with its bar: a stack's image (its layers
// summed), model and draft arrive at once. A stack's bars go when it leaves pulling and fetching.
const fetches = new Map();  // stack -> Map(stream -> Map(task -> [done, total]))
function followFetch(event) {
  if (event.kind === "progress") {
    const stream = event.task.startsWith("layer ") ? "image" : event.task;
    const streams = fetches.get(event.stack) || new Map();
    const tasks = streams.get(stream) || new Map();
    fetches.set(event.stack, streams.set(stream, tasks.set(event.task, [event.done, event.total])));
  } else if ((event.kind === "phase" && !["pulling", "fetching"].includes(event.phase)) || event.kind === "outcome") {
    fetches.delete(event.stack);
  } else return;
  const list = $("fetches");
  list.replaceChildren();
  for (const [stack, streams] of fetches) {
    for (const [stream, tasks] of streams) {
      const [done, total] = [...tasks.values()].reduce(([d, t], [dd, tt]) => [d + dd, t + tt], [0, 0]);
      const label = `${stack}: ${stream} ${(done / 1e6).toFixed(0)} of ${(total / 1e6).toFixed(0)} MB`;
      list.append(el("li", {}, el("span", { textContent: label }), " ",
        el("progress", { max: Math.max(total, 1), value: done, ariaLabel: label })));
    }
  }
}

const events = new EventSource("/ui/api/v1/events");
events.onopen = () => { $("live").textContent = "live"; };
events.onerror = () => { $("live").textContent = "reconnecting…"; };
events.onmessage = (message) => {
  const event = JSON.parse(message.data);
  $("live").dataset.time = event.time;  // the event's own time on the daemon's bus (its latency, measured)
  $("live").textContent = `live: ${progressLine(event)}`;
  followFetch(event);
  if (event.kind !== "progress") soon();  // a bar moves by itself: the rest reads the same
};

async function tick() {
  try {  // the gateway's own counters, and the engines'
    const [gateway, series] = await Promise.all([fetch("/metrics", { credentials: "same-origin" }), api("/v1/series")]);
    latest = series;
    if (gateway.ok) renderGateway(await gateway.text());
    refreshCharts();
  } catch (e) { /* the daemon restarts: the next tick tries again */ }
}
refresh();
tick();
setInterval(tick, 5000);  // the daemon samples every 5 s
