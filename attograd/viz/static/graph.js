// UOp graphs in the browser: a node store with hash-consing like the IR's (so a replayed rewrite finds the same
// nodes the trace names), the replay of a pass's steps, and its SVG drawing (laid out by layout.js in a web worker).
"use strict";

// ***** nodes: id -> [op, dtype, arg, [src ids]] *****
class NodeStore {
  constructor(rows) {
    this.rows = new Map(); this.byKey = new Map(); this.next = -1;
    for (const [id, row] of Object.entries(rows)) this.put(+id, row);
  }
  static key(op, dt, arg, src) { return op + "\u0001" + dt + "\u0001" + arg + "\u0001" + src.join(","); }
  put(id, row) {
    this.rows.set(id, row);
    const k = NodeStore.key(row[0], row[1], row[2], row[3]);
    if (!this.byKey.has(k)) this.byKey.set(k, id);
  }
  // the node with these fields: the one the trace has if any, else a new one (ids below 0)
  intern(op, dt, arg, src) {
    const k = NodeStore.key(op, dt, arg, src);
    let id = this.byKey.get(k);
    if (id === undefined) { id = this.next--; this.rows.set(id, [op, dt, arg, src]); this.byKey.set(k, id); }
    return id;
  }
}

// The graph after the first k steps of a pass: each step's `before` node is rewritten to its `after`, children first, to
// a fixed point (what uop/trace.py replay() does with UOps). All steps give the pass's output.
function replay(store, root, steps, k) { return replayMap(store, root, steps, k).get(root); }
// the same, as the map of every node reached to what it became (a rule's result is itself rewritten further: its
// sources to what earlier steps made them)
function replayMap(store, root, steps, k) {
  const table = new Map();
  for (let i = 0; i < k; i++) table.set(steps[i][0], steps[i][1]);
  const done = new Map();
  const stack = [[root, 0, 0]];
  let n = 0;
  while (stack.length) {
    const [u, state, other] = stack.pop();
    if (state === 0) {
      if (done.has(u)) continue;
      stack.push([u, 1, 0]);
      const src = store.rows.get(u)[3];
      for (let i = src.length - 1; i >= 0; i--) if (!done.has(src[i])) stack.push([src[i], 0, 0]);
    } else if (state === 1) {
      if (done.has(u)) continue;
      if (++n > 2e6) throw new Error("replay does not reach a fixed point");
      const row = store.rows.get(u);
      const src = row[3].map(s => done.get(s));
      const same = src.every((s, i) => s === row[3][i]);
      const rebuilt = same ? u : store.intern(row[0], row[1], row[2], src);
      const to = table.get(rebuilt);
      if (to === undefined || to === rebuilt) { done.set(u, rebuilt); if (!done.has(rebuilt)) done.set(rebuilt, rebuilt); }
      else if (done.has(to)) done.set(u, done.get(to));
      else { stack.push([u, 2, to]); stack.push([to, 0, 0]); }
    } else done.set(u, done.get(other));
  }
  return done;
}

// ***** drawing: nodes coloured by op, edges by source position *****
const OP_COLORS = [
  [/^(CONST|VCONST|DEFINE_VAR|BIND)$/, "#fff3c4"], [/^(BUFFER|PARAM|DEFINE_GLOBAL|DEFINE_LOCAL|DEFINE_REG|BUFFERIZE)$/, "#ffd5b8"],
  [/^(LOAD|STORE|INDEX|AT|ASSIGN|COPY)$/, "#ffc7d1"], [/^(RANGE|END|SPECIAL|CORE_ID)$/, "#c9e4ff"],
  [/^(REDUCE|REDUCE_AXIS|MULACC)$/, "#d7c9ff"], [/^(RESHAPE|PERMUTE|EXPAND|PAD|SHRINK|FLIP|CONTIGUOUS|DETACH)$/, "#c8f0d8"],
  [/^(SINK|KERNEL|AFTER|NOOP|BARRIER|GROUP)$/, "#e3e6ea"], [/^(VECTORIZE|GEP|CAST|BITCAST)$/, "#d9f2f7"], [/.*/, "#eef5ff"],
];
function opColor(op) { for (const [re, c] of OP_COLORS) if (re.test(op)) return c; }
const EDGE_COLORS = ["#3b6fd8", "#e0711c", "#1f9d55", "#b0309e", "#8a6d1d", "#d12e2e", "#555"];

let MAX_DRAWN = 2500;  // more is drawn on request (the "draw all" button)
const LABELS_MAX = 2500;  // a bigger drawing shows labels only zoomed in (see draw)

// the nodes to draw below root: constants folded into their users' labels when collapse is set
function collect(store, root, collapse) {
  const order = [], seen = new Set([root]), stack = [root];
  while (stack.length && order.length < MAX_DRAWN) {
    const u = stack.pop(); order.push(u);
    for (const s of store.rows.get(u)[3]) {
      if (seen.has(s)) continue;
      if (collapse && store.rows.get(s)[0] === "CONST") continue;
      seen.add(s); stack.push(s);
    }
  }
  return {ids: order, cut: stack.length > 0};
}

function label(store, id, collapse) {
  const [op, dt, arg, src] = store.rows.get(id);
  let a = arg;
  if (collapse) {
    const consts = src.map(s => store.rows.get(s)).filter(r => r[0] === "CONST").map(r => r[2]);
    if (consts.length) a = (a ? a + " " : "") + "c:" + consts.join(",");
  }
  if (a.length > 40) a = a.slice(0, 39) + "…";
  return [op + (dt && dt !== "void" ? " " + dt : ""), a];
}

function esc(s) { return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;"); }

// the layout runs in a web worker (layout.js): a layered layout first, dagre's after it for graphs it lays out quickly
let worker = null, nextReq = 0;
const pending = new Map();  // request -> what to draw with its answer
function layoutWorker() {
  if (worker) return worker;
  worker = new Worker("/static/layout.js");
  worker.onmessage = e => { const p = pending.get(e.data.req); if (p) p(e.data); };
  return worker;
}

// draw root's graph into container (an element); mark: {id: "hl"|"new"}. Returns at once what will be drawn ({count,
// cut}); the drawing comes when the worker answers (container.dataset.layout says which layout is shown)
function drawGraph(container, store, root, mark, collapse, onClick) {
  const {ids, cut} = collect(store, root, collapse);
  const index = new Map(ids.map((id, i) => [id, i]));
  const srcs = ids.map(id => store.rows.get(id)[3].filter(s => index.has(s)).map(s => index.get(s)));
  const labels = ids.map(id => label(store, id, collapse));
  const widths = labels.map(([l1, l2]) => Math.max(l1.length, l2.length) * 6.8 + 14);
  mark = {...mark};
  for (const [id, cls] of Object.entries(mark)) {  // a folded constant: mark its users, which show it in their label
    if (index.has(+id)) continue;
    for (const u of ids) if (store.rows.get(u)[3].includes(+id)) mark[u] = cls;
  }
  const req = nextReq++;
  container.dataset.req = req; container.dataset.layout = "";
  for (const r of pending.keys()) if (r < req) pending.delete(r);  // a newer drawing replaces any older one still coming
  pending.set(req, L => {
    if (+container.dataset.req !== req) return;
    draw(container, store, ids, srcs, labels, widths, L, mark);
    container.dataset.layout = L.kind;
    if (L.kind === "dagre" || ids.length > 400) pending.delete(req);
  });
  layoutWorker().postMessage({req, srcs, widths});
  return {count: ids.length, cut};
}

// a route through points, its corners rounded (a quadratic curve through each inner point's neighbouring midpoints)
function smooth(pts) {
  const mid = (a, b) => `${(a[0] + b[0]) / 2},${(a[1] + b[1]) / 2}`;
  let d = `M${pts[0][0]},${pts[0][1]}`;
  if (pts.length === 2) return d + ` L${pts[1][0]},${pts[1][1]}`;
  d += ` L${mid(pts[0], pts[1])}`;
  for (let j = 1; j < pts.length - 1; j++) d += ` Q${pts[j][0]},${pts[j][1]} ${mid(pts[j], pts[j + 1])}`;
  const e = pts[pts.length - 1];
  return d + ` L${e[0]},${e[1]}`;
}

function draw(container, store, ids, srcs, labels, widths, L, mark) {
  const H = 34, parts = [];
  // the edges as one path per colour (source position): a path element each cost the browser more than the nodes
  const edges = EDGE_COLORS.map(() => []), r = v => Math.round(v * 10) / 10;
  ids.forEach((u, k) => {
    const bx = L.x[k], by = L.y[k], bw = widths[k], n = srcs[k].length;
    srcs[k].forEach((s, i) => {
      const to = edges[Math.min(i, EDGE_COLORS.length - 1)];
      if (L.points) return to.push(smooth(L.points[k][i]));  // dagre's route
      const x1 = r(L.x[s] + widths[s] / 2), y1 = r(L.y[s] + H), x2 = r(bx + bw * (i + 1) / (n + 1)), y2 = r(by), my = r((y1 + y2) / 2);
      to.push(`M${x1},${y1} C${x1},${my} ${x2},${my} ${x2},${y2}`);
    });
  });
  edges.forEach((d, i) => { if (d.length) parts.push(`<path d="${d.join(" ")}" stroke="${EDGE_COLORS[i]}"/>`); });
  // text is what costs the browser most (13k labelled boxes: 3 s to paint here, unlabelled 0.8 s): a big graph's boxes are
  // drawn bare and the labels of those in view are added once zoomed in to at most LABELS_MAX of them
  const bare = ids.length > LABELS_MAX;
  const text = k => `<text x="7" y="14">${esc(labels[k][0])}</text><text x="7" y="28" fill="#556">${esc(labels[k][1])}</text>`;
  ids.forEach((u, k) => {
    const cls = mark[u] ? "node " + mark[u] : "node", row = store.rows.get(u), op = row[0];
    parts.push(`<g class="${cls}" data-id="${u}" data-op="${op}" transform="translate(${L.x[k]},${L.y[k]})"><title>${esc(u + ": " + row.slice(0, 3).join(" "))}</title>` +
      `<rect width="${widths[k]}" height="${H}" fill="${opColor(op)}"/>${bare ? "" : text(k)}</g>`);
  });
  // the whole graph when it fits the pane at a readable width, else (a tall graph: a long chain) its bottom, where the
  // root is, at least 1,200 units wide
  const pad = 20, aspect = (container.clientHeight || 600) / (container.clientWidth || 1000);
  let vw = L.width + 2 * pad, vh = L.height + pad, vx = -pad, vy = -pad;
  if (vh > Math.max(vw, 1200) * aspect * 2) { vx -= (Math.max(vw, 1200) - vw) / 2; vw = Math.max(vw, 1200); vy = L.height + pad - vw * aspect; vh = vw * aspect; }
  container.innerHTML = `<svg data-layout="${L.kind}" viewBox="${vx} ${vy} ${vw} ${vh}" preserveAspectRatio="xMidYMin meet"><g>${parts.join("")}</g><g class="labels"></g></svg>`;
  const svg = container.querySelector("svg");
  let timer = 0;
  const labelInView = () => {
    const vb = svg.viewBox.baseVal, inView = [];
    ids.forEach((u, k) => { if (L.x[k] + widths[k] >= vb.x && L.x[k] <= vb.x + vb.width && L.y[k] + H >= vb.y && L.y[k] <= vb.y + vb.height) inView.push(k); });
    svg.querySelector("g.labels").innerHTML = inView.length > LABELS_MAX ? "" :
      inView.map(k => `<g transform="translate(${L.x[k]},${L.y[k]})" pointer-events="none">${text(k)}</g>`).join("");
  };
  panZoom(svg, bare ? () => { clearTimeout(timer); timer = setTimeout(labelInView, 120); } : null);
  if (bare) labelInView();
}

// wheel to zoom at the pointer, drag to pan, by changing the viewBox
function panZoom(svg, onChange) {
  let vb = svg.viewBox.baseVal, drag = null;
  svg.addEventListener("wheel", e => {
    e.preventDefault();
    const r = svg.getBoundingClientRect(), f = e.deltaY > 0 ? 1.2 : 1 / 1.2;
    const sx = vb.x + (e.clientX - r.left) / r.width * vb.width, sy = vb.y + (e.clientY - r.top) / r.height * vb.height;
    vb.x = sx - (sx - vb.x) * f; vb.y = sy - (sy - vb.y) * f; vb.width *= f; vb.height *= f;
    if (onChange) onChange();
  }, {passive: false});
  svg.addEventListener("mousedown", e => { drag = [e.clientX, e.clientY, vb.x, vb.y]; });
  window.addEventListener("mouseup", () => { drag = null; });
  svg.addEventListener("mousemove", e => {
    if (!drag) return;
    const r = svg.getBoundingClientRect(), s = Math.max(vb.width / r.width, vb.height / r.height);
    vb.x = drag[2] - (e.clientX - drag[0]) * s; vb.y = drag[3] - (e.clientY - drag[1]) * s;
    if (onChange) onChange();
  });
}
