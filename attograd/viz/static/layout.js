// The graph layout, in a web worker so a big graph never blocks the page. A request is the nodes to place (their box
// sizes) and each one's sources; the answer comes in up to two messages: first a layered layout that costs O(nodes x
// sweeps) (what a 10k-node graph gets drawn with at once), then, for graphs up to DAGRE_MAX nodes, dagre's (the vendored
// @dagrejs/dagre: fewer crossings, routed edges), which replaces it.
"use strict";
importScripts("/static/vendor/dagre.min.js");
const DAGRE_MAX = 400;  // dagre took 5.7 s for 500 nodes on this 2-core machine under load, so bigger graphs keep the first layout
const H = 34, VGAP = 46, HGAP = 14;

// layers by longest path from the leaves, order within a layer by barycenters (4 sweeps each way)
function layered(n, srcs, widths) {
  const layer = new Int32Array(n), topo = [], mark = new Uint8Array(n);
  for (let r = 0; r < n; r++) {
    if (mark[r]) continue;
    const st = [[r, false]];
    while (st.length) {
      const [u, ready] = st.pop();
      if (ready) { topo.push(u); continue; }
      if (mark[u]) continue;
      mark[u] = 1; st.push([u, true]);
      for (const s of srcs[u]) if (!mark[s]) st.push([s, false]);
    }
  }
  let nl = 1;
  for (const u of topo) { let l = 0; for (const s of srcs[u]) l = Math.max(l, layer[s] + 1); layer[u] = l; nl = Math.max(nl, l + 1); }
  const users = Array.from({length: n}, () => []);
  for (let u = 0; u < n; u++) for (const s of srcs[u]) users[s].push(u);
  const layers = Array.from({length: nl}, () => []);
  for (const u of topo) layers[layer[u]].push(u);
  const pos = new Float64Array(n);
  const reindex = L => L.forEach((u, i) => { pos[u] = i; });
  layers.forEach(reindex);
  const bary = (u, nb) => { const v = nb[u]; if (!v.length) return pos[u]; let t = 0; for (const w of v) t += pos[w]; return t / v.length; };
  const order = (l, nb) => { const b = new Map(layers[l].map(u => [u, bary(u, nb)])); layers[l].sort((x, y) => b.get(x) - b.get(y)); reindex(layers[l]); };
  for (let sweep = 0; sweep < 4; sweep++) {
    for (let l = 1; l < nl; l++) order(l, srcs);
    for (let l = nl - 2; l >= 0; l--) order(l, users);
  }
  const x = new Float64Array(n), y = new Float64Array(n);
  let width = 0;
  const rowW = layers.map(L => L.reduce((a, u) => a + widths[u] + HGAP, 0));
  for (const w of rowW) width = Math.max(width, w);
  layers.forEach((L, l) => {
    let cx = (width - rowW[l]) / 2;
    for (const u of L) { x[u] = cx; y[u] = l * (H + VGAP); cx += widths[u] + HGAP; }
  });
  return {x, y, width, height: nl * (H + VGAP)};
}

// dagre: sources above their users, the root at the bottom (as the layered layout), boxes by their top-left corner
function withDagre(n, srcs, widths) {
  const g = new dagre.graphlib.Graph({multigraph: true});
  g.setGraph({rankdir: "TB", nodesep: HGAP, ranksep: VGAP, marginx: 0, marginy: 0});
  g.setDefaultEdgeLabel(() => ({}));
  for (let u = 0; u < n; u++) g.setNode(String(u), {width: widths[u], height: H});
  for (let u = 0; u < n; u++) srcs[u].forEach((s, i) => g.setEdge(String(s), String(u), {}, String(i)));
  dagre.layout(g);
  const x = new Float64Array(n), y = new Float64Array(n);
  for (let u = 0; u < n; u++) { const v = g.node(String(u)); x[u] = v.x - widths[u] / 2; y[u] = v.y - H / 2; }
  // each edge's route around the boxes, by (user, source position)
  const points = srcs.map((ss, u) => ss.map((s, i) => g.edge({v: String(s), w: String(u), name: String(i)}).points.map(p => [p.x, p.y])));
  // the box around the nodes and routes (a route may pass outside the nodes' span), moved to start at 0, 0
  let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
  const grow = (px, py, w, h) => { x0 = Math.min(x0, px); y0 = Math.min(y0, py); x1 = Math.max(x1, px + w); y1 = Math.max(y1, py + h); };
  for (let u = 0; u < n; u++) { grow(x[u], y[u], widths[u], H); for (const r of points[u]) for (const [px, py] of r) grow(px, py, 0, 0); }
  for (let u = 0; u < n; u++) { x[u] -= x0; y[u] -= y0; for (const r of points[u]) for (const p of r) { p[0] -= x0; p[1] -= y0; } }
  return {x, y, points, width: x1 - x0, height: y1 - y0 + VGAP};
}

onmessage = e => {
  const {req, srcs, widths} = e.data, n = widths.length;
  postMessage({req, kind: "layered", ...layered(n, srcs, widths)});
  if (n <= DAGRE_MAX) postMessage({req, kind: "dagre", ...withDagre(n, srcs, widths)});
};
