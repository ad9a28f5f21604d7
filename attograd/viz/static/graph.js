// UOp graphs in the browser: a node store with hash-consing like the IR's (so a replayed rewrite finds the same
// nodes the trace names), the replay of a pass's steps, a layered layout and its SVG drawing.
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

// ***** layout: layers by longest path from the leaves, order in a layer by barycenters *****
const OP_COLORS = [
  [/^(CONST|VCONST|DEFINE_VAR|BIND)$/, "#fff3c4"], [/^(BUFFER|PARAM|DEFINE_GLOBAL|DEFINE_LOCAL|DEFINE_REG|BUFFERIZE)$/, "#ffd5b8"],
  [/^(LOAD|STORE|INDEX|AT|ASSIGN|COPY)$/, "#ffc7d1"], [/^(RANGE|END|SPECIAL|CORE_ID)$/, "#c9e4ff"],
  [/^(REDUCE|REDUCE_AXIS|MULACC)$/, "#d7c9ff"], [/^(RESHAPE|PERMUTE|EXPAND|PAD|SHRINK|FLIP|CONTIGUOUS|DETACH)$/, "#c8f0d8"],
  [/^(SINK|KERNEL|AFTER|NOOP|BARRIER|GROUP)$/, "#e3e6ea"], [/^(VECTORIZE|GEP|CAST|BITCAST)$/, "#d9f2f7"], [/.*/, "#eef5ff"],
];
function opColor(op) { for (const [re, c] of OP_COLORS) if (re.test(op)) return c; }
const EDGE_COLORS = ["#3b6fd8", "#e0711c", "#1f9d55", "#b0309e", "#8a6d1d", "#d12e2e", "#555"];

let MAX_DRAWN = 2500;  // more is drawn on request (the "draw all" button): layout and drawing take about 0.1 s per 1,000 nodes

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

function layout(store, root, collapse) {
  const {ids, cut} = collect(store, root, collapse);
  const inGraph = new Set(ids);
  const srcMap = new Map(ids.map(id => [id, store.rows.get(id)[3].filter(s => inGraph.has(s))]));  // found once: read often
  const srcs = id => srcMap.get(id);
  const layer = new Map();
  // longest path from leaves, iteratively over a topological order
  const topo = [], mark = new Set();
  for (const r of ids) {
    if (mark.has(r)) continue;
    const st = [[r, false]];
    while (st.length) {
      const [u, ready] = st.pop();
      if (ready) { topo.push(u); continue; }
      if (mark.has(u)) continue;
      mark.add(u); st.push([u, true]);
      for (const s of srcs(u)) if (!mark.has(s)) st.push([s, false]);
    }
  }
  for (const u of topo) layer.set(u, Math.max(0, ...srcs(u).map(s => layer.get(s) + 1)));
  const users = new Map(ids.map(id => [id, []]));
  for (const u of ids) for (const s of srcs(u)) users.get(s).push(u);
  const nl = Math.max(...layer.values()) + 1;
  const layers = Array.from({length: nl}, () => []);
  for (const u of topo) layers[layer.get(u)].push(u);
  const pos = new Map();
  const reindex = L => L.forEach((u, i) => pos.set(u, i));  // one layer: re-numbering them all per layer is quadratic
  layers.forEach(reindex);
  const bary = (u, nb) => { const xs = nb(u).map(v => pos.get(v)); return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : pos.get(u); };
  const order = (l, nb) => { const b = new Map(layers[l].map(u => [u, bary(u, nb)])); layers[l].sort((x, y) => b.get(x) - b.get(y)); reindex(layers[l]); };
  for (let sweep = 0; sweep < 4; sweep++) {
    for (let l = 1; l < nl; l++) order(l, srcs);
    for (let l = nl - 2; l >= 0; l--) order(l, v => users.get(v));
  }
  const H = 34, VGAP = 46, HGAP = 14, boxes = new Map();
  let width = 0;
  for (const L of layers) {
    let x = 0;
    for (const u of L) {
      const [l1, l2] = label(store, u, collapse);
      const w = Math.max(l1.length, l2.length) * 6.8 + 14;
      boxes.set(u, {x, y: 0, w, h: H, l1, l2});
      x += w + HGAP;
    }
    width = Math.max(width, x);
  }
  layers.forEach((L, l) => {
    const total = L.reduce((a, u) => a + boxes.get(u).w + HGAP, 0);
    const off = (width - total) / 2;
    for (const u of L) { const b = boxes.get(u); b.x += off; b.y = l * (H + VGAP); }
  });
  return {boxes, srcs, width, height: nl * (H + VGAP), count: ids.length, cut};
}

function esc(s) { return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;"); }

// draw root's graph into container (an element); mark: {id: "hl"|"new"}; returns the layout
function drawGraph(container, store, root, mark, collapse, onClick) {
  const L = layout(store, root, collapse);
  mark = {...mark};
  for (const [id, cls] of Object.entries(mark)) {  // a folded constant: mark its users, which show it in their label
    if (L.boxes.has(+id)) continue;
    for (const u of L.boxes.keys()) if (store.rows.get(u)[3].includes(+id)) mark[u] = cls;
  }
  const parts = [];
  for (const [u, b] of L.boxes) {
    const ss = L.srcs(u), n = ss.length;
    ss.forEach((s, i) => {
      const a = L.boxes.get(s); if (!a) return;
      const x1 = a.x + a.w / 2, y1 = a.y + a.h;
      const x2 = b.x + b.w * (i + 1) / (n + 1), y2 = b.y, my = (y1 + y2) / 2;
      parts.push(`<path d="M${x1},${y1} C${x1},${my} ${x2},${my} ${x2},${y2}" stroke="${EDGE_COLORS[Math.min(i, EDGE_COLORS.length - 1)]}"/>`);
    });
  }
  for (const [u, b] of L.boxes) {
    const cls = mark[u] ? "node " + mark[u] : "node";
    const op = store.rows.get(u)[0];
    parts.push(`<g class="${cls}" data-id="${u}" data-op="${op}" transform="translate(${b.x},${b.y})"><title>${esc(u + ": " + store.rows.get(u).slice(0, 3).join(" "))}</title>` +
      `<rect width="${b.w}" height="${b.h}" fill="${opColor(op)}"/><text x="7" y="14">${esc(b.l1)}</text><text x="7" y="28" fill="#556">${esc(b.l2)}</text></g>`);
  }
  const pad = 20;
  container.innerHTML = `<svg viewBox="${-pad} ${-pad} ${L.width + 2 * pad} ${L.height + pad}" preserveAspectRatio="xMidYMin meet"><g>${parts.join("")}</g></svg>`;
  panZoom(container.querySelector("svg"));
  return L;
}

// wheel to zoom at the pointer, drag to pan, by changing the viewBox
function panZoom(svg) {
  let vb = svg.viewBox.baseVal, drag = null;
  svg.addEventListener("wheel", e => {
    e.preventDefault();
    const r = svg.getBoundingClientRect(), f = e.deltaY > 0 ? 1.2 : 1 / 1.2;
    const sx = vb.x + (e.clientX - r.left) / r.width * vb.width, sy = vb.y + (e.clientY - r.top) / r.height * vb.height;
    vb.x = sx - (sx - vb.x) * f; vb.y = sy - (sy - vb.y) * f; vb.width *= f; vb.height *= f;
  }, {passive: false});
  svg.addEventListener("mousedown", e => { drag = [e.clientX, e.clientY, vb.x, vb.y]; });
  window.addEventListener("mouseup", () => { drag = null; });
  svg.addEventListener("mousemove", e => {
    if (!drag) return;
    const r = svg.getBoundingClientRect(), s = Math.max(vb.width / r.width, vb.height / r.height);
    vb.x = drag[2] - (e.clientX - drag[0]) * s; vb.y = drag[3] - (e.clientY - drag[1]) * s;
  });
}
