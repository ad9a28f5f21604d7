"""Kernel AST -> loop-level UOps (DESIGN §3.5): upcast iterations are written out, reductions become
accumulators with explicit loop ends, and narrow float math is done in float32. The passes run in the order of
codegen/__init__.py's PASSES."""
from __future__ import annotations
import functools, itertools
from dataclasses import dataclass
from attograd.helpers import prod
from attograd.dtype import dtypes, DType
from attograd.uop.ops import AxisKind, UOp, Ops, GroupOp
from attograd.uop.patterns import UPat, PatternMatcher, graph_rewrite
from attograd.uop.symbolic import clauses

NARROW_FLOATS = (dtypes.float16, dtypes.bfloat16)

def reduce_identity(op: Ops, dtype: DType) -> float | int | bool:
  if op is Ops.ADD: return 0
  if op is Ops.MUL: return 1
  if op is Ops.MAX: return dtypes.min(dtype)
  raise NotImplementedError(f"no identity for reduce {op}")

def instances(x: UOp, ranges: list[UOp]) -> list[UOp]:
  """x once per value of the (non-loop) ranges, the last range varying fastest. Only the nodes that depend on a range
  are rebuilt for each value (a 16x8 register tile's loads of one operand depend on one of its two ranges)."""
  if not ranges: return [x]
  sizes = [r.src[0].arg for r in ranges]
  rs = set(ranges)
  varies: list[UOp] = []  # the nodes below x that depend on a range, children first
  moved: set[UOp] = set()
  for u in x.toposort:
    if u in rs or any(s in moved for s in u.src):
      moved.add(u)
      if u not in rs: varies.append(u)
  out = []
  for idx in itertools.product(*map(range, sizes)):
    new: dict[UOp, UOp] = {r: UOp.const(r.dtype, i) for r, i in zip(ranges, idx)}
    for u in varies: new[u] = UOp(u.op, u.dtype, tuple([new.get(s, s) for s in u.src]), u.arg)
    out.append(new.get(x, x))
  return out

def fresh_range_id(ast: UOp) -> int:
  """An id no RANGE of ast has (ids order loops: a new one sorts after every existing one)."""
  return 1 + max((u.arg[0] for u in ast.toposort if u.op is Ops.RANGE), default=-1)

def kind_of(ranges, kind: AxisKind) -> list[UOp]:
  """Split-off ranges of one kind, in the order of the axes they came from (the later axis, usually
  the one contiguous in memory, varies fastest); of two splits of one axis, the first made is finer."""
  return sorted((r for r in ranges if r.op is Ops.RANGE and r.arg[1] is kind), key=lambda r: (r.arg[2], -r.arg[0]))

def fold(op: Ops, acc: UOp, value: UOp) -> UOp:
  """acc op value; a float sum of products is one fused multiply-add (rounded once, as BLAS does)."""
  if op is Ops.ADD and dtypes.is_float(acc.dtype) and value.op is Ops.MUL: return UOp(Ops.MULACC, acc.dtype, (*value.src, acc))
  return acc.alu(op, value)

def upcast_store(st: UOp) -> UOp | None:
  """A store inside upcast ranges: written out once per upcast value."""
  if not (ups := kind_of(st.ranges, AxisKind.UPCAST)): return None
  return UOp(Ops.NOOP, dtypes.void, tuple(instances(st, ups)))

def compute_in_float32(a: UOp) -> UOp | None:
  """Math on float16/bfloat16 is done in float32 and rounded once, as PyTorch's CPU kernels do."""
  if not (a.dtype in NARROW_FLOATS or any(s.dtype in NARROW_FLOATS for s in a.src)): return None
  srcs = tuple(s.cast(dtypes.float32) if s.dtype in NARROW_FLOATS else s for s in a.src)
  return UOp(a.op, dtypes.float32 if a.dtype in NARROW_FLOATS else a.dtype, srcs, a.arg).cast(a.dtype)

def reduce_in_float32(red: UOp) -> UOp | None:
  # accumulate narrow floats in float32, as PyTorch does
  if red.dtype not in NARROW_FLOATS: return None
  return UOp(Ops.REDUCE, dtypes.float32, (red.src[0].cast(dtypes.float32), *red.src[1:]), red.arg).cast(red.dtype)

def hoist_gate(red: UOp) -> UOp | None:
  """Inside a SIMD loop, a sum of (g ? x : 0) where g doesn't depend on some of the reduce's loops (a padded conv's
  input gradient: the window position's gate, the channels summed inside it) sums x over those loops first, in an
  inner loop of its own, and tests g once per sum. gcc makes each select a masked store of the accumulator, which
  the next iteration's load waits on; the inner loop is plain multiply-adds (measured 2.4x on a conv's input
  gradient). The sum is reassociated, as partial accumulators are. Elsewhere one loop nest with one accumulator is
  better (schedule.py merges nested reduces)."""
  if red.arg is not Ops.ADD or red.src[0].op is not Ops.WHERE or not dtypes.is_float(red.dtype): return None
  g, x, z = red.src[0].src
  if z.op is not Ops.CONST or z.arg != 0 or not any(r.arg[1] is AxisKind.SIMD for r in red.src[0].live_ranges): return None
  inner = tuple(r for r in red.src[1:] if r not in g.live_ranges)
  outer = tuple(r for r in red.src[1:] if r in g.live_ranges)
  if not inner or not outer or any(r.op is not Ops.RANGE or r.arg[1] is not AxisKind.REDUCE for r in inner): return None
  x, inner = skip_when_false(g, x, inner)
  return UOp(Ops.REDUCE, red.dtype, (g.where(UOp(Ops.REDUCE, red.dtype, (x, *inner), Ops.ADD), z), *outer), Ops.ADD)

def skip_when_false(g: UOp, x: UOp, inner: tuple[UOp, ...]) -> tuple[UOp, tuple[UOp, ...]]:
  """x with the outermost of the inner loops run 0 times where the gate's clauses that no SIMD loop moves are false: a
  padded conv's input gradient gates each row of its window by the row's place in the image (y - kh in the gradient's
  rows), and a whole inner sum of a row outside it is thrown away by the select (a 5x5 conv's 24 rows from 20: 20 of
  24 rows valid per kh; a 3x3's 10 from 8). The select stays for the clauses that vary along the SIMD lanes or a
  written-out axis (each copy of the loop would be a loop of its own size, one name for several loops)."""
  skip = [c for c in clauses(g) if all(r.arg[1] in (AxisKind.GLOBAL, AxisKind.REDUCE) for r in c.live_ranges)]
  r = min(inner, key=lambda r: r.arg)
  if not skip or r.src[0].op is not Ops.CONST: return x, inner
  cond = functools.reduce(lambda a, b: a & b, skip)
  runs = UOp(Ops.RANGE, r.dtype, (cond.where(r.src[0], UOp.const(r.dtype, 0)),), r.arg)
  return x.substitute({r: runs}), tuple(runs if s is r else s for s in inner)

expander = PatternMatcher([
  (UPat(Ops.REDUCE, name="red"), reduce_in_float32),
  (UPat(Ops.REDUCE, name="red"), hoist_gate),
  (UPat(Ops.STORE, name="st"), upcast_store),
])

lowerer = PatternMatcher([
  (UPat(GroupOp.ALU, name="a"), compute_in_float32),
])

def _conjuncts(g: UOp) -> list[UOp]:
  return [*_conjuncts(g.src[0]), *_conjuncts(g.src[1])] if g.op is Ops.AND and g.dtype == dtypes.bool else [g]

def _in_lanes(u: UOp) -> bool: return any(r.arg[1] is AxisKind.SIMD for r in u.ranges)

def lane_bound_gate(g: UOp) -> UOp | None:
  """Inside a SIMD loop, a gate that ANDs a condition the lanes share (a padded conv's row in range) with a compare of
  the lanes' index (its columns in range) is that compare alone, against a bound the shared condition picks: `x < y`
  and p is `x < (p ? y : INT_MIN)` (`y < x` and p: `(p ? y : INT_MAX) < x`). gcc 12 makes a lane mask of the shared
  bool by setting its 16 bits one at a time (~50 instructions) wherever the lanes' masks are combined with it; a bound
  is one broadcast. One core, AVX-512: PP-OCR rec's 5x5 depthwise conv, 240 channels at 12x80, 0.61 -> 0.35 ms."""
  cs = _conjuncts(g)
  shared = [c for c in cs if not _in_lanes(c)]
  if not shared or len(shared) == len(cs): return None
  p = functools.reduce(lambda a, b: a & b, shared)
  for c in cs:
    if c.op is not Ops.CMPLT or not dtypes.is_int(c.src[0].dtype): continue
    a, b = c.src
    if _in_lanes(a) and not _in_lanes(b): new = a < p.where(b, dtypes.min(b.dtype))
    elif _in_lanes(b) and not _in_lanes(a): new = p.where(a, dtypes.max(a.dtype)) < b
    else: continue
    return functools.reduce(lambda x, y: x & y, [new if d is c else d for d in cs if _in_lanes(d)])
  return None

lane_gates = PatternMatcher([(UPat(Ops.AND, dtype=dtypes.bool, name="g"), lane_bound_gate)])

INIT_WRITTEN_OUT = 16  # accumulator slots a reduce's init writes out; more are set by a loop (lower_reduce_group)

@dataclass
class Fresh:
  """The next unused accumulator and loop ids of a kernel being lowered."""
  reg: int
  loop: int

def lower_reduce_group(group: list[UOp], fresh: Fresh) -> dict[UOp, UOp]:
  """REDUCEs over the same loops share them: one accumulator slot each (one register array per
  dtype and op), initialised before the loops, updated inside, read after their END. An unrolled
  range is written out inside the loop, its values accumulated in order. A lane range (UPCAST of a
  reduce axis) stays an innermost loop with one accumulator per iteration, which the C compiler
  turns into a SIMD register; the lanes are combined after the loops. A simd range (SIMD of an output axis)
  the values depend on is moved inside the reduce's loops, as a loop of its own (one accumulator per
  iteration); after them, each iteration of the outer simd loop reads its own accumulator."""
  ranges = group[0].src[1:]
  # a loop of one iteration (what is left of a window axis unrolled whole) is no loop: its counter is 0. Kept, it made a
  # loop nest inside the output loop, which gcc then left scalar (a batch norm + 2x2 max pool, one core: 23 -> 11.5 ms)
  once = {r: UOp.const(r.dtype, 0) for r in ranges if r.op is Ops.RANGE and r.src[0].op is Ops.CONST and r.src[0].arg == 1}
  loops = [r for r in ranges if r.op is Ops.RANGE and r.arg[1] is not AxisKind.UNROLL and r not in once]
  unrolled, lanes = kind_of(ranges, AxisKind.UNROLL), kind_of(ranges, AxisKind.LANE)
  values = {red: [v.substitute(once) if once else v for v in instances(red.src[0], unrolled)] for red in group}
  if not loops: return {red: functools.reduce(lambda a, b: fold(red.arg, a, b), vs) for red, vs in values.items()}
  simd = kind_of(frozenset().union(*(v.live_ranges for vs in values.values() for v in vs)), AxisKind.SIMD)
  if simd:
    inner = {r: UOp(Ops.RANGE, r.dtype, r.src, (fresh.loop + n, AxisKind.SIMD, *r.arg[2:])) for n, r in enumerate(simd)}
    fresh.loop += len(simd)
    values = {red: [v.substitute(inner) for v in vs] for red, vs in values.items()}
    loops, lanes = loops + list(inner.values()), lanes + list(inner.values())
  n_lanes = prod(r.src[0].arg for r in lanes)
  lane = functools.reduce(lambda a, r: a * r.src[0].arg + r, lanes[1:], lanes[0]).cast(dtypes.int32) if lanes else UOp.const(dtypes.int32, 0)
  outer = tuple(sorted(frozenset().union(*(v.live_ranges for vs in values.values() for v in vs)) - set(loops), key=lambda r: r.arg))
  regs: dict[tuple[DType, Ops], list[UOp]] = {}
  for red in group: regs.setdefault((red.dtype, red.arg), []).append(red)
  slot: dict[UOp, tuple[UOp, int]] = {}
  inits = []
  for (dt, op), members in regs.items():
    acc = UOp(Ops.DEFINE_REG, dt.ptr(len(members) * n_lanes, "reg"), (), fresh.reg); fresh.reg += 1
    for i, red in enumerate(members): slot[red] = (acc, i * n_lanes)
    ident, n = UOp.const(dt, reduce_identity(op, dt)), len(members) * n_lanes
    if n_lanes > 1 and n > INIT_WRITTEN_OUT:
      # a loop: 256 stores written out (a SIMD loop of 32 by 8 rows) took gcc 150 ms of a kernel's 280. Only where the
      # slots are lanes, which the reduce's loop indexes by its counter anyway: a written-out tile's accumulators must
      # stay constant-indexed for gcc to keep them in registers
      r = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, n),), (fresh.loop, AxisKind.FOLD)); fresh.loop += 1
      inits.append(acc.after(*outer).index(r).store(ident).end(r))
    else: inits += [acc.after(*outer).index(UOp.const(dtypes.int32, c)).store(ident) for c in range(n)]
  init = inits[0] if len(inits) == 1 else UOp(Ops.NOOP, dtypes.void, tuple(inits))
  updates = []
  for red in group:
    acc, base = slot[red]
    i = lane + base if base else lane
    updates.append(acc.index(i).store(functools.reduce(lambda a, b: fold(red.arg, a, b), values[red], acc.after(init, *loops).index(i).load())))
  end = (updates[0] if len(updates) == 1 else UOp(Ops.NOOP, dtypes.void, tuple(updates))).end(*loops)
  n_simd = prod(r.src[0].arg for r in simd)
  at = functools.reduce(lambda a, r: a * r.src[0].arg + r, simd[1:], simd[0]).cast(dtypes.int32) if simd else UOp.const(dtypes.int32, 0)
  def read(red: UOp) -> UOp:
    acc, base = slot[red]
    n = n_lanes // n_simd
    if n_simd == 1 and n > 2:
      # the lanes folded in place by loops, the top ones onto the bottom ones (acc[i] op= acc[i + n - half]), each loop
      # a vector op: log2(lanes) steps. A chain through every lane waited on each (a row max over 32 lanes: 31 branchy
      # NaN-aware maxes, 5x the time of the row's own loop)
      done = end
      while n > 1:
        half = n // 2
        r = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, half),), (fresh.loop, AxisKind.FOLD)) if half > 1 else UOp.const(dtypes.int32, 0)
        i, a = r + base if base else r, acc.after(done)
        done = a.index(i).store(a.index(i).load().alu(red.arg, a.index(i + (n - half)).load()))
        if half > 1: done, fresh.loop = done.end(r), fresh.loop + 1
        n -= half
      return acc.after(done).index(UOp.const(dtypes.int32, base)).load()
    parts = [acc.after(end).index(at + (base + c * n_simd)).load() for c in range(n)]
    return functools.reduce(lambda a, b: a.alu(red.arg, b), parts)
  return {red: read(red) for red in group}

def lower_reduces(sink: UOp) -> UOp:
  """Every REDUCE -> accumulators, innermost first. Not a PatternMatcher pass: copies of one reduce
  made by an upcast must be lowered together (one loop, several accumulators), and a rule sees one
  node at a time."""
  # registers after the scratches opts made (PACK); new loop ids after every loop's
  fresh = Fresh(sum(1 for u in sink.toposort if u.op is Ops.DEFINE_REG), fresh_range_id(sink))
  while reds := [u for u in sink.toposort if u.op is Ops.REDUCE]:
    loops = [r for r in reds[0].src[1:] if r.op is Ops.RANGE and r.arg[1] is not AxisKind.UNROLL]
    group = [u for u in reds if u.src[1:] == reds[0].src[1:]] if loops else [reds[0]]
    # (a set against each one's ancestors: a toposort per pair made this check a tenth of lowering a 16x8 register tile)
    members = set(group)
    assert not any(b.src[0] in members or not members.isdisjoint(b.src[0].ancestors) for b in group), "a reduce feeds another over the same loops"
    sink = sink.substitute(lower_reduce_group(group, fresh))
  return sink

def simd_inside_serial(ctx: dict[UOp, UOp], st: UOp) -> UOp | None:
  """A store inside serial loops (a scatter-add's, schedule.py) that moves along a simd loop opened outside them gets a
  simd loop of its own inside them, innermost: a token's row is then one vector read, add and write, where the
  loop outside would run the whole token loop once per column. Its END outside is dropped (simd_outside_serial)."""
  if not any(r.arg[1] is AxisKind.SERIAL for r in st.live_ranges): return None
  if not (simd := sorted((r for r in st.live_ranges if r.arg[1] is AxisKind.SIMD and r not in ctx.values()), key=lambda r: r.arg)): return None
  first = fresh_range_id(st) + len(ctx)
  inner = {r: UOp(Ops.RANGE, r.dtype, r.src, (first + n, *r.arg[1:])) for n, r in enumerate(simd)}
  ctx.update(inner)
  return st.substitute(inner).end(*inner.values())

def simd_outside_serial(x: UOp, r: UOp) -> UOp | None:
  # the loop's body no longer moves along it: running it again would add each token again
  return x if r.arg[1] is AxisKind.SIMD and r not in x.toposort else None

serial_simd = PatternMatcher([
  (UPat(Ops.STORE, name="st"), simd_inside_serial),
  (UPat(Ops.END, src=(UPat.var("x"), UPat(Ops.RANGE, name="r"))), simd_outside_serial),
])

VECTOR_STEP = 8  # floats in the vectors gcc's loop vectorizer uses (256-bit, which it prefers on AVX-512 too)

def split_loop(ctx: dict[str, int], x: UOp, r: UOp) -> UOp | None:
  """An innermost loop is cut into pieces, each a loop with no select or remainder in it:
  - where its body tests its counter against constants (a concatenation: `r < 64 ? a[..] : 0` + `64 <= r ? b[..] : 0`):
    one loop per stretch between those constants, each with the tests decided, reading one input;
  - where its length is no multiple of the vector step (a vocabulary of 90): a loop of whole vector steps and the rest.
    gcc's cheap vectorizer cost model (runtime/ops_cpu.py) leaves a loop whose length needs a scalar epilogue scalar
    (softmax's exp over 90 logits: every element a scalar exp).
  The loop of a GPU's thread index is not a loop (add_gpudims made it SPECIAL) and is left alone."""
  if r.arg[1] not in (AxisKind.GLOBAL, AxisKind.SIMD) or r.src[0].op is not Ops.CONST: return None
  body, n = x.toposort, r.src[0].arg
  if any(u.op is Ops.END or u.op is Ops.REDUCE for u in body): return None  # the innermost loop only: a piece shares no loop
  cuts = {n - n % VECTOR_STEP} if n > 2 * VECTOR_STEP else set()
  for u in body:
    if u.op is Ops.CMPLT and u.src[0] is r and u.src[1].op is Ops.CONST: cuts.add(u.src[1].arg)       # r < c
    elif u.op is Ops.CMPLT and u.src[1] is r and u.src[0].op is Ops.CONST: cuts.add(u.src[0].arg + 1)  # c < r: r >= c+1
  bounds = [0, *sorted(c for c in cuts if 0 < c < n), n]
  if len(bounds) == 2 or len(bounds) > 9: return None  # nothing to split, or code size past its worth
  loops = []
  for lo, hi in zip(bounds, bounds[1:]):
    if hi - lo == 1:  # one iteration: no loop
      loops.append(x.substitute({r: UOp.const(r.dtype, lo)}))
      continue
    piece = UOp(Ops.RANGE, r.dtype, (UOp.const(r.dtype, hi - lo),), (ctx["next"], *r.arg[1:])); ctx["next"] += 1
    loops.append(x.substitute({r: piece + lo if lo else piece}).end(piece))
  return UOp(Ops.NOOP, dtypes.void, tuple(loops))

loop_splitter = PatternMatcher([(UPat(Ops.END, src=(UPat.var("x"), UPat(Ops.RANGE, name="r"))), split_loop)])

def split_loops(sink: UOp) -> UOp:
  return graph_rewrite(sink, loop_splitter, ctx={"next": fresh_range_id(sink)}, name="split_loops")

def simd_in_serial_loops(sink: UOp) -> UOp:
  # only a kernel with serial loops has stores to move: elsewhere an END of a simd loop its body doesn't read stays
  if not any(u.op is Ops.RANGE and u.arg[1] is AxisKind.SERIAL for u in sink.toposort): return sink
  return graph_rewrite(sink, serial_simd, ctx={}, name="simd_in_serial_loops")
