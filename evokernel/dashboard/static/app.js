// The evokernel dashboard page: renders the model that /api/events streams, and opens
// a candidate from /api/node when a lineage node or a point is clicked. All data is put
// into the page as text (never as HTML), so a kernel's source cannot inject markup.
"use strict";

const $ = (id) => document.getElementById(id);
const COLORS = ["#2f6fdf", "#e07b39", "#1f8a4c", "#9b59b6", "#c0392b", "#16a085", "#7f8c8d", "#d4a017"];
const PLOT = { displaylogo: false, responsive: true, displayModeBar: "hover" };
const LEGEND = { orientation: "h", x: 0, y: -0.22, yanchor: "top", font: { size: 11 } };
const page = { run: new URLSearchParams(location.search).get("run"), source: null, node: null, state: null };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

const fmt = (x, digits = 4) => (x === null || x === undefined ? "-" : Number(x).toPrecision(digits));
const short = (id) => (id ? id.slice(0, 10) : "?");

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

// -- live updates --------------------------------------------------------------------------
function connect() {
  if (page.source) page.source.close();
  const url = "/api/events" + (page.run ? "?run=" + encodeURIComponent(page.run) : "");
  const source = new EventSource(url);
  page.source = source;
  source.addEventListener("state", (ev) => {
    setLive(true);
    let state;
    try {
      state = JSON.parse(ev.data);
    } catch (err) {
      showError("the dashboard sent an unreadable update: " + err);
      return;
    }
    render(state);
  });
  source.onerror = () => setLive(false);
  source.onopen = () => setLive(true);
}

function setLive(on) {
  const live = $("live");
  live.className = "live " + (on ? "on" : "off");
  live.textContent = on ? "live" : "reconnecting";
}

function showError(text) {
  const box = $("error");
  box.hidden = !text;
  box.textContent = text || "";
}

function showNotices(list) {
  const box = $("notices");
  box.hidden = !list.length;
  box.replaceChildren(...list.map((n) => el("li", {}, n)));
}

// -- the model -----------------------------------------------------------------------------
function render(state) {
  page.state = state;
  showError(state.error || "");
  if (state.error) return;
  const notices = [...(state.notices || [])];
  if (state.kind === "waiting") {
    $("title").textContent = "evokernel: waiting";
    $("subtitle").textContent = state.path;
    $("comparison").hidden = true;
    $("run").hidden = true;
    showNotices(notices);
    return;
  }
  if (state.kind === "comparison") {
    renderComparison(state);
    if (state.selected) {
      renderRun(state.selected, true);
      for (const n of state.selected.notices || []) if (!notices.some((m) => m.endsWith(n))) notices.push(n);
    }
  } else {
    $("comparison").hidden = true;
    $("title").textContent = "evokernel: " + (state.label || "run");
    $("subtitle").textContent = [state.workload, state.strategy, "seed " + state.seed].join(" / ");
    renderRun(state, false);
  }
  showNotices(notices);
  $("footer").textContent = "following " + state.path + " (read-only); updated " + new Date().toLocaleTimeString();
}

function renderComparison(state) {
  $("comparison").hidden = false;
  $("title").textContent = "evokernel: comparison";
  const budget = state.budget ? `budget ${state.budget.value} ${state.budget.unit}` : "";
  $("subtitle").textContent = [state.workload, state.strategies.join(", "), state.seeds.length + " seeds", budget,
    state.finished ? "finished" : "running"].join(" / ");
  const selected = state.selected ? state.selected.label : null;
  fill($("runs").tBodies[0], state.runs.map((r) => el("tr", {
    class: "clickable" + (r.key === selected ? " selected" : ""), "data-run": r.key,
    onclick: () => selectRun(r.key),
  }, el("td", {}, r.strategy), el("td", {}, r.seed), el("td", {}, r.state + (r.stop_reason ? ` (${r.stop_reason})` : "")),
     el("td", {}, r.evaluations), el("td", {}, fmt(r.device_s, 3)), el("td", {}, fmt(r.best)))));
  bandChart("chart-bands", state.strategies, state.bands, "evaluations spent (seeds included)");
  bandChart("chart-bands-device", state.strategies, state.bands_device, "device seconds spent");
}

function bandChart(id, strategies, bands, xlabel) {
  const traces = [];
  strategies.forEach((s, i) => {
    const b = bands[s];
    if (!b || !b.x.length) return;
    const color = COLORS[i % COLORS.length];
    traces.push({ x: b.x, y: b.high, mode: "lines", line: { width: 0 }, showlegend: false, hoverinfo: "skip", name: s });
    traces.push({ x: b.x, y: b.low, mode: "lines", line: { width: 0 }, fill: "tonexty", fillcolor: color + "33",
      showlegend: false, hoverinfo: "skip", name: s });
    traces.push({ x: b.x, y: b.median, mode: "lines", line: { color, width: 2 }, name: s,
      customdata: b.seeds, hovertemplate: s + ": %{y:.4g} (median of %{customdata} seeds)<extra></extra>" });
  });
  Plotly.react(id, traces, {
    title: { text: "best so far: median, band min-max over seeds", font: { size: 13 }, x: 0.01, xanchor: "left" },
    xaxis: { title: { text: xlabel } }, yaxis: { title: { text: "fitness" } },
    margin: { l: 55, r: 15, t: 40, b: 80 }, uirevision: id, legend: LEGEND,
  }, PLOT);
}

function selectRun(key) {
  page.run = key;
  const url = new URL(location.href);
  url.searchParams.set("run", key);
  history.replaceState(null, "", url);
  closeNode();
  connect();
}

function renderRun(s, inComparison) {
  $("run").hidden = false;
  $("run-title").textContent = inComparison ? "Run " + s.label : "Run";
  const budget = s.budget;
  $("stat-evaluations").textContent = s.evaluations;
  setBar("bar-evaluations", budget.evaluations.spent, budget.evaluations.limit);
  $("stat-evaluations-budget").textContent = budget.evaluations.limit ? `of ${budget.evaluations.limit} budgeted` : "no evaluation budget";
  $("stat-best").textContent = s.best ? fmt(s.best.fitness) : "none passed";
  $("stat-best-who").textContent = s.best ? `${short(s.best.id)} (${s.best.name}, ${s.best.operator})` : "";
  $("stat-rate").textContent = s.rate.per_minute === null ? "-" : fmt(s.rate.per_minute, 3);
  const age = s.rate.last ? Math.max(0, (Date.now() - Date.parse(s.rate.last)) / 1000) : null;
  $("stat-rate-sub").textContent = s.rate.last
    ? `last 5 min: ${fmt(s.rate.recent_per_minute, 3)}/min; last one ${age < 90 ? Math.round(age) + " s" : Math.round(age / 60) + " min"} ago`
    : "";
  $("stat-device").textContent = fmt(budget.device_s.spent, 4);
  setBar("bar-device", budget.device_s.spent, budget.device_s.limit);
  $("stat-device-budget").textContent = budget.device_s.limit ? `of ${budget.device_s.limit} budgeted` : "no device-time budget";
  $("stat-status").replaceChildren(...Object.entries(s.status_counts).sort().map(([k, v]) => el("span", { class: k }, `${k} ${v}`)));
  $("stat-generation").textContent = s.generation === null || s.generation === undefined ? "no snapshot yet"
    : `generation ${s.generation} snapshotted ${s.snapshot_written || ""}`;
  progressCharts(s);
  lineage(s);
  islands(s);
  mapElites(s);
  finalists(s);
  llm(s);
  optuna(s);
}

function setBar(id, spent, limit) {
  const bar = $(id).firstElementChild;
  bar.style.width = limit ? Math.min(100, (100 * spent) / limit) + "%" : "0";
}

function progressCharts(s) {
  const series = s.series;
  const islandsSeen = [...new Set(series.island.filter((i) => i !== null))].sort((a, b) => a - b);
  for (const [id, xkey, xlabel] of [["chart-evals", "index", "evaluations spent"], ["chart-device", "device_s", "device seconds spent"]]) {
    const x = series[xkey];
    const traces = [{
      x, y: series.fitness, mode: "markers", name: "evaluated (passed)", customdata: series.id,
      text: series.operator, marker: { size: 6, color: "#9aa3b5" },
      hovertemplate: "%{customdata}<br>%{text}<br>fitness %{y:.4g}<extra></extra>",
    }, {
      x, y: series.best, mode: "lines", name: "best so far", line: { shape: "hv", width: 3, color: COLORS[0] },
      hovertemplate: "best %{y:.4g}<extra></extra>",
    }];
    if (islandsSeen.length > 1) {
      islandsSeen.forEach((isl, k) => {
        const xs = [], ys = [];
        let best = null;
        series.island.forEach((i, n) => {
          if (i !== isl) return;
          const f = series.fitness[n];
          if (f !== null && (best === null || f > best)) best = f;
          xs.push(x[n]);
          ys.push(best);
        });
        traces.push({ x: xs, y: ys, mode: "lines", name: "island " + isl,
          line: { shape: "hv", width: 1.5, dash: "dot", color: COLORS[(k + 1) % COLORS.length] } });
      });
    }
    Plotly.react(id, traces, {
      title: { text: "best fitness so far over " + xlabel.split(" ")[0] + (xkey === "device_s" ? " seconds" : ""), font: { size: 13 }, x: 0.01, xanchor: "left" },
      xaxis: { title: { text: xlabel } }, yaxis: { title: { text: "fitness (speedup)" } },
      margin: { l: 55, r: 15, t: 40, b: 80 }, uirevision: id + (s.label || ""), legend: LEGEND,
    }, PLOT);
    bindClick(id);
  }
}

function bindClick(id) {
  const div = $(id);
  if (div.dataset.bound) return;
  div.dataset.bound = "1";
  div.on("plotly_click", (ev) => {
    const point = ev.points && ev.points[0];
    if (point && typeof point.customdata === "string") openNode(point.customdata);
  });
}

function lineage(s) {
  const nodes = s.lineage.nodes;
  const byId = Object.fromEntries(nodes.map((n) => [n.id, n]));
  const fitnessOf = (n) => (n.fitness === null ? 0 : n.fitness);
  const edgeX = [], edgeY = [];
  for (const [p, c] of s.lineage.edges) {
    if (!byId[p] || !byId[c]) continue;
    edgeX.push(byId[p].generation, byId[c].generation, null);
    edgeY.push(fitnessOf(byId[p]), fitnessOf(byId[c]), null);
  }
  Plotly.react("chart-lineage", [
    { x: edgeX, y: edgeY, mode: "lines", line: { color: "#b8bfcc", width: 1 }, hoverinfo: "skip", showlegend: false },
    { x: nodes.map((n) => n.generation), y: nodes.map(fitnessOf), mode: "markers+text", customdata: nodes.map((n) => n.id),
      text: nodes.map((n) => n.operator), textposition: "top center", textfont: { size: 10 }, showlegend: false,
      marker: { size: nodes.map((n) => (n.main ? 13 : 9)), color: nodes.map((n) => (n.status === "PASSED" ? (n.main ? COLORS[0] : "#8fb0ee") : COLORS[4])) },
      hovertemplate: "%{customdata}<br>%{text}<br>fitness %{y:.4g}<extra></extra>" },
  ], {
    title: { text: s.lineage.of ? "ancestry of " + short(s.lineage.of) + (s.lineage.truncated ? " (first 200)" : "") : "no passed candidate yet", font: { size: 13 }, x: 0.01, xanchor: "left" },
    xaxis: { title: { text: "generation" } }, yaxis: { title: { text: "fitness (0: failed)" } },
    margin: { l: 55, r: 15, t: 40, b: 45 }, uirevision: "lineage" + (s.label || ""),
  }, PLOT);
  bindClick("chart-lineage");
  fill($("lineage").tBodies[0], nodes.map((n) => el("tr", {
    class: "clickable" + (n.main ? " main" : "") + (page.node === n.id ? " selected" : ""), "data-id": n.id,
    onclick: () => openNode(n.id),
  }, el("td", {}, n.depth), el("td", {}, el("code", {}, short(n.id)), " ", n.name), el("td", {}, n.operator),
     el("td", {}, n.generation ?? "-"), el("td", {}, n.status), el("td", {}, fmt(n.fitness)))));
}

function islands(s) {
  $("islands-section").hidden = !s.islands.length;
  $("islands").replaceChildren(...s.islands.map((isl) => el("div", { class: "card" },
    el("div", { class: "label" }, `island ${isl.index} (${isl.kind})`),
    el("div", { class: "value" }, isl.best ? fmt(isl.best.fitness) : "-"),
    el("div", { class: "sub" }, `${isl.size}${isl.capacity ? " of " + isl.capacity : ""} members`),
    el("table", {}, el("tbody", {}, isl.top.map((m) => el("tr", { class: "clickable", onclick: () => openNode(m.id) },
      el("td", {}, el("code", {}, short(m.id))), el("td", {}, m.operator), el("td", {}, m.status === "PASSED" ? fmt(m.fitness) : m.status))))))));
}

function mapElites(s) {
  const grids = s.map_elites;
  $("map-elites-section").hidden = !grids.length;
  const holder = $("map-elites");
  while (holder.children.length > grids.length) holder.lastChild.remove();
  grids.forEach((g, k) => {
    let div = holder.children[k];
    if (!div) holder.append((div = el("div", { class: "chart", id: "map-elites-" + k })));
    const [ax, ay] = [g.axes[0], g.axes[1] || { name: "", bins: ["all"], labels: [""] }];
    const z = ay.bins.map(() => ax.bins.map(() => null));
    const ids = ay.bins.map(() => ax.bins.map(() => ""));
    for (const c of g.cells) {
      const i = ay.bins.indexOf(g.axes[1] ? c.cell[1] : "all"), j = ax.bins.indexOf(c.cell[0]);
      if (i < 0 || j < 0) continue;
      const f = c.fitness === null ? 0 : c.fitness;
      if (z[i][j] === null || f > z[i][j]) { z[i][j] = f; ids[i][j] = c.id; }
    }
    Plotly.react(div, [{ type: "heatmap", x: ax.labels, y: ay.labels, z, customdata: ids, colorscale: "Viridis",
      hovertemplate: ax.name + " %{x}, " + ay.name + " %{y}<br>best %{z:.4g}<br>%{customdata}<extra></extra>",
      colorbar: { title: { text: "fitness" } } }], {
      title: { text: `island ${g.island}: ${g.cells.length} cells occupied` + (g.axes.length > 2 ? " (first two axes)" : ""), font: { size: 13 }, x: 0.01, xanchor: "left" },
      xaxis: { title: { text: ax.name }, type: "category" }, yaxis: { title: { text: ay.name }, type: "category" },
      margin: { l: 70, r: 15, t: 40, b: 55 }, uirevision: "me" + k,
    }, PLOT);
    if (!div.dataset.bound) {
      div.dataset.bound = "1";
      div.on("plotly_click", (ev) => { const p = ev.points && ev.points[0]; if (p && p.customdata) openNode(p.customdata); });
    }
  });
}

function finalists(s) {
  const f = s.finalists;
  $("finalists-section").hidden = !f;
  if (!f) return;
  const gain = f.gain_over_best_seed;
  $("finalists-note").textContent = `${f.rounds} fresh evaluations each, interleaved (${fmt(f.device_s)} device seconds, `
    + `not charged to the budget). Best found: ${f.best || "none confirmed"}`
    + (gain ? `, ${fmt(gain)}x the best seed` : "")
    + (f.gain_range ? ` (range ${fmt(f.gain_range[0])}-${fmt(f.gain_range[1])}: `
      + (f.gain_range[0] > 1 ? "faster in every round)" : "not separated from the seed by these rounds)") : "") + ".";
  fill($("finalists").tBodies[0], f.finalists.map((x) => el("tr", { class: x.candidate === f.best ? "best" : "" },
    el("td", {}, el("a", { href: "#", onclick: (ev) => { ev.preventDefault(); openNode(x.candidate); } }, x.candidate)),
    el("td", {}, x.seed ? "best seed" : "found"), el("td", {}, fmt(x.in_search)), el("td", {}, fmt(x.fitness)),
    el("td", {}, x.fresh.map((r) => (r.fitness === null ? r.status : fmt(r.fitness))).join(", ")),
    el("td", { class: x.confirmed ? "PASSED" : "INCORRECT" }, x.confirmed ? "confirmed" : x.failure))));
}

function llm(s) {
  $("llm-section").hidden = !s.llm;
  if (!s.llm) return;
  fill($("llm").tBodies[0], Object.entries(s.llm.operators).map(([op, outcomes]) => el("tr", {},
    el("td", {}, op), el("td", {}, Object.entries(outcomes).map(([k, v]) => `${k} ${v}`).join(", ")))));
  $("llm-tokens").textContent = `${s.llm.proposals} proposals, ${s.llm.tokens} tokens`;
}

function optuna(s) {
  $("optuna-section").hidden = !s.optuna.length;
  fill($("optuna").tBodies[0], s.optuna.map((st) => el("tr", {},
    el("td", {}, st.name), el("td", {}, st.trials), el("td", {}, st.complete), el("td", {}, st.failed),
    el("td", {}, fmt(st.best_value)), el("td", {}, el("code", {}, JSON.stringify(st.best_params || {}))),
    el("td", {}, el("code", {}, st.command)))));
}

// -- one candidate -------------------------------------------------------------------------
async function openNode(id) {
  page.node = id;
  for (const tr of document.querySelectorAll("#lineage tr[data-id]")) tr.classList.toggle("selected", tr.dataset.id === id);
  const box = $("node");
  box.hidden = false;
  box.replaceChildren(el("p", {}, "loading " + id + " ..."));
  const params = new URLSearchParams({ id });
  const run = page.state && page.state.kind === "comparison" && page.state.selected ? page.state.selected.label : null;
  if (run) params.set("run", run);
  let data;
  try {
    const resp = await fetch("/api/node?" + params);
    data = await resp.json();
  } catch (err) {
    data = { error: "could not load " + id + ": " + err };
  }
  if (page.node !== id) return;
  box.replaceChildren(...nodeView(data));
  box.scrollIntoView({ behavior: "smooth", block: "nearest" });
}

function closeNode() {
  page.node = null;
  $("node").hidden = true;
}

function nodeView(n) {
  const close = el("button", { class: "close", title: "close", onclick: closeNode }, "\u00d7");
  if (n.error) return [close, el("p", { class: "banner error" }, n.error)];
  const ev = n.evaluation;
  const parts = [close,
    el("h3", {}, `${n.name} `, el("code", {}, n.id)),
    el("p", {}, `operator ${n.operator}, generation ${n.generation ?? "-"}, language ${n.language || "-"}; parents: `,
      n.parents.length ? n.parents.map((p, i) => [i ? ", " : "", el("a", { href: "#", onclick: (e) => { e.preventDefault(); openNode(p); } }, short(p))]) : "none (a seed)"),
  ];
  for (const notice of n.notices) parts.push(el("p", { class: "banner notice" }, notice));
  if (ev) {
    parts.push(el("p", {}, `status ${ev.status}, fitness ${fmt(ev.fitness)}, mean speedup ${fmt(ev.mean_speedup)}, ` +
      `device ${fmt(ev.device_s, 3)} s, journal line ${ev.seq} (generation ${ev.generation})`));
    parts.push(el("table", { class: "shapes" }, el("thead", {}, el("tr", {}, ["shape", "status", "ms", "reference ms", "speedup", "timing", "message"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ev.shapes.map((sh) => el("tr", {}, el("td", {}, sh.shape), el("td", {}, sh.status), el("td", {}, fmt(sh.ms)),
        el("td", {}, fmt(sh.reference_ms)), el("td", {}, fmt(sh.speedup)), el("td", {}, sh.method || "-"), el("td", {}, sh.message))))));
    if (ev.feedback) parts.push(el("details", {}, el("summary", {}, "feedback"), el("pre", {}, ev.feedback)));
    if (ev.log) parts.push(el("details", {}, el("summary", {}, "log"), el("pre", {}, ev.log)));
  } else {
    parts.push(el("p", {}, "not evaluated in this run"));
  }
  for (const d of n.diffs) {
    parts.push(el("details", { open: "", class: "diff" }, el("summary", {}, `diff against parent ${short(d.parent)} (${d.parent_name})`), diffView(d.text)));
  }
  if (Object.keys(n.params).length) {
    parts.push(el("p", {}, "parameters: ", el("code", {}, Object.entries(n.params).map(([k, v]) => `${k}=${v}`).join("  "))));
  }
  for (const [file, text] of Object.entries(n.sources)) {
    parts.push(el("details", { class: "source" }, el("summary", {}, "source " + file), el("pre", {}, text)));
  }
  for (const call of n.llm) {
    const body = [el("summary", {}, `LLM ${call.operator}: ${call.outcome} (${call.model || "?"}, ${call.tokens} tokens)`)];
    if (call.detail) body.push(el("p", {}, call.detail));
    for (const x of call.exchanges) {
      if (x.problem) { body.push(el("p", { class: "banner notice" }, `${x.key}: ${x.problem}`)); continue; }
      for (const m of x.messages) body.push(el("div", { class: "msg" }, el("div", { class: "role" }, m.role), el("pre", {}, m.content)));
      body.push(el("div", { class: "msg" }, el("div", { class: "role" }, "reply" + (x.latency_s ? ` (${x.latency_s} s)` : "")), el("pre", {}, x.reply || "(no text)")));
      for (const t of x.tool_calls) body.push(el("div", { class: "msg" }, el("div", { class: "role" }, "tool call " + t.name), el("pre", {}, t.arguments)));
    }
    parts.push(el("details", { class: "llm" }, body));
  }
  return parts;
}

function diffView(text) {
  const pre = el("pre", { class: "diff-text" });
  for (const line of text.split("\n")) {
    const cls = line.startsWith("+++") || line.startsWith("---") ? "file" : line.startsWith("@@") ? "hunk"
      : line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : null;
    pre.append(cls ? el("span", { class: cls }, line) : line + "\n");
  }
  return pre;
}

connect();
