// The run explorer's page (rlbench.explorer.render embeds this file): reads the run's data from the
// <script id="run-data"> element and builds the page. Every text from the data goes into a text node
// (textContent), never into markup. window.runPage is the page's handle for tests and benchmarks.
(function () {
  "use strict";
  const T0 = performance.now();
  const data = JSON.parse(document.getElementById("run-data").textContent);
  const run = data.run || {};
  const turns = data.turns || [];
  const subs = data.submissions || [];
  const ROW = 22;
  const MARGIN = {left: 72, right: 100};
  const OK_STATUS = new Set(["scored", "cached"]);
  const BAD_STATUS = new Set(["refused", "failed", "error", "rejected", "timeout"]);
  const state = {selectedTurn: null, selectedSub: null, filtered: [], position: new Map(), hay: null};
  const api = {ready: false, firstScreenMs: null, filtered: [], selectTurn, selectSubmission, scrollToTurn};
  window.runPage = api;

  // -- helpers -------------------------------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "class") node.className = value;
      else if (key === "data") for (const [k, v] of Object.entries(value)) node.dataset[k] = String(v);
      else node.setAttribute(key, String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.appendChild(typeof child === "object" ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  const isNum = (v) => typeof v === "number" && isFinite(v);
  function fmtT(s) {
    if (!isNum(s)) return "–";
    if (Math.abs(s) < 60) return s.toFixed(1) + " s";
    const sign = s < 0 ? "-" : "", a = Math.abs(Math.round(s));
    const h = Math.floor(a / 3600), m = Math.floor((a % 3600) / 60), sec = a % 60;
    const two = (n) => String(n).padStart(2, "0");
    return sign + (h ? `${h}:${two(m)}:${two(sec)}` : `${m}:${two(sec)}`);
  }
  function fmtNum(v, digits) {
    if (!isNum(v)) return v === null || v === undefined ? "–" : String(v);
    return Number.isInteger(v) ? String(v) : v.toFixed(digits === undefined ? 3 : digits);
  }
  function fmtCount(v) {
    if (!isNum(v)) return "–";
    if (Math.abs(v) >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (Math.abs(v) >= 1e4) return Math.round(v / 1e3) + "k";
    return String(Math.round(v));
  }
  // a time axis tick, in the unit of the step between ticks: "30 s", "15 min", "2 h", "1.5 h"
  function fmtTick(t, step) {
    const [unit, size] = step >= 3600 ? ["h", 3600] : step >= 60 ? ["min", 60] : ["s", 1];
    const v = t / size;
    return (Math.abs(v - Math.round(v)) < 1e-9 ? String(Math.round(v)) : String(Number(v.toFixed(2)))) + " " + unit;
  }
  function fmtBytes(v) {
    if (!isNum(v)) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
    return (i ? v.toFixed(1) : String(v)) + " " + units[i];
  }
  const statusClass = (s) => OK_STATUS.has(s) ? "status-ok" : BAD_STATUS.has(s) ? "status-bad" : "status-other";
  const statusColour = (s) => OK_STATUS.has(s) ? "#0072B2" : BAD_STATUS.has(s) ? "#D55E00" : "#888888";
  const turnBad = (t) => t.ok === false || (t.messages || []).some((m) => m.error === true);
  function short(value) {
    if (value === null || value === undefined) return "–";
    if (typeof value === "object") return JSON.stringify(value);
    return String(value);
  }

  // -- header, verdicts, what is missing -------------------------------------------------------------
  function header() {
    document.getElementById("title").textContent = data.title || "run";
    const fields = [];
    const add = (name, value) => { if (value !== null && value !== undefined && value !== "") fields.push([name, value]); };
    const labels = run.labels && typeof run.labels === "object" ? run.labels : {};
    const own = Object.entries(labels).filter(([k, v]) => v !== null && v !== undefined && v !== "");
    if (own.length) add("labels", own.map(([k, v]) => `${k}=${short(v)}`).join(", "));
    add("status", run.status);
    add("exit code", run.exit_code);
    add("budget", isNum(run.budget_s) ? fmtT(run.budget_s) : null);
    add("duration", isNum(run.duration_s) ? fmtT(run.duration_s) : null);
    add("mode", run.mode);
    add("scaffold", run.scaffold);
    add("driver", run.driver);
    if (run.tokens && typeof run.tokens === "object") add("tokens", Object.entries(run.tokens).map(([k, v]) => `${k} ${v}`).join(", "));
    if (data.final) {
      add("final score", fmtNum(data.final.score));
      add("baseline", fmtNum(data.final.baseline_score));
      add("Δ", fmtNum(data.final.delta));
      add("metric", data.final.primary_metric);
    }
    if (data.summary) {
      add("best", fmtNum(data.summary.best));
      add("summary Δ", fmtNum(data.summary.delta));
      add("route", data.summary.route);
      add("failure type", data.summary.failure_type);
    }
    add("submissions", subs.length);
    add("turns", turns.length);
    if (run.error) add("error", run.error);
    const box = document.getElementById("header");
    for (const [name, value] of fields) box.appendChild(el("span", {}, el("b", {}, name + ": "), short(value)));

    const verdicts = document.getElementById("verdicts");
    const v = data.verdicts || {};
    const line = (prefix, integrity, audit) => {
      const row = el("div", {}, el("b", {}, prefix + "integrity: "));
      if (integrity && typeof integrity === "object") {
        const status = integrity.status || "unknown";
        row.appendChild(el("span", {class: status === "clean" ? "verdict-clean" : status === "flagged" ? "verdict-flagged" : "verdict-unknown"},
          integrity.label || status));
        const reasons = [].concat(integrity.reasons || [], integrity.incomplete || []);
        if (reasons.length) row.appendChild(document.createTextNode(" (" + reasons.map(short).join("; ") + ")"));
      } else row.appendChild(el("span", {class: "verdict-unknown"}, "not audited"));
      row.appendChild(el("b", {}, " · mode audit: "));
      if (audit && typeof audit === "object") {
        row.appendChild(el("span", {class: audit.violation ? "verdict-flagged" : "verdict-clean"},
          `${audit.mode || "?"}: ${audit.violation ? "MODE VIOLATION" : "no violation"}`));
        if (audit.violation && audit.evidence) row.appendChild(document.createTextNode(" (" + short(audit.evidence) + ")"));
      } else row.appendChild(el("span", {class: "verdict-unknown"}, "none"));
      return row;
    };
    if (v.members && Object.keys(v.members).length) {
      for (const [task, member] of Object.entries(v.members)) verdicts.appendChild(line(task + " · ", member.integrity, member.mode_audit));
    } else verdicts.appendChild(line("", v.integrity, v.mode_audit));
    if ((data.missing || []).length) {
      document.getElementById("missing").textContent = "not recorded for this run: " + data.missing.join(", ");
    }
  }

  // -- the time axis -------------------------------------------------------------------------------
  function horizon() {
    let end = 1;
    for (const v of [run.budget_s, run.duration_s]) if (isNum(v)) end = Math.max(end, v);
    for (const c of data.cuts || []) if (isNum(c.t)) end = Math.max(end, c.t);
    if (turns.length && isNum(turns[turns.length - 1].t)) end = Math.max(end, turns[turns.length - 1].t);
    for (const s of subs) if (isNum(s.t)) end = Math.max(end, s.t);
    const r = data.resources;
    if (r && r.t && r.t.length) end = Math.max(end, r.t[r.t.length - 1]);
    return end * 1.02;
  }
  const END = horizon();
  function niceStep(span, target) {
    const raw = span / target, power = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5, 10]) if (m * power >= raw) return m * power;
    return 10 * power;
  }
  function timeStep(span) {
    const steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
    return steps.find((s) => span / s <= 10) || niceStep(span, 8);
  }
  function setup(canvas) {
    const dpr = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || 800, height = canvas.clientHeight || 150;
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.font = "11px system-ui, sans-serif";
    return {ctx, width, height, x: (t) => MARGIN.left + (t / END) * (width - MARGIN.left - MARGIN.right)};
  }
  function timeGrid(g, top, bottom, labels) {
    const {ctx} = g;
    const step = timeStep(END);
    ctx.strokeStyle = "#eeeeee";
    ctx.fillStyle = "#666666";
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    for (let t = 0; t <= END; t += step) {
      const x = Math.round(g.x(t)) + 0.5;
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, bottom); ctx.stroke();
      if (labels) ctx.fillText(fmtTick(t, step), x, bottom + 3);
    }
  }

  // -- the timeline: turns, submissions, budget and cuts ------------------------------------------
  const timeline = {g: null, band: null, scoreY: null, marks: []};
  function scoreRange() {
    const values = subs.map((s) => s.score).filter(isNum);
    const base = data.final && isNum(data.final.baseline_score) ? data.final.baseline_score
      : data.summary && isNum(data.summary.baseline) ? data.summary.baseline : null;
    if (base !== null) values.push(base);
    if (!values.length) return {lo: 0, hi: 1, base};
    let lo = Math.min(...values), hi = Math.max(...values);
    if (hi - lo < 1e-9) { lo -= 1; hi += 1; }
    const pad = (hi - lo) * 0.1;
    return {lo: lo - pad, hi: hi + pad, base};
  }
  function drawTimeline() {
    const canvas = document.getElementById("timeline");
    const g = setup(canvas);
    const {ctx, width, height} = g;
    const top = 16, bandH = 22, bottom = height - 20, band = {top: bottom - bandH, bottom};
    const plotBottom = band.top - 6;
    const range = scoreRange();
    const y = (v) => plotBottom - ((v - range.lo) / (range.hi - range.lo)) * (plotBottom - top);
    timeline.g = g; timeline.band = band; timeline.scoreY = y; timeline.marks = [];
    timeGrid(g, top, bottom, true);
    // score axis
    ctx.strokeStyle = "#999999"; ctx.fillStyle = "#444444"; ctx.textAlign = "right"; ctx.textBaseline = "middle";
    ctx.beginPath(); ctx.moveTo(MARGIN.left - 0.5, top); ctx.lineTo(MARGIN.left - 0.5, plotBottom); ctx.stroke();
    const step = niceStep(range.hi - range.lo, 4);
    for (let v = Math.ceil(range.lo / step) * step; v <= range.hi; v += step) {
      ctx.fillText(fmtNum(Number(v.toFixed(6)), 2), MARGIN.left - 5, y(v));
    }
    ctx.save(); ctx.translate(12, (top + plotBottom) / 2); ctx.rotate(-Math.PI / 2); ctx.textAlign = "center";
    ctx.fillText("score", 0, 0); ctx.restore();
    if (range.base !== null) {
      ctx.strokeStyle = "#777777"; ctx.setLineDash([2, 3]);
      ctx.beginPath(); ctx.moveTo(MARGIN.left, y(range.base)); ctx.lineTo(width - MARGIN.right, y(range.base)); ctx.stroke();
      ctx.setLineDash([]); ctx.textAlign = "left"; ctx.fillStyle = "#555555";
      ctx.fillText("baseline", width - MARGIN.right + 4, y(range.base));
    }
    // turns: one tick per pixel column (red where any turn there failed)
    ctx.fillStyle = "#555555"; ctx.textAlign = "right"; ctx.textBaseline = "middle";
    ctx.fillText(turns.length && turns[0].kind === "log" ? "log" : "turns", MARGIN.left - 5, (band.top + band.bottom) / 2);
    const columns = new Map();
    for (const t of turns) {
      if (!isNum(t.t)) continue;
      const x = Math.round(g.x(t.t));
      const bad = turnBad(t);
      const seen = columns.get(x);
      if (seen === undefined || (bad && !seen)) columns.set(x, bad);
    }
    for (const [x, bad] of columns) {
      ctx.fillStyle = bad ? "#D55E00" : "#9aa5b1";
      ctx.fillRect(x, band.top, 1, bad ? bandH : bandH - 6);
    }
    // budget and cuts
    for (const cut of data.cuts || []) {
      if (!isNum(cut.t)) continue;
      const x = Math.round(g.x(cut.t)) + 0.5;
      ctx.strokeStyle = cut.kind === "budget" ? "#E69F00" : cut.kind === "end" ? "#444444" : "#c62828";
      ctx.setLineDash(cut.kind === "budget" ? [5, 4] : []);
      ctx.lineWidth = 1.5;
      ctx.beginPath(); ctx.moveTo(x, top - 4); ctx.lineTo(x, bottom); ctx.stroke();
      ctx.setLineDash([]); ctx.lineWidth = 1;
      // the budget's label left of its line, what ended the run right of its own
      ctx.fillStyle = ctx.strokeStyle; ctx.textAlign = cut.kind === "budget" ? "right" : "left"; ctx.textBaseline = "top";
      ctx.fillText(cut.kind, x + (cut.kind === "budget" ? -3 : 3), 2);
    }
    // the score's path over the scored submissions, then the markers
    ctx.strokeStyle = "rgba(0,114,178,0.35)"; ctx.beginPath();
    let started = false;
    for (const s of subs) {
      if (!isNum(s.t) || !isNum(s.score) || !OK_STATUS.has(s.status)) continue;
      const px = g.x(s.t), py = y(s.score);
      if (started) ctx.lineTo(px, py); else { ctx.moveTo(px, py); started = true; }
    }
    ctx.stroke();
    for (const s of subs) {
      if (!isNum(s.t)) continue;
      const px = g.x(s.t), py = isNum(s.score) ? y(s.score) : plotBottom;
      timeline.marks.push({x: px, y: py, sub: s});
      ctx.beginPath(); ctx.arc(px, py, 5, 0, 2 * Math.PI);
      ctx.fillStyle = statusColour(s.status);
      if (isNum(s.score)) ctx.fill(); else { ctx.strokeStyle = ctx.fillStyle; ctx.lineWidth = 2; ctx.stroke(); ctx.lineWidth = 1; }
      if (state.selectedSub !== null && String(s.id) === String(state.selectedSub)) {
        ctx.strokeStyle = "#000000"; ctx.lineWidth = 2; ctx.beginPath(); ctx.arc(px, py, 8, 0, 2 * Math.PI); ctx.stroke(); ctx.lineWidth = 1;
      }
    }
    if (state.selectedTurn !== null) {
      const t = turns.find((u) => u.i === state.selectedTurn);
      if (t && isNum(t.t)) {
        ctx.strokeStyle = "#0b4f7c"; ctx.lineWidth = 2;
        const x = Math.round(g.x(t.t)) + 0.5;
        ctx.beginPath(); ctx.moveTo(x, band.top - 4); ctx.lineTo(x, band.bottom); ctx.stroke(); ctx.lineWidth = 1;
      }
    }
  }
  // Turns in time order (by index into `turns`) for the nearest-turn lookup.
  const timed = turns.map((t, k) => k).filter((k) => isNum(turns[k].t)).sort((a, b) => turns[a].t - turns[b].t);
  function nearestTurn(px) {
    const g = timeline.g;
    if (!g || !timed.length) return null;
    const t = ((px - MARGIN.left) / (g.width - MARGIN.left - MARGIN.right)) * END;
    let lo = 0, hi = timed.length - 1;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (turns[timed[mid]].t < t) lo = mid + 1; else hi = mid; }
    let best = timed[lo];
    if (lo > 0 && Math.abs(turns[timed[lo - 1]].t - t) < Math.abs(turns[best].t - t)) best = timed[lo - 1];
    return Math.abs(g.x(turns[best].t) - px) <= 6 ? turns[best] : null;
  }
  function hit(event) {
    const canvas = document.getElementById("timeline");
    const rect = canvas.getBoundingClientRect();
    const px = event.clientX - rect.left, py = event.clientY - rect.top;
    let found = null, distance = 9;
    for (const mark of timeline.marks) {
      const d = Math.hypot(mark.x - px, mark.y - py);
      if (d < distance) { distance = d; found = mark.sub; }
    }
    if (found) return {sub: found, px, py};
    const turn = nearestTurn(px);
    return turn ? {turn, px, py} : {px, py};
  }
  function describeSub(s) {
    const lines = [`submission ${s.id} at ${fmtT(s.t)}: ${s.status}`, `score ${fmtNum(s.score)} (improvement ${fmtNum(s.improvement)})`];
    if (s.task) lines.push(`task ${s.task}`);
    if (s.reason) lines.push(`reason: ${s.reason}`);
    if (s.error) lines.push(`error: ${String(s.error).slice(0, 300)}`);
    return lines.join("\n");
  }
  function describeTurn(t) {
    return `turn ${t.i} at ${fmtT(t.t)}${t.t_exact === false ? " (approx.)" : ""}${t.ok === false ? " · failed" : ""}\n${t.label}`;
  }
  function wireTimeline() {
    const canvas = document.getElementById("timeline");
    const tip = document.getElementById("tooltip");
    canvas.addEventListener("mousemove", (event) => {
      const found = hit(event);
      if (!found.sub && !found.turn) { tip.hidden = true; return; }
      tip.textContent = found.sub ? describeSub(found.sub) : describeTurn(found.turn);
      tip.hidden = false;
      tip.style.left = Math.min(found.px + 12, canvas.clientWidth - 300) + "px";
      tip.style.top = found.py + 12 + "px";
    });
    canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
    canvas.addEventListener("click", (event) => {
      const found = hit(event);
      if (found.sub) selectSubmission(found.sub.id);
      else if (found.turn) { selectTurn(found.turn.i); scrollToTurn(found.turn.i); }
    });
  }

  // -- the resource plot ------------------------------------------------------------------------------
  function drawResources() {
    const canvas = document.getElementById("resources");
    const g = setup(canvas);
    const {ctx, width, height} = g;
    const r = data.resources;
    if (!r || !r.t || !r.t.length) {
      ctx.fillStyle = "#777777"; ctx.textAlign = "center"; ctx.textBaseline = "middle"; ctx.font = "italic 13px system-ui, sans-serif";
      ctx.fillText("no resource trace", width / 2, height / 2);
      return;
    }
    const GiB = 1024 * 1024 * 1024;
    const strips = [
      {name: "CPU %", values: r.cpu_percent, scale: 1, colour: "#0072B2", unit: "%"},
      {name: "RAM", values: r.rss_bytes, scale: 1, colour: "#009E73", bytes: true},
      {name: "workspace", values: r.workspace_bytes, scale: 1, colour: "#CC79A7", bytes: true},
    ];
    for (const [gpu, series] of Object.entries(r.gpus || {})) {
      strips.push({name: `GPU ${gpu} %`, values: series.utilization_percent, scale: 1, colour: "#D55E00", unit: "%", max: 100});
      strips.push({name: `GPU ${gpu} mem`, values: series.memory_used_mib, scale: 1024 * 1024, colour: "#E69F00", bytes: true,
        max: isNum(series.memory_total_mib) ? series.memory_total_mib * 1024 * 1024 : undefined});
    }
    const top = 4, bottom = height - 4, h = (bottom - top) / strips.length;
    timeGrid(g, top, bottom, false);
    strips.forEach((strip, k) => {
      const y0 = top + k * h, y1 = y0 + h - 3;
      const values = (strip.values || []).map((v) => isNum(v) ? v * strip.scale : null);
      const peak = Math.max(strip.max || 0, ...values.filter(isNum), 1e-9);
      ctx.strokeStyle = "#e6e6e6"; ctx.beginPath(); ctx.moveTo(MARGIN.left, y1 + 0.5); ctx.lineTo(width - MARGIN.right, y1 + 0.5); ctx.stroke();
      ctx.fillStyle = "#444444"; ctx.textAlign = "right"; ctx.textBaseline = "middle";
      ctx.fillText(strip.name, MARGIN.left - 5, (y0 + y1) / 2);
      ctx.textAlign = "left";
      const top_ = Math.max(...values.filter(isNum), 0);
      ctx.fillText("max " + (strip.bytes ? fmtBytes(top_) : fmtNum(top_, 1) + strip.unit), width - MARGIN.right + 4, (y0 + y1) / 2);
      ctx.strokeStyle = strip.colour; ctx.fillStyle = strip.colour + "33"; ctx.lineWidth = 1.5;
      ctx.beginPath();
      let open = false, first = null, last = null;
      for (let i = 0; i < r.t.length; i += 1) {
        const v = values[i];
        if (!isNum(v)) continue;
        const px = g.x(r.t[i]), py = y1 - (v / peak) * (y1 - y0 - 2);
        if (open) ctx.lineTo(px, py); else { ctx.moveTo(px, py); open = true; first = px; }
        last = px;
      }
      ctx.stroke(); ctx.lineWidth = 1;
      if (open) { ctx.lineTo(last, y1); ctx.lineTo(first, y1); ctx.closePath(); ctx.fill(); }
    });
  }

  // -- the turns: filters and a virtualised list -----------------------------------------------------
  const list = document.getElementById("turns");
  const spacer = document.getElementById("turns-spacer");
  function haystack(k) {
    if (!state.hay) state.hay = new Array(turns.length);
    let text = state.hay[k];
    if (text === undefined) {
      const t = turns[k];
      const parts = [t.label || "", t.error || ""];
      for (const m of [].concat(t.messages || [], t.response || [])) parts.push(m.name || "", m.text || "");
      text = state.hay[k] = parts.join("\n").toLowerCase();
    }
    return text;
  }
  function applyFilters() {
    const text = document.getElementById("filter-text").value.trim().toLowerCase();
    const tool = document.getElementById("filter-tool").value;
    const errors = document.getElementById("filter-errors").checked;
    const kept = [];
    for (let k = 0; k < turns.length; k += 1) {
      const t = turns[k];
      if (tool && !(t.tools || []).includes(tool)) continue;
      if (errors && !turnBad(t)) continue;
      if (text && !haystack(k).includes(text)) continue;
      kept.push(k);
    }
    state.filtered = kept;
    state.position = new Map(kept.map((k, p) => [turns[k].i, p]));
    api.filtered = kept.map((k) => turns[k].i);
    document.getElementById("turn-count").textContent = `${kept.length} of ${turns.length} turns`;
    spacer.style.height = kept.length * ROW + "px";
    renderRows();
  }
  function renderRows() {
    const first = Math.max(0, Math.floor(list.scrollTop / ROW) - 10);
    const last = Math.min(state.filtered.length, Math.ceil((list.scrollTop + (list.clientHeight || 360)) / ROW) + 10);
    const rows = document.createDocumentFragment();
    for (let p = first; p < last; p += 1) {
      const t = turns[state.filtered[p]];
      const row = el("div", {class: "turn-row" + (turnBad(t) ? " bad" : "") + (t.i === state.selectedTurn ? " selected" : ""),
        data: {i: t.i}},
        el("span", {class: "t"}, fmtT(t.t)),
        el("span", {class: "kind"}, t.kind || ""),
        t.kind === "log" ? null  // a log line has no tokens or latency: its text gets the width
          : el("span", {class: "tokens"}, isNum(t.tokens_in) || isNum(t.tokens_out) ? `${fmtCount(t.tokens_in)}/${fmtCount(t.tokens_out)}` : ""),
        t.kind === "log" ? null : el("span", {class: "latency"}, isNum(t.latency_s) ? t.latency_s.toFixed(1) + " s" : ""),
        (t.tools || []).length ? el("span", {class: "tools"}, t.tools.join(", ")) : null,
        t.label || "");
      row.style.top = p * ROW + "px";
      rows.appendChild(row);
    }
    spacer.replaceChildren(rows);
  }
  function scrollToTurn(i) {
    const p = state.position.get(i);
    if (p === undefined) return false;
    const view = list.clientHeight || 360;
    if (p * ROW < list.scrollTop || (p + 1) * ROW > list.scrollTop + view) list.scrollTop = Math.max(0, p * ROW - view / 2);
    renderRows();
    return true;
  }
  function messageBlock(m) {
    const role = m.name ? `${m.role} (${m.name})` : m.role;
    return el("div", {class: `message ${m.role}` + (m.error ? " error" : "")},
      el("span", {class: "role"}, role + (m.error ? " · error" : "")), el("pre", {}, m.text || ""));
  }
  function selectTurn(i) {
    const t = turns.find((u) => u.i === i);
    if (!t) return false;
    state.selectedTurn = i;
    const box = document.getElementById("turn-detail");
    const facts = [`turn ${t.i}`, `${fmtT(t.t)}${t.t_exact === false ? " (approx.)" : ""}`, t.kind];
    if (t.model) facts.push(t.model);
    if (isNum(t.tokens_in) || isNum(t.tokens_out)) facts.push(`tokens ${fmtNum(t.tokens_in)} in / ${fmtNum(t.tokens_out)} out`);
    if (isNum(t.latency_s)) facts.push(`latency ${t.latency_s.toFixed(2)} s`);
    const parts = [el("h3", {}, facts.join(" · "))];
    if (t.error) parts.push(el("p", {class: "error-text"}, t.error));
    if (t.kind === "log") parts.push(el("pre", {}, t.response && t.response.length ? t.response[0].text : t.label));
    if ((t.messages || []).length) {
      parts.push(el("h3", {}, "added to the conversation"));
      for (const m of t.messages) parts.push(messageBlock(m));
    }
    if (t.kind !== "log" && (t.response || []).length) {
      parts.push(el("h3", {}, "answer"));
      for (const m of t.response) parts.push(messageBlock(m));
    }
    box.replaceChildren(...parts);
    renderRows();
    drawTimeline();
    return true;
  }
  function wireTurns() {
    const select = document.getElementById("filter-tool");
    for (const tool of data.tools || []) select.appendChild(el("option", {value: tool}, tool));
    document.getElementById("filter-text").addEventListener("input", applyFilters);
    select.addEventListener("change", applyFilters);
    document.getElementById("filter-errors").addEventListener("change", applyFilters);
    list.addEventListener("scroll", () => renderRows(), {passive: true});
    list.addEventListener("click", (event) => {
      const row = event.target.closest(".turn-row");
      if (row) selectTurn(Number(row.dataset.i));
    });
  }

  // -- submissions ------------------------------------------------------------------------------------
  function submissionsTable() {
    const box = document.getElementById("submissions");
    if (!subs.length) { box.appendChild(el("p", {class: "empty"}, "no submissions")); return; }
    const multi = subs.some((s) => s.task);
    const head = el("tr", {}, ...["#", "t", ...(multi ? ["task"] : []), "status", "score", "improvement", "reason"].map((h) => el("th", {}, h)));
    const body = el("tbody");
    for (const s of subs) {
      body.appendChild(el("tr", {class: "submission-row", data: {id: s.id}},
        el("td", {class: "num"}, short(s.id)), el("td", {class: "num"}, fmtT(s.t)),
        multi ? el("td", {}, short(s.task)) : null,
        el("td", {class: statusClass(s.status)}, short(s.status)),
        el("td", {class: "num"}, fmtNum(s.score)), el("td", {class: "num"}, fmtNum(s.improvement)),
        el("td", {class: "wrap"}, s.reason || s.error ? String(s.reason || s.error).slice(0, 160) : "")));
    }
    box.appendChild(el("table", {}, el("thead", {}, head), body));
    body.addEventListener("click", (event) => {
      const row = event.target.closest(".submission-row");
      if (row) selectSubmission(row.dataset.id);
    });
  }
  function diffBlock(text) {
    const box = el("div", {class: "diff"});
    for (const line of text.split("\n")) {
      let kind = "ctx";
      if (line.startsWith("diff --git") || line.startsWith("+++") || line.startsWith("---") || line.startsWith("index ")
          || line.startsWith("new file") || line.startsWith("deleted file") || line.startsWith("similarity") || line.startsWith("rename")) kind = "file";
      else if (line.startsWith("@@")) kind = "hunk";
      else if (line.startsWith("+")) kind = "add";
      else if (line.startsWith("-")) kind = "del";
      box.appendChild(el("div", {class: kind}, line || " "));
    }
    return box;
  }
  function keyValues(object) {
    const body = el("tbody");
    for (const [key, value] of Object.entries(object)) {
      body.appendChild(el("tr", {}, el("td", {}, key), el("td", {class: isNum(value) ? "num" : "wrap"}, isNum(value) ? fmtNum(value, 4) : short(value))));
    }
    return el("table", {}, body);
  }
  function selectSubmission(id) {
    const s = subs.find((u) => String(u.id) === String(id));
    if (!s) return false;
    state.selectedSub = String(s.id);
    for (const row of document.querySelectorAll("#submissions .submission-row")) row.classList.toggle("selected", row.dataset.id === state.selectedSub);
    const parts = [el("h3", {}, `submission ${short(s.id)} · ${fmtT(s.t)} · `, el("span", {class: statusClass(s.status)}, short(s.status)))];
    const facts = {score: s.score, improvement: s.improvement, model_path: s.model_path, code_revision: s.code_revision};
    if (s.task) facts.task = s.task;
    if (s.reason) facts.reason = s.reason;
    parts.push(keyValues(facts));
    if (s.error) parts.push(el("p", {class: "error-text"}, String(s.error)));
    // the code first (what the agent changed), then what the grader measured and kept
    if (s.code_files) parts.push(el("p", {}, `code (${s.code_files.length} files): ` + s.code_files.slice(0, 60).join(", ")));
    parts.push(el("h3", {}, s.diff_against === null || s.diff_against === undefined ? "code" : `code diff against submission ${s.diff_against}`));
    if (s.diff === null || s.diff === undefined) parts.push(el("p", {class: "empty"}, "no code recorded for this submission"));
    else if (s.diff === "") parts.push(el("p", {class: "empty"}, `no code change since submission ${short(s.diff_against)}`));
    else parts.push(diffBlock(s.diff));
    if (s.metrics) { parts.push(el("h3", {}, "evaluation")); parts.push(keyValues(s.metrics)); }
    if (s.checkpoint) {
      const c = s.checkpoint;
      parts.push(el("h3", {}, `checkpoint (${short(c.method)}, fingerprint ${short(c.fingerprint).slice(0, 16)})`));
      const body = el("tbody");
      for (const f of c.files || []) {
        body.appendChild(el("tr", {}, el("td", {}, short(f.name)), el("td", {class: "num"}, fmtBytes(f.size)), el("td", {}, short(f.sha256).slice(0, 12))));
      }
      parts.push(el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "file"), el("th", {}, "size"), el("th", {}, "sha256"))), body));
      if (c.config) parts.push(el("p", {}, "config: " + Object.keys(c.config).slice(0, 40).join(", ")));
    }
    document.getElementById("submission-detail").replaceChildren(...parts);
    drawTimeline();
    return true;
  }

  // -- the summary's iterations -------------------------------------------------------------------------
  function iterationsTable() {
    const box = document.getElementById("iterations");
    if (!data.summary) { box.appendChild(el("p", {class: "empty"}, "no summary")); return; }
    const rows = data.summary.iterations || [];
    if (!rows.length) { box.appendChild(el("p", {class: "empty"}, "no iterations recorded")); return; }
    // the columns present, in the data's order (rlbench.explorer.data keeps summary.jsonl's fields in order)
    const columns = [];
    for (const row of rows) for (const key of Object.keys(row)) if (!columns.includes(key)) columns.push(key);
    const body = el("tbody");
    for (const row of rows) {
      body.appendChild(el("tr", {}, ...columns.map((c) => {
        const v = row[c];
        if (c === "since_start_s" || c === "duration_s") return el("td", {class: "num"}, fmtT(v));
        return el("td", {class: isNum(v) ? "num" : "wrap"}, isNum(v) ? fmtNum(v) : v === undefined ? "" : short(v));
      })));
    }
    box.appendChild(el("table", {}, el("thead", {}, el("tr", {}, ...columns.map((c) => el("th", {}, c)))), body));
  }

  // -- the first screen ------------------------------------------------------------------------------
  header();
  wireTurns();
  applyFilters();
  drawTimeline();
  drawResources();
  wireTimeline();
  submissionsTable();
  iterationsTable();
  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => { drawTimeline(); drawResources(); }, 100);
  });
  api.firstScreenMs = performance.now() - T0;
  api.ready = true;
})();
