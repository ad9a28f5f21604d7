// The page: groups (kernels by the names DEBUG=1 prints, schedules) with their passes on the left; a pass's steps with
// the graph before/after each and the rule's file:line; a kernel's AST, Opts, source and linear uops; the timeline.
"use strict";
const $ = s => document.querySelector(s);
let S = null;  // /api/summary
const state = {group: -1, pass: -1, step: 0, after: true, collapse: true, data: null, store: null};

async function get(path) { const r = await fetch(path); if (!r.ok) throw new Error(path + ": " + r.status); return r.json(); }
function bytes(n) { return n >= 1e9 ? (n / 1e9).toFixed(2) + " GB" : n >= 1e6 ? (n / 1e6).toFixed(2) + " MB" : n >= 1e3 ? (n / 1e3).toFixed(1) + " KB" : n + " B"; }
function ms(s) { return s >= 1 ? s.toFixed(2) + " s" : s >= 1e-3 ? (s * 1e3).toFixed(2) + " ms" : (s * 1e6).toFixed(1) + " µs"; }

function groupLabel(g, i) {
  if (g.kind === "kernel") return g.name + (g.device ? "  " + g.device : "");
  if (g.kind === "schedule") return "schedule #" + i;
  return "other rewrites";
}

function renderSide() {
  const f = $("#filter").value.toLowerCase();
  const ul = $("#groups"); ul.innerHTML = "";
  S.groups.forEach((g, i) => {
    const passes = S.passes.map((p, j) => [p, j]).filter(([p]) => p.group === i);
    if (g.kind === "other" && !passes.length) return;
    const names = groupLabel(g, i).toLowerCase();
    if (f && !names.includes(f) && !passes.some(([p]) => p.name.includes(f))) return;
    const li = document.createElement("li");
    li.className = "group-item" + (state.group === i && state.pass < 0 ? " selected" : "");
    li.dataset.kind = g.kind; li.dataset.i = i; li.dataset.name = g.name;
    if ((g.chosen_by || "").startsWith("caller (compile_kernel")) li.classList.add("candidate");
    li.innerHTML = `<div class="label" title="${esc(groupLabel(g, i))}">${esc(groupLabel(g, i))}</div>`;
    li.firstChild.onclick = () => openGroup(i);
    if (state.group === i) {
      const sub = document.createElement("ul");
      const depth = new Map();
      for (const [p, j] of passes) {
        const d = p.parent >= 0 && depth.has(p.parent) ? depth.get(p.parent) + 1 : 0;
        depth.set(j, d);
        const pl = document.createElement("li");
        pl.className = "pass-item" + (p.nsteps || !p.rewrite ? "" : " empty") + (state.pass === j ? " selected" : "");
        pl.dataset.i = j;
        pl.innerHTML = `<div class="label" style="padding-left:${14 + 12 * d}px">${esc(p.name)}<span class="n">${p.rewrite ? p.nsteps + " steps" : "fn"} · ${ms(p.dur)}</span></div>`;
        pl.firstChild.onclick = () => openPass(j);
        sub.appendChild(pl);
      }
      li.appendChild(sub);
    }
    ul.appendChild(li);
  });
}

function showView(which) {
  $("#view").hidden = which !== "view"; $("#timeline").hidden = which !== "timeline";
  $("#tab-passes").classList.toggle("active", which === "view"); $("#tab-timeline").classList.toggle("active", which === "timeline");
  if (which === "timeline") drawTimeline();
}

// ***** a kernel *****
async function openGroup(i) {
  state.group = i; state.pass = -1; renderSide(); showView("view");
  const g = S.groups[i];
  if (g.kind === "other") {  // rewrites outside scheduling and lowering: the first one
    const first = S.passes.findIndex(p => p.group === i);
    if (first >= 0) return openPass(first);
    $("#view").innerHTML = `<p class="hint">no passes recorded</p>`; return;
  }
  const k = await get("/api/group/" + i);
  if (g.kind === "schedule") return showSchedule(k);
  const store = new NodeStore(k.nodes);
  $("#view").innerHTML = `<div class="title"><h2 id="kernel-name">${esc(k.name)}</h2><span class="meta">${esc(k.device)} · lowering ${ms(k.lower_s)} · compile ${ms(k.compile_s)} · ${k.uops.length} uops</span></div>
    <div class="tools tabs2"><button data-t="src" class="on">Source</button><button data-t="ast">AST</button><button data-t="uops">Linear uops</button><button data-t="opts">Opts</button></div>
    <div class="pane" id="kpane"></div>`;
  const tabs = {
    src: () => `<pre class="code" id="source">${highlight(k.src)}</pre>`,
    uops: () => `<pre class="code" id="uops">${esc(k.uops.join("\n"))}</pre>`,
    opts: () => `<table class="kv" id="opts"><tr><td>Opts</td><td>${esc(k.opts.join(", ") || "(none)")}</td></tr>` +
                `<tr><td>chosen by</td><td>${esc(k.chosen_by)}</td></tr>` +
                `<tr><td>its output is a buffer</td><td class="why" id="kernel-why">${k.why.map(([c, t]) => `<b>${esc(c)}</b> ${esc(t)}`).join("<br>") || "(not in a recorded schedule)"}</td></tr>` +
                `<tr><td>lowering</td><td>${ms(k.lower_s)}</td></tr><tr><td>compile</td><td>${ms(k.compile_s)}</td></tr>` +
                `<tr><td>launches</td><td>${S.events.filter(e => e.group === i).length}</td></tr></table>`,
    ast: () => `<div class="graph" id="graph"></div>`,
  };
  const show = t => {
    document.querySelectorAll(".tabs2 button").forEach(b => b.classList.toggle("on", b.dataset.t === t));
    $("#kpane").innerHTML = tabs[t]();
    if (t === "ast") drawGraph($("#graph"), store, k.ast, {}, true);
  };
  document.querySelectorAll(".tabs2 button").forEach(b => b.onclick = () => show(b.dataset.t));
  show("src");
}

// a realize's schedule: its kernels and copies in run order, each with the buffers it binds (output first)
function showSchedule(k) {
  const rows = (k.items || []).map((it, n) => {
    const kg = it.kernel >= 0 ? S.groups[it.kernel] : null;
    const name = kg ? `<a href="#" class="sched-kernel" data-g="${it.kernel}">${esc(kg.name)}</a>` : esc(it.op === "COPY" ? "copy" : "(lowered before recording)");
    const bufs = it.bufs.map(([uid, dt, size, dev], j) => `${j ? "" : "→ "}buf${uid} ${esc(dt)}[${size}]${dev !== "CPU" ? " " + esc(dev) : ""}`).join(", ");
    const [code, text] = it.why || ["", ""];
    return `<tr><td>${n + 1}</td><td>${name}</td><td>${bufs}</td><td class="why" data-why="${esc(code)}" title="${esc(text)}"><b>${esc(code)}</b> ${esc(text)}</td></tr>`;
  });
  $("#view").innerHTML = `<div class="title"><h2 id="schedule-name">schedule #${k.index}</h2><span class="meta">${(k.items || []).length} items · scheduling ${ms(k.dur)} · its passes are listed on the left</span></div>
    <div class="pane" style="overflow:auto"><table class="kv" id="schedule"><tr><td>#</td><td>kernel</td><td>buffers (output first)</td><td>why its output is a buffer (the scheduler's rule)</td></tr>${rows.join("")}</table></div>`;
  document.querySelectorAll(".sched-kernel").forEach(a => a.onclick = e => { e.preventDefault(); openGroup(+a.dataset.g); });
}

const KW = /\b(void|return|for|if|else|while|const|restrict|static|inline|struct|typedef|unsigned|signed|__kernel|__global|__local|kernel|global|local|fn|let|var)\b/;
const TY = /\b(float|double|half|int|long|char|short|bool|_Float16|size_t|u?int(8|16|32|64)_t|float[248]|int[248]|f32|i32|u32|vec[234])\b/;
function highlight(src) {
  const re = /(\/\/[^\n]*|\/\*[\s\S]*?\*\/)|("(?:[^"\\]|\\.)*")|(\b\d+(?:\.\d*)?(?:[eE][-+]?\d+)?[fFuUlL]*\b|0x[0-9a-fA-F]+)|([A-Za-z_]\w*)|([\s\S])/g;
  let out = "", m;
  while ((m = re.exec(src))) {
    if (m[1]) out += `<span class="com">${esc(m[1])}</span>`;
    else if (m[2]) out += `<span class="str">${esc(m[2])}</span>`;
    else if (m[3]) out += `<span class="num">${esc(m[3])}</span>`;
    else if (m[4]) out += KW.test(m[4]) && m[4].match(KW)[0] === m[4] ? `<span class="kw">${m[4]}</span>` :
                          TY.test(m[4]) && m[4].match(TY)[0] === m[4] ? `<span class="ty">${m[4]}</span>` : m[4];
    else out += esc(m[5]);
  }
  return out;
}

// ***** a pass and its steps *****
async function openPass(j) {
  const p = S.passes[j];
  if (state.group !== p.group) state.group = p.group;
  state.pass = j; state.step = 0; renderSide(); showView("view");
  const d = await get("/api/pass/" + j);
  state.data = d; state.store = new NodeStore(d.nodes);
  const g = S.groups[d.group];
  let check = "";
  if (d.rewrite) {
    const end = replay(state.store, d.input, d.steps, d.steps.length);
    check = end === d.output ? `<span class="ok" id="replay-check">steps replay to the output ✓</span>` :
                               `<span class="bad" id="replay-check">steps do not replay to the output</span>`;
  }
  const steps = [`<li class="step-item" data-k="0"><b>input</b> · ${Object.keys(d.nodes).length} nodes</li>`].concat(d.steps.map((s, k) => {
    const r = s[2] >= 0 ? d.rules[s[2]] : null;
    return `<li class="step-item" data-k="${k + 1}"><span class="num">${k + 1}</span> ${r ? `<span class="loc">${esc(r.short)}</span><span class="pat">${esc(r.pattern)}</span>` :
      `<span class="loc">(rewritten before in this pass)</span>`}</li>`;
  }));
  $("#view").innerHTML = `<div class="title"><h2 id="pass-name">${esc(d.name)}</h2><span class="meta">${esc(groupLabel(g, d.group))} · ${d.rewrite ? d.steps.length + " steps" : "function pass"} · ${ms(d.dur)} · ${check}</span></div>
    <div class="body"><ul id="steps">${steps.join("")}</ul>
    <div class="pane"><div class="tools"><button id="btn-before">before</button><button id="btn-after" class="on">after</button>
      <label><input type="checkbox" id="collapse" ${state.collapse ? "checked" : ""}> fold constants</label>
      <button id="btn-output">pass output</button><span id="graph-info"></span><span>(←/→: steps)</span></div>
    <div id="rule"></div><div class="graph" id="graph"></div></div></div>`;
  document.querySelectorAll(".step-item").forEach(li => li.onclick = () => showStep(+li.dataset.k));
  $("#btn-before").onclick = () => { state.after = false; showStep(state.step); };
  $("#btn-after").onclick = () => { state.after = true; showStep(state.step); };
  $("#btn-output").onclick = () => showRoot(d.output ?? d.input, {}, "the pass's output");
  $("#collapse").onchange = e => { state.collapse = e.target.checked; showStep(state.step); };
  showStep(d.steps.length && d.rewrite ? 1 : 0);
}

function showRoot(root, mark, what) {
  const L = drawGraph($("#graph"), state.store, root, mark, state.collapse);
  $("#graph-info").innerHTML = esc(`${what}: ${L.count} nodes drawn`) + (L.cut ? ` (the first ${MAX_DRAWN} from the root: <button id="draw-all">draw all</button>)` : "");
  if (L.cut) $("#draw-all").onclick = () => { MAX_DRAWN = Infinity; showStep(state.step); };
}

function showStep(k) {
  const d = state.data;
  state.step = k;
  document.querySelectorAll(".step-item").forEach(li => li.classList.toggle("selected", +li.dataset.k === k));
  const sel = document.querySelector(`.step-item[data-k="${k}"]`); if (sel) sel.scrollIntoView({block: "nearest"});
  $("#btn-before").classList.toggle("on", !state.after); $("#btn-after").classList.toggle("on", state.after);
  if (k === 0) {
    $("#rule").innerHTML = `<span id="rule-loc">input of ${esc(d.name)}</span>`;
    return showRoot(d.input, {}, "input");
  }
  const [before, after, r] = d.steps[k - 1], rule = r >= 0 ? d.rules[r] : null;
  $("#rule").innerHTML = rule ? `<span id="rule-loc" title="${esc(rule.loc)}">${esc(rule.short)}</span>  ${esc(rule.pattern)}\n${esc(rule.code)}` :
    `<span id="rule-loc">(no rule: this node was rewritten earlier in the pass)</span>`;
  const done = replayMap(state.store, d.input, d.steps, state.after ? k : k - 1);
  // after: the rule's result as it stands in the graph (its sources rewritten as earlier steps made them)
  const mark = state.after ? {[done.get(after) ?? after]: "new"} : {[before]: "hl"};
  showRoot(done.get(d.input), mark, `step ${k} ${state.after ? "after" : "before"}`);
}

document.addEventListener("keydown", e => {
  if (!state.data || $("#view").hidden || e.target.tagName === "INPUT") return;
  if (e.key === "ArrowDown" || e.key === "ArrowRight") showStep(Math.min(state.step + 1, state.data.steps.length));
  if (e.key === "ArrowUp" || e.key === "ArrowLeft") showStep(Math.max(state.step - 1, 0));
});

// ***** the timeline: host rows (scheduling, rewrite passes, lowering, compiling), a lane per device for launches and
// transfers, and the memory in use below *****
const tl = {t0: 0, t1: 1, full: null, transform: null, zoom: null}, TL_LEFT = 110;
// (no spread into Math.min: a long trace's arrays exceed the call's argument limit)
const minOf = a => a.reduce((m, v) => v < m ? v : m, Infinity), maxOf = a => a.reduce((m, v) => v > m ? v : m, -Infinity);
const HOST_ROWS = ["schedule", "passes", "lowering", "compile"];
function hostBars() {  // [row, start, dur, class, colour, title, data attributes] of the host's phases
  const out = [];
  S.groups.forEach((g, i) => {
    if (g.kind === "schedule") out.push([0, g.start, g.dur, "host schedule", "#f2b25c", `${groupLabel(g, i)}: scheduling ${ms(g.dur)}`, `data-group="${i}"`]);
    if (g.kind !== "kernel") return;
    out.push([2, g.start, g.dur, "host lowering", "#8fb3ff", `${g.name}: lowering ${ms(g.dur)}`, `data-group="${i}"`]);
    // the compiler's CPU time, ending when the run loop took the binary (0: it came from the disk cache)
    if (g.compile_s > 0 && g.ready > 0) out.push([3, g.ready - g.compile_s, g.compile_s, "host compile", "#b98cf0", `${g.name}: compiling ${ms(g.compile_s)} (CPU)`, `data-group="${i}"`]);
  });
  S.passes.forEach((p, j) => {  // the passes nothing else ran (their children are inside them)
    if (p.parent < 0) out.push([1, p.start, p.dur, "host pass", p.rewrite ? "#9fd4a8" : "#c6d9a0", `${p.name} (${groupLabel(S.groups[p.group], p.group)}): ${p.rewrite ? p.nsteps + " steps" : "function pass"}, ${ms(p.dur)}`, `data-pass="${j}"`]);
  });
  return out;
}
function drawTimeline() {
  const svg = $("#tl-svg"), W = svg.clientWidth || 1000;
  const host = tl.host || (tl.host = hostBars());
  const transfers = S.transfers || [], memory = S.memory || [];
  if (!tl.full) {
    const starts = [...S.events, ...transfers].map(e => e.start).concat(host.map(b => b[1]));
    const ends = [...S.events, ...transfers].map(e => e.start + e.dur).concat(host.map(b => b[1] + b[2]));
    const t0 = minOf(starts), t1 = maxOf(ends);
    tl.full = [t0, t1 > t0 ? t1 : t0 + 1e-3];
  }
  const scale = (tl.transform || d3.zoomIdentity).rescaleX(baseScale());
  [tl.t0, tl.t1] = scale.domain();
  const devices = [...new Set([...S.events, ...transfers].map(e => e.device))];
  const lanes = [...HOST_ROWS.map(r => "host: " + r), ...devices], LH = 24, TOP = 24, LEFT = TL_LEFT, memH = 60;
  const x = scale;
  const parts = [];
  for (const t of scale.ticks(8))
    parts.push(`<line x1="${x(t)}" x2="${x(t)}" y1="${TOP - 6}" y2="${TOP + lanes.length * LH + memH}" stroke="#eee"/><text x="${x(t) + 2}" y="${TOP - 10}" fill="#667">${ms(t)}</text>`);
  lanes.forEach((l, i) => parts.push(`<text x="4" y="${TOP + i * LH + 16}"${i < HOST_ROWS.length ? ' fill="#667"' : ""}>${esc(l)}</text>`));
  // a bar; `merge`: skip it when it would cover only pixels the row's last bar covered (thousands of passes stay cheap)
  const lastPx = new Map();
  const bar = (t, dur, lane, cls, color, title, data, merge) => {
    const x0 = x(t), w = Math.max(x(t + dur) - x0, 1.5);
    if (x0 + w < LEFT || x0 > W) return;
    if (merge) { if ((lastPx.get(lane) ?? -1) >= x0 + w - 0.5) return; lastPx.set(lane, x0 + w); }
    parts.push(`<rect class="${cls}" ${data} x="${Math.max(x0, LEFT - 2)}" y="${TOP + lane * LH + 3}" width="${w}" height="${LH - 6}" fill="${color}"><title>${esc(title)}</title></rect>`);
  };
  for (const [row, t, dur, cls, color, title, data] of host) bar(t, dur, row, cls, color, title, data, true);
  const D = HOST_ROWS.length;
  transfers.forEach((e, n) => bar(e.start, e.dur, D + devices.indexOf(e.device), "transfer", "#e0711c",
    `${e.name}: ${bytes(e.nbytes)} in ${ms(e.dur)} at ${ms(e.start)}, ${(e.nbytes / Math.max(e.dur, 1e-9) * 1e-9).toFixed(2)} GB/s`, `data-t="${n}"`, false));
  S.events.forEach((e, n) => bar(e.start, e.dur, D + devices.indexOf(e.device), "launch" + (e.name.startsWith("copy") ? " copy" : "") + (e.jit ? " jit" : ""),
    e.name.startsWith("copy") ? "#d4552b" : e.group < 0 ? "#999" : e.jit ? "#1c8fa8" : "#3aa76d",
    `${e.name}${e.jit ? " (TinyJit replay)" : ""}: ${ms(e.dur)} at ${ms(e.start)}, ${(e.ops / Math.max(e.dur, 1e-9) * 1e-9).toFixed(2)} GFLOPS, ${(e.nbytes / Math.max(e.dur, 1e-9) * 1e-9).toFixed(2)} GB/s`
    + `, memory in use ${bytes(e.mem)}`, `data-group="${e.group}" data-n="${n}"`, false));
  // memory in use: a level stepping at each allocation and free (older traces: after each launch)
  const samples = memory.length ? memory : S.events.map(e => [e.start + e.dur, e.mem]);
  const memTop = TOP + lanes.length * LH + 6, maxMem = Math.max(1, maxOf(samples.map(m => m[1])));
  const my = m => memTop + memH - 8 - m / maxMem * (memH - 16), pts = [];
  let prev = null, lastX = -1;
  for (const [t, m] of samples) {
    const px = x(t);
    if (px < LEFT) { prev = m; continue; }
    if (px > W) break;
    if (prev !== null) pts.push(`${Math.max(px, LEFT)},${my(prev)}`);
    if (px - lastX >= 0.5 || prev === null) { pts.push(`${Math.max(px, LEFT)},${my(m)}`); lastX = px; }
    prev = m;
  }
  if (prev !== null) pts.push(`${W - 10},${my(prev)}`);
  parts.push(`<text x="4" y="${memTop + 20}">memory</text><text x="4" y="${memTop + 34}" fill="#667">${bytes(maxMem)} max</text>`);
  if (pts.length) parts.push(`<polyline id="tl-mem" points="${pts.join(" ")}" fill="none" stroke="#b0309e" stroke-width="1.5"/>`);
  svg.setAttribute("height", memTop + memH);
  svg.innerHTML = parts.join("");
  const nj = S.events.filter(e => e.jit).length;
  $("#tl-info").textContent = `${S.events.length} launches${nj ? ` (${nj} TinyJit replays)` : ""}, ${transfers.length} transfers on ${devices.join(", ") || "no device"}; showing ${ms(tl.t0)} – ${ms(tl.t1)}`;
  svg.querySelectorAll("rect[data-group]").forEach(r => r.onclick = () => { if (+r.dataset.group >= 0) openGroup(+r.dataset.group); });
  svg.querySelectorAll("rect[data-pass]").forEach(r => r.onclick = () => openPass(+r.dataset.pass));
}
// d3's zoom (wheel, drag, touch) moves the time axis only: its transform rescales the scale of the whole span
function baseScale() { const W = $("#tl-svg").clientWidth || 1000; return d3.scaleLinear().domain(tl.full).range([TL_LEFT, W - 10]); }
function showSpan(a, b) {  // the transform that puts [a, b] across the lanes
  const base = baseScale(), [r0, r1] = base.range(), k = (r1 - r0) / Math.max(base(b) - base(a), 1e-9);
  d3.select("#tl-svg").call(tl.zoom.transform, d3.zoomIdentity.translate(r0 - k * base(a), 0).scale(k));
}
function timelineControls() {
  tl.zoom = d3.zoom().scaleExtent([0.5, 1e8]).on("zoom", e => { tl.transform = e.transform; drawTimeline(); });
  d3.select("#tl-svg").call(tl.zoom).on("dblclick.zoom", null);
  $("#tl-reset").onclick = () => showSpan(...tl.full);
  $("#tl-launches").onclick = () => {  // the span of the launches alone (scheduling and lowering dwarf them at first)
    if (!S.events.length) return;
    const t0 = minOf(S.events.map(e => e.start)), t1 = maxOf(S.events.map(e => e.start + e.dur));
    const pad = (t1 - t0) * 0.02 + 1e-6; showSpan(t0 - pad, t1 + pad);
  };
}

async function main() {
  S = await get("/api/summary");
  const nk = S.groups.filter(g => g.kind === "kernel").length;
  $("#summary").textContent = `${nk} kernels · ${S.passes.length} passes · ${S.nrules} rules fired · ${S.events.length} launches`;
  $("#filter").oninput = renderSide;
  $("#tab-passes").onclick = () => showView("view");
  $("#tab-timeline").onclick = () => showView("timeline");
  timelineControls();
  renderSide();
  document.body.dataset.ready = "1";  // for tests: the summary is in
}
main().catch(e => { document.body.innerHTML = `<p class="bad">VIZ: ${esc(e.message)}</p>`; });
