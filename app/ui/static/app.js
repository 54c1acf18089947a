// tokengate status page: one module, no dependencies, no build step.
//
// Flow: ask for the admin key once (kept in sessionStorage, sent only in the
// Authorization header), then read /admin/ui/snapshot every POLL_MS while the tab is
// visible and redraw. 401 forgets the key and asks again. Everything shown is set
// with textContent or SVG attributes: nothing from the gateway is parsed as HTML.

const SNAPSHOT = "/admin/ui/snapshot";
const STORE_KEY = "tokengate.admin-key";
const POLL_MS = 2000;
const STALE_MS = 10000;
const SVG = "http://www.w3.org/2000/svg";

const $ = (id) => document.getElementById(id);
const state = { key: null, timer: null, paused: false, lastOk: 0, refreshes: 0, busy: false };

// -- formatting ------------------------------------------------------------------
function num(v, digits = 1) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  const a = Math.abs(v);
  if (a >= 1e9) return (v / 1e9).toFixed(digits) + "G";
  if (a >= 1e6) return (v / 1e6).toFixed(digits) + "M";
  if (a >= 1e4) return (v / 1e3).toFixed(digits) + "k";
  if (Number.isInteger(v)) return String(v);
  return v.toFixed(a >= 100 ? 0 : a >= 10 ? 1 : 2);
}

function ms(v) {
  if (v === null || v === undefined) return "–";
  return v >= 1000 ? (v / 1000).toFixed(v >= 10000 ? 0 : 1) + " s" : Math.round(v) + " ms";
}

function percent(share) {
  return share > 0 && share < 0.01 ? "<1 %" : Math.round(share * 100) + " %";
}

function clock(unix) {
  return new Date(unix * 1000).toLocaleTimeString([], { hour12: false });
}

function ago(sec) {
  if (sec < 1.5) return "now";
  if (sec < 90) return Math.round(sec) + " s ago";
  return Math.round(sec / 60) + " min ago";
}

// -- DOM helpers ---------------------------------------------------------------------
function el(tag, opts = {}, ...children) {
  const node = document.createElement(tag);
  if (opts.cls) node.className = opts.cls;
  if (opts.text !== undefined) node.textContent = opts.text;
  if (opts.title) node.title = opts.title;
  for (const c of children) if (c) node.append(c);
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

function cell(text, cls) {
  return el("td", { text: text === null || text === undefined ? "–" : String(text), cls });
}

function fill(tbody, rows, empty, columns) {
  tbody.replaceChildren(...rows);
  if (!rows.length) {
    const td = el("td", { text: empty, cls: "empty" });
    td.colSpan = columns;
    tbody.append(el("tr", {}, td));
  }
}

function meter(used, limit, label) {
  const wrap = el("div", { cls: "use" });
  const m = document.createElement("meter");
  m.min = 0;
  m.max = limit;
  m.low = limit * 0.7;
  m.high = limit * 0.9;
  m.optimum = 0;
  m.value = used;
  wrap.append(m, el("span", { text: label }));
  return wrap;
}

// What is left of a limit: full (and good) when idle, low (and bad) when nearly spent.
function leftMeter(left, limit, label) {
  const wrap = el("div", { cls: "use left" });
  const m = document.createElement("meter");
  m.min = 0;
  m.max = limit;
  m.low = limit * 0.1;
  m.high = limit * 0.3;
  m.optimum = limit;
  m.value = Math.max(0, left);
  wrap.append(m, el("span", { text: label }));
  return wrap;
}

// -- the admin key ------------------------------------------------------------------
function askForKey(message) {
  state.key = null;
  sessionStorage.removeItem(STORE_KEY);
  stop();
  document.body.dataset.state = "login";
  $("board").hidden = true;
  $("signout").hidden = true;
  $("pause").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("key").value = "";
  $("key").focus();
}

function onLogin(event) {
  event.preventDefault(); // never submitted: the key must not travel in a form or URL
  const key = $("key").value.trim();
  if (!key) return;
  state.key = key;
  sessionStorage.setItem(STORE_KEY, key);
  $("key").value = "";
  $("login-error").textContent = "";
  refresh();
}

// -- polling ----------------------------------------------------------------------------
function stop() {
  clearTimeout(state.timer);
  state.timer = null;
}

function schedule() {
  stop();
  if (state.key && !state.paused && !document.hidden) state.timer = setTimeout(refresh, POLL_MS);
}

async function refresh() {
  if (!state.key || state.busy) return;
  state.busy = true;
  try {
    const r = await fetch(SNAPSHOT, {
      headers: { Authorization: "Bearer " + state.key, Accept: "application/json" },
      cache: "no-store",
      credentials: "omit",
      referrerPolicy: "no-referrer",
    });
    if (r.status === 401) return askForKey("The gateway refused this admin key.");
    const body = await r.json().catch(() => null);
    if (!r.ok) {
      const why = body && body.error ? body.error.message : "HTTP " + r.status;
      if (r.status === 404) return askForKey(why);
      throw new Error(why);
    }
    state.lastOk = Date.now();
    state.refreshes += 1;
    $("login").hidden = true;
    $("board").hidden = false;
    $("signout").hidden = false;
    $("pause").hidden = false;
    render(body);
    document.body.dataset.state = "live";
    document.body.dataset.refreshes = String(state.refreshes);
  } catch (err) {
    document.body.dataset.state = "stale";
    $("updated").textContent = "cannot reach the gateway (" + err.message + ")";
  } finally {
    state.busy = false;
    showFreshness();
    if (state.key) schedule();
  }
}

function showFreshness() {
  const node = $("updated");
  if (!state.lastOk) return;
  const age = Date.now() - state.lastOk;
  node.classList.toggle("stale", age > STALE_MS);
  if (age > STALE_MS) {
    node.textContent = "no answer for " + Math.round(age / 1000) + " s: figures are old";
  } else if (!document.body.dataset.state || document.body.dataset.state === "live") {
    node.textContent = (state.paused ? "paused · " : "live · ") + "updated " + clock(state.lastOk / 1000);
  }
}

// -- rendering ----------------------------------------------------------------------------
function render(s) {
  renderHeader(s);
  renderAttention(s.attention);
  renderTiles(s);
  renderDomains(s.status.domains);
  renderCharts(s.series);
  renderKeys(s.keys);
  renderSessions(s.sessions || []);
  renderErrors(s.errors);
  renderAudit(s.status.audit || []);
  renderDeferred(s.status.deferred || []);
  renderReplicas(s.replicas);
}

function renderDeferred(held) {
  const rows = held.map((d) =>
    el("tr", {}, cell(d.kind || "batch"), cell(d.id || d.batch, "mono"), cell(d.key),
      cell(d.window), cell(d.pending), cell(d.held_since ? clock(d.held_since) : null),
      cell(d.release_at)),
  );
  fill(document.querySelector("#deferred tbody"), rows, "nothing held", 7);
}

function renderAudit(changes) {
  const shown = (v) => (v === null || v === undefined ? null : JSON.stringify(v));
  const rows = changes.map((c) =>
    el("tr", {}, cell(c.at), cell(c.actor), cell(c.action), cell(c.target, "mono"),
      cell(shown(c.before), "message"), cell(shown(c.after), "message")),
  );
  fill(document.querySelector("#audit tbody"), rows, "no change recorded yet", 6);
}

function renderHeader(s) {
  $("cluster").textContent = s.status.cluster;
  const badge = $("readiness");
  badge.textContent = s.readiness;
  badge.className = "badge " + (s.ready ? "good" : s.readiness === "draining" ? "warn" : "bad");
  const others = s.replicas.length - 1;
  $("replica").textContent =
    "replica " + s.replica.id + (others > 0 ? " (+" + others + " other" + (others > 1 ? "s" : "") + ")" : "");
  $("replica").title = "uptime " + Math.round(s.status.uptime_sec) + " s";
  const note = $("workers-note");
  note.hidden = s.replica.workers <= 1;
  note.textContent =
    "This replica runs " + s.replica.workers + " worker processes; each refresh is answered " +
    "by one of them, and its charts and errors are that worker's own (Prometheus sums them all).";
}

function renderAttention(items) {
  const list = $("attention");
  const rows = items.map((a) => el("li", { cls: a.level, text: a.text }));
  if (!rows.length) rows.push(el("li", { cls: "ok", text: "Nothing needs attention." }));
  list.replaceChildren(...rows);
}

// The mean of the last minute's complete buckets (fewer right after a start: the
// buckets before it were not "no traffic", they did not exist).
function lastMinute(values, step, uptime) {
  const n = Math.max(1, Math.min(Math.round(60 / step), Math.floor(uptime / step)));
  const tail = values.slice(-n);
  return tail.reduce((a, b) => a + b, 0) / tail.length;
}

function renderTiles(s) {
  const se = s.series;
  const minute = (values) => lastMinute(values, se.step_sec, s.status.uptime_sec);
  const byClass = se.requests_per_sec;
  const rps = Object.values(byClass).reduce((a, v) => a + minute(v), 0);
  const share = (cls) => (rps ? minute(byClass[cls]) / rps : 0);
  $("tile-rps").textContent = num(rps);
  $("tile-5xx").textContent = rps ? percent(share("5xx")) : "–";
  $("tile-5xx").classList.toggle("bad", share("5xx") > 0.05);
  $("tile-429").textContent = rps ? percent(share("429")) : "–";
  $("tile-429").classList.toggle("warn", share("429") > 0.05);
  const tps = minute(se.tokens_per_sec.prompt) + minute(se.tokens_per_sec.completion);
  $("tile-tps").textContent = num(tps);
  $("tile-ttft").textContent = ms(se.totals.ttft_ms.p95);
  let queued = 0;
  let inflight = 0;
  for (const d of Object.values(s.status.domains)) {
    queued += d.queue_depth;
    inflight += d.inflight;
  }
  $("tile-queue").textContent = queued + " / " + inflight;
  const total = Object.values(se.totals.requests).reduce((a, b) => a + b, 0);
  $("total-requests").textContent = String(total);
}

const STATE_CLASS = {
  healthy: "good",
  unknown: "muted",
  throttled: "warn",
  quota_exhausted: "bad",
  unhealthy: "bad",
  circuit_open: "bad",
};

function renderDomains(domains) {
  const rows = Object.entries(domains).map(([name, d]) => {
    const pace = d.pace || {};
    const paceText =
      pace.requests_per_sec === null || pace.requests_per_sec === undefined
        ? "unbounded"
        : num(pace.requests_per_sec) + " req/s" + (pace.learned ? " (learned)" : "");
    const q = d.queue_by_priority || {};
    const queueText =
      [q.high || 0, q.normal || 0, q.low || 0, q.batch || 0].join(" · ") + " of " + d.queue_capacity;
    const probe = d.last_probe;
    const probeText = probe ? (probe.ok ? "ok" : "failed") + ", " + ago(probe.age_sec) : "–";
    const stateCell = el("td", {}, el("span", { cls: "badge " + (STATE_CLASS[d.state] || "muted"), text: d.state }));
    const inflight = el("td", {}, meter(d.inflight, Math.max(1, d.max_inflight), d.inflight + " of " + d.max_inflight));
    return el(
      "tr",
      {},
      cell(name, "name"),
      stateCell,
      cell(d.breaker, d.breaker === "closed" ? "" : "bad-text"),
      cell(paceText + (pace.shared ? " · shared" : "")),
      cell(pace.cooldown_sec > 0 ? pace.cooldown_sec.toFixed(1) + " s" : "–", pace.cooldown_sec > 0 ? "warn-text" : ""),
      cell(queueText, d.queue_depth >= 0.8 * d.queue_capacity ? "warn-text" : ""),
      inflight,
      el("td", { text: probeText, title: probe && probe.detail ? String(probe.detail) : "" }),
      failureCell(d.last_failure, d.state),
    );
  });
  fill(document.querySelector("#domains tbody"), rows, "no domain configured", 9);
}

// Why the domain last failed (connection refused at host:port, DNS, TLS, 401, 429...), with
// its age and, on hover, what to do about it.
function failureCell(failure, domainState) {
  if (!failure) return cell("–", "muted");
  const failing = domainState === "unhealthy" || domainState === "circuit_open";
  const text = failure.summary + ", " + ago(failure.age_sec);
  return el("td", { cls: failing ? "bad-text failure" : "muted failure", text, title: failure.fix || "" });
}

function renderKeys(keys) {
  const budgets = keys.some((k) => k.budget);
  document.querySelectorAll("#keys .budget").forEach((th) => (th.hidden = !budgets));
  const rows = keys.map((k) => {
    const use = (part) => {
      if (part.remaining === null) return el("td", { text: "limit " + num(part.limit, 0), cls: "muted" });
      const left = Math.max(0, part.remaining);
      const label = num(left) + " left of " + num(part.limit) + " · " + num(part.limit - part.remaining) + " used";
      return el("td", {}, leftMeter(left, part.limit, label));
    };
    const asOf =
      k.source === "live" ? "live" : k.source === "last_request" ? "last request, " + ago(k.age_sec) : "no request here yet";
    const row = el("tr", {}, cell(k.alias, "name"), cell(k.priority), cell(k.domain || "any"), use(k.requests), use(k.tokens));
    if (budgets) {
      const b = k.budget;
      row.append(b ? el("td", {}, meter(b.used, b.limit, num(b.used) + " of " + num(b.limit) + " / " + b.period)) : cell("–"));
    }
    row.append(cell(asOf, "muted"));
    return row;
  });
  fill(document.querySelector("#keys tbody"), rows, "no gateway key configured", budgets ? 7 : 6);
}

function renderSessions(sessions) {
  const rows = sessions.map((x) =>
    el("tr", {}, cell(x.session, "name"), cell(x.key), cell(num(x.requests, 0)), cell(num(x.tokens)),
      cell(x.cost + " " + x.currency), cell(ago(x.last_seen_sec), "muted")));
  fill(document.querySelector("#sessions tbody"), rows, "no agent session today", 6);
}

function renderErrors(errors) {
  $("errors-total").textContent = errors.total ? errors.recent.length + " shown of " + errors.total + " since start" : "";
  // What the listed errors are, grouped: a flood of one kind must not hide the rest.
  const kinds = new Map();
  for (const e of errors.recent) {
    const kind = e.status + " " + (e.code || "");
    const k = kinds.get(kind) || { n: 0, keys: new Set(), since: e.at, status: e.status };
    k.n += 1;
    k.keys.add(e.key);
    k.since = Math.min(k.since, e.at);
    kinds.set(kind, k);
  }
  $("error-kinds").replaceChildren(
    ...[...kinds.entries()]
      .sort((a, b) => b[1].n - a[1].n)
      .map(([kind, k]) =>
        el("li", { cls: k.status >= 500 ? "bad" : "warn", text: kind + " ×" + k.n + " · keys " + [...k.keys].join(", ") + " · since " + clock(k.since) }),
      ),
  );
  const rows = errors.recent.map((e) =>
    el(
      "tr",
      {},
      cell(clock(e.at)),
      cell(e.status, e.status >= 500 ? "bad-text" : "warn-text"),
      cell(e.code),
      cell(e.key),
      cell(e.model),
      cell(e.domain),
      cell(e.request_id, "mono"),
      cell(e.message, "message"),
    ),
  );
  fill(document.querySelector("#errors tbody"), rows, "no error answered since start", 8);
}

function renderReplicas(replicas) {
  const items = replicas.map((r) => {
    const stale = r.last_seen_sec > 10;
    const li = el("li", { cls: stale ? "stale" : "" });
    li.append(
      el("span", { cls: "dot " + (stale ? "warn" : "good") }),
      el("span", { cls: "mono", text: r.id }),
      el("span", { cls: "muted", text: r.self ? " · this page" : " · seen " + ago(r.last_seen_sec) }),
    );
    return li;
  });
  if (replicas.length === 1) {
    items.push(el("li", { cls: "muted", text: "No other replica known (replicas appear here when they share Redis)." }));
  }
  $("replicas").replaceChildren(...items);
}

// -- charts ---------------------------------------------------------------------------------
const CHARTS = [
  {
    title: "Requests/s by status",
    unit: num,
    lines: (s) => [
      ["2xx", s.requests_per_sec["2xx"]],
      ["4xx", s.requests_per_sec["4xx"]],
      ["429", s.requests_per_sec["429"]],
      ["5xx", s.requests_per_sec["5xx"]],
    ],
  },
  {
    title: "Tokens/s",
    unit: num,
    lines: (s) => [
      ["prompt", s.tokens_per_sec.prompt],
      ["completion", s.tokens_per_sec.completion],
    ],
  },
  {
    title: "Time to first token",
    unit: ms,
    lines: (s) => [
      ["p50", s.ttft_ms.p50],
      ["p95", s.ttft_ms.p95],
    ],
  },
  { title: "Queue wait p95", unit: ms, lines: (s) => [["p95", s.queue_wait_ms.p95]] },
  { title: "Upstream 429s/s", unit: num, lines: (s) => [["429", s.upstream_429_per_sec]] },
];

function renderCharts(series) {
  const box = $("charts");
  if (box.children.length !== CHARTS.length) box.replaceChildren(...CHARTS.map(() => el("figure", { cls: "chart" })));
  CHARTS.forEach((spec, i) => drawChart(box.children[i], spec, series));
}

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

function drawChart(fig, spec, series) {
  const lines = spec.lines(series);
  const n = series.points;
  const max = niceMax(Math.max(0, ...lines.flatMap(([, v]) => v.filter((x) => x !== null))));
  const W = 300;
  const H = 100;
  const x = (i) => (n <= 1 ? W : (i * W) / (n - 1));
  const y = (v) => H - (v / max) * H;

  const plot = svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", class: "plot", role: "img" });
  plot.setAttribute("aria-label", spec.title);
  for (const f of [0.25, 0.5, 0.75]) plot.append(svg("line", { x1: 0, x2: W, y1: H * f, y2: H * f, class: "grid" }));
  for (const [name, values] of lines) {
    let points = [];
    const flush = () => {
      if (points.length === 1) points.push([points[0][0] + 0.5, points[0][1]]);
      if (points.length) plot.append(svg("polyline", { points: points.map((p) => p.join(",")).join(" "), class: "line s-" + name }));
      points = [];
    };
    values.forEach((v, i) => (v === null ? flush() : points.push([x(i).toFixed(1), y(v).toFixed(1)])));
    flush();
  }
  const cursor = svg("line", { x1: 0, x2: 0, y1: 0, y2: H, class: "cursor", visibility: "hidden" });
  plot.append(cursor);

  const legend = el("div", { cls: "legend" });
  for (const [name, values] of lines) {
    const last = [...values].reverse().find((v) => v !== null);
    legend.append(el("span", { cls: "key s-" + name, text: name + " " + spec.unit(last === undefined ? null : last) }));
  }
  const head = el("figcaption", {}, el("span", { cls: "chart-title", text: spec.title }), legend);
  const axis = el("div", { cls: "axis" }, el("span", { text: "−" + Math.round((n * series.step_sec) / 60) + " min" }), el("span", { text: "max " + spec.unit(max) }), el("span", { text: clock(series.end_unix) }));
  const frame = el("div", { cls: "frame" }, plot);
  fig.replaceChildren(head, frame, axis);

  frame.addEventListener("mousemove", (ev) => hover(ev, frame, cursor, spec, lines, series));
  frame.addEventListener("mouseleave", () => {
    cursor.setAttribute("visibility", "hidden");
    $("tooltip").hidden = true;
  });
}

function hover(ev, frame, cursor, spec, lines, series) {
  const box = frame.getBoundingClientRect();
  const n = series.points;
  const i = Math.min(n - 1, Math.max(0, Math.round(((ev.clientX - box.left) / box.width) * (n - 1))));
  const xv = n <= 1 ? 300 : (i * 300) / (n - 1);
  cursor.setAttribute("x1", xv);
  cursor.setAttribute("x2", xv);
  cursor.setAttribute("visibility", "visible");
  const at = series.end_unix - (n - 1 - i) * series.step_sec;
  const tip = $("tooltip");
  tip.replaceChildren(el("div", { cls: "muted", text: clock(at - series.step_sec) + "–" + clock(at) }));
  for (const [name, values] of lines) tip.append(el("div", { cls: "key s-" + name, text: name + " " + spec.unit(values[i]) }));
  tip.hidden = false;
  tip.style.left = Math.min(window.innerWidth - 180, ev.clientX + 12) + "px";
  tip.style.top = ev.clientY + window.scrollY + 12 + "px";
}

// -- start ------------------------------------------------------------------------------------
function start() {
  $("login-form").addEventListener("submit", onLogin);
  $("signout").addEventListener("click", () => askForKey("Key forgotten. Enter it again to continue."));
  $("pause").addEventListener("click", () => {
    state.paused = !state.paused;
    $("pause").textContent = state.paused ? "Resume" : "Pause";
    if (state.paused) stop();
    else refresh();
    showFreshness();
  });
  document.addEventListener("visibilitychange", () => (document.hidden ? stop() : refresh()));
  setInterval(showFreshness, 1000);
  state.key = sessionStorage.getItem(STORE_KEY);
  if (state.key) refresh();
  else askForKey("");
}

start();
