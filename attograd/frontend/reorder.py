"""Ops that reorder or combine elements: scans, sort and topk, cat/stack/split, roll, triangles.

Everything is built from the lazy primitives (pad, shrink, expand, where, reductions), so gradients
come for free. Scans (cumsum, cumprod, cummax/cummin, logcumsumexp) and sort avoid Python loops over elements:
- a short scan (n <= _SCAN_DIRECT) is a reduce over an (n, n) triangle mask (`j <= i` from two aranges):
  output i reduces the inputs j <= i, one fused kernel. A longer one scans blocks of _SCAN_BLOCK that
  way, scans the block totals (recursively) and combines each block with the total of the blocks
  before it: O(n * _SCAN_BLOCK) work in O(log n / log _SCAN_BLOCK) levels of one or two kernels each.
  (Hillis-Steele doubling would take log2(n) kernels of O(n) each: more kernels, more passes over memory.)
- a short sort (n <= _RANK_SORT_MAX) is rank based: rank[i] = number of elements that come before
  element i (ties broken by index, NaN last as in torch), then output k picks the element whose rank is
  k (a one-hot reduce against an arange): O(n^2) work, 2 kernels. A longer one sorts one unsigned 64-bit key per
  element that orders like torch's stable sort: the value mapped to an order-preserving 32-bit word (NaN largest,
  -0.0 equal to 0.0, complemented when descending) above the element's index, so every key is unique. The row is
  padded to a power of two P; blocks of _SORT_BLOCK are sorted by counting, then runs are merged in pairs, two kernels
  per level: each key's place in the merged pair is its index in its run plus the number of keys of the other run below
  it (a search whose steps read several entries at once, see _search), then a scatter puts every key at its place:
  O(P log P) reads in 2 log2(P/_SORT_BLOCK) + 3 kernels. The key graphs are built as UOps directly (no gradient flows
  through keys, and a level is a few hundred nodes, which through the Tensor API would cost ~30 us each), and once per
  shape (_templated): a later sort of that shape is two CALL nodes over its input (uop/ops.py), whose realize finds the
  schedule by those few nodes, where rebuilding and walking the thousands of the sort's graph took ~9 ms of a 100k sort.
  The indices are the keys' low bits; the values are read from the input at them: exact, and differentiable (when a
  gradient may flow, the read also checks the inverse permutation, found by searching the sorted keys, so the
  backward reads one element per element too). 64-bit dtypes don't fit value and index in one word: they sort twice
  (low word, then high word, each pass's key holding the position in the last pass's order, which keeps it stable).
- topk of k much smaller than n: the k wanted keys all lie in the k chunks (of _TOPK_CHUNK) with the best chunk
  maxima, so the chunk maxima's top k (recursively) name those chunks and the answer is the top k of their k*C keys.
  A short row's top k (the maxima's, the candidates') is a chain of k max reduces in one kernel, each over the keys below
  the one before, for small k (_chain_largest: O(k m)), else picked by rank. topk(10) of 100k: the chunk maxima, the
  chain over them, the chain over the 320 candidates, the values: 4 kernels of O(n) work in all. Larger k sorts.
- median takes the stable sort's (n-1)//2-th element (the first NaN if any): a row from _SELECT_MIN long (of a dtype up
  to 32 bits) selects it without sorting, a radix selection of the sort's keys (_radix_select: a histogram per 7-bit
  digit, O(n) each), a shorter one sorts. unique sorts, marks where the sorted value changes and reads those marks back
  to size its outputs."""
from __future__ import annotations
import math
from typing import Sequence
from attograd.errors import ArgumentError
from attograd.helpers import gc_paused
from attograd.frontend.pairs import ValuesIndices
from attograd.dtype import dtypes, least_upper_dtype
from attograd.uop.ops import UOp, Ops, Template, device_leaf
from attograd.frontend.replay import replayed

# scans of rows up to _SCAN_DIRECT long are one triangle reduce; longer ones go by blocks of _SCAN_BLOCK (bench/sort.py:
# cumsum of 1M is fastest near 32; logcumsumexp pays an exp per triangle entry, so it takes blocks of 8)
_SCAN_DIRECT, _SCAN_BLOCK = 64, 32
_RANK_SORT_MAX = 64  # rows up to this long sort by rank (2 kernels, O(n^2)); longer ones by a merge sort
_SORT_BLOCK = 64  # the merge sort starts from blocks of this many sorted by counting
_TOPK_RANK_MAX, _TOPK_CHUNK = 512, 32  # topk of small k: rows up to this long by rank, longer ones by chunks of this
_RANK_INLINE_MAX = 1 << 22  # a pick by rank counts each candidate's rank in place up to this many compares
# topk of k up to _CHAIN_K_MAX over rows of m keys with k * m up to _CHAIN_WORK: k max reduces in a chain, each over the keys
# below the one before, all in one kernel of k passes over the row (topk(10) of 100k: 4 kernels, where picks by rank took 10)
_CHAIN_K_MAX, _CHAIN_WORK = 16, 1 << 16

# ***** key graphs, built as UOps: the sort's keys need no gradient and no checks, and a merge level is ~14 nodes per
# search step (through the Tensor API each node costs ~30 us of Python, which a sort of 100k would spend 150 ms on) *****
U64, I64 = dtypes.uint64, dtypes.int64

def _full(v: int, dtype, shape: tuple[int, ...], device: str) -> UOp:
  c = device_leaf(Ops.CONST, dtype, device, v)
  return c.reshape((1,) * len(shape)).expand(shape)

def _iota(shape: tuple[int, ...], axis: int, device: str) -> UOp:
  """0..shape[axis]-1 along axis (int64), broadcast to shape."""
  i = device_leaf(Ops.IOTA, I64, device, shape[axis])
  return i.reshape(tuple(s if a == axis else 1 for a, s in enumerate(shape))).expand(shape)

def _bin(op: Ops, a: UOp, b: UOp | int) -> UOp:
  if isinstance(b, int): b = _full(b, a.dtype, a.shape, a.device)
  return UOp(op, dtypes.bool if op in (Ops.CMPLT, Ops.CMPEQ, Ops.CMPNE) else a.dtype, (a, b))

def _take(table: UOp, idx: UOp) -> UOp:
  """table (.., 1, L) expanded rows, idx (.., m, 1) int64: (.., m, 1) with table[.., idx]; an index outside [0, L)
  reads 0. A one-hot sum the scheduler turns into one load (collapse_one_hot)."""
  shape = (*idx.shape[:-1], table.shape[-1])
  hit = UOp(Ops.CMPEQ, dtypes.bool, (idx.expand(shape), _iota(shape, len(shape) - 1, idx.device)))
  return UOp(Ops.WHERE, table.dtype, (hit, table.expand(shape), _full(0, table.dtype, shape, idx.device))).reduce_axis(Ops.ADD, (len(shape) - 1,))

def _where(c: UOp, a: UOp, b: UOp) -> UOp: return UOp(Ops.WHERE, a.dtype, (c, a, b))

def _block_sort(keys: UOp, B: int) -> UOp:
  """keys (R, P) of unique uint64, each block of B sorted by counting: an element's rank is the number of keys of its
  block below it, and output t picks the key of rank t. O(B) per element in 2 kernels, no search steps."""
  R, P = keys.shape
  full, dev = (R, P // B, B, B), keys.device
  rows, cols = keys.reshape((R, P // B, B, 1)).expand(full), keys.reshape((R, P // B, 1, B)).expand(full)
  rank = UOp(Ops.CAST, I64, (UOp(Ops.CMPLT, dtypes.bool, (cols, rows)),)).reduce_axis(Ops.ADD, (3,))  # (.., i, 1)
  rank = UOp(Ops.CONTIGUOUS, I64, (rank,))  # stored: inlined, the pick would count every rank again for each t
  hit = UOp(Ops.CMPEQ, dtypes.bool, (rank.reshape((R, P // B, 1, B)).expand(full), _iota(full, 2, dev)))
  return _where(hit, cols, _full(0, U64, full, dev)).reduce_axis(Ops.ADD, (3,)).reshape((R, P))

def _largest_by_rank(keys: UOp, k: int) -> UOp:
  """The k largest of unique uint64 keys (R, m), largest first: output t picks the key with t keys above it. The counts
  are made in place, O(k m^2) in one kernel, up to _RANK_INLINE_MAX compares (they vectorize: 31 us for k=10, m=320,
  where storing the ranks first took a kernel more and 100-200 us); past that they are stored first (O(m^2), 2 kernels)."""
  R, m = keys.shape
  full, dev = (R, m, m), keys.device
  rows, cols = keys.reshape((R, m, 1)).expand(full), keys.reshape((R, 1, m)).expand(full)
  above = UOp(Ops.CAST, I64, (UOp(Ops.CMPLT, dtypes.bool, (rows, cols)),)).reduce_axis(Ops.ADD, (2,))  # (R, i, 1)
  if k * m * m > _RANK_INLINE_MAX: above = UOp(Ops.CONTIGUOUS, I64, (above,))
  full = (R, k, m)
  hit = UOp(Ops.CMPEQ, dtypes.bool, (above.reshape((R, 1, m)).expand(full), _iota(full, 1, dev)))
  return _where(hit, keys.reshape((R, 1, m)).expand(full), _full(0, U64, full, dev)).reduce_axis(Ops.ADD, (2,)).reshape((R, k))

def _largest(keys: UOp, k: int, unit: int = 1, source=None) -> UOp:
  """The k largest of unique uint64 keys (R, m) whose low 32 bits hold an element index, largest first, for k much
  smaller than m. Short rows by rank; longer ones by chunks of _TOPK_CHUNK: the k largest keys are all in the k chunks
  with the largest maxima (any other chunk's max has k keys above it), so the chunk maxima's k largest (recursively)
  name k chunks, and the answer is the k largest of their k*C keys. O(m) work in a few kernels. `unit`: how many of
  the first level's elements one of these keys stands for (a chunk max's index names its chunk by index // unit).
  `source` (table, key_of): the candidates' keys are key_of(table read at their positions, positions), so keys
  computed from the input are computed again there rather than stored for the whole row."""
  R, m = keys.shape
  if k == 1 or (k <= _CHAIN_K_MAX and k * m <= _CHAIN_WORK): return _chain_largest(keys, k)  # (k = 1: a max, one kernel)
  if m <= _TOPK_RANK_MAX: return _largest_by_rank(keys, k)
  C = _TOPK_CHUNK
  if k * C * 2 > m:  # the chunks would keep half the row or more: sort it (complemented: the largest come first)
    ones = (1 << 64) - 1
    return _bin(Ops.XOR, _sorted_keys(_bin(Ops.XOR, keys, ones)).shrink(((0, R), (0, k))), ones)
  nc, dev = -(-m // C), keys.device
  padded = keys.pad(((0, 0), (0, nc * C - m)))  # zero keys: below every real one
  maxima = UOp(Ops.CONTIGUOUS, U64, (padded.reshape((R, nc, C)).reduce_axis(Ops.MAX, (2,)).reshape((R, nc)),))
  kc = min(k, nc)
  top = _largest(maxima, kc, unit * C)  # (R, kc)
  # (a chain's output is stored: inlined into the gathers below, its k passes would each get a kernel)
  if kc <= _CHAIN_K_MAX: top = UOp(Ops.CONTIGUOUS, U64, (top,))
  low = _bin(Ops.AND, _bin(Ops.XOR, top, (1 << 64) - 1), 0xFFFFFFFF)  # the key complemented holds the index
  chunk = _bin(Ops.IDIV, UOp(Ops.CAST, I64, (low,)), unit * C)  # (R, kc)
  shape = (R, kc, C)
  pos = _bin(Ops.ADD, _bin(Ops.MUL, chunk.reshape((R, kc, 1)).expand(shape), C), _iota(shape, 2, dev)).reshape((R, kc * C, 1))
  table, key_of = source if source is not None else (keys, lambda v, p: v)
  cand = key_of(_take(table.reshape((R, 1, m)), pos), pos)
  cand = _where(_bin(Ops.CMPLT, pos, m), cand, _full(0, U64, cand.shape, dev)).reshape((R, kc * C))
  return _largest(cand, k, unit)

_templates: dict[tuple, Template] = {}
_TEMPLATES_KEPT = 64

def _templated(build, x: UOp, *args) -> tuple[UOp, ...]:
  """The outputs of build(x, *args) (the sources of the SINK it returns, or its one result), where the graph depends on
  x only through x's shape, dtype and device: built once per those (and args) over a stand-in leaf, kept as a Template,
  and given as CALL nodes over x (uop/ops.py): a later call of that shape makes a node per output, and its realize finds
  the schedule by walking those few nodes, not the thousands of a sort's key graph (a sort of 100k, CPU time to build
  its graph: 45-54 ms built each call, 11-18 ms rebuilt from the template, ~0 as a CALL). On several devices (a sharded
  x) the graph is rebuilt over x instead."""
  key = (build, x.shape, x.dtype, x.device, args)
  if (t := _templates.get(key)) is None:
    dev = UOp(Ops.DEVICE, dtypes.void, (), x.device)
    leaf = UOp(Ops.CONST, x.dtype, (dev,), "stand-in").reshape((1,) * len(x.shape)).expand(x.shape)
    if len(_templates) >= _TEMPLATES_KEPT: del _templates[next(iter(_templates))]  # the oldest: a bounded cache
    with gc_paused(): t = _templates[key] = Template((leaf,), build(leaf, *args))
  if isinstance(x.device, str): return t.calls(x)
  with gc_paused(): root = t(x)  # hundreds to thousands of acyclic nodes: no collection (helpers.gc_paused)
  return root.src if root.op is Ops.SINK else (root,)

def _sorted_keys(keys: UOp) -> UOp:
  """Unique uint64 keys (R, m) sorted along the row: padded to a power of two P with keys above every real one, blocks
  of _SORT_BLOCK sorted by counting, then two kernels per merge level. (R, P), the first m being the real keys."""
  return _templated(_build_sorted_keys, keys, _SORT_BLOCK, _SEARCH_WAYS)[0]

def _build_sorted_keys(keys: UOp, block: int, ways: int) -> UOp:
  R, m = keys.shape
  P = 1 << (m - 1).bit_length()
  if P > m:  # padding: the largest keys, each its own (2**64-1-j), above any real key's index part
    at = UOp(Ops.CAST, U64, (_iota((R, P), 1, keys.device),))
    # (m - 1 - at wraps around to 2**64 - 1 - (at - m))
    keys = _where(_bin(Ops.CMPLT, at, m), keys.pad(((0, 0), (0, P - m))), _bin(Ops.SUB, _full(m - 1, U64, (R, P), keys.device), at))
  B = min(P, block)
  keys, L = _block_sort(keys, B), B  # a scatter's output (as each level's): stored already
  while L < P: keys, L = _merge(keys, L, ways), 2 * L
  return keys

# a search step reads this many - 1 entries at once and narrows by this factor. Sort of 100k, sum of each kernel's best
# time over 6 runs, two alternating runs each: 2 ways 40-50 ms, 4 ways 21-22, 8 ways 23-26; 4 has half the probes of 8,
# so about half the graph to build and schedule
_SEARCH_WAYS = 4

def _search(table: UOp, q: UOp, L: int, ways: int = _SEARCH_WAYS) -> UOp:
  """How many entries of sorted runs of L (a power of two) are below each query: table (.., 1, L) expanded rows, q
  (.., m, 1), int64 (.., m, 1). Each step reads ways - 1 evenly spaced entries of the candidates left (loads that don't
  wait on each other) and counts those below: log_ways(L) + 1 dependent steps, not log2(L) + 1 (the loads' latency, not
  their number, bounds a search). Every read is inside the run (the count before a step of stride s and r ways is at
  most L - r*s), so the gathers need no checks."""
  c, M = _full(0, I64, q.shape, q.device), L
  while M > 1:
    r = min(ways, M)
    s = M // r
    below = [UOp(Ops.CAST, I64, (_bin(Ops.CMPLT, _take(table, _bin(Ops.ADD, c, j * s - 1)), q),)) for j in range(1, r)]
    n = below[0]
    for b in below[1:]: n = _bin(Ops.ADD, n, b)
    c, M = _bin(Ops.ADD, c, n if s == 1 else _bin(Ops.MUL, n, s)), s
  return _where(_bin(Ops.CMPLT, _take(table, c), q), _bin(Ops.ADD, c, 1), c)  # c <= L - 1 here, L after

def _count_below(table: UOp, q: UOp) -> UOp:
  """For a sorted (non-decreasing) uint64 table (R, P), P a power of two, and queries q (R, m): how many entries of the
  row are below each query (at most P - 1: a query that is in the row, or below its last entry), int64 (R, m). For
  unique keys that is the query's position."""
  R, P = table.shape
  m = q.shape[1]
  c = _search(table.reshape((R, 1, P)), q.reshape((R, m, 1)), P).reshape((R, m))
  return _where(_bin(Ops.CMPLT, c, P - 1), c, _full(P - 1, I64, (R, m), q.device))

def _merge(keys: UOp, L: int, ways: int) -> UOp:
  """keys (R, P) of unique uint64 in sorted runs of L: runs merged in pairs, by rank. Element i of a run lands at i plus
  the number of keys of the other run below it (_search), then a scatter puts each key at its place. Two kernels a level:
  the positions (split across the cores), then the scatter (one pass, a load and a store per key)."""
  R, P = keys.shape
  Q, dev = P // (2 * L), keys.device
  k = keys.reshape((R, Q, 2, L))
  table = k.flip((False, False, True, False)).reshape((R, Q, 2, 1, L))  # the other run of each element's pair
  shape = (R, Q, 2, L, 1)
  c = _search(table, k.reshape(shape), L, ways)
  pos = UOp(Ops.CONTIGUOUS, I64, (_bin(Ops.ADD, c, _iota(shape, 3, dev)),)).reshape((R, Q, 1, 2, L))
  full = (R, Q, 2 * L, 2, L)
  hit = UOp(Ops.CMPEQ, dtypes.bool, (pos.expand(full), _iota(full, 2, dev)))
  picked = _where(hit, k.reshape((R, Q, 1, 2, L)).expand(full), _full(0, U64, full, dev))
  return picked.reduce_axis(Ops.ADD, (3, 4)).reshape((R, P))

def _chain_largest(keys: UOp, k: int) -> UOp:
  """The k largest of unique uint64 keys (.., m) along the last axis, largest first, (.., k): the first is the max, each
  next one the max of the keys below the one before (zero keys, below every real one, fill a row shorter than k). One
  kernel of k passes over the row: the passes' maxima are scalars of the row, the output t selects the t-th."""
  shape, ax, dev = keys.shape, len(keys.shape) - 1, keys.device
  out_shape = (*shape[:-1], k)
  # left[t] = t - j + 1 at step j: output t takes each step's max up to step t. (One constant for every step: a node per
  # step fewer than comparing t with each j, and nodes are what a call's Python time goes by)
  left, one, none = _iota(out_shape, ax, dev), _full(1, I64, out_shape, dev), _full(0, I64, out_shape, dev)
  top = keys.reduce_axis(Ops.MAX, (ax,))
  out, zero = top.expand(out_shape), _full(0, U64, shape, dev)
  # the keys below the last max as keys & -(key < max), not a select of key or 0: branch-free, and a loop gcc 12 can
  # vectorize (AVX-512's vpmaxuq; over the select it can't). One core, the chain over topk(10) of 100k's 3125 chunk
  # maxima, alternating in one process: 43 -> 37 us median (its cost model still leaves a loop of 3125 scalar)
  for _ in range(1, k):
    below = _bin(Ops.SUB, zero, UOp(Ops.CAST, U64, (_bin(Ops.CMPLT, keys, top.expand(shape)),)))
    top = _bin(Ops.AND, keys, below).reduce_axis(Ops.MAX, (ax,))
    out = _where(_bin(Ops.CMPLT, none, left), top.expand(out_shape), out)
    left = _bin(Ops.SUB, left, one)
  return out

# a selection (the median) by radix: digits of at most _RADIX_BITS, a histogram (scatter-add) per digit
_RADIX_BITS, _SELECT_MIN = 7, 1024  # rows from _SELECT_MIN long select; shorter ones sort (a few kernels, O(n^2) work)

def _radix_select(keys: UOp, bits: int, rank: UOp) -> UOp:
  """The key of the given rank (0 = smallest) of each row of unique uint64 keys (R, n) below 2**bits, rank (R, 1) int64:
  (R, 1). A digit at a time from the top: a histogram of the digit over the keys whose higher digits are those chosen
  so far (a scatter-add, O(n)); the digit is the number of buckets whose running count (a triangle over the 2**d
  buckets, O(4**d)) stays at or below the rank, and the rank drops by the count of the buckets before it. The state
  between digits is one word a row, the digits chosen above the rank left: keys are unique, so fewer than 2**s of them
  share a prefix with s bits below it, and the rank fits in those bits. Three kernels a digit (the histogram, the running
  counts, the next state): ceil(bits / _RADIX_BITS) digits."""
  R, n = keys.shape
  dev, L = keys.device, -(-bits // _RADIX_BITS)
  d = -(-bits // L)  # the digits' width, as even as can be; the top one may hold leading zeros (L * d >= bits)
  nb = 1 << d
  state = UOp(Ops.CAST, U64, (rank,))
  full, tri, col = (R, nb, n), (R, nb, nb), (R, nb, 1)
  upto = UOp(Ops.CMPLT, dtypes.bool, (_iota(tri, 1, dev), _iota(tri, 2, dev)))  # [b, b2]: b < b2, not in b's running count
  below_b = lambda c: UOp(Ops.CMPLT, dtypes.bool, (_iota(col, 1, dev), c.reshape((R, 1, 1)).expand(col)))
  for level in range(L):
    shift = (L - 1 - level) * d
    q = _bin(Ops.AND, state, (1 << (shift + d)) - 1)  # the rank within the keys of the prefix chosen so far
    digit = _bin(Ops.AND, _bin(Ops.SHR, keys, shift), nb - 1) if shift else _bin(Ops.AND, keys, nb - 1)
    if level:  # keys under another prefix get a digit out of range: they add nothing
      same = _bin(Ops.CMPEQ, _bin(Ops.SHR, keys, shift + d), _bin(Ops.SHR, state, shift + d).expand((R, n)))
      digit = _where(same, digit, _full(nb, U64, (R, n), dev))
    e = UOp(Ops.CAST, I64, (digit,)).reshape((R, 1, n)).expand(full)
    hit = UOp(Ops.CMPEQ, dtypes.bool, (e, _iota(full, 1, dev)))
    hist = _where(hit, _full(1, U64, full, dev), _full(0, U64, full, dev)).reduce_axis(Ops.ADD, (2,))  # (R, nb, 1): a scatter-add
    cum = _where(upto, _full(0, U64, tri, dev), hist.reshape((R, 1, nb)).expand(tri)).reduce_axis(Ops.ADD, (2,))  # (R, nb, 1)
    within = UOp(Ops.CMPLT, dtypes.bool, (cum, _bin(Ops.ADD, q, 1).reshape((R, 1, 1)).expand(col)))  # running count <= q
    chosen = UOp(Ops.CAST, U64, (within,)).reduce_axis(Ops.ADD, (1,)).reshape((R, 1))
    before = _where(below_b(chosen), hist, _full(0, U64, col, dev)).reduce_axis(Ops.ADD, (1,)).reshape((R, 1))
    # the prefix (state's bits above shift + d) and the digit, above the rank left
    top = _bin(Ops.OR, _bin(Ops.SUB, state, q), _bin(Ops.SHL, chosen, shift)) if level else _bin(Ops.SHL, chosen, shift)
    state = UOp(Ops.CONTIGUOUS, U64, (_bin(Ops.OR, top, _bin(Ops.SUB, q, before)),))
  return state

def _median_indices(x: UOp, T: type) -> UOp:
  """The int64 index (R, 1) of each row's lower median of x (R, n), the element at the stable sort's position (n-1)//2,
  or the row's first NaN (NaN sorts last: at n - the number of NaNs), by _radix_select of keys that order like the
  stable sort: the 32-bit order word above the element's index."""
  R, n = x.shape
  t, ib = T(x), max((n - 1).bit_length(), 1)
  if dtypes.is_float(x.dtype):
    nans = t.isnan().sum(1, keepdim=True)
    pos = (nans > 0).where(n - nans, (n - 1) // 2)
  else: pos = T.full((R, 1), (n - 1) // 2, dtype=dtypes.int64, device=x.device)
  keys = _bin(Ops.OR, _bin(Ops.SHL, t._order_word(False, 32).uop, ib), UOp(Ops.CAST, U64, (_iota((R, n), 1, x.device),)))
  key = T(_radix_select(keys, 32 + ib, pos.uop))
  return (key & ((1 << ib) - 1)).cast(dtypes.int64).minimum(n - 1).uop

def _topk_indices(x: UOp, k: int, largest: bool, T: type) -> UOp:
  """The int64 indices (R, k) of the k largest (smallest) of x (R, n) along the row, in order, by _largest of keys that
  order like the sort (ties by index), complemented so that the wanted ones are the largest."""
  R, n = x.shape
  def key_of(v: UOp, i: UOp) -> UOp:
    w = T(v)._order_word(largest, 32).uop
    return _bin(Ops.XOR, _bin(Ops.OR, _bin(Ops.SHL, w, 32), UOp(Ops.CAST, U64, (i,))), (1 << 64) - 1)
  top = _largest(key_of(x, _iota((R, n), 1, x.device)), k, 1, (x, key_of))
  return ((T(top) ^ ((1 << 64) - 1)) & 0xFFFFFFFF).cast(dtypes.int64).minimum(n - 1).uop

def _sort_pair(x: UOp, descending: bool, T: type) -> UOp:
  """SINK(values, indices) of the stable sort of x along its last axis, where no gradient flows (_merge_sort). The rows
  are made one axis (R, n) and back inside the template: reshapes made each call were nodes to build and walk too."""
  lead, n = x.shape[:-1], x.shape[-1]
  v, i = T(x.reshape((math.prod(lead), n)))._merge_sort_rows(descending, False)
  return UOp(Ops.SINK, dtypes.void, (v.uop.reshape(x.shape), i.uop.reshape(x.shape)))

def _topk_pair(x: UOp, k: int, largest: bool, T: type) -> UOp:
  """SINK(values, indices) of topk along the last axis of x: the values' gather is in the template too (through the
  Tensor API it cost a third of a call's graph building), and the reshapes to rows (R, n) and back."""
  lead, n = x.shape[:-1], x.shape[-1]
  rows = x.reshape((math.prod(lead), n))
  idx = T(_topk_indices(rows, k, largest, T))
  return UOp(Ops.SINK, dtypes.void, (T(rows)._gather(1, idx).uop.reshape((*lead, k)), idx.uop.reshape((*lead, k))))

def _axis(axis: int, ndim: int, extra: int = 0) -> int:
  n = max(ndim + extra, 1)
  if not isinstance(axis, int) or not -n <= axis < n: raise IndexError(f"dim {axis} is out of range for a tensor of {ndim} dimension(s)")
  return axis % n

# the scans' blocked recursions, at module level: a nested function that calls itself is a reference cycle (it holds its
# own cell), and each call's cycle would keep the tensor it closes over until the cycle collector's next pass
def _blocked_scan(x, tri, fill, combine, B: int):
  """_scan along the last axis: tri(x) for short rows, else tri within blocks of B and the scan of the blocks' totals
  folded into each block by combine."""
  n, lead = x.shape[-1], x.shape[:-1]
  if n <= _SCAN_DIRECT: return tri(x)
  nb = -(-n // B)
  inner = tri(x.pad(tuple((0, 0) for _ in lead) + ((0, nb * B - n),), value=fill).reshape(*lead, nb, B)).contiguous()
  totals = _blocked_scan(inner.shrink(tuple((0, s) for s in lead) + ((0, nb), (B - 1, B))).reshape(*lead, nb), tri, fill, combine, B)
  before = totals.pad(tuple((0, 0) for _ in lead) + ((1, 0),), value=fill).shrink(tuple((0, s) for s in lead) + ((0, nb),))
  return combine(before.unsqueeze(-1), inner).reshape(*lead, nb * B).shrink(tuple((0, s) for s in lead) + ((0, n),))

def _blocked_cummax(x, where_from, tri, low, isf: bool):
  """cummax along the last axis as (values, indices), by blocks like _blocked_scan, carrying the index along."""
  n, lead = x.shape[-1], x.shape[:-1]
  if n <= _SCAN_DIRECT: return tri(x, where_from)
  B = _SCAN_BLOCK
  nb = -(-n // B)
  pad = tuple((0, 0) for _ in lead) + ((0, nb * B - n),)
  g = type(x).arange(n, device=x.device, dtype=dtypes.int64).expand(*lead, n) if where_from is None else where_from
  v, i = tri(x.pad(pad, value=low).reshape(*lead, nb, B), g.pad(pad).reshape(*lead, nb, B))
  v, i = v.contiguous(), i.contiguous()
  last = tuple((0, s) for s in lead) + ((0, nb), (B - 1, B))
  tv, ti = _blocked_cummax(v.shrink(last).reshape(*lead, nb), i.shrink(last).reshape(*lead, nb), tri, low, isf)
  shift = lambda t, fill: t.pad(tuple((0, 0) for _ in lead) + ((1, 0),), value=fill).shrink(tuple((0, s) for s in lead) + ((0, nb),)).unsqueeze(-1)
  bv, bi = shift(tv, low), shift(ti, 0)
  # the blocks before win only when strictly larger, or when they saw a NaN and this block's prefix didn't
  take = (bv > v) | (bv.isnan() & v.isnan().logical_not()) if isf else (bv > v)
  out = lambda t: t.reshape(*lead, nb * B).shrink(tuple((0, s) for s in lead) + ((0, n),))
  return out(take.where(bv, v)), out(take.where(bi, i))

class ReorderOps:
  __slots__ = ()  # Tensor defines the slots

  # ***** combining and splitting *****
  def cat(self, *args, dim: int = 0):
    """torch.cat: Tensor.cat(a, b, dim=0) or a.cat(b, dim=0); a list/tuple of tensors works as well."""
    if isinstance(self, (list, tuple)) and len(args) == 1 and isinstance(args[0], int): dim, args = args[0], ()  # torch.cat(xs, 1)
    tensors = [self, *args]
    if len(tensors) == 1 and isinstance(self, (list, tuple)): tensors = list(self)
    if not tensors: raise ArgumentError("cat needs at least one tensor")
    for t in tensors:
      if not isinstance(t, ReorderOps): raise TypeError(f"cat expects Tensors, got {type(t).__name__}")
    first = tensors[0]
    if first.ndim == 0 or any(t.ndim == 0 for t in tensors): raise ArgumentError("zero-dimensional tensors cannot be concatenated")
    for t in tensors:
      if t.device != first.device: raise ArgumentError(f"cat of tensors on different devices: {first.device} and {t.device}")
    # as in torch, 1-D empty tensors are skipped (a legacy rule), but still take part in dtype promotion
    kept = [t for t in tensors if t.shape != (0,)] or tensors[:1]
    ref = kept[0]
    d = _axis(dim, ref.ndim)
    for t in kept:
      if t.ndim != ref.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, ref.shape)) if i != d):
        raise ArgumentError(f"cat: shapes {ref.shape} and {t.shape} must match except in dim {d}")
    dt = first.dtype
    for t in tensors[1:]: dt = least_upper_dtype(dt, t.dtype)
    kept = [t.cast(dt) for t in kept if t.shape[d] != 0] or [kept[0].cast(dt)]  # empty pieces add nothing
    if len(kept) == 1: return kept[0]
    total, off, out = sum(t.shape[d] for t in kept), 0, None
    for t in kept:
      n = t.shape[d]
      pos = tuple((off, total - off - n) if i == d else (0, 0) for i in range(t.ndim))
      # with int sizes, the node pad() builds for these amounts (none negative, not all 0), without its argument parsing:
      # a stack of a model's 30 gradient norms (clipping by global norm) took 2.5 ms
      p = type(t)(UOp(Ops.PAD, dt, (t.uop,), pos)) if type(total) is int else t.pad(pos)
      off += n
      # (pieces of one shape and dtype: the node `out + p` (`out | p` for bools) builds, directly)
      if out is None: out = p
      elif type(total) is int: out = type(t)(UOp(Ops.OR if dt == dtypes.bool else Ops.ADD, dt, (out.uop, p.uop)))
      else: out = out | p if dt == dtypes.bool else out + p
    return out

  # (replayed: clipping by global norm stacks a model's 30 gradient norms every step, 89 nodes and as many Tensors built
  # through cat, one CALL replayed. A list argument, torch.stack(xs, 1), is built as it is)
  @replayed
  def stack(self, *args, dim: int = 0):
    """torch.stack: Tensor.stack(a, b, dim=0) or a.stack(b, dim=0)."""
    if isinstance(self, (list, tuple)) and len(args) == 1 and isinstance(args[0], int): dim, args = args[0], ()  # torch.stack(xs, 1)
    tensors = list(self) if isinstance(self, (list, tuple)) and not args else [self, *args]
    if not tensors: raise ArgumentError("stack needs at least one tensor")
    for t in tensors:
      if t.shape != tensors[0].shape: raise ArgumentError(f"stack expects tensors of equal shape, got {tensors[0].shape} and {t.shape}")
    d = _axis(dim, tensors[0].ndim, extra=1)
    if len(tensors) > 1 and type(math.prod(shape := tensors[0].shape)) is int:
      # the pieces, read by cat alone, reshaped as nodes of their own, not as views of the tensors (a view is registered
      # with its base, for a write to the base to reach it: a model's 30 gradient norms stacked, each a new base)
      shape = shape[:d] + (1,) + shape[d:]
      pieces = [type(t)(UOp(Ops.RESHAPE, t.dtype, (t.uop,), shape)) for t in tensors]
      return pieces[0].cat(*pieces[1:], dim=d)
    return tensors[0].unsqueeze(d).cat(*[t.unsqueeze(d) for t in tensors[1:]], dim=d)

  def split(self, sizes: int | Sequence[int], dim: int = 0) -> tuple:
    """torch.split: chunks of `sizes` elements (the last may be smaller), or one piece per entry of a list."""
    if self.ndim == 0: raise ArgumentError("split of a 0-d tensor")
    d = _axis(dim, self.ndim)
    n = self.shape[d]
    if isinstance(sizes, int):
      if sizes <= 0 and not (sizes == 0 and n == 0): raise ArgumentError(f"split size must be positive, got {sizes}")
      sizes = [min(sizes, n - i) for i in range(0, n, sizes)] if n else [0]
    sizes = list(sizes)
    if any(not isinstance(s, int) or s < 0 for s in sizes): raise ArgumentError(f"split sizes {sizes} must be non-negative ints")
    if sum(sizes) != n: raise ArgumentError(f"split sizes {sizes} sum to {sum(sizes)}, but dim {d} has size {n}")
    out, off = [], 0
    for s in sizes:
      out.append(self.shrink(tuple((off, off + s) if i == d else None for i in range(self.ndim))))
      off += s
    return tuple(out)

  def chunk(self, chunks: int, dim: int = 0) -> tuple:
    """torch.chunk: pieces of ceil(n / chunks) elements, so there may be fewer than `chunks` of them."""
    if not isinstance(chunks, int) or chunks <= 0: raise ArgumentError(f"chunk count must be a positive int, got {chunks}")
    if self.ndim == 0: raise ArgumentError("chunk of a 0-d tensor")
    d = _axis(dim, self.ndim)
    n = self.shape[d]
    if n == 0: return tuple(self for _ in range(chunks))  # torch returns `chunks` empty pieces
    return self.split(math.ceil(n / chunks), d)

  def repeat_interleave(self, repeats: int | Sequence[int], dim: int | None = None):
    """torch.repeat_interleave: each element repeated `repeats` times along dim (dim None: over the
    flattened tensor). `repeats` may also be one count per element (a list, or a 1-D int Tensor, which
    is read back to the host as torch does), built as a cat of one piece per element."""
    x = self.flatten() if dim is None else self
    d = 0 if dim is None else _axis(dim, x.ndim)
    if x.ndim == 0: x = x.reshape(1)
    sh = x.shape
    if isinstance(repeats, ReorderOps):
      if repeats.ndim > 1 or dtypes.is_float(repeats.dtype): raise ArgumentError(f"repeats must be 0-d or 1-d ints, got {repeats.dtype} of shape {repeats.shape}")
      repeats = repeats.tolist()
    if isinstance(repeats, (list, tuple)):
      if len(repeats) == 1: repeats = repeats[0]
      else:
        if len(repeats) != sh[d]: raise ArgumentError(f"repeats has {len(repeats)} entries, but dim {d} has size {sh[d]}")
        if any(not isinstance(r, int) or r < 0 for r in repeats): raise ArgumentError(f"repeats {list(repeats)} must be non-negative ints")
        parts = [x.shrink(tuple((i, i + 1) if a == d else None for a in range(x.ndim))).repeat_interleave(r, d) for i, r in enumerate(repeats)]
        if not parts: return x
        return parts[0].cat(*parts[1:], dim=d)
    if not isinstance(repeats, int) or repeats < 0: raise ArgumentError(f"repeats must be a non-negative int, got {repeats}")
    return x.unsqueeze(d + 1).expand(*sh[:d + 1], repeats, *sh[d + 1:]).reshape(*sh[:d], sh[d] * repeats, *sh[d + 1:])

  def roll(self, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None):
    """torch.roll: element i moves to i + shift (wrapping). dims None: roll the flattened tensor."""
    if dims is None:
      if not isinstance(shifts, int): raise ArgumentError(f"roll without dims takes a single shift, got {shifts}")
      return self.flatten().roll(shifts, 0).reshape(self.shape)
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    if len(shifts) != len(dims): raise ArgumentError(f"roll: shifts {shifts} and dims {dims} must have the same length")
    x = self
    for s, dm in zip(shifts, dims):
      d = _axis(dm, self.ndim)
      n = x.shape[d]
      if n == 0 or s % n == 0: continue
      s %= n
      a, b = x.split([n - s, s], d)
      x = b.cat(a, dim=d)
    return x

  def _tri_mask(self, diagonal: int, upper: bool):
    if self.ndim < 2: raise ArgumentError(f"{'triu' if upper else 'tril'} needs a tensor of at least 2 dimensions, got shape {self.shape}")
    r, c = self.shape[-2:]
    rows = type(self).arange(r, device=self.device).reshape(r, 1)
    cols = type(self).arange(c, device=self.device).reshape(1, c)
    return (cols - rows >= diagonal) if upper else (cols - rows <= diagonal)
  def tril(self, diagonal: int = 0):
    return self._tri_mask(diagonal, False).where(self, self.zeros_like())
  def triu(self, diagonal: int = 0):
    return self._tri_mask(diagonal, True).where(self, self.zeros_like())

  def meshgrid(self, *args, indexing: str = "ij") -> tuple:
    """torch.meshgrid: Tensor.meshgrid(x, y, indexing='ij') or x.meshgrid(y)."""
    if indexing not in ("ij", "xy"): raise ArgumentError(f"meshgrid indexing must be 'ij' or 'xy', got {indexing!r}")
    ts = [self, *args]
    for t in ts:
      if t.ndim > 1: raise ArgumentError(f"meshgrid expects 0-d or 1-d tensors, got shape {t.shape}")
    ts = [t.reshape(-1) for t in ts]
    if indexing == "xy" and len(ts) >= 2: ts[0], ts[1] = ts[1], ts[0]
    shape = tuple(t.shape[0] for t in ts)
    out = [t.reshape(tuple(-1 if i == k else 1 for i in range(len(ts)))).expand(shape) for k, t in enumerate(ts)]
    if indexing == "xy" and len(ts) >= 2: out[0], out[1] = out[1], out[0]
    return tuple(out)

  def _pad_mode(self, pairs: Sequence[tuple[int, int]], mode: str):
    """pad with mode 'reflect', 'replicate' or 'circular', given ((before, after), ...) per axis."""
    if mode not in ("reflect", "replicate", "circular"):
      raise ArgumentError(f"padding mode {mode!r} is not one of 'constant', 'reflect', 'replicate', 'circular'")
    x = self
    for d, (b, a) in enumerate(pairs):
      if (b, a) == (0, 0): continue
      n = x.shape[d]
      if b < 0 or a < 0: raise ArgumentError(f"{mode} padding {(b, a)} of dim {d}: negative padding is only supported in constant mode")
      if mode == "reflect" and (b >= n or a >= n):
        raise ArgumentError(f"reflect padding {(b, a)} of dim {d} must be less than its size {n}")
      if mode == "circular" and (b > n or a > n):
        raise ArgumentError(f"circular padding {(b, a)} of dim {d} must be at most its size {n}")
      if mode == "replicate" and n == 0: raise ArgumentError(f"replicate padding of dim {d}, which is empty")
      def part(lo: int, hi: int, x=x, d=d): return x.shrink(tuple((lo, hi) if i == d else None for i in range(x.ndim)))
      def rep(t, k: int, d=d): return t.expand(tuple(k if i == d else s for i, s in enumerate(t.shape)))
      if mode == "reflect": before, after = part(1, b + 1).flip(d), part(n - 1 - a, n - 1).flip(d)
      elif mode == "replicate": before, after = rep(part(0, 1), b), rep(part(n - 1, n), a)
      else: before, after = part(n - b, n), part(0, a)
      x = before.cat(x, after, dim=d)
    return x

  # ***** reductions *****
  def logsumexp(self, axis=None, keepdim: bool = False, *, dim=None):
    """log(sum(exp(x))) computed stably around the (detached) max; all -inf gives -inf, as in torch."""
    if dim is not None: axis = dim
    if self.ndim == 0: self._axes(axis); return self._float_unary()  # a one-element reduce (the axis is checked)
    x = self if dtypes.is_float(self.dtype) else self.cast(dtypes.default_float)
    if x.numel() == 0: return x.exp().sum(axis, keepdim).log()
    m = x.amax(axis, keepdim=True).detach()
    m = m.isinf().where(0.0, m)
    out = (x - m).exp().sum(axis, keepdim=True).log() + m
    return out if keepdim else out.squeeze(axis) if isinstance(axis, int) else out.reshape(x.sum(axis).shape)

  def var_mean(self, axis=None, keepdim: bool = False, correction: int = 1, *, dim=None, unbiased=None) -> tuple:
    return self.var(axis, keepdim, correction, dim=dim, unbiased=unbiased), self.mean(axis, keepdim, dim=dim)
  def std_mean(self, axis=None, keepdim: bool = False, correction: int = 1, *, dim=None, unbiased=None) -> tuple:
    return self.std(axis, keepdim, correction, dim=dim, unbiased=unbiased), self.mean(axis, keepdim, dim=dim)

  # ***** scans: a reduce over the (n, n) triangle j <= i, blocked for long rows *****
  def _scan(self, axis: int, dtype, fill, reduce, combine, block: int = 0):
    """An inclusive scan along axis: a masked reduce over the (n, n) triangle for short rows, else
    blocked (see the module docstring). `reduce(masked, axis)` reduces the triangle, `combine(before, x)`
    folds the total of everything before a block into each of its elements, `fill` is the identity."""
    d = _axis(axis, self.ndim)
    x = (self.reshape(1) if self.ndim == 0 else self.transpose(d, -1)).cast(dtype)
    def tri(x):
      n = x.shape[-1]
      ar = type(self).arange(n, device=self.device)
      return reduce((ar.reshape(1, n) <= ar.reshape(n, 1)).where(x.unsqueeze(-2).expand(*x.shape[:-1], n, n), fill), -1)
    out = _blocked_scan(x, tri, fill, combine, block or _SCAN_BLOCK)
    return out.reshape(()) if self.ndim == 0 else out.transpose(d, -1)

  def cumsum(self, axis: int = 0, *, dim=None):
    """torch.cumsum; ints and bools accumulate in int64 as in torch."""
    if dim is not None: axis = dim
    dt = dtypes.int64 if not dtypes.is_float(self.dtype) else self.dtype
    return self._scan(axis, dt, 0, lambda t, a: t.sum(a, dtype=dt), lambda b, x: b + x)
  def cumprod(self, axis: int = 0, *, dim=None):
    if dim is not None: axis = dim
    dt = dtypes.int64 if not dtypes.is_float(self.dtype) else self.dtype
    return self._scan(axis, dt, 1, lambda t, a: t.prod(a, dtype=dt), lambda b, x: b * x)
  def cummax(self, axis: int = 0, *, dim=None) -> tuple:
    """torch.cummax: (values, int64 indices); the index is the latest position of the max, and a NaN
    sticks once seen, as in torch. Long rows go by blocks like the other scans, carrying the index along."""
    if dim is not None: axis = dim
    d = _axis(axis, self.ndim)
    x = self.reshape(1) if self.ndim == 0 else self.transpose(d, -1)
    if x.numel() == 0: return ValuesIndices(self, self.zeros_like(dtype=dtypes.int64))
    T, isf = type(self), dtypes.is_float(self.dtype)
    low = -math.inf if isf else dtypes.min(self.dtype)
    def tri(x, where_from):
      """(running max, index of its latest occurrence: where_from at that position, or the position itself)."""
      n = x.shape[-1]
      ar = T.arange(n, device=self.device)
      mask = ar.reshape(1, n) <= ar.reshape(n, 1)
      xe = x.unsqueeze(-2).expand(*x.shape[:-1], n, n)
      vals = mask.where(xe, T.full((), low, dtype=self.dtype, device=self.device)).amax(-1, keepdim=True)
      if isf: vals = (mask & xe.isnan()).any(-1, keepdim=True).where(math.nan, vals)
      hit = mask & ((xe == vals) | (xe.isnan() & vals.isnan()) if isf else (xe == vals))
      j = T.arange(n, device=self.device, dtype=dtypes.int64)
      pos = hit.where(j, -1).amax(-1)
      if where_from is None: return vals.squeeze(-1), pos
      return vals.squeeze(-1), (j == pos.unsqueeze(-1)).where(where_from.unsqueeze(-2), 0).sum(-1)
    v, i = _blocked_cummax(x, None, tri, low, isf)
    # torch's gradient goes to the index it returns (the latest of tied maxima); through the reductions above it was shared
    if isf and self._may_need_grad(): v = x.gather(-1, i)
    if self.ndim == 0: return ValuesIndices(v.reshape(()), i.reshape(()))
    return ValuesIndices(v.transpose(d, -1), i.transpose(d, -1))
  def cummin(self, axis: int = 0, *, dim=None) -> tuple:
    """torch.cummin, through cummax of the order-reversed values."""
    if dim is not None: axis = dim
    if self.dtype == dtypes.bool: v, i = self.logical_not().cummax(axis); return ValuesIndices(v.logical_not(), i)
    if dtypes.is_float(self.dtype): v, i = (-self).cummax(axis); return ValuesIndices(-v, i)
    v, i = (~self).cummax(axis)
    return ValuesIndices(~v, i)
  def logcumsumexp(self, axis: int = 0, *, dim=None):
    """torch.logcumsumexp: a stable logsumexp over each prefix (masked entries are -inf)."""
    if dim is not None: axis = dim
    s = self if dtypes.is_float(self.dtype) else self.cast(dtypes.default_float)
    if s.numel() == 0: return s
    def logaddexp(b, x):
      m = b.maximum(x).detach()
      m = m.isinf().where(0.0, m)
      return ((b - m).exp() + (x - m).exp()).log() + m
    return s._scan(axis, s.dtype, -math.inf, lambda t, a: t.logsumexp(a), logaddexp, block=8)

  # ***** sort: rank by counting, then a one-hot gather by rank (short rows); a merge sort of unique keys (long ones) *****
  def _order_word(self, descending: bool, bits: int):
    """An unsigned `bits`-wide integer (in uint64) that orders like torch's sort does the values: NaN
    largest, -0.0 equal to 0.0; complemented when descending, so NaN comes first there as in torch."""
    u64, top = dtypes.uint64, 1 << (bits - 1)
    if dtypes.is_float(self.dtype):
      f = self.cast(dtypes.float32) if bits == 32 else self
      # one zero and one NaN (its word set as an int: a NaN constant in a graph would never match the schedule cache)
      w = (f == 0).where(0.0, f).bitcast(dtypes.uint32 if bits == 32 else u64).cast(u64)
      w = f.isnan().where(0x7FC00000 if bits == 32 else 0x7FF8000000000000, w)
      w = (w >= top).where(w ^ ((1 << bits) - 1), w | top)  # negatives: all bits flipped; positives: sign bit set
    elif self.dtype == dtypes.bool or dtypes.is_unsigned(self.dtype): w = self.cast(u64)
    elif bits == 32: w = (self.cast(dtypes.int64) + top).cast(u64)
    else: w = self.bitcast(u64) ^ top
    return w ^ ((1 << bits) - 1) if descending else w

  def _merge_sort(self, descending: bool) -> tuple:
    """(values, int64 indices) of the rows of self along the last axis by merge sorts of unique keys: one pass over the
    32-bit order word, or for 64-bit dtypes two (low word, then high word: each pass keeps the order of the last one
    among equal words, its position being the key's low half). Where no gradient flows, the whole sort is a template
    (two CALL nodes: _sort_pair)."""
    if not self._may_need_grad(): return tuple(type(self)(u) for u in _templated(_sort_pair, self.uop, descending, type(self)))
    return self._merge_sort_rows(descending, True)

  def _merge_sort_rows(self, descending: bool, grad: bool) -> tuple:
    n, lead = self.shape[-1], self.shape[:-1]
    R, P, T, mask = math.prod(lead), 1 << (n - 1).bit_length(), type(self), 0xFFFFFFFF
    wide = self.dtype.itemsize > 4
    w = self._order_word(descending, 64 if wide else 32).reshape(R, n)
    order = pos = None  # the input index at each position of the order so far, and each input's position in it
    for word in ([w & mask, w >> 32] if wide else [w]):
      word = word.pad(((0, 0), (0, P - n)), value=mask)  # padding sorts last: the largest word, indices past n
      if order is not None: word = word._gather(1, order)
      start = _bin(Ops.OR, _bin(Ops.SHL, word.uop, 32), UOp(Ops.CAST, U64, (_iota((R, P), 1, self.device),)))
      keys = _sorted_keys(start)
      # the minimum changes nothing (the keys' low halves are positions below P) but bounds index math: it stays int32
      step = (T(keys) & mask).cast(dtypes.int64).minimum(P - 1)
      order = step if order is None else order._gather(1, step)
      if grad:
        moved = T(_count_below(keys, start)).contiguous()
        pos = moved if pos is None else moved._gather(1, pos)
    idx, x = order[:, :n].minimum(n - 1), self.reshape(R, n)
    if not grad: vals = x._gather(1, idx)
    else:
      # values[p] = x[idx[p]], written as a sum over r of (r == idx[p] and pos[r] == p) ? x[r] : 0 with pos the inverse
      # permutation (found by searching the sorted keys): the forward reads one element per output, and so does the
      # gradient, a sum over p of the same condition (a plain gather's gradient would sum over all n outputs for each r)
      ar = T.arange(n, device=self.device)
      hit = (idx.unsqueeze(-1) == ar) & (pos[:, :n].unsqueeze(-2) == ar.reshape(n, 1))
      vals = hit.where(x.unsqueeze(-2), x.zeros_like().unsqueeze(-2)).sum(-1, dtype=x.dtype)
    return vals.reshape(*lead, n), idx.reshape(*lead, n)

  def _topk_small(self, k: int, largest: bool) -> tuple:
    """(values, int64 indices) of the k largest (smallest) along the last axis, k small next to n: by chunk maxima
    of keys that order like the sort (ties by index), complemented so the wanted ones are the largest."""
    n, lead = self.shape[-1], self.shape[:-1]
    R, T = math.prod(lead), type(self)
    if k == 0:
      idx = T.zeros(R, 0, dtype=dtypes.int64, device=self.device)
      vals = self.reshape(R, n)._gather(1, idx)
    elif not self._may_need_grad(): return tuple(T(u) for u in _templated(_topk_pair, self.uop, k, largest, T))
    else:  # the values gathered outside the template, where their gradient flows
      idx = T(_templated(_topk_indices, self.uop.reshape((R, n)), k, largest, T)[0])
      vals = self.reshape(R, n)._gather(1, idx)
    return vals.reshape(*lead, k), idx.reshape(*lead, k)

  def _long_sort(self, descending: bool) -> tuple:
    if self.shape[-1] >= 1 << 31: raise NotImplementedError(f"sort of rows of {self.shape[-1]} elements (at most 2**31 - 1)")
    return self._merge_sort(descending) if 0 not in self.shape else (self, self.zeros_like(dtype=dtypes.int64))

  def _rank(self, descending: bool):
    """(x with axis last, rank of each element along it); ties keep index order, NaN sorts as the largest."""
    n = self.shape[-1]
    xi, xj = self.unsqueeze(-1), self.unsqueeze(-2)  # (..., i, 1) and (..., 1, j)
    if self.dtype == dtypes.bool: xi, xj = xi.cast(dtypes.uint8), xj.cast(dtypes.uint8)
    before = (xj > xi) if descending else (xj < xi)
    same = xj == xi
    if dtypes.is_float(self.dtype):
      ni, nj = xi.isnan(), xj.isnan()
      before = (before | (nj & ni.logical_not())) if descending else (before | (ni & nj.logical_not()))
      same = same | (ni & nj)
    ar = type(self).arange(n, device=self.device)
    earlier = ar.reshape(1, n) < ar.reshape(n, 1)  # [i, j]: j < i
    return (before | (same & earlier)).sum(-1)  # (..., i) int64

  def _by_rank(self, k: int, descending: bool) -> tuple:
    """The first k elements (along the last axis) in sorted order, and their indices."""
    n = self.shape[-1]
    rank = self._rank(descending)
    pos = type(self).arange(k, device=self.device, dtype=dtypes.int64)
    onehot = rank.unsqueeze(-2) == pos.reshape(k, 1)  # (..., k, i)
    x = self.unsqueeze(-2)
    vals = x._pick(onehot, -1)
    idx = onehot.where(type(self).arange(n, device=self.device, dtype=dtypes.int64), 0).sum(-1)
    return vals, idx

  def sort(self, dim: int = -1, descending: bool = False, *, stable: bool = False) -> tuple:
    """torch.sort: (values, int64 indices); always stable (so stable= changes nothing). See the module docstring."""
    d = _axis(dim, self.ndim)
    x = self.reshape(1) if self.ndim == 0 else self.transpose(d, -1)
    v, i = x._by_rank(x.shape[-1], descending) if x.shape[-1] <= _RANK_SORT_MAX else x._long_sort(descending)
    if self.ndim == 0: return ValuesIndices(v.reshape(()), i.reshape(()))
    return ValuesIndices(v.transpose(d, -1), i.transpose(d, -1))
  def argsort(self, dim: int = -1, descending: bool = False): return self.sort(dim, descending)[1]
  def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple:
    """torch.topk: the k largest (or smallest) along dim, always in sorted order, with int64 indices."""
    d = _axis(dim, self.ndim)
    last = d == self.ndim - 1  # (the row axis last already: no transposes, each a view to make and track)
    x = self.reshape(1) if self.ndim == 0 else self if last else self.transpose(d, -1)
    n = x.shape[-1]
    if not isinstance(k, int) or not 0 <= k <= n: raise RuntimeError(f"topk: selected index k={k} is out of range for dim {d} of size {n}")
    if n <= _RANK_SORT_MAX: v, i = x._by_rank(k, largest)
    elif x.dtype.itemsize <= 4 and k * _TOPK_CHUNK < n and n < 1 << 32: v, i = x._topk_small(k, largest)
    else: v, i = (t.shrink(tuple((0, s) for s in t.shape[:-1]) + ((0, k),)) for t in x._long_sort(largest))
    if self.ndim == 0: return ValuesIndices(v.reshape(()), i.reshape(()))
    return ValuesIndices(v, i) if last else ValuesIndices(v.transpose(d, -1), i.transpose(d, -1))

  # ***** median (a selection, or the sort's middle) and unique (through the sort) *****
  # ***** median (a selection, or the sort's middle) and unique (through the sort) *****
  def _select(self, d: int, pos):
    """(values, int64 indices) of the elements at stable-sort position pos (keepdim-shaped, int64) along d: by a radix
    select of keys that order like the stable sort (the 32-bit order word above the index), O(n) a digit."""
    x = self.transpose(d, -1)
    n, lead = x.shape[-1], x.shape[:-1]
    R, T = math.prod(lead), type(self)
    ib = max((n - 1).bit_length(), 1)
    w = x.reshape(R, n)._order_word(False, 32)
    keys = _bin(Ops.OR, _bin(Ops.SHL, w.uop, ib), UOp(Ops.CAST, U64, (_iota((R, n), 1, self.device),)))
    key = T(_radix_select(keys, 32 + ib, pos.transpose(d, -1).reshape(R, 1).uop))
    i = (key & ((1 << ib) - 1)).cast(dtypes.int64).minimum(n - 1)
    v = x.reshape(R, n)._gather(1, i)
    return v.reshape(*lead, 1).transpose(d, -1), i.reshape(*lead, 1).transpose(d, -1)


  def median(self, dim: int | None = None, keepdim: bool = False):
    """torch.median: the lower median ((n-1)//2-th in sorted order). dim None: of all elements (a 0-d tensor; empty
    gives NaN); with dim: (values, int64 indices), the index being the stable sort's. A row holding NaN gives NaN and
    the index of its first NaN, as in torch."""
    if dim is None:
      if self.numel() == 0:
        if not dtypes.is_float(self.dtype): raise RuntimeError("median of an empty integer tensor (torch returns an arbitrary value)")
        return type(self).full((), math.nan, dtype=self.dtype, device=self.device)
      return self.flatten().median(0)[0]
    d = _axis(dim, self.ndim)
    x = self.reshape(1) if self.ndim == 0 else self
    n = x.shape[d]
    if n == 0: raise IndexError(f"median(): expected reduction dim {d} to have non-zero size")
    if n >= _SELECT_MIN and x.dtype.itemsize <= 4 and n < 1 << 31:  # a selection: O(n) a digit, no sort
      rows = x.transpose(d, -1)
      lead = rows.shape[:-1]
      rows = rows.reshape(math.prod(lead), n)
      i = type(self)(_templated(_median_indices, rows.uop, type(self))[0])
      v, i = (t.reshape(*lead, 1).transpose(d, -1) for t in (rows._gather(1, i), i))
    else:
      shape = tuple(1 if a == d else s for a, s in enumerate(x.shape))
      if dtypes.is_float(x.dtype):  # NaN sorts last: the first NaN sits at n - (number of NaNs)
        nans = x.isnan().sum(d, keepdim=True)
        pos = (nans > 0).where(n - nans, (n - 1) // 2)
      else: pos = type(self).full(shape, (n - 1) // 2, dtype=dtypes.int64, device=self.device)
      v, i = x.sort(d)
      v, i = v._gather(d, pos), i._gather(d, pos)
    if not keepdim or self.ndim == 0: v, i = v.squeeze(d), i.squeeze(d)
    if self.ndim == 0: v, i = v.reshape(()), i.reshape(())
    return ValuesIndices(v, i)

  def unique(self, sorted: bool = True, return_inverse: bool = False, return_counts: bool = False, dim: int | None = None):
    """torch.unique over all elements (dim=None): the distinct values in ascending order (also when sorted=False, which
    torch allows), and optionally the inverse (each element's position among them, in self's shape) and the counts.
    NaNs are each distinct, -0.0 equals 0.0, as in torch. The output's size depends on the values, so this reads the
    number of distinct values back (a sync), like indexing with a bool mask; where each group starts in the sorted
    row is found by a binary search of the group numbers, on the device."""
    if dim is not None: raise NotImplementedError("unique with dim= (unique slices) is not supported; flatten or use dim=None")
    T, flat = type(self), self.flatten()
    n = flat.shape[0]
    if n == 0:
      empty = T.zeros(0, dtype=dtypes.int64, device=self.device)
      out = [flat] + ([empty.reshape(self.shape)] if return_inverse else []) + ([empty] if return_counts else [])
      return tuple(out) if len(out) > 1 else out[0]
    v, order = flat.sort()
    # a new group starts at 0 and wherever the sorted value differs from the one before (NaN != NaN: each its own)
    one = T.ones(1, dtype=dtypes.bool, device=self.device)
    starts = one.cat(v[1:] != v[:-1]) if n > 1 else one
    group = starts.cumsum(0) - 1  # each sorted position's group: sorted, so a group's start is found by a search
    count = starts.sum()
    T.realize_all([count, v, group, *([order] if return_inverse else [])])  # stored once: the reads below reuse them
    k = int(count.item())  # the output's size: the one sync
    P = 1 << (n - 1).bit_length()
    table = group.cast(U64).pad(((0, P - n),), value=k).reshape(1, P).uop
    at = T(_count_below(table, _iota((1, k), 1, self.device).cast(U64))).reshape(k)
    out = [v._gather(0, at)]
    if return_inverse:
      rank = order.cast(dtypes.int32).argsort()  # each element's sorted position (the sort's inverse permutation)
      out.append(group._gather(0, rank).reshape(self.shape))
    if return_counts: out.append(at[1:].cat(T.full((1,), n, dtype=dtypes.int64, device=self.device)) - at)
    return tuple(out) if len(out) > 1 else out[0]
