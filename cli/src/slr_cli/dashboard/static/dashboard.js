// slr dashboard: plain JS, SVG charts drawn here, no libraries (the page works offline).
// Live: the API and one server-sent event stream per shown run. Exported: window.SLR_DATA.
"use strict";

const STATIC = window.SLR_DATA;
const TOKEN = new URLSearchParams(location.search).get("token");
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f"];
// metrics shown first, in this order, when a run has them; then the rest by name
const PRIORITY = [
  "reward/mean", "reward/pass_rate", "actor/entropy", "actor/kl_ref", "rollout/k3_kl",
  "actor/pg_clipfrac", "actor/clipfrac", "actor/grad_norm", "rollout/logprob_pearson",
  "rollout/logprob_abs_diff_mean", "perf/tokens_per_s", "time/step_s",
];
const state = { runs: {}, order: [], shown: [], streams: {}, trial: null, pending: false };

const $ = (id) => document.getElementById(id);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) =>
  ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const fmt = (v) => v == null || Number.isNaN(v) ? "-" :
  typeof v !== "number" ? String(v) :
  Math.abs(v) >= 1000 || Number.isInteger(v) ? String(Math.round(v * 100) / 100) :
  Math.abs(v) < 0.001 && v !== 0 ? v.toExponential(2) : v.toPrecision(4).replace(/\.?0+$/, "");

function api(path) {
  const url = path + (TOKEN ? (path.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(TOKEN) : "");
  return fetch(url).then((r) => { if (!r.ok) throw new Error(r.status + " " + path); return r.json(); });
}

// -- data ---------------------------------------------------------------------------------

function addRun(snap) {
  state.runs[snap.id] = snap;
  snap.noSignal = noSignal(snap.trials);
}

function merge(run, upd) {
  run.metrics.push(...upd.metrics);
  run.events.push(...upd.events);
  const known = new Set(run.trials.map((t) => t.id));
  for (const t of upd.trials) if (!known.has(t.id)) run.trials.push(t);
  run.offsets = upd.offsets;
  run.noSignal = noSignal(run.trials);
}

// infrastructure failures, trials without policy tokens, and every trial of a group whose
// trainable rewards are all equal (zero group-relative advantage): no gradient signal
function noSignal(trials) {
  const groups = {};
  const out = new Map();
  for (const t of trials) {
    if (t.infra) out.set(t.id, "infrastructure failure (not in the loss)");
    else if (!t.trainable) out.set(t.id, "no reward");
    else if (!t.policy_tokens) out.set(t.id, "no policy tokens");
    if (t.group != null) (groups[t.group] ||= []).push(t);
  }
  for (const members of Object.values(groups)) {
    const rewards = new Set(members.filter((t) => t.trainable).map((t) => t.reward));
    if (rewards.size <= 1) for (const t of members)
      if (!out.has(t.id)) out.set(t.id, "group without reward variance");
  }
  return out;
}

// the last event says: "finished" carries the run's status; anything after it (a resume) runs
function runStatus(run) {
  const last = run.events[run.events.length - 1];
  if (!last) return "not started";
  return last.event === "finished" ? last.status || "finished" : "running";
}

// -- charts -------------------------------------------------------------------------------

function lineChart(title, series, opts = {}) {
  const W = opts.width || 320, H = opts.height || 170, L = 48, R = 8, T = 22, B = 22;
  const pts = series.flatMap((s) => s.points);
  const n = pts.length;
  let body = "";
  if (n) {
    // every chart over the same steps (opts.steps), so they line up when scanned down
    let [x0, x1] = opts.steps || [Math.min(...pts.map((p) => p[0])), Math.max(...pts.map((p) => p[0]))];
    let [y0, y1] = [Math.min(...pts.map((p) => p[1])), Math.max(...pts.map((p) => p[1]))];
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
    const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
    const sy = (y) => H - B - (y - y0) / (y1 - y0) * (H - T - B);
    body += `<line x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}" class="axis"/>`;
    body += `<line x1="${L}" y1="${T}" x2="${L}" y2="${H - B}" class="axis"/>`;
    for (const y of [y0, (y0 + y1) / 2, y1])
      body += `<text x="${L - 4}" y="${sy(y) + 4}" class="tick" text-anchor="end">${esc(fmt(y))}</text>`;
    for (const x of [x0, x1])
      body += `<text x="${sx(x)}" y="${H - 6}" class="tick" text-anchor="middle">${esc(fmt(x))}</text>`;
    for (const s of series) {
      if (!s.points.length) continue;
      const d = s.points.map((p, i) => (i ? "L" : "M") + sx(p[0]).toFixed(1) + " " + sy(p[1]).toFixed(1)).join("");
      body += `<path d="${d}" stroke="${s.color}" class="line"/>`;
      for (const p of s.points)
        body += `<circle cx="${sx(p[0]).toFixed(1)}" cy="${sy(p[1]).toFixed(1)}" r="2.2" fill="${s.color}">` +
          `<title>${esc(s.name)} step ${p[0]}: ${fmt(p[1])}</title></circle>`;
    }
  } else body = `<text x="${W / 2}" y="${H / 2}" text-anchor="middle" class="tick">no data</text>`;
  if (series.length > 1)  // comparing runs: which colour is which
    body += series.map((s, i) => `<text x="${W - R}" y="${T + 10 + i * 11}" text-anchor="end" class="tick" ` +
      `fill="${s.color}" style="fill:${s.color}">${esc(s.name)}</text>`).join("");
  return `<figure class="chart" data-metric="${esc(title)}" data-points="${n}">` +
    `<svg viewBox="0 0 ${W} ${H}" width="${W}" height="${H}" role="img" aria-label="${esc(title)}">` +
    `<text x="${L}" y="14" class="title">${esc(title)}</text>${body}</svg></figure>`;
}

function stackedBars(title, steps, keys, value, colorOf) {
  const W = 660, H = 190, L = 48, B = 22, T = 22, R = 150;
  const totals = steps.map((s) => keys.reduce((a, k) => a + (value(s, k) || 0), 0));
  const max = Math.max(1e-9, ...totals);
  const bw = Math.min(40, Math.max(2, (W - L - R) / Math.max(steps.length, 1) - 2));
  let body = `<line x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}" class="axis"/>` +
    `<text x="${L - 4}" y="${T + 4}" class="tick" text-anchor="end">${esc(fmt(max))}</text>`;
  steps.forEach((s, i) => {
    let y = H - B;
    const x = L + i * (bw + 2);
    for (const k of keys) {
      const v = value(s, k) || 0;
      const h = v / max * (H - T - B);
      if (h > 0) body += `<rect x="${x}" y="${y - h}" width="${bw}" height="${h}" fill="${colorOf(k)}">` +
        `<title>step ${esc(s)}: ${esc(k)} ${fmt(v)}</title></rect>`;
      y -= h;
    }
    if (steps.length <= 20 || i % Math.ceil(steps.length / 20) === 0)
      body += `<text x="${x + bw / 2}" y="${H - 6}" class="tick" text-anchor="middle">${esc(s)}</text>`;
  });
  keys.forEach((k, i) => {
    body += `<rect x="${W - R + 10}" y="${T + i * 16}" width="10" height="10" fill="${colorOf(k)}"/>` +
      `<text x="${W - R + 24}" y="${T + i * 16 + 9}" class="tick">${esc(k)}</text>`;
  });
  return `<figure class="chart wide" data-chart="${esc(title)}"><svg viewBox="0 0 ${W} ${Math.max(H, T + keys.length * 16)}" ` +
    `width="${W}" height="${Math.max(H, T + keys.length * 16)}"><text x="${L}" y="14" class="title">${esc(title)}</text>${body}</svg></figure>`;
}

const TERM_COLORS = {
  completed: "#16a34a", agent_timeout: "#f59e0b", agent_error: "#ef4444", context_overflow: "#a855f7",
  verifier_timeout: "#fb923c", verifier_error: "#6b7280", sandbox_error: "#4b5563",
  engine_error: "#374151", broken_task: "#9ca3af", worker_lost: "#d1d5db",
};

// -- panels -------------------------------------------------------------------------------

function primary() { return state.runs[state.shown[0]]; }

function renderRuns() {
  $("runs").innerHTML = state.order.map((id, i) =>
    `<label class="run"><input type="checkbox" data-run="${esc(id)}" ${state.shown.includes(id) ? "checked" : ""}>` +
    `<span class="swatch" style="background:${COLORS[i % COLORS.length]}"></span>${esc(id)}</label>`).join("");
  for (const box of $("runs").querySelectorAll("input")) box.onchange = () => toggleRun(box.dataset.run, box.checked);
}

function renderOverview() {
  const run = primary();
  if (!run) { $("overview-body").innerHTML = "<p class='hint'>No run selected.</p>"; return; }
  const last = run.metrics[run.metrics.length - 1] || {};
  const trainable = run.trials.filter((t) => t.trainable);
  const rewards = trainable.map((t) => t.reward).filter((r) => r != null);
  const ev = run.events[run.events.length - 1];
  const facts = [
    ["run", run.id], ["status", runStatus(run)], ["step", last.step ?? 0],
    ["steps planned", run.config.run?.steps], ["mode", run.config.run?.mode],
    ["trials", run.trials.length], ["trainable", trainable.length],
    ["reward mean (trainable trials)", rewards.length ? fmt(rewards.reduce((a, b) => a + b, 0) / rewards.length) : "-"],
    ["no gradient signal", run.noSignal.size], ["last complete checkpoint", run.latest_checkpoint],
    ["last event", ev ? `${ev.event} at ${ev.time}` : "-"], ["path", run.path],
  ];
  if (run.unreadable_trials?.length)
    facts.push(["unreadable trial records", run.unreadable_trials.join(", ")]);
  const plugins = run.plugins.map((p) =>
    `<tr><td>${esc(p.role)}</td><td>${esc(p.name)}</td><td>${esc(p.distribution ?? "-")}</td><td>${esc(p.version ?? "-")}</td></tr>`).join("");
  $("overview-body").innerHTML =
    `<table class="facts" id="facts">${facts.map(([k, v]) => `<tr><th>${esc(k)}</th><td data-fact="${esc(k)}">${esc(v ?? "-")}</td></tr>`).join("")}</table>` +
    `<table class="list"><caption>plugins (distribution and version installed where the dashboard runs)</caption>` +
    `<tr><th>role</th><th>name</th><th>distribution</th><th>version</th></tr>${plugins}</table>` +
    `<details><summary>resolved config</summary><pre>${esc(run.config_text)}</pre></details>` +
    `<details><summary>events (${run.events.length})</summary><pre>${esc(run.events.map((e) => JSON.stringify(e)).join("\n"))}</pre></details>`;
}

function metricNames() {
  const names = new Set();
  for (const id of state.shown) for (const m of state.runs[id].metrics)
    for (const k of Object.keys(m)) if (k !== "step" && typeof m[k] === "number") names.add(k);
  const first = PRIORITY.filter((k) => names.has(k));
  return first.concat([...names].filter((k) => !first.includes(k)).sort());
}

function renderCurves() {
  const filter = $("metric-filter").value.trim();
  let re = null;
  try { re = filter ? new RegExp(filter, "i") : null; } catch { re = null; }
  const steps = state.shown.flatMap((id) => state.runs[id].metrics.map((m) => m.step)).filter((s) => s != null);
  const range = steps.length ? [Math.min(...steps), Math.max(...steps)] : undefined;
  const charts = metricNames().filter((k) => !re || re.test(k)).map((k) => lineChart(k, state.shown.map((id) => ({
    name: id, color: COLORS[state.order.indexOf(id) % COLORS.length],
    points: state.runs[id].metrics.filter((m) => typeof m[k] === "number" && m.step != null).map((m) => [m.step, m[k]]),
  })), { steps: range }));
  $("charts").innerHTML = charts.join("") || "<p class='hint'>No metrics yet: metrics.jsonl gets a line per optimizer step.</p>";
  const run = primary();
  const split = run ? [...new Set(run.metrics.flatMap((m) => Object.keys(m)))]
    .filter((k) => k.startsWith("time/") && k !== "time/step_s").sort() : [];
  $("timesplit").innerHTML = split.length ? stackedBars("step time split, seconds (" + run.id + ")",
    run.metrics.map((m) => m.step), split, (s, k) => run.metrics.find((m) => m.step === s)?.[k],
    (k) => COLORS[split.indexOf(k) % COLORS.length]) : "";
}

function renderOutcomes() {
  const run = primary();
  if (!run) { $("outcomes-body").innerHTML = ""; return; }
  const steps = [...new Set(run.trials.map((t) => t.step ?? "-"))];
  const terms = [...new Set(run.trials.map((t) => t.termination))].sort();
  const count = (s, k) => run.trials.filter((t) => (t.step ?? "-") === s && t.termination === k).length;
  const reasons = {};
  for (const why of run.noSignal.values()) reasons[why] = (reasons[why] || 0) + 1;
  const rows = terms.map((k) => `<tr><td><span class="swatch" style="background:${TERM_COLORS[k] || "#999"}"></span>${esc(k)}</td>` +
    `<td>${run.trials.filter((t) => t.termination === k).length}</td>` +
    `<td>${run.trials.some((t) => t.termination === k && t.infra) ? "infrastructure (not in the loss)" : "policy"}</td></tr>`).join("");
  $("outcomes-body").innerHTML =
    (steps.length ? stackedBars("trials per step by termination", steps, terms, count, (k) => TERM_COLORS[k] || "#999") : "") +
    `<table class="list" id="terminations"><tr><th>termination</th><th>trials</th><th>counts as</th></tr>${rows}</table>` +
    `<h3>no gradient signal: ${run.noSignal.size} of ${run.trials.length} trials</h3>` +
    `<ul id="no-signal">${Object.entries(reasons).map(([w, n]) => `<li>${esc(w)}: ${n}</li>`).join("")}</ul>` +
    `<p class="hint">Type <code>no signal</code> in the trial filter to list them.</p>`;
}

function renderGrid() {
  const run = primary();
  if (!run || !run.trials.length) { $("grid").innerHTML = "<p class='hint'>No trials recorded yet.</p>"; return; }
  const tasks = [...new Set(run.trials.map((t) => t.task))].sort();
  const steps = [...new Set(run.trials.map((t) => t.step ?? -1))].sort((a, b) => a - b);
  const cells = {};
  for (const t of run.trials) ((cells[t.task + "\u0000" + (t.step ?? -1)]) ||= []).push(t);
  let html = `<table class="grid" id="task-grid"><tr><th>task \\ step</th>${steps.map((s) => `<th>${s < 0 ? "-" : s}</th>`).join("")}</tr>`;
  for (const task of tasks) {
    html += `<tr><th class="task">${esc(task)}</th>`;
    for (const s of steps) {
      const ts = cells[task + "\u0000" + s] || [];
      if (!ts.length) { html += "<td></td>"; continue; }
      const infra = ts.filter((t) => t.infra).length;
      const scored = ts.filter((t) => !t.infra && t.reward != null).length;
      const solved = ts.filter((t) => !t.infra && t.reward != null && t.reward > 0).length;
      const cls = scored === 0 ? (infra ? "infra" : "unscored") :
        solved === scored ? "solved" : solved === 0 ? "failed" : "mixed";
      html += `<td class="cell ${cls}" data-task="${esc(task)}" data-step="${s}" title="${esc(task)} step ${s}: ` +
        `${solved} solved, ${scored - solved} failed, ${infra} infra, ${ts.length - scored - infra} without reward">` +
        `${solved}/${scored}${infra ? "+" + infra : ""}</td>`;
    }
    html += "</tr>";
  }
  $("grid").innerHTML = html + "</table><p class='legend'><span class='cell solved'>solved</span> " +
    "<span class='cell mixed'>some solved</span> <span class='cell failed'>failed</span> <span class='cell infra'>infra only</span> <span class='cell unscored'>no reward (served)</span>" +
    " &nbsp;cells: solved/scored(+infrastructure failures); click one to list its trials</p>";
  for (const td of $("grid").querySelectorAll("td.cell[data-task]"))
    td.onclick = () => { $("trial-filter").value = td.dataset.task; renderTrials(); location.hash = "#trials"; };
}

function renderTrials() {
  const run = primary();
  if (!run) { $("trial-list").innerHTML = ""; return; }
  const q = $("trial-filter").value.trim().toLowerCase();
  const rows = run.trials.filter((t) => !q || (q === "no signal" ? run.noSignal.has(t.id) :
    [t.id, t.task, t.termination, t.group].some((v) => String(v ?? "").toLowerCase().includes(q))));
  $("trial-list").innerHTML = `<table class="list" id="trial-table"><tr><th>trial</th><th>task</th><th>step</th><th>group</th>` +
    `<th>reward</th><th>termination</th><th>policy tokens</th><th>calls</th><th>segments</th><th>seconds</th><th>signal</th></tr>` +
    rows.slice(-500).map((t) => `<tr class="trial ${t.infra ? "infra" : ""}" data-trial="${esc(t.id)}"><td>${esc(t.id)}</td><td>${esc(t.task)}</td>` +
      `<td>${esc(t.step ?? "-")}</td><td>${esc(t.group ?? "-")}</td><td>${fmt(t.reward)}</td><td>${esc(t.termination)}</td>` +
      `<td>${t.policy_tokens}</td><td>${t.calls}</td><td>${t.segments}</td><td>${fmt(t.seconds)}</td>` +
      `<td>${run.noSignal.has(t.id) ? esc(run.noSignal.get(t.id)) : "yes"}</td></tr>`).join("") + "</table>" +
    (rows.length > 500 ? `<p class="hint">showing the last 500 of ${rows.length}</p>` : "");
  for (const tr of $("trial-list").querySelectorAll("tr.trial")) tr.onclick = () => openTrial(run.id, tr.dataset.trial);
}

// -- trajectory viewer --------------------------------------------------------------------

// probability of the sampled token -> colour: red (unlikely) through yellow to green (sure)
function lpColor(lp) {
  if (lp == null) return "#e5e7eb";
  const p = Math.max(0, Math.min(1, Math.exp(lp)));
  return `hsl(${Math.round(p * 120)}, 75%, ${Math.round(80 - p * 15)}%)`;
}

function tokenText(seg, i) {
  const t = seg.text ? seg.text[i] : null;
  if (t == null) return "⟨" + seg.ids[i] + "⟩";
  return t === "" ? "⟨" + seg.ids[i] + "⟩" : t;
}

function renderSegment(seg, limit) {
  let html = `<div class="segment" data-segment="${seg.index}"><h4>segment ${seg.index}` +
    (seg.parent != null ? ` — ${esc(seg.branch || "branch")} of segment ${seg.parent} at token ${seg.branch_at}` : " — root") +
    ` · ${seg.ids.length} tokens, ${seg.mask.reduce((a, b) => a + b, 0)} policy</h4><div class="tokens">`;
  let version = undefined;
  const n = Math.min(seg.ids.length, limit);
  for (let i = 0; i < n; i++) {
    if (seg.mask[i] && seg.versions[i] !== version) {
      version = seg.versions[i];
      html += `<span class="version" title="weights version ${esc(version)} from here">v${esc(version)}</span>`;
    }
    if (seg.parent != null && i === seg.branch_at && i > 0) html += `<span class="branch" title="this segment diverges from its parent here">↳</span>`;
    const pol = seg.mask[i] === 1;
    const lp = seg.logprobs[i];
    const tip = `id ${seg.ids[i]} · ${pol ? "policy token (loss mask 1)" : "context (mask 0)"}` +
      (pol ? ` · logprob ${fmt(lp)} · p ${fmt(lp == null ? null : Math.exp(lp))} · weights v${seg.versions[i]}` : "");
    html += `<span class="tok ${pol ? "pol" : "ctx"}" data-mask="${seg.mask[i]}" data-id="${seg.ids[i]}"` +
      (pol ? ` data-logprob="${lp}" style="background:${lpColor(lp)}"` : "") +
      ` title="${esc(tip)}">${esc(tokenText(seg, i))}</span>`;
  }
  if (n < seg.ids.length) html += `<button class="more" data-segment="${seg.index}">show all ${seg.ids.length} tokens</button>`;
  return html + "</div></div>";
}

function renderTrial(detail) {
  const calls = detail.calls.map((c) => `<div class="call"><h4>call ${esc(c.call)} · segment ${esc(c.segment)} (${esc(c.mode)})` +
    ` · weights v${esc(c.weights_versions ? c.weights_versions.join("→") : c.weights_version)} · ${esc(c.finish_reason)}` +
    ` · ${esc(c.prompt_tokens)} prompt + ${esc(c.completion_tokens)} completion tokens · ${fmt(c.seconds)} s</h4>` +
    `<details><summary>prompt added (${esc(c.new_prompt_tokens)} tokens)</summary><pre>${esc(c.new_prompt_text)}</pre></details>` +
    `<pre class="completion">${esc(c.completion_text)}</pre>` +
    (c.tool_calls?.length ? `<ul class="toolcalls">${c.tool_calls.map((t) => `<li><b>${esc(t.name)}</b> <code>${esc(JSON.stringify(t.arguments))}</code></li>`).join("")}</ul>` : "") +
    "</div>").join("");
  const verifier = Object.entries(detail.logs).filter(([k]) => k.startsWith("verifier"));
  const other = Object.entries(detail.logs).filter(([k]) => !k.startsWith("verifier"));
  const logBlock = ([k, v]) => `<details><summary>${esc(k)}</summary><pre>${esc(v)}</pre></details>`;
  $("viewer").innerHTML =
    `<h3 id="trial-title">${esc(detail.id)}</h3><table class="facts">` +
    [["task", detail.task], ["step", detail.step], ["group", detail.group], ["reward", fmt(detail.reward)],
     ["termination", detail.termination], ["agent", `${detail.agent ?? "-"} ${detail.agent_version ?? ""}`],
     ["weights version", detail.weights_version], ["error", detail.error]]
      .map(([k, v]) => `<tr><th>${esc(k)}</th><td>${esc(v ?? "-")}</td></tr>`).join("") + "</table>" +
    `<h4>verifier</h4><pre>${esc(JSON.stringify(detail.reward_details, null, 2))}</pre>${verifier.map(logBlock).join("")}` +
    (other.length ? `<h4>logs</h4>${other.map(logBlock).join("")}` : "") +
    `<h4>turns (${detail.calls.length} model calls)</h4>${calls || "<p class='hint'>No proxy transcript (a model-free agent, or none was written).</p>"}` +
    `<h4>tokens</h4><p class="legend">policy tokens (loss mask 1) coloured by the probability the policy gave them: ` +
    `<span class="tok pol" style="background:${lpColor(Math.log(0.05))}">p≈0.05</span> <span class="tok pol" style="background:${lpColor(Math.log(0.5))}">p≈0.5</span> ` +
    `<span class="tok pol" style="background:${lpColor(0)}">p≈1</span>; <span class="tok ctx">context (mask 0)</span>; ` +
    `<span class="version">vN</span> weights version; <span class="branch">↳</span> where a segment leaves its parent.` +
    (detail.decoded ? "" : " Token text needs a tokenizer: <code>slr dashboard --tokenizer MODEL_DIR</code>.") + "</p>" +
    (detail.segments.map((s) => renderSegment(s, 4000)).join("") || "<p class='hint'>No trajectory recorded.</p>");
  for (const b of $("viewer").querySelectorAll("button.more"))
    b.onclick = () => { b.parentElement.parentElement.outerHTML = renderSegment(detail.segments[+b.dataset.segment], Infinity); };
}

async function openTrial(runId, trialId) {
  state.trial = [runId, trialId];
  let detail = null;
  if (STATIC) detail = STATIC.trials?.[runId]?.[trialId];
  else detail = await api(`/api/runs/${encodeURIComponent(runId)}/trials/${encodeURIComponent(trialId)}`);
  if (!detail) { $("viewer").innerHTML = `<p class="hint">${esc(trialId)}: not in this export.</p>`; return; }
  renderTrial(detail);
  location.hash = "#trajectory";
}

// -- live ---------------------------------------------------------------------------------

function renderAll() {
  state.pending = false;
  renderRuns(); renderOverview(); renderCurves(); renderOutcomes(); renderGrid(); renderTrials();
}
function schedule() { if (!state.pending) { state.pending = true; requestAnimationFrame(renderAll); } }

function follow(id) {
  if (STATIC || state.streams[id]) return;
  const o = state.runs[id].offsets;
  let url = `/api/runs/${encodeURIComponent(id)}/stream?metrics=${o.metrics}&events=${o.events}`;
  if (TOKEN) url += "&token=" + encodeURIComponent(TOKEN);
  const es = new EventSource(url);
  state.streams[id] = es;
  es.addEventListener("update", (e) => { merge(state.runs[id], JSON.parse(e.data)); setLive("live"); schedule(); });
  es.onerror = () => {
    setLive("reconnecting");
    es.close(); delete state.streams[id];
    // reconnect from the offsets merged so far: nothing is read twice or missed
    setTimeout(() => { if (state.shown.includes(id)) follow(id); }, 2000);
  };
}

function setLive(text) { const b = $("live"); b.textContent = text; b.dataset.state = text; }

async function toggleRun(id, on) {
  if (on && !state.shown.includes(id)) {
    if (!state.runs[id]) addRun(await api(`/api/runs/${encodeURIComponent(id)}`));
    state.shown.push(id); follow(id);
  } else if (!on) {
    state.shown = state.shown.filter((x) => x !== id);
    state.streams[id]?.close(); delete state.streams[id];
  }
  schedule();
}

async function main() {
  $("metric-filter").oninput = renderCurves;
  $("trial-filter").oninput = renderTrials;
  if (STATIC) {
    for (const snap of STATIC.runs) addRun(snap);
    state.order = STATIC.runs.map((r) => r.id);
    state.shown = state.order.slice(0, 1);
    setLive("static export");
  } else {
    state.order = await api("/api/runs");
    const wanted = new URLSearchParams(location.search).getAll("run").filter((r) => state.order.includes(r));
    for (const id of wanted.length ? wanted : state.order.slice(-1)) await toggleRun(id, true);
    setLive("live");
    // runs started after the page opened join the list (the newest is shown if none is)
    setInterval(async () => {
      const ids = await api("/api/runs").catch(() => state.order);
      if (ids.join("\n") === state.order.join("\n")) return;
      state.order = ids;
      if (!state.shown.length && ids.length) await toggleRun(ids[ids.length - 1], true);
      schedule();
    }, 5000);
  }
  renderAll();
}

main().catch((err) => { setLive("error"); $("overview-body").textContent = String(err); });
