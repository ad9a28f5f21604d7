"""Attention as one kernel (flash attention's forward): `softmax(s) @ v`, where nothing else reads the probabilities,
is computed row by row with an online softmax instead of three kernels (the scores, the softmax, P @ V).

Two steps, both on the one IR:
- `fuse_attention` (tensor graph, after realize_points): the scores and the probabilities lose their buffers when the
  only reader of the probabilities is the sum with v, so the P @ V kernel computes everything;
- `flash_kernel` (kernel AST, an indexing pass): that kernel, `out[r, c] = sum_j e(r, j) / l(r) * w(j, c)` with
  `e = exp(x - max_j x)` and `l = sum_j e`, becomes one pass over the keys j per row r with a running max m, a running
  sum l and the row's outputs acc[c], rescaled by exp(m_old - m_new) when the max grows:

    for r: m = -inf; l = 0; acc[c] = 0 for every c
      for j < bound(r):   (a causal mask i >= j bounds the loop at i + 1: the keys past it are never visited)
        s = x(r, j); m' = max(m, s); k = m' == -inf ? 0 : m'   (a row masked so far adds nothing, not NaN)
        a = exp(m - k); p = exp(s - k); l = l * a + p; acc[c] = acc[c] * a + p * w(j, c) for every c; m = m'
      out[r, c] = acc[c] * (1 / l)

  The keys are taken FLASH_KEY_BLOCKS at a time (the block's max, one rescale, its exps in one loop) for a tile of
  FLASH_QUERY_TILE query rows (each key and value row read once per tile). The key and output-column loops are SERIAL
  (no Opt names them); the scores' dot products (REDUCEs over one loop) are lowered as any reduce, one loop with an
  accumulator each, their lanes chosen by the heuristics (`codegen/heuristic.py: flash_opts`).

The backward (flash attention 2's, from FLASH_BWD_MIN_BYTES of scores: sdpa's vjp recomputes P = exp(s - lse) from q, k
and the rows' logsumexp): `fuse_attention_grads` drops the buffers of the recomputed scores, probabilities, dP and dS
where only the gradient matmuls read them, `grad_kernel` makes each gradient's sum compute them once per (row, key), and
`lse_kernel` makes the forward's lse one pass over the keys. Six kernels a step (o, lse, rowsum(dO * O), dQ, dK, dV).
"""
from __future__ import annotations
import functools, math
from attograd.dtype import dtypes
from attograd.helpers import prod
from attograd.uop.ops import AxisKind, GroupOp, UOp, Ops
from attograd.codegen.lower import fresh_range_id

FLASH_MAX_COLUMNS = 256  # outputs a row keeps in registers (acc[c]): a head dimension; wider rows keep today's kernels
FLASH_KEY_BLOCKS = (8, 4, 2, 1)  # keys a step takes: the block's scores are independent dot products, its exps one loop
FLASH_QUERY_TILE = 4  # query rows a pass takes together: each key and value row is read once per tile
# a cost rule: shorter rows keep today's three kernels. Measured in one process against them, one core (AVX-512, a loaded
# machine, so +-15%): 0.73x their speed at 64 keys (16, 4, 64, 16), 0.83-0.86x at 256 (16, 6, 256, 64), 0.88x at 1024,
# 1.05-1.19x at 2048 and 0.92-1.10x at 4096, where it also never allocates the T x T scores and probabilities (two
# buffers of 6.4 GB for 16 x 6 heads of 4096). The three kernels' matmuls are register tiles of 8 rows reusing each
# load; this kernel's scores are a 4 x 8 tile whose dot products each end in a fold of 8 lanes, and its softmax is
# scalar per score (what a faster one needs: scores accumulated along the keys, not the head dimension). From 2048 keys
# split_long_sum leaves P @ V whole for it (softmax_weighted).
FLASH_MIN_KEYS = 2048
# the backward's rule (sdpa's vjp, frontend/elementwise.py): the gradients recompute the probabilities from q, k and the
# rows' logsumexp inside their kernels (fuse_attention_grads, grad_kernel; the forward a pass and lse_kernel's) instead of
# reading T x S buffers of scores, probabilities and dS, from FLASH_BWD_MIN_KEYS keys where one such buffer would take
# FLASH_BWD_MIN_BYTES. A memory rule, not a speed one: measured in one process against the buffers, one core (a loaded
# machine), causal (1, 1, 2048, 64), forward + backward: 0.64x their speed (116 ms against 75; torch 33). They recompute
# the scores in 4 passes (the forward's, the lse's, dQ's and dK's with dP, dV's) of dot products along the head dimension,
# where the buffers' matmuls are register tiles; the win is memory: a step keeps O(T) per row, where the buffers took 3 x
# B x H x T x S floats (19 GB for 16 x 6 heads of 4096 keys)
FLASH_BWD_MIN_KEYS = 2048
FLASH_BWD_MIN_BYTES = 1 << 30

def flash_backward(scores: tuple, itemsize: int, *head_dims) -> bool:
  """Does sdpa's backward recompute its probabilities (scores of shape (..., T, S) of itemsize bytes, heads of head_dims
  columns)?"""
  if not all(isinstance(n, int) for n in (*scores, *head_dims)) or scores[-1] < FLASH_BWD_MIN_KEYS: return False
  return prod(scores) * itemsize >= FLASH_BWD_MIN_BYTES and all(d <= FLASH_MAX_COLUMNS for d in head_dims)

# ***** tensor graph: which softmax @ v to fuse *****

def _through(u: UOp, *ops: Ops) -> UOp:
  while u.op in ops: u = u.src[0]
  return u

def softmax_parts(p: UOp) -> tuple[UOp, int] | None:
  """(x, axis) if p is softmax(x) along its last axis as Tensor.softmax builds it: e * recip(sum(e)), e = exp(x - max(x))."""
  if p.op is not Ops.MUL or len(p.shape) < 1: return None
  ax = len(p.shape) - 1
  for e, r in (p.src, p.src[::-1]):
    if e.op is not Ops.EXP or (rs := _through(r, Ops.EXPAND, Ops.RESHAPE)).op is not Ops.RECIP: continue
    if (s := _through(rs.src[0], Ops.RESHAPE)).op is not Ops.REDUCE_AXIS or s.arg != (Ops.ADD, (ax,)) or s.src[0] is not e: continue
    if (d := e.src[0]).op is not Ops.SUB: continue
    x, mx = d.src
    if (m := _through(mx, Ops.EXPAND, Ops.RESHAPE, Ops.DETACH)).op is not Ops.REDUCE_AXIS or m.arg != (Ops.MAX, (ax,)) or m.src[0] is not x: continue
    return x, ax
  return None

def probabilities(p: UOp) -> tuple[UOp, int] | None:
  """softmax_parts of p, or of the softmax inside where(g, 0, softmax(x)) (sdpa's rows that a mask leaves empty)."""
  if p.op is Ops.WHERE and (z := _through(p.src[1], Ops.EXPAND, Ops.RESHAPE)).op is Ops.CONST and z.arg == 0: p = p.src[2]
  return softmax_parts(p)

def softmax_weighted(red: UOp) -> bool:
  """Is red a sum over the keys of softmax probabilities times values, long enough for the fused kernel (split_long_sum
  leaves it whole for fuse_attention: its chunks would be partial sums no pass over the keys can make)?"""
  if red.op is not Ops.REDUCE_AXIS or red.arg[0] is not Ops.ADD or len(red.arg[1]) != 1 or red.src[0].op is not Ops.MUL: return False
  if red.arg[1][0] != len(red.src[0].shape) - 1: return False
  # (or a gradient of sdpa's flash backward, a sum of its recomputed probabilities: grad_kernel's)
  if isinstance(k := red.src[0].shape[-1], int) and k >= FLASH_BWD_MIN_KEYS and recomputes_probabilities(red.src[0]): return True
  for s in red.src[0].src:
    if (p := _through(s, Ops.EXPAND, Ops.RESHAPE, Ops.WITH_DERIVATIVE)) is not s and probabilities(p) is not None:
      return isinstance(k := p.shape[-1], int) and k >= FLASH_MIN_KEYS
  return False

def _users(sink: UOp) -> dict[UOp, list[UOp]]:
  users: dict[UOp, list[UOp]] = {}
  for u in sink.toposort:
    for s in u.src: users.setdefault(s, []).append(u)
  return users

def attention_pv(p: UOp, users: dict[UOp, list[UOp]]) -> UOp | None:
  """The sum over the keys of p * w that is p's only use (P @ V: p reshaped to (..., q, 1, k), expanded along v's
  columns, multiplied and summed over k), else None."""
  u = p
  while len(us := users.get(u, [])) == 1 and us[0].op in (Ops.RESHAPE, Ops.EXPAND): u = us[0]
  if len(us) != 1 or (mul := us[0]).op is not Ops.MUL or mul.src.count(u) != 1: return None
  if len(users.get(mul, [])) != 1 or (red := users[mul][0]).op is not Ops.REDUCE_AXIS or red.arg[0] is not Ops.ADD: return None
  # the reduced axis must be p's key axis: p's shape (..., q, k) read as (..., q, 1, k)
  if len(red.arg[1]) != 1 or u.shape != (*p.shape[:-1], red.src[0].shape[-2], p.shape[-1]) or red.arg[1][0] != len(u.shape) - 1: return None
  return red

def fuse_attention(sink: UOp, points: dict[UOp, str]) -> dict[UOp, str]:
  """Drop the buffers of the scores and the probabilities of a softmax @ v that nothing else reads (an inference
  forward; a training step's backward reads the probabilities, and keeps today's kernels): flash_kernel then makes the
  sum one pass over the keys."""
  users = None
  for p in [p for p, why in points.items() if p.op in (Ops.MUL, Ops.WHERE) and why == "expand"]:
    if (parts := probabilities(p)) is None: continue
    x, _ = parts
    if users is None: users = _users(sink)
    if (red := attention_pv(p, users)) is None: continue
    keys, cols = p.shape[-1], red.shape[-2]
    if not isinstance(keys, int) or keys < FLASH_MIN_KEYS or not isinstance(cols, int) or cols > FLASH_MAX_COLUMNS: continue
    # the scores (x, or the epilogue store_epilogues put over their reduce) keep their buffer if anything outside the
    # softmax reads them
    if x in points and any(v not in p.toposort for v in users.get(x, [])): continue
    # (and the exps, if stored for a second reader: the sum a training step's logsumexp reads (sdpa's flash backward),
    # which then recomputes them as the pass does)
    points = {u: w for u, w in points.items() if u is not p and u is not x and not (u.op is Ops.EXP and u.src[0].op is Ops.SUB and u.src[0].src[0] is x)}
    # and the row's max and sum, if only the pass and a logsumexp (m + log(l), stored: a training step's, which sdpa's
    # flash backward reads) read them: lse_kernel computes it in one pass over the keys of its own, as the forward's
    inside = set(p.toposort)
    row = [u for u in inside if u.op is Ops.REDUCE_AXIS and u.arg[1] == (len(x.shape) - 1,) and u in points and
           ((u.arg[0] is Ops.MAX and u.src[0] is x) or (u.arg[0] is Ops.ADD and u.src[0].op is Ops.EXP and u.src[0].src[0].op is Ops.SUB and u.src[0].src[0].src[0] is x))]
    if len(row) == 2 and all(_lse_reader(w, inside, users) for r in row for w in users.get(r, [])):
      points = {u: w for u, w in points.items() if u not in row}
  return fuse_attention_grads(sink, points, users)

def _lse_reader(u: UOp, inside: set[UOp], users: dict[UOp, list[UOp]]) -> bool:
  """Does u read a row's max or sum only for the pass (inside) or a stored logsumexp (m + log(l))?"""
  if u in inside: return True
  # (log is log2 times ln 2)
  if u.op in (Ops.RESHAPE, Ops.EXPAND, Ops.DETACH, Ops.LOG2) or (u.op is Ops.MUL and any(_through(a, Ops.EXPAND, Ops.RESHAPE).op is Ops.CONST for a in u.src)):
    return all(_lse_reader(w, inside, users) for w in users.get(u, []))
  return u.op is Ops.ADD and all(w.op is Ops.CONTIGUOUS for w in users.get(u, []))

# ***** tensor graph: the backward's recomputed probabilities *****

def _numel(u: UOp) -> int | None: return prod(u.shape) if all(isinstance(n, int) for n in u.shape) else None

def recomputes_probabilities(f: UOp) -> bool:
  """Does f read exp(scores - lse) with lse a stored row value (sdpa's backward: its contiguous logsumexp)?"""
  # (a walk of f's elementwise and movement nodes only: the exp is above the scores' sum, and every long sum of a graph
  # asks (split_long_sum), where a whole toposort each time cost O(graph))
  seen, stack = set(), [f]
  while stack:
    if (u := stack.pop()) in seen or u.op in (Ops.REDUCE_AXIS, Ops.CONTIGUOUS, Ops.BUFFER): continue
    seen.add(u)
    if u.op is Ops.EXP and u.src[0].op is Ops.SUB and _through(u.src[0].src[1], Ops.EXPAND, Ops.RESHAPE).op is Ops.CONTIGUOUS: return True
    stack.extend(u.src)
  return False

def _grad_reader_ok(u: UOp, big: dict[UOp, int], points: dict[UOp, str], users: dict[UOp, list[UOp]], memo: dict[UOp, bool]) -> bool:
  """Is u a gradient's matmul over a candidate (one of big), or elementwise or movement on the way to only such?"""
  if u in memo: return memo[u]
  memo[u] = False  # (a cycle can't happen; a node seen twice is decided once)
  if u in big: ok = True
  elif u.op is Ops.REDUCE_AXIS:  # the gradient's matmul: a sum over the keys (or the queries) with its own buffer
    k = u.src[0].shape[u.arg[1][0]] if len(u.arg[1]) == 1 else 0
    ok = u in points and u.arg[0] is Ops.ADD and len(u.arg[1]) == 1 and u.arg[1][0] == len(u.shape) - 1 and isinstance(k, int) and \
      k >= FLASH_BWD_MIN_KEYS and isinstance(c := u.shape[-2], int) and c <= FLASH_MAX_COLUMNS
  elif u in points or u.op is Ops.SINK: ok = False
  elif u.op in GroupOp.Movement or u.op in GroupOp.ALU: ok = all(_grad_reader_ok(w, big, points, users, memo) for w in users.get(u, []))
  else: ok = False
  memo[u] = ok
  return ok

def fuse_attention_grads(sink: UOp, points: dict[UOp, str], users: dict[UOp, list[UOp]] | None) -> dict[UOp, str]:
  """Drop the buffers of sdpa's backward's T x S values (the recomputed scores and probabilities, dP, dS) where every
  reader is a long sum of them times a narrow operand (a gradient's matmul): grad_kernel then computes each such value
  once per (row, key) in the sum's kernel, not once per output column."""
  cands = [f for f, why in points.items() if why in ("expand", "two_nests", "shared_reduce") and (n := _numel(f)) is not None
           and len(f.shape) >= 2 and recomputes_probabilities(f)]
  if not cands: return points
  if users is None: users = _users(sink)
  big = {f: _numel(f) for f in cands}
  memo: dict[UOp, bool] = {}
  # the candidates whose readers all are gradient matmuls (or other candidates), repeated until stable
  while True:
    bad = [f for f in big if not all(_grad_reader_ok(w, big, points, users, memo) for w in users.get(f, []))]
    if not bad: break
    for f in bad: del big[f]
    memo.clear()
  # and the T x S values inside them (the scores, dP), stopping at the stored lse: each is recomputed where it is read,
  # if nothing outside the candidates reads it
  region: set[UOp] = set()
  stack = list(big)
  while stack:
    if (u := stack.pop()) in region or u.op in (Ops.CONTIGUOUS, Ops.BUFFER): continue
    region.add(u)
    # (a stored value of another shape is read, not recomputed: the forward's output, which rowsum(dO * O) reads)
    stack.extend(w for w in u.src if w not in points or _numel(w) in big.values())
  drop = set(big) | {u for u in region if u in points and _numel(u) in big.values() and points[u] in ("expand", "two_nests", "shared_reduce", "nested")
                     and all(w in region for w in users.get(u, []))}
  # a row's value inside them (rowsum(dO * O)) is stored: recomputed, it cost a dot product per (row, key)
  rows = {u: "expand" for u in region if u.op is Ops.REDUCE_AXIS and u not in points and (m := _numel(u)) is not None and m not in big.values()}
  return {u: w for u, w in points.items() if u not in drop} | rows

# ***** kernel AST: the sum as one pass over the keys *****

def _softmax_term(t: UOp, j: UOp) -> tuple[UOp, UOp, UOp | None, UOp] | None:
  """(x, w, g, m) if t, a term of the sum over j, is e * recip(l) * w with e = exp(x - m), m a max over j and l a sum, or
  where(g, 0, e * recip(l)) * w with g the same for every j (the tensor graph was checked to be a softmax: here only
  its pieces are taken apart)."""
  if t.op is not Ops.MUL: return None
  for pe, w in (t.src, t.src[::-1]):
    g = None
    if pe.op is Ops.WHERE and pe.src[1].op is Ops.CONST and pe.src[1].arg == 0 and j not in pe.src[0].ranges: g, pe = pe.src[0], pe.src[2]
    if pe.op is not Ops.MUL: continue
    for e, rl in (pe.src, pe.src[::-1]):
      if e.op is not Ops.EXP or rl.op is not Ops.RECIP or (l := rl.src[0]).op is not Ops.REDUCE or l.arg is not Ops.ADD: continue
      if (d := e.src[0]).op is not Ops.SUB or (m := d.src[1]).op is not Ops.REDUCE or m.arg is not Ops.MAX: continue
      if j in m.ranges or j in l.ranges: continue  # the row's max and sum are over keys of their own
      return d.src[0], w, g, m
  return None

def _query_tile(rows: list[UOp], w: UOp, fid: int):
  """A tile of FLASH_QUERY_TILE query rows: the innermost row loop the tile divides that w doesn't move along (the tile's
  rows read the same key and value rows), its loop qi, the tile's size bq, the loop over tiles qo, the fresh range ids
  left, row(t) (qi as the tile's t-th row) and the output loops with qo for qi. No such loop: a tile of one row."""
  qi = next((r for r in reversed(rows) if r.src[0].op is Ops.CONST and r.src[0].arg % FLASH_QUERY_TILE == 0 and r not in w.ranges), None)
  bq = FLASH_QUERY_TILE if qi is not None else 1
  ids = iter(range(fid, fid + 64))
  qo = UOp(Ops.RANGE, qi.dtype, (UOp.const(qi.dtype, qi.src[0].arg // bq),), (next(ids), AxisKind.GLOBAL)) if qi is not None else None
  def row(t: int) -> dict[UOp, UOp]: return {} if qi is None else {qi: qo * bq + t}
  return qi, bq, qo, ids, row, [qo if r is qi else r for r in rows]

def _causal_index(x: UOp, j: UOp, j_side: int) -> UOp | None:
  """i if x is a causal mask where(i >= j, s, -inf) (j_side 1) or where(j >= i, s, -inf) (j_side 0), i not depending
  on the loop j and not negative (casts off j, and off i where they only widen it)."""
  if x.op is not Ops.WHERE or x.src[2].op is not Ops.CONST or x.src[2].arg != -math.inf: return None
  g = x.src[0]
  # a >= b is written not(a < b): CMPNE(CMPLT(a, b), True)
  if g.op is not Ops.CMPNE or g.src[1].op is not Ops.CONST or g.src[1].arg is not True or (lt := g.src[0]).op is not Ops.CMPLT: return None
  jj, i = lt.src[j_side], lt.src[1 - j_side]
  if jj.op is Ops.CAST: jj = jj.src[0]
  if i.op is Ops.CAST and i.src[0].dtype == j.dtype: i = i.src[0]
  return i if jj is j and i.dtype == j.dtype and j not in i.ranges and i.vmin >= 0 else None

def _causal_bound(x: UOp, j: UOp) -> UOp | None:
  """i + 1 if x is where(i >= j, s, -inf): the keys past i are masked, and never visited."""
  return None if (i := _causal_index(x, j, 1)) is None or i.vmax + 1 > j.src[0].vmax else i + 1

def flash_kernel(sink: UOp) -> UOp | None:
  """grad_kernel's or lse_kernel's rewrite if one applies, else the kernel `out[r, c] = sum_j softmax_j(x(r, j)) * w(j, c)` (softmax @ v with nothing else stored) rewritten to one
  pass over the keys per row (the module's docstring); None if the kernel isn't one."""
  if (g := grad_kernel(sink)) is not None or (g := lse_kernel(sink)) is not None: return g
  ends, st = [], sink.src[0] if len(sink.src) == 1 else None
  while st is not None and st.op is Ops.END: ends.append(st.src[1]); st = st.src[0]
  if st is None or st.op is not Ops.STORE or (red := st.src[1]).op is not Ops.REDUCE or red.arg is not Ops.ADD or len(red.src) != 2: return None
  if not dtypes.is_float(red.dtype) or (parts := _softmax_term(red.src[0], j := red.src[1])) is None: return None
  x, w, empty, mx = parts
  # sdpa's test for a row the mask leaves empty, max(x) == -inf (frontend/elementwise.py), is the pass's own running max
  # at the end: computed as it stands, it would be a second pass over the row's keys
  row_max = empty is not None and empty.op is Ops.CMPEQ and empty.src[0] is mx and empty.src[1].op is Ops.CONST and empty.src[1].arg == -math.inf
  # the same rule as fuse_attention's: a softmax-weighted sum that was fused anyway (a row's softmax stays in its
  # consumer's kernel) changes only where the pass is the faster; a symbolic key count (a KV cache) keeps its kernel
  if j.src[0].op is not Ops.CONST or j.src[0].arg < FLASH_MIN_KEYS: return None
  if any(u.op in (Ops.DEFINE_REG, Ops.AFTER) for u in sink.toposort): return None
  # the output loops the scores (or the empty-row test) move along: the rest are a row's columns
  rows = [r for r in ends if r in x.ranges or (empty is not None and r in empty.ranges)]
  cols = [r for r in ends if r not in rows]
  if any(r.src[0].op is not Ops.CONST for r in cols) or prod(r.src[0].arg for r in cols) > FLASH_MAX_COLUMNS: return None
  # the softmax's own max and sum are not computed: the pass needs only x and w (and the causal bound)
  fid, dt, n = fresh_range_id(sink), red.dtype, j.src[0].arg
  bk = next(b for b in FLASH_KEY_BLOCKS if n % b == 0)
  # a tile of bq query rows (the innermost row loop the tile divides) shares each key and value row it reads
  # (ends lists the loops outermost first; v must not move along it: the tile's rows read the same value rows)
  qi, bq, qo, ids, row, tile_rows = _query_tile(rows, w, fid)
  bound = _causal_bound(x, j)
  if bound is not None: bound = bound.substitute(row(bq - 1))  # the tile's last row sees the most keys
  nblocks = UOp.const(j.dtype, n // bk) if bound is None else (bound + (bk - 1)) // bk
  def serial(rs: list[UOp]) -> list[UOp]: return [UOp(Ops.RANGE, r.dtype, r.src, (next(ids), AxisKind.SERIAL)) for r in rs]
  def flat(rs: list[UOp]) -> UOp:
    out = UOp.const(j.dtype, 0)
    for r in rs: out = out * r.src[0].arg + r
    return out
  def at(t: int) -> UOp: return UOp.const(j.dtype, t)
  ncols = prod(r.src[0].arg for r in cols)
  # registers: each row's running max and sum and outputs, a block's scores and their exps
  mreg, lreg, areg, sreg, preg = (UOp(Ops.DEFINE_REG, dt.ptr(size, "reg"), (), i) for i, size in enumerate((bq, bq, bq * ncols, bq * bk, bq * bk)))
  e_init, a_init = (UOp(Ops.RANGE, j.dtype, (UOp.const(j.dtype, size),), (next(ids), AxisKind.SERIAL)) for size in (bq, bq * ncols))
  inits = UOp(Ops.NOOP, dtypes.void, (UOp(Ops.NOOP, dtypes.void, (mreg.after(*tile_rows).index(e_init).store(UOp.const(dt, -math.inf)),
                                                                   lreg.after(*tile_rows).index(e_init).store(UOp.const(dt, 0)))).end(e_init),
                                      areg.after(*tile_rows).index(a_init).store(UOp.const(dt, 0)).end(a_init)))
  block = UOp(Ops.RANGE, j.dtype, (nblocks,), (next(ids), AxisKind.SERIAL))
  # the tile's scores, written out: dot products over the same loop, which lowering gives one loop with an accumulator
  # each (independent chains of multiply-adds, a register tile's), where a loop over the keys ran them one by one
  scores = UOp(Ops.NOOP, dtypes.void, tuple(sreg.after(inits, block).index(at(t * bk + u)).store(x.substitute({j: block * bk + u, **row(t)}))
                                            for t in range(bq) for u in range(bk)))
  c_upd = serial(cols)
  wv = [w.substitute({j: block * bk + u, **dict(zip(cols, c_upd))}) for u in range(bk)]
  updates, news = [], []
  for t in range(bq):
    sv = [sreg.after(scores).index(at(t * bk + u)).load() for u in range(bk)]
    m_old = mreg.after(inits, block).index(at(t)).load()
    m_new = functools.reduce(lambda a, b: a.maximum(b), sv, m_old)
    # a row whose keys so far are all masked has m' = -inf: shifting by 0 there adds exp(-inf) = 0, where -inf - -inf is NaN
    shift = m_new.eq(UOp.const(dt, -math.inf)).where(UOp.const(dt, 0), m_new)
    scale = UOp(Ops.EXP, dt, (m_old - shift,))
    # the block's exps in a loop, which the C compiler vectorizes (written out, each was a scalar polynomial)
    e = UOp(Ops.RANGE, j.dtype, (UOp.const(j.dtype, bk),), (next(ids), AxisKind.SERIAL)) if bk > 1 else UOp.const(j.dtype, 0)
    exps = preg.index(e + t * bk).store(UOp(Ops.EXP, dt, (sreg.after(scores).index(e + t * bk).load() - shift,)))
    exps = exps.end(e) if bk > 1 else exps
    pv = [preg.after(exps).index(at(t * bk + u)).load() for u in range(bk)]
    l_new = functools.reduce(lambda a, b: a + b, pv, lreg.after(inits, block).index(at(t)).load() * scale)
    acc = areg.after(inits, block, *c_upd).index(flat(c_upd) + t * ncols).load() * scale
    for u in range(bk): acc = acc + pv[u] * wv[u]
    updates.append(areg.index(flat(c_upd) + t * ncols).store(acc))
    news += [lreg.index(at(t)).store(l_new), mreg.index(at(t)).store(m_new)]
  body = UOp(Ops.NOOP, dtypes.void, (UOp(Ops.NOOP, dtypes.void, tuple(updates)).end(*c_upd), *news)).end(block)
  stores = []
  for t in range(bq):
    c_out = serial(cols)
    inv = UOp(Ops.RECIP, dt, (lreg.after(body).index(at(t)).load(),))
    sub = {**dict(zip(cols, c_out)), **row(t)}
    value = areg.after(body, *c_out).index(flat(c_out) + t * ncols).load() * inv
    # a row the mask leaves empty is 0 (torch's safe softmax), whatever the pass computed for it
    if empty is not None:
      gone = mreg.after(body).index(at(t)).load().eq(UOp.const(dt, -math.inf)) if row_max else empty.substitute(sub)
      value = gone.where(UOp.const(dt, 0), value)
    stores.append(st.src[0].substitute(sub).store(value).end(*c_out))
  return UOp(Ops.NOOP, dtypes.void, tuple(stores)).end(*tile_rows).sink()

# ***** kernel AST: a gradient's sum of recomputed probabilities, each computed once per (row, key) *****

def _factors(u: UOp) -> list[UOp]: return [f for s in u.src for f in _factors(s)] if u.op is Ops.MUL else [u]

def _causal_first(x: UOp, j: UOp) -> UOp | None:
  """i if x is where(j >= i, s, -inf) (a key gradient's sum over the queries j: the queries before key i are masked,
  and never visited)."""
  return None if (i := _causal_index(x, j, 0)) is None or i.vmax > j.src[0].vmax else i

def grad_kernel(sink: UOp) -> UOp | None:
  """The kernel `out[r, c] = sum_j f(r, j) * w(j, c)` where f reads a sum of its own (sdpa's flash backward: the
  probabilities and dS recomputed from q, k, v; schedule: fuse_attention_grads) rewritten so f is computed once per (row,
  key), not once per output column: a tile of FLASH_QUERY_TILE rows, keys FLASH_KEY_BLOCKS at a time, their f in
  registers, then every column's accumulator updated; causal keys outside the mask never visited. None if the kernel
  isn't one."""
  ends, st = [], sink.src[0] if len(sink.src) == 1 else None
  while st is not None and st.op is Ops.END: ends.append(st.src[1]); st = st.src[0]
  if st is None or st.op is not Ops.STORE or (red := st.src[1]).op is not Ops.REDUCE or red.arg is not Ops.ADD or len(red.src) != 2: return None
  j = red.src[1]
  if not dtypes.is_float(red.dtype) or j.src[0].op is not Ops.CONST or (n := j.src[0].arg) < FLASH_BWD_MIN_KEYS: return None
  if any(u.op in (Ops.DEFINE_REG, Ops.AFTER) for u in sink.toposort): return None
  facs = _factors(red.src[0])
  costly = [f for f in facs if any(u.op is Ops.REDUCE for u in f.toposort)]
  if not costly: return None
  rows = [r for r in ends if any(r in f.ranges for f in costly)]
  cols = [r for r in ends if r not in rows]
  fs, ws = [f for f in facs if not any(r in f.ranges for r in cols)], [f for f in facs if any(r in f.ranges for r in cols)]
  if not ws or any(u.op is Ops.REDUCE for w in ws for u in w.toposort) or not recomputes_row_values(fs): return None
  if any(r.src[0].op is not Ops.CONST for r in cols) or (ncols := prod(r.src[0].arg for r in cols)) > FLASH_MAX_COLUMNS: return None
  f, w = functools.reduce(lambda a, b: a * b, fs), functools.reduce(lambda a, b: a * b, ws)
  fid, dt = fresh_range_id(sink), red.dtype
  bk = next(b for b in FLASH_KEY_BLOCKS if n % b == 0)
  qi, bq, qo, ids, row, tile_rows = _query_tile(rows, w, fid)
  # the causal bounds: keys past the tile's last row (a query's gradient), queries before its first row (a key's)
  wheres = [u for u in f.toposort if u.op is Ops.WHERE]
  last = next((b for x in wheres if (b := _causal_bound(x, j)) is not None), None)
  first = next((b for x in wheres if (b := _causal_first(x, j)) is not None), None)
  start = UOp.const(j.dtype, 0) if first is None else first.substitute(row(0)) // bk
  stop = UOp.const(j.dtype, n // bk) if last is None else (last.substitute(row(bq - 1)) + (bk - 1)) // bk
  def serial(rs: list[UOp]) -> list[UOp]: return [UOp(Ops.RANGE, r.dtype, r.src, (next(ids), AxisKind.SERIAL)) for r in rs]
  def flat(rs: list[UOp]) -> UOp:
    out = UOp.const(j.dtype, 0)
    for r in rs: out = out * r.src[0].arg + r
    return out
  def at(t: int) -> UOp: return UOp.const(j.dtype, t)
  freg, areg, xreg, ereg = (UOp(Ops.DEFINE_REG, dt.ptr(size, "reg"), (), i) for i, size in enumerate((bq * bk, bq * ncols, bq * bk, bq * bk)))
  a_init = UOp(Ops.RANGE, j.dtype, (UOp.const(j.dtype, bq * ncols),), (next(ids), AxisKind.SERIAL))
  inits = areg.after(*tile_rows).index(a_init).store(UOp.const(dt, 0)).end(a_init)
  block = UOp(Ops.RANGE, j.dtype, (stop - start,), (next(ids), AxisKind.SERIAL))
  key = lambda u: (start + block) * bk + u
  # the probabilities' exp (f's one exp along the keys): its arguments written out, then the exps in one loop, which the C
  # compiler vectorizes (written out, each was a scalar polynomial), then the rest of f from them
  ex = [u for u in f.toposort if u.op is Ops.EXP and j in u.ranges]
  if len(ex) == 1:
    args = UOp(Ops.NOOP, dtypes.void, tuple(xreg.after(inits, block).index(at(t * bk + u)).store(ex[0].src[0].substitute({j: key(u), **row(t)}))
                                            for t in range(bq) for u in range(bk)))
    e = UOp(Ops.RANGE, j.dtype, (UOp.const(j.dtype, bq * bk),), (next(ids), AxisKind.SERIAL))
    exps = ereg.index(e).store(UOp(Ops.EXP, dt, (xreg.after(args).index(e).load(),))).end(e)
    def f_at(t: int, u: int) -> UOp: return f.substitute({ex[0]: ereg.after(exps).index(at(t * bk + u)).load()}).substitute({j: key(u), **row(t)})
  else:
    def f_at(t: int, u: int) -> UOp: return f.substitute({j: key(u), **row(t)})
  vals = UOp(Ops.NOOP, dtypes.void, tuple(freg.after(inits, block).index(at(t * bk + u)).store(f_at(t, u)) for t in range(bq) for u in range(bk)))
  c_upd = serial(cols)
  wv = [w.substitute({j: key(u), **dict(zip(cols, c_upd))}) for u in range(bk)]
  updates = []
  for t in range(bq):
    acc = areg.after(inits, block, *c_upd).index(flat(c_upd) + t * ncols).load()
    for u in range(bk): acc = acc + freg.after(vals).index(at(t * bk + u)).load() * wv[u]
    updates.append(areg.index(flat(c_upd) + t * ncols).store(acc))
  body = UOp(Ops.NOOP, dtypes.void, tuple(updates)).end(*c_upd).end(block)
  stores = []
  for t in range(bq):
    c_out = serial(cols)
    sub = {**dict(zip(cols, c_out)), **row(t)}
    stores.append(st.src[0].substitute(sub).store(areg.after(body, *c_out).index(flat(c_out) + t * ncols).load()).end(*c_out))
  return UOp(Ops.NOOP, dtypes.void, tuple(stores)).end(*tile_rows).sink()

def recomputes_row_values(fs: list[UOp]) -> bool:
  """Is the product fs sdpa's recomputed probabilities (exp of something minus a loaded row value, its lse), as
  fuse_attention_grads left them in the kernel?"""
  return any(u.op is Ops.EXP and u.src[0].op is Ops.SUB and u.src[0].src[1].op is Ops.LOAD for f in fs for u in f.toposort)

# ***** kernel AST: a row's logsumexp in one pass (what sdpa's flash backward reads of its forward) *****

def _same_shape_of(a: UOp, b: UOp) -> bool:
  """Are a and b the same expression but for the ids of their loops (RANGE args)?"""
  def key(u: UOp) -> tuple: return tuple((v.op, v.dtype, None if v.op is Ops.RANGE else v.arg, len(v.src)) for v in u.toposort)
  return a is b or key(a) == key(b)

def _lse_parts(v: UOp) -> tuple[UOp, UOp, UOp] | None:
  """(x, j, ln2) if v is max_j x + log2(sum_j' exp(x' - max x)) * ln2 (m + log(l), as Tensor.log writes it)."""
  if v.op is not Ops.ADD: return None
  for m, lg in (v.src, v.src[::-1]):
    if m.op is not Ops.REDUCE or m.arg is not Ops.MAX or lg.op is not Ops.MUL: continue
    for l2, c in (lg.src, lg.src[::-1]):
      if l2.op is not Ops.LOG2 or c.op is not Ops.CONST or (l := l2.src[0]).op is not Ops.REDUCE or l.arg is not Ops.ADD: continue
      x, j = m.src
      e = l.src[0]
      if e.op is not Ops.EXP or e.src[0].op is not Ops.SUB or (m2 := e.src[0].src[1]).op is not Ops.REDUCE or m2.arg is not Ops.MAX: continue
      # the same x each time, up to the ids of the loops lowering gave each copy (its own key loop, its dot product's)
      if not _same_shape_of(e.src[0].src[0], x) or not _same_shape_of(m2.src[0], x): continue
      return x, j, c
  return None

def lse_kernel(sink: UOp) -> UOp | None:
  """The kernel `lse[r] = max_j x(r, j) + log(sum_j exp(x(r, j) - max_j x(r, j)))` (its max and sum inline: fuse_attention
  dropped their buffers) rewritten as one pass over the keys with a running max and sum (flash_kernel's, with no output
  columns), a tile of FLASH_QUERY_TILE rows, causal keys past the tile never visited. None if the kernel isn't one."""
  ends, st = [], sink.src[0] if len(sink.src) == 1 else None
  while st is not None and st.op is Ops.END: ends.append(st.src[1]); st = st.src[0]
  if st is None or st.op is not Ops.STORE or (parts := _lse_parts(st.src[1])) is None: return None
  x, j, ln2 = parts
  if not dtypes.is_float(x.dtype) or j.src[0].op is not Ops.CONST or (n := j.src[0].arg) < FLASH_BWD_MIN_KEYS: return None
  if any(u.op in (Ops.DEFINE_REG, Ops.AFTER) for u in sink.toposort) or any(r not in x.ranges for r in ends): return None
  fid, dt = fresh_range_id(sink), x.dtype
  bk = next(b for b in FLASH_KEY_BLOCKS if n % b == 0)
  qi = next((r for r in reversed(ends) if r.src[0].op is Ops.CONST and r.src[0].arg % FLASH_QUERY_TILE == 0), None)
  bq = FLASH_QUERY_TILE if qi is not None else 1
  ids = iter(range(fid, fid + 64))
  qo = UOp(Ops.RANGE, qi.dtype, (UOp.const(qi.dtype, qi.src[0].arg // bq),), (next(ids), AxisKind.GLOBAL)) if qi is not None else None
  def row(t: int) -> dict[UOp, UOp]: return {} if qi is None else {qi: qo * bq + t}
  tile_rows = [qo if r is qi else r for r in ends]
  bound = _causal_bound(x, j)
  nblocks = UOp.const(j.dtype, n // bk) if bound is None else (bound.substitute(row(bq - 1)) + (bk - 1)) // bk
  def at(t: int) -> UOp: return UOp.const(j.dtype, t)
  mreg, lreg, sreg, preg = (UOp(Ops.DEFINE_REG, dt.ptr(size, "reg"), (), i) for i, size in enumerate((bq, bq, bq * bk, bq * bk)))
  e_init = UOp(Ops.RANGE, j.dtype, (UOp.const(j.dtype, bq),), (next(ids), AxisKind.SERIAL))
  inits = UOp(Ops.NOOP, dtypes.void, (mreg.after(*tile_rows).index(e_init).store(UOp.const(dt, -math.inf)),
                                      lreg.after(*tile_rows).index(e_init).store(UOp.const(dt, 0)))).end(e_init)
  block = UOp(Ops.RANGE, j.dtype, (nblocks,), (next(ids), AxisKind.SERIAL))
  scores = UOp(Ops.NOOP, dtypes.void, tuple(sreg.after(inits, block).index(at(t * bk + u)).store(x.substitute({j: block * bk + u, **row(t)}))
                                            for t in range(bq) for u in range(bk)))
  news = []
  for t in range(bq):
    sv = [sreg.after(scores).index(at(t * bk + u)).load() for u in range(bk)]
    m_old = mreg.after(inits, block).index(at(t)).load()
    m_new = functools.reduce(lambda a, b: a.maximum(b), sv, m_old)
    shift = m_new.eq(UOp.const(dt, -math.inf)).where(UOp.const(dt, 0), m_new)  # (a row masked so far adds 0, not NaN)
    e = UOp(Ops.RANGE, j.dtype, (UOp.const(j.dtype, bk),), (next(ids), AxisKind.SERIAL)) if bk > 1 else UOp.const(j.dtype, 0)
    exps = preg.index(e + t * bk).store(UOp(Ops.EXP, dt, (sreg.after(scores).index(e + t * bk).load() - shift,)))
    exps = exps.end(e) if bk > 1 else exps
    pv = [preg.after(exps).index(at(t * bk + u)).load() for u in range(bk)]
    l_new = functools.reduce(lambda a, b: a + b, pv, lreg.after(inits, block).index(at(t)).load() * UOp(Ops.EXP, dt, (m_old - shift,)))
    news += [lreg.index(at(t)).store(l_new), mreg.index(at(t)).store(m_new)]
  body = UOp(Ops.NOOP, dtypes.void, tuple(news)).end(block)
  stores = []
  for t in range(bq):
    m, l = mreg.after(body).index(at(t)).load(), lreg.after(body).index(at(t)).load()
    stores.append(st.src[0].substitute(row(t)).store(m + UOp(Ops.LOG2, dt, (l,)) * ln2))
  return UOp(Ops.NOOP, dtypes.void, tuple(stores)).end(*tile_rows).sink()
