// Conveyor dashboard: polls /v1/dashboard/state every 2 s and charts the last 10 minutes.
// Rates and windowed percentiles come from the difference between two polls.
"use strict";

const POLL_MS = 2000;
const WINDOW_S = 600;
const KEY_STORE = "conveyor.dashboard.key";
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea"];

const history = new Map(); // model name -> {t: [], values: {series: []}, charts: [], card}
let previous = null;
const jobRates = new Map(); // job id -> {t, done}
// Every chart drawn, for whoever inspects the page (the browser test reads its axes).
window.conveyorCharts = [];

function $(id) { return document.getElementById(id); }

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function sum(obj) { return Object.values(obj || {}).reduce((a, b) => a + b, 0); }

function fmt(x, digits) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  return Number(x).toFixed(digits === undefined ? 1 : digits);
}

// Prometheus-style quantile over the buckets that filled between two polls.
function quantile(now, before, q) {
  if (!now || !now.length) return null;
  const counts = now.map(([le, c], i) => [le, c - (before && before[i] ? before[i][1] : 0)]);
  const total = counts[counts.length - 1][1];
  if (total <= 0) return null;
  const rank = q * total;
  let lower = 0, below = 0;
  for (const [le, c] of counts) {
    if (c >= rank) {
      if (le === null) return lower;
      const inBucket = c - below;
      return inBucket > 0 ? lower + (le - lower) * (rank - below) / inBucket : le;
    }
    if (le !== null) lower = le;
    below = c;
  }
  return lower;
}

function rate(now, before, pick, dt) {
  if (!before || dt <= 0) return 0;
  return Math.max(0, (pick(now) - pick(before)) / dt);
}

function derive(model, before, dt) {
  const t = model.totals, h = model.histograms;
  const pb = before ? before.histograms : {};
  const ok = (m) => (m.totals.requests.ok || 0);
  const rejected = (m) => sum(m.totals.requests) - ok(m);
  const through = model.kind === "generative" ? (m) => m.totals.generated_tokens
    : model.kind === "fleet" ? (m) => sum(m.totals.requests) : (m) => m.totals.inputs;
  const batches = before ? t.batches - before.totals.batches : 0;
  const q = (key, level) => ms(quantile(h[key], pb[key], level));
  return {
    throughput: rate(model, before, through, dt),
    rejected: rate(model, before, rejected, dt),
    // Online requests and batch lines apart: a job's lines wait behind online callers.
    p50: q("latency_s", 0.5),
    p99: q("latency_s", 0.99),
    ttft: q("ttft_s", 0.5),
    tpot: q("tpot_s", 0.5),
    batch_p50: q("batch_latency_s", 0.5),
    batch_p99: q("batch_latency_s", 0.99),
    batch_ttft: q("batch_ttft_s", 0.5),
    fill: batches > 0 ? (t.batch_fill_sum - before.totals.batch_fill_sum) / batches : null,
    queue: sum(model.queue_depth),
    running: model.running,
    kv: model.kv_blocks ? model.kv_blocks.used : null,
    // The second KV tier: blocks copied back instead of recomputed, and MB/s each way.
    tier_hits: model.kv_tier ? rate(model, before, (m) => sum(m.kv_tier.hit_blocks), dt) : null,
    tier_out_mb: model.kv_tier ? rate(model, before, (m) => tierBytes(m, "device_to_host"), dt) / 1e6 : null,
    tier_in_mb: model.kv_tier ? rate(model, before, (m) => tierBytes(m, "host_to_device") + tierBytes(m, "disk_to_device"), dt) / 1e6 : null,
  };
}

function tierBytes(model, direction) { return (model.kv_tier && model.kv_tier.bytes[direction]) || 0; }

function ms(seconds) { return seconds === null ? null : seconds * 1000; }

const CHARTS = [
  { title: "throughput /s", series: ["throughput", "rejected"] },
  { title: "online latency ms", series: ["p50", "p99", "ttft", "tpot"] },
  { title: "batch-job latency ms", series: ["batch_p50", "batch_p99", "batch_ttft"] },
  { title: "queue and running", series: ["queue", "running"] },
  { title: "batch fill / KV blocks", series: ["fill", "kv"] },
  { title: "KV tier blocks/s, MB/s", series: ["tier_hits", "tier_out_mb", "tier_in_mb"], kind: "generative" },
];
const SERIES = CHARTS.flatMap((spec) => spec.series);

// A value axis as wide as its widest tick label (uPlot's default width cuts "25,000" to
// "5,000"), so every label is shown whole.
function axisWidth(plot, labels, index) {
  const axis = plot.axes[index];
  plot.ctx.font = axis.font[0];
  const widest = Math.max(0, ...(labels || []).map((label) => plot.ctx.measureText(label).width));
  return Math.ceil(axis.ticks.size + axis.gap + widest / devicePixelRatio) + 2;
}

// One chart of ``spec``'s series in ``box``.
function chart(spec, box) {
  const series = [{}].concat(spec.series.map((name, i) => ({ label: name, stroke: COLORS[i], spanGaps: true })));
  const data = [[]].concat(spec.series.map(() => []));
  const options = {
    title: spec.title, width: 330, height: 160, series, scales: { x: { time: true } },
    axes: [{}, { size: axisWidth }],
  };
  const plot = new uPlot(options, data, box);
  window.conveyorCharts.push({ title: spec.title, plot, box });
  return plot;
}

function unit(model) {
  return model.kind === "generative" ? "tokens/s" : model.kind === "fleet" ? "requests/s" : "inputs/s";
}

function card(model) {
  const entry = { t: [], values: {}, charts: [], card: el("div", { class: "model", "data-model": model.name }) };
  entry.card.append(el("h3", { class: "model-name" }, model.name));
  const stats = el("div", { class: "stats" });
  const shown = [["throughput", unit(model)], ["p50", "online p50 ms"], ["p99", "online p99 ms"],
    ["batch_p50", "batch-job p50 ms"], ["batch_p99", "batch-job p99 ms"], ["queue", "queued"],
    ["running", "running"]];
  for (const [key, label] of shown) {
    const item = el("span", {}, label + " ");
    item.append(el("b", { "data-stat": key }, "–"));
    stats.append(item);
  }
  entry.card.append(stats);
  entry.card.append(el("table", { class: "plan" }));
  const charts = el("div", { class: "charts" });
  entry.card.append(charts);
  for (const spec of CHARTS) {
    if (spec.kind && spec.kind !== model.kind) continue;
    const box = el("div", { class: "chart", "data-chart": spec.title });
    charts.append(box);
    entry.charts.push({ spec, plot: chart(spec, box) });
  }
  for (const name of SERIES) entry.values[name] = [];
  $("models").append(entry.card);
  return entry;
}

function record(entry, time, figures) {
  entry.t.push(time);
  for (const [name, list] of Object.entries(entry.values)) list.push(figures[name] ?? null);
  while (entry.t.length && entry.t[0] < time - WINDOW_S) {
    entry.t.shift();
    for (const list of Object.values(entry.values)) list.shift();
  }
  entry.card.dataset.points = String(entry.t.length);
  for (const { spec, plot } of entry.charts) {
    plot.setData([entry.t.slice()].concat(spec.series.map((name) => entry.values[name].slice())));
  }
}

function showStats(entry, model, figures) {
  const put = (key, text) => { entry.card.querySelector(`[data-stat="${key}"]`).textContent = text; };
  put("throughput", fmt(figures.throughput));
  for (const key of ["p50", "p99", "batch_p50", "batch_p99"]) put(key, fmt(figures[key]));
  put("queue", fmt(figures.queue, 0));
  put("running", fmt(figures.running, 0));
  showPlan(entry.card.querySelector("table.plan"), model, figures);
}

// Which plan this is and when it was made: calibrated (from this model's own measured
// batch times) or a preset's nominal figures, which the page says are not measured here.
function planTitle(plan) {
  const made = plan.planned_at ? new Date(plan.planned_at * 1000).toLocaleTimeString() : "?";
  const kind = plan.plan_kind === "preset" ? `${plan.source}, nominal, not measured` : `calibrated: ${plan.source}`;
  return `plan (${kind}), made ${made}`;
}

// The plan's figures beside what the model measures now (online requests).
function showPlan(node, model, figures) {
  const plan = model.plan;
  if (model.kind === "fleet") { node.hidden = true; return; }
  if (!plan || plan.error) {
    table(node, ["plan", plan ? plan.error : "not yet: waiting for measured batches"], []);
    return;
  }
  node.dataset.planKind = plan.plan_kind;
  node.dataset.plannedAt = String(plan.planned_at);
  const rows = model.kind === "generative" ? [
    ["tokens/s", fmt(plan.tokens_per_s_per_replica), "capacity per replica at batch " + plan.max_batch, fmt(figures.throughput)],
    ["p99 ms", fmt(plan.predicted_p99_ms), `at ${fmt(plan.per_replica_qps)} req/s`, fmt(figures.p99)],
    ["TTFT ms", fmt(plan.predicted_ttft_ms), "at a full batch", fmt(figures.ttft)],
    ["step ms", fmt(plan.decode_step_ms, 2), "decode at that batch", fmt(figures.tpot, 2)],
  ] : [
    ["inputs/s", fmt(plan.inputs_per_s_per_replica), "capacity per replica at batch " + plan.max_batch, fmt(figures.throughput)],
    ["p99 ms", fmt(plan.predicted_p99_ms), `at ${fmt(plan.per_replica_qps)} inputs/s`, fmt(figures.p99)],
    ["batch ms", fmt(plan.batch_ms_at_max), "at the largest batch", "–"],
  ];
  if (plan.note) rows.push(["note", plan.note, "", ""]);
  table(node, [planTitle(plan), "planned", "", "measured now (online)"], rows);
  node.dataset.source = plan.source;
}

function updateModels(state) {
  const dt = previous ? state.time - previous.time : 0;
  const before = new Map((previous ? previous.models : []).map((m) => [m.name, m]));
  for (const model of state.models) {
    const entry = history.get(model.name) || history.set(model.name, card(model)).get(model.name);
    const figures = derive(model, before.get(model.name), dt);
    if (previous) record(entry, state.time, figures);
    showStats(entry, model, figures);
  }
}

function table(node, header, rows) {
  node.replaceChildren();
  const head = el("tr");
  for (const h of header) head.append(el("th", {}, h));
  node.append(head);
  for (const row of rows) {
    const tr = el("tr");
    for (const cell of row) {
      const td = el("td");
      if (cell instanceof Node) td.append(cell); else td.textContent = cell;
      tr.append(td);
    }
    node.append(tr);
  }
}

function updateFleet(fleet) {
  $("fleet-section").hidden = !fleet;
  if (!fleet) return;
  table($("fleet-models"), ["model", "replicas", "queued", "arrivals/s", "desired replicas"],
    Object.entries(fleet.models).map(([name, m]) => [name, m.num_replicas, m.queue_depth, fmt(m.arrival_per_s), m.desired_replicas]));
  table($("workers"), ["worker", "address", "models (loaded)", "in flight", "heartbeat age s", "state"],
    fleet.workers.map((w) => [w.id, w.address, `${w.models.join(", ")} (${w.loaded_models.join(", ")})`,
      w.load.in_flight ?? w.gateway_in_flight, fmt(w.heartbeat_age_s),
      w.is_stale ? "stale" : w.is_draining ? "draining" : w.is_ejected ? "ejected" : "healthy"]));
}

function progress(fraction) {
  const bar = el("div", { class: "bar" });
  const fill = el("div");
  fill.style.width = `${Math.round(100 * fraction)}%`;
  bar.append(fill);
  return bar;
}

// A stalled job's status cell: "stalled since HH:MM:SS", the store's note as its tooltip.
function jobStatus(job) {
  if (!job.stall) return job.status;
  const since = job.stall.since ? new Date(job.stall.since * 1000).toLocaleTimeString() : "?";
  return el("span", { class: "bad", title: job.stall.message },
    `${job.status}, stalled since ${since}: ${job.stall.message}`);
}

function updateJobs(jobs, time) {
  if (!jobs) { table($("jobs"), ["batch jobs unavailable right now"], []); return; }
  table($("jobs"), ["batch", "status", "model", "progress", "lines/s", "ETA s", "failed"], jobs.map((job) => {
    const done = job.completed + job.failed;
    const last = jobRates.get(job.id);
    const perS = last && time > last.t ? (done - last.done) / (time - last.t) : null;
    jobRates.set(job.id, { t: time, done });
    const eta = perS > 0 ? (job.total - done) / perS : null;
    return [job.id, jobStatus(job), job.model || "", progress(job.total ? done / job.total : 0),
      fmt(perS), fmt(eta, 0), job.failed];
  }));
}

function updateTenants(tenants) {
  $("tenants-note").textContent = tenants.note;
  if (!tenants.available) table($("tenants"), ["usage unavailable right now"], []);
  else table($("tenants"), ["tenant", "requests", "input tokens", "output tokens", "model s", "cost $"],
    tenants.usage.map((t) => [t.tenant, t.requests, t.input_tokens, t.output_tokens,
      fmt(t.model_seconds), t.cost_usd.toFixed(4)]));
  const limits = tenants.limits || [];
  table($("limits"), ["tenant", "429s", "rpm", "input tpm", "output tpm", "budget", "month cost $ / budget $"],
    limits.map((t) => {
      const r = t.refused;
      const budget = t.budget_usd === null ? "–" : `${fmt(t.month_cost_usd, 2)} / ${fmt(t.budget_usd, 2)}`;
      return [t.tenant, t.num_refused, r.rpm || 0, r.input_tpm || 0, r.output_tpm || 0, r.monthly_budget || 0, budget];
    }));
}

function mib(bytes) { return fmt(bytes / 1048576, 1); }

function updatePulls(pulls) {
  $("pulls-section").hidden = pulls === null || pulls === undefined;
  if (!pulls) return;
  table($("pulls"), ["model", "progress", "MiB held / total", "MiB/s", "ETA s"], pulls.map((p) => {
    const perS = p.running_s > 0 ? p.held_bytes / p.running_s : null;
    const eta = perS > 0 ? (p.total_bytes - p.held_bytes) / perS : null;
    return [p.model, progress(p.progress || 0), `${mib(p.held_bytes)} / ${mib(p.total_bytes)}`,
      perS === null ? "–" : mib(perS), fmt(eta, 0)];
  }));
  if (!pulls.length) table($("pulls"), ["no model pull running"], []);
}

function render(state) {
  $("role").textContent = `${state.role} · viewing ${state.viewer.scope === "all" ? "everything" : "tenant " + state.viewer.tenant}`;
  $("updated").textContent = `updated ${new Date(state.time * 1000).toLocaleTimeString()}`;
  updateModels(state);
  updateFleet(state.fleet);
  updateJobs(state.jobs, state.time);
  updateTenants(state.tenants);
  updatePulls(state.pulls);
  previous = state;
}

async function poll() {
  const key = sessionStorage.getItem(KEY_STORE);
  const headers = key ? { Authorization: `Bearer ${key}` } : {};
  try {
    const answer = await fetch("/v1/dashboard/state", { headers, cache: "no-store" });
    if (answer.status === 401) {
      $("key-form").hidden = false;
      return;
    }
    $("key-form").hidden = true;
    if (!answer.ok) throw new Error(`state answered ${answer.status}`);
    $("error").hidden = true;
    render(await answer.json());
  } catch (error) {
    $("error").hidden = false;
    $("error").textContent = `cannot read the state: ${error.message}`;
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY_STORE, $("key-input").value);
  previous = null;
});

poll();
