// The inspector page: the caller's sessions, and for one session the history beside what
// the model saw at each request. Data from /v1/sessions (the API key picks the tenant).
// No framework, no build step; text goes in through textContent only.
"use strict";

const app = document.getElementById("app");
const keyInput = document.getElementById("api-key");
keyInput.value = localStorage.getItem("foldgate-api-key") || "";
keyInput.addEventListener("change", () => {
  localStorage.setItem("foldgate-api-key", keyInput.value);
  route();
});

async function api(path) {
  const headers = keyInput.value ? { Authorization: "Bearer " + keyInput.value } : {};
  const resp = await fetch(path, { headers });
  const body = await resp.json();
  if (!resp.ok) throw new Error((body.error && body.error.message) || resp.statusText);
  return body;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "onclick") node.addEventListener("click", value);
    else if (value !== null && value !== undefined) node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) {
      node.append(child instanceof Node ? child : String(child));
    }
  }
  return node;
}

const num = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en"));
const pct = (part, whole) => (whole ? ((100 * part) / whole).toFixed(1) + "%" : "–");
const when = (t) => (t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) : "–");

function table(columns, rows, onRow, selected) {
  const head = el("tr", {}, ...columns.map(([title]) => el("th", {}, title)));
  const body = rows.map((row, i) => {
    const tr = el("tr", { class: "clickable" + (i === selected ? " selected" : "") },
      ...columns.map(([, cell]) => el("td", {}, cell(row))));
    tr.addEventListener("click", () => onRow(row));
    return tr;
  });
  return el("table", {}, el("thead", {}, head), el("tbody", {}, ...body));
}

const SESSION_COLUMNS = [
  ["Session", (s) => s.id],
  ["Requests", (s) => num(s.requests)],
  ["Raw tokens", (s) => num(s.raw_tokens)],
  ["Rendered", (s) => num(s.rendered_tokens)],
  ["Saved", (s) => pct(s.saved_tokens, s.raw_tokens)],
  ["Upstream prompt", (s) => num(s.upstream_prompt_tokens)],
  ["Cached", (s) => pct(s.upstream_cached_tokens, s.upstream_prompt_tokens)],
  ["Stubs", (s) => num(s.stubs)],
  ["Folds", (s) => num(s.folds)],
  ["Restores", (s) => num(s.restores)],
  ["Compactions", (s) => num(s.compactions)],
  ["Replica", (s) => s.replica || "–"],
  ["Last request", (s) => when(s.last_request_at)],
];

// One page of the session list as a table, its rows marked with their session ids.
function sessionTable(sessions) {
  const t = table(SESSION_COLUMNS, sessions,
    (s) => { location.hash = "session=" + encodeURIComponent(s.id); });
  for (const [i, tr] of [...t.tBodies[0].rows].entries()) {
    tr.classList.add("session-row");
    tr.dataset.session = sessions[i].id;
  }
  return t;
}

// The list comes a page at a time (GET /v1/sessions pages with a cursor): the first page,
// then each next one appended under it when asked for.
async function showList() {
  document.getElementById("where").textContent = "sessions";
  const first = await api("/v1/sessions");
  if (!first.data.length) {
    app.replaceChildren(el("p", {}, "No sessions for this tenant yet."));
    return;
  }
  const t = sessionTable(first.data);
  const shown = el("p", { id: "sessions-shown" });
  const more = el("button", { id: "more-sessions" }, "More sessions");
  let page = first;
  let count = first.data.length;
  const update = () => {
    shown.textContent = num(count) + " sessions shown" + (page.has_more ? ", more follow" : "");
    more.hidden = !page.has_more;
  };
  more.addEventListener("click", async () => {
    more.disabled = true;
    try {
      page = await api("/v1/sessions?after=" + encodeURIComponent(page.next_cursor));
      t.tBodies[0].append(...sessionTable(page.data).tBodies[0].rows);
      count += page.data.length;
      update();
    } catch (err) {
      shown.textContent = String(err.message || err);
    } finally {
      more.disabled = false;
    }
  });
  update();
  app.replaceChildren(el("h2", {}, "Sessions"), t, shown, more);
}

function figure(label, value) {
  return el("div", { class: "figure" }, el("b", {}, value), label);
}

async function showSession(id, wanted) {
  document.getElementById("where").textContent = "session " + id;
  const path = "/v1/sessions/" + encodeURIComponent(id);
  const s = await api(path);
  const request = wanted || s.log.length;
  const go = (n) => { location.hash = "session=" + encodeURIComponent(id) + "&request=" + n; };
  const parts = [
    el("h2", {}, "Session " + id),
    el("div", { class: "figures" },
      figure("requests", num(s.requests)),
      figure("raw tokens (est.)", num(s.raw_tokens)),
      figure("rendered tokens (est.)", num(s.rendered_tokens)),
      figure("saved", pct(s.saved_tokens, s.raw_tokens)),
      figure("removed by stubs", num(s.rendered_tokens_removed_by_stubs)),
      figure("removed by folds", num(s.rendered_tokens_removed_by_folds)),
      figure("added (protocol, labels)", num(s.rendered_tokens_added)),
      figure("upstream prompt tokens", num(s.upstream_prompt_tokens)),
      figure("cached by the replica", pct(s.upstream_cached_tokens, s.upstream_prompt_tokens)),
      figure("stubs now", num(s.stubs)),
      figure("folds now", num(s.folds)),
      figure("restores", num(s.restores)),
      figure("compactions", num(s.compactions)),
      figure("bound to replica", s.replica || "–"),
      figure("branches", num(s.branches))),
    table([
      ["Request", (r) => r.request],
      ["Messages", (r) => num(r.messages)],
      ["Strategy", (r) => r.strategy + (r.strategy.includes("refold") ? " (" + r.fold + ")" : "")],
      ["Raw", (r) => num(r.raw_tokens)],
      ["Rendered", (r) => num(r.rendered_tokens)],
      ["Upstream", (r) => num(r.upstream_prompt_tokens)],
      ["Cached", (r) => num(r.upstream_cached_tokens)],
      ["Stubs", (r) => num(r.stubs)],
      ["Folds", (r) => num(r.folds)],
      ["Restores", (r) => num(r.restores)],
      ["Replica", (r) => r.replica],
      ["At", (r) => when(r.at)],
    ], s.log, (r) => go(r.request), request - 1),
  ];
  if (s.log.length) {
    parts.push(await renderView(path, request));
  }
  app.replaceChildren(...parts);
}

function messageBody(m, text) {
  const nodes = [];
  if (m.thinking) nodes.push(el("pre", { class: "thinking" }, "(thinking) " + m.thinking));
  nodes.push(text);
  for (const call of m.tool_calls) {
    nodes.push(el("pre", { class: "call" }, "→ " + call.name + "(" + call.arguments + ")"));
  }
  if (m.attachments) nodes.push(el("div", { class: "head" }, m.attachments + " attachment(s)"));
  return nodes;
}

const spans = (...texts) => texts.filter((t) => t !== null).map((t) => el("span", {}, t));

function historyCard(h) {
  const badges = [];
  if (h.gateway) badges.push(el("span", { class: "badge gateway" }, "gateway restore"));
  if (!h.rendered) badges.push(el("span", { class: "badge dropped" }, "not sent"));
  return el("div", { class: "msg history" + (h.rendered ? "" : " dropped"), "data-index": h.index },
    el("div", { class: "head" }, ...spans("#" + h.index, h.role,
      h.step === null ? null : "step " + h.step), ...badges),
    ...messageBody(h, el("pre", { class: "text" }, h.text)));
}

const EXPANDABLE = new Set(["stub", "fold", "masked", "clipped", "rewritten"]);

function renderedCard(r, history, cached) {
  let text = el("pre", { class: "text" }, r.text);
  let cls = "msg rendered kind-" + r.kind;
  if (cached && r.index < cached.messages) cls += " cached";
  if (cached && r.index === cached.messages && cached.chars) {
    text = el("pre", { class: "text" },
      el("span", { class: "cached-part" }, r.text.slice(0, cached.chars)), r.text.slice(cached.chars));
  }
  const head = el("div", { class: "head" }, ...spans("#" + r.index, r.role),
    el("span", { class: "badge kind" }, r.kind), ...spans("~" + num(r.tokens) + " tok"));
  const card = el("div", { class: cls, "data-index": r.index, "data-source": r.source }, head,
    ...messageBody(r, text));
  if (EXPANDABLE.has(r.kind) && r.source !== null) {
    const original = history[r.source];
    const pre = el("pre", { class: "original", hidden: "" }, original.text);
    const button = el("button", { class: "expand" },
      "show original (" + num(original.text.length) + " chars)");
    button.addEventListener("click", () => {
      pre.hidden = !pre.hidden;
      button.textContent = pre.hidden ? "show original (" + num(original.text.length) + " chars)"
        : "hide original";
    });
    head.append(button);
    card.append(pre);
  }
  return card;
}

// Rows of the side-by-side grid: each rendered message beside the history message it
// renders; history messages that were not sent get a row of their own.
function rows(view) {
  const out = [];
  let next = 0;
  for (const r of view.rendered) {
    if (r.source !== null) {
      for (; next < r.source; next++) out.push([view.history[next], null]);
      out.push([view.history[r.source], r]);
      next = r.source + 1;
    } else {
      out.push([null, r]);
    }
  }
  for (; next < view.history.length; next++) out.push([view.history[next], null]);
  return out;
}

async function renderView(path, request) {
  const view = await api(path + "/render?request=" + request);
  const rec = view.record;
  const cached = view.cached_prefix;
  const grid = el("div", { class: "grid" },
    el("div", { class: "col-head" }, "History as the harness sent it (" + view.history.length
      + " messages, ~" + num(view.tokens.history) + " tokens)"),
    el("div", { class: "col-head" }, "What the model saw at request " + request + " ("
      + rec.strategy + ", " + view.rendered.length + " messages, ~" + num(view.tokens.rendered)
      + " tokens)"));
  const boundary = view.stats.boundary > 0 ? view.chunk_boundary : null;
  for (const [h, r] of rows(view)) {
    if (r && boundary && r.index === boundary.rendered_index) {
      grid.append(el("div", { class: "marker chunk-marker" },
        "chunk boundary at step " + boundary.step + ": only steps below it may be folded or "
        + "compacted (dedup stubs come at arrival)"));
    }
    if (r && cached && r.index === cached.messages) {
      grid.append(el("div", { class: "marker cache-marker" },
        "cached-prefix boundary: everything above" + (cached.chars ? " (and the highlighted start below)" : "")
        + " was sent identically at request " + (request - 1) + " (~" + num(cached.tokens)
        + " tokens" + (cached.same_replica ? ", same replica" : ", another replica") + "); the replica reported "
        + num(rec.upstream_cached_tokens) + " of " + num(rec.upstream_prompt_tokens) + " prompt tokens cached"));
    }
    grid.append(h ? historyCard(h) : el("div", { class: "msg empty" }),
      r ? renderedCard(r, view.history, cached) : el("div", { class: "msg empty" }));
  }
  const s = view.stats;
  return el("section", { id: "render" },
    el("h3", {}, "Request " + request + ": " + num(rec.messages) + " history messages, routed to "
      + rec.replica),
    el("div", { class: "figures" },
      figure("raw tokens (est.)", num(rec.raw_tokens)),
      figure("rendered tokens (est.)", num(rec.rendered_tokens)),
      figure("upstream prompt tokens", num(rec.upstream_prompt_tokens)),
      figure("cached by the replica", num(rec.upstream_cached_tokens)),
      figure("stubs", num(s.stubs)),
      figure("folded steps", num(s.folded_steps)),
      figure("removed by stubs", num(s.stub_saved_tokens)),
      figure("removed by folds", num(s.fold_saved_tokens)),
      figure("added", num(s.overhead_tokens)),
      figure("rewrites so far", num(s.rewrites)),
      figure("KV pressure priced", rec.pressure.toFixed(2)),
      figure("compactions", num(s.compactions)),
      figure("restores answered", num(rec.restores))),
    grid);
}

async function route() {
  const params = new URLSearchParams(location.hash.slice(1));
  try {
    if (params.get("session")) {
      await showSession(params.get("session"), Number(params.get("request")) || null);
    } else {
      await showList();
    }
  } catch (err) {
    app.replaceChildren(el("p", { class: "error" }, String(err.message || err)));
  }
}

window.addEventListener("hashchange", route);
route();
