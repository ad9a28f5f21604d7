"""Kernel optimizations as explicit actions (DESIGN §3.4). An Opt names what to do to which axis;
a kernel's program is a pure function of its AST and its list of Opts. Heuristics and BEAM search
only choose Opts.

Axes are named by role and index: the kernel's global (output) loops sorted by id come first, then
its reduce loops sorted by id; `Opt.axis` indexes that list. An Opt never renumbers axes: a split
keeps the outer loop's name and gives the inner part a new kind ('upcast', 'unroll', 'lane', 'simd'), which
is no longer an axis of its own."""
from __future__ import annotations
import functools, os
from dataclasses import dataclass
from enum import Enum, auto
from attograd.dtype import dtypes
from attograd.helpers import ContextVar, prod
from attograd.uop.ops import AxisKind, UOp, Ops, GroupOp
from attograd.uop.patterns import graph_rewrite
from attograd.uop.symbolic import symbolic
from attograd.codegen.lower import reduce_identity, fresh_range_id, NARROW_FLOATS

class OptOps(Enum):
  THREAD = auto()   # split a global axis across CPU cores: each core runs one contiguous slice
  UPCAST = auto()   # split off `amount` iterations and compute them side by side (no loop): on a global
                    # axis, several outputs per iteration; on a reduce axis, that many partial accumulators
  UNROLL = auto()   # a reduce axis's loop body repeated `amount` times, accumulated in the same order
  PADTO = auto()    # round an axis up to a multiple of `amount`; the extra iterations are masked out
  SWAP = auto()     # exchange the loop nesting of two global axes (`amount` names the other axis)
  LOCAL = auto()    # GPU-style targets: a global axis split into workgroup-local threads
  GROUP = auto()    # GPU-style targets: a reduce axis split across the threads of a workgroup
  SIMD = auto()     # CPU: a global axis's `amount` iterations stay an innermost loop, inside a reduce's loops too (one
                    # accumulator per iteration): the C compiler's loop vectorizer makes it SIMD registers, where it
                    # makes a mix of vector and scalar code from the same iterations written out (UPCAST)
  PACK = auto()     # CPU: what an input read inside a reduce needs for one iteration of a global axis (a
                    # matmul's column panel) is copied to a contiguous scratch before that iteration's inner loops
  STASH = auto()    # CPU: a value both the output and a reduce compute per element (softmax's exp) is stored to the
                    # output inside the reduce's loop (`amount` names the reduce axis) and read back by the output's loop

@dataclass(frozen=True)
class Opt:
  op: OptOps
  axis: int         # index into axes(ast): global axes, then reduce axes
  amount: int
  def __repr__(self) -> str: return f"Opt({self.op.name}, {self.axis}, {self.amount})"

class KernelOptError(ValueError): pass

# the kind of axis an Opt applies to (True: global, False: reduce); the others take either
NEEDS = {OptOps.THREAD: True, OptOps.SWAP: True, OptOps.PACK: True, OptOps.SIMD: True, OptOps.LOCAL: True, OptOps.STASH: True,
         OptOps.UNROLL: False, OptOps.GROUP: False}

THREADS = ContextVar("THREADS", os.cpu_count() or 1)
MAX_COPIES = 512  # upcast x unroll (x simd): the number of copies of the loop body written out
# nodes of a kernel once its copies are written out (written_out_size): a matmul's 8x32 register tile is ~2300-2600; a
# 128-wide row of a column sum with a GELU's gradient fused in was 30k, and took gcc minutes
MAX_WRITTEN_OUT = 3072
# a register tile's outputs at most, in vector registers (of the renderer's simd_floats): AVX2 has sixteen of 8 floats. A
# 16x6 tile (12 registers, with 2 for a row of the right operand and 1 for a broadcast of the left) keeps everything in
# registers: 52-68 GFLOPS on one core over a small transformer's matmuls and a 1024^3 one; 16x8 spilled three
# accumulators to the stack (48-53), 32x8 most (35). With AVX-512's 32 registers a 32x6 tile of them does 102-111 where
# 16x6 did 66-68 (torch 96), and 32x8 the same
TILE_REGISTERS = 16
SWAP_MAX_ROWS = 1 << 21  # elements of a matmul's row operand that a loop over column panels can re-read from cache

def ranges_of(ast: UOp, kind: AxisKind) -> list[UOp]:
  return sorted((u for u in ast.toposort if u.op is Ops.RANGE and u.arg[1] is kind), key=lambda r: r.arg)

def global_ranges(ast: UOp) -> list[UOp]: return ranges_of(ast, AxisKind.GLOBAL)
def axes(ast: UOp) -> list[UOp]: return ranges_of(ast, AxisKind.GLOBAL) + ranges_of(ast, AxisKind.REDUCE)
def const_size(r: UOp) -> int | None: return r.src[0].arg if r.src[0].op is Ops.CONST else None

def split_size(r: UOp, opt: Opt) -> int:
  """The size of the axis opt splits, which must be a constant that opt.amount divides."""
  if (size := const_size(r)) is None: raise KernelOptError(f"{opt}: axis {opt.axis} has a symbolic size")
  if opt.amount < 2 or size % opt.amount: raise KernelOptError(f"{opt}: axis size {size} doesn't split in {opt.amount}")
  return size

WRITTEN_OUT = (AxisKind.UPCAST, AxisKind.UNROLL)  # the split-off kinds lowering writes out as copies (lane and simd stay loops)

def written_out_size(ast: UOp) -> int:
  """The kernel's nodes once lowering has written out its upcast and unrolled ranges: a node is copied once per
  combination of those it depends on (a matmul tile's loads once per row or column, its multiply-adds once per
  output). Lowering, rendering and the C compiler all take time in proportion to it."""
  deps: dict[UOp, frozenset[UOp]] = {}
  total = 0
  for u in ast.toposort:
    d = frozenset().union(*(deps[s] for s in u.src)) if u.src else frozenset()
    if u.op is Ops.RANGE and u.arg[1] in WRITTEN_OUT: d = d | {u}
    elif u.op is Ops.REDUCE: d = d - set(u.src[1:])
    deps[u] = d
    total += prod(const_size(r) for r in d)
  return total

def copies(ast: UOp) -> int:
  # a simd loop's iterations each hold their own accumulators too: they count against the same register budget
  return prod(const_size(r) for r in ranges_of(ast, AxisKind.UPCAST) + ranges_of(ast, AxisKind.UNROLL) + ranges_of(ast, AxisKind.SIMD))

def apply_opts(ast: UOp, opts: list[Opt], has_local: bool = False) -> UOp:
  for opt in opts: ast = apply_opt(ast, opt, has_local)
  return ast

def apply_opt(ast: UOp, opt: Opt, has_local: bool = False) -> UOp:
  """One Opt as a rewrite of the AST; KernelOptError when it doesn't apply to this kernel."""
  if opt.op in (OptOps.LOCAL, OptOps.GROUP) and not has_local:
    raise KernelOptError(f"{opt}: {opt.op.name} needs a target with workgroups (a GPU); this one has no work-groups")
  if opt.op is not OptOps.THREAD and any(u.op is Ops.RANGE and u.arg[1] is AxisKind.PACK for u in ast.toposort):
    # the copy is laid out for the loops as they were: only splitting the work across cores keeps it valid
    raise KernelOptError(f"{opt}: only THREAD may follow PACK")
  ax = axes(ast)
  if not 0 <= opt.axis < len(ax): raise KernelOptError(f"{opt}: the kernel has {len(ax)} axes")
  r = ax[opt.axis]
  is_global = r.arg[1] is AxisKind.GLOBAL
  if opt.op in NEEDS and NEEDS[opt.op] != is_global:
    raise KernelOptError(f"{opt}: {opt.op.name} applies to a {'global' if NEEDS[opt.op] else 'reduce'} axis, axis {opt.axis} is {r.arg[1]}")
  if opt.op is OptOps.SWAP: return apply_swap(ast, opt, ax)
  if opt.op is OptOps.STASH:
    # on a GPU each output's thread runs the whole reduce: every thread would store the whole row
    if has_local: raise KernelOptError(f"{opt}: STASH is for a loop that runs a reduce once per row; this target has work-groups")
    return apply_stash(ast, *stash_plan(ast, opt, ax))
  if opt.op is OptOps.LOCAL: return apply_local(ast, opt, r)
  if opt.op is OptOps.GROUP: return apply_group(ast, opt, r)
  if opt.op is OptOps.PACK:
    if has_local: raise KernelOptError(f"{opt}: PACK's scratch is per call: a target with work-groups would share it")
    return apply_pack(ast, opt, r)
  if opt.op is OptOps.PADTO:
    if (size := const_size(r)) is None: raise KernelOptError(f"{opt}: axis {opt.axis} has a symbolic size")
    if opt.amount < 2 or size % opt.amount == 0: raise KernelOptError(f"{opt}: axis size {size} is already a multiple of {opt.amount}")
    if opt.amount > 2 * size: raise KernelOptError(f"{opt}: padding {size} to {opt.amount} more than doubles the work")
    return apply_padto(ast, r, -(-size // opt.amount) * opt.amount, size)
  split_size(r, opt)
  if opt.op is OptOps.THREAD: return apply_thread(ast, opt, r)
  if opt.op is OptOps.SIMD:
    if has_local: raise KernelOptError(f"{opt}: SIMD is for a C compiler's loop vectorizer; this target has work-groups")
    if ranges_of(ast, AxisKind.SIMD): raise KernelOptError(f"{opt}: the kernel already has a SIMD loop")
    return split(ast, r, opt.amount, AxisKind.SIMD)
  if opt.op in (OptOps.UPCAST, OptOps.UNROLL):
    if copies(ast) * opt.amount > MAX_COPIES: raise KernelOptError(f"{opt}: more than {MAX_COPIES} copies of the loop body")
    out = split(ast, r, opt.amount, AxisKind.UNROLL if opt.op is OptOps.UNROLL else AxisKind.UPCAST if is_global else AxisKind.LANE)
    if (n := written_out_size(out)) > MAX_WRITTEN_OUT: raise KernelOptError(f"{opt}: {n} nodes written out, over {MAX_WRITTEN_OUT}")
    return out
  raise KernelOptError(f"{opt}: {opt.op.name} has no lowering for this target yet")

def split(ast: UOp, r: UOp, amount: int, kind: AxisKind) -> UOp:
  """r = outer*amount + inner: the outer loop keeps r's name, the inner one is of `kind` and (but for
  simd) never becomes a loop (lowering writes out its iterations). A reduce over r reduces over both. The inner
  range remembers the axis it came from (arg[2]): lowering orders the copies by it."""
  size = const_size(r)
  outer = UOp(Ops.RANGE, r.dtype, (UOp.const(r.dtype, size // amount),), r.arg)
  inner = UOp(Ops.RANGE, r.dtype, (UOp.const(r.dtype, amount),), (fresh_range_id(ast), kind, r.arg[0]))
  new: dict[UOp, UOp] = {r: outer * amount + inner}
  for u in ast.toposort:
    if u in new: continue
    src = tuple(new.get(s, s) for s in u.src)
    if u.op is Ops.REDUCE and r in u.src[1:]: src = (src[0], *(x for s in u.src[1:] for x in ((outer, inner) if s is r else (s,))))
    # a simd range stays a loop: it closes inside the outer one
    if u.op is Ops.END and u.src[1] is r: src = (src[0].end(inner) if kind is AxisKind.SIMD else src[0], outer)
    new[u] = u.replace(src=src)
  return graph_rewrite(new[ast], symbolic, name="apply_opts/split")

def apply_thread(ast: UOp, opt: Opt, r: UOp) -> UOp:
  """Global axis `axis` of size S becomes core_id*(S/n) + r with r over S/n: core_id is a kernel
  argument from 0 to n-1, and the runtime calls the kernel once per core, in parallel."""
  if any(u.op is Ops.CORE_ID for u in ast.toposort): raise KernelOptError(f"{opt}: already threaded")
  # each core writes its own slice of every output: a store the axis doesn't move (a STASH's, along the reduce) would be
  # written by every core, over what another core already finished
  if any(r not in st.src[0].toposort for st in ast.toposort if st.op is Ops.STORE and st.src[0].src[0].op is Ops.PARAM):
    raise KernelOptError(f"{opt}: a store doesn't move along axis {opt.axis}: every core would write all of it")
  chunk = const_size(r) // opt.amount
  inner = UOp(Ops.RANGE, r.dtype, (UOp.const(r.dtype, chunk),), r.arg)
  core = UOp(Ops.CORE_ID, r.dtype, (), opt.amount)
  # the loop's END now closes the smaller range; every use of the old index gets the offset
  ends = {u: UOp(Ops.END, u.dtype, (u.src[0], inner)) for u in ast.toposort if u.op is Ops.END and u.src[1] is r}
  return graph_rewrite(ast.substitute(ends).substitute({r: core * chunk + inner}), symbolic, name="apply_opts/thread")

def apply_padto(ast: UOp, r: UOp, padded: int, size: int) -> UOp:
  """The loop runs to `padded`; every memory access that depends on it is gated by r < size, and a
  reduce over it sees its identity there, so the extra iterations read, write and add nothing."""
  big = UOp(Ops.RANGE, r.dtype, (UOp.const(r.dtype, padded),), r.arg)
  valid = big < size
  new: dict[UOp, UOp] = {r: big}
  for u in ast.toposort:
    if u in new: continue
    src = tuple(new.get(s, s) for s in u.src)
    # (an output read back after a store to it, a scatter-add's or a STASH's, is a PARAM behind an AFTER)
    if u.op is Ops.INDEX and (src[0].op is Ops.PARAM or src[0].op is Ops.AFTER and src[0].src[0].op is Ops.PARAM) and big in src[1].toposort:
      src = (src[0], src[1], valid if len(src) == 2 else (src[2] & valid))
    if u.op is Ops.REDUCE and r in u.src[1:]: src = (valid.where(src[0], UOp.const(u.dtype, reduce_identity(u.arg, u.dtype))), *src[1:])
    new[u] = u.replace(src=src)
  return graph_rewrite(new[ast], symbolic, name="apply_opts/padto")

def apply_swap(ast: UOp, opt: Opt, ax: list[UOp]) -> UOp:
  """Loops open in the order of their ids and close in the order of their ENDs: both are exchanged."""
  if not 0 <= opt.amount < len(ax) or ax[opt.amount].arg[1] is not AxisKind.GLOBAL or opt.amount == opt.axis:
    raise KernelOptError(f"{opt}: SWAP needs another global axis as amount")
  if stash_stores(ast): raise KernelOptError(f"{opt}: a STASH's reduce must stay outside the loop that reads it back")
  a, b = ax[opt.axis], ax[opt.amount]
  new = {a: UOp(Ops.RANGE, a.dtype, a.src, b.arg), b: UOp(Ops.RANGE, b.dtype, b.src, a.arg)}
  ends = {u.src[1]: u for u in ast.toposort if u.op is Ops.END and u.src[1] in (a, b)}
  if len(ends) != 2: raise KernelOptError(f"{opt}: axes {opt.axis} and {opt.amount} don't both end in this kernel")
  outer, inner = (a, b) if ends[b] in ends[a].toposort else (b, a)
  if ends[outer].src[0] is not ends[inner]: raise KernelOptError(f"{opt}: other work sits between the two loops")
  # END(END(x, inner), outer) -> END(END(x, outer), inner), with each range renamed
  body = ends[inner].src[0]
  swapped = UOp(Ops.END, ends[outer].dtype, (UOp(Ops.END, ends[inner].dtype, (body, outer)), inner))
  return ast.substitute({ends[outer]: swapped}).substitute(new)

# ***** STASH: one value computed once for a reduce and its output *****

def bound_ranges(x: UOp) -> set[UOp]:
  """The loops x runs inside: the ranges it depends on, less those a reduce within it sums over."""
  nodes = x.toposort
  return {u for u in nodes if u.op is Ops.RANGE} - {r for u in nodes if u.op is Ops.REDUCE for r in u.src[1:]}

def outside_reduces(x: UOp) -> set[UOp]:
  """x's nodes that are computed once per value of x's loops: those not inside any reduce within x."""
  seen, stack = set(), [x]
  while stack:
    if (u := stack.pop()) in seen: continue
    seen.add(u)
    if u.op is not Ops.REDUCE: stack.extend(u.src)
  return seen

def stash_stores(ast: UOp) -> list[UOp]:
  """Stores to an output from inside a reduce's loop."""
  return [u for red in ast.toposort if red.op is Ops.REDUCE for u in red.src[0].toposort if u.op is Ops.STORE and u.src[0].src[0].op is Ops.PARAM]

def stash_plan(ast: UOp, opt: Opt, ax: list[UOp]) -> tuple[UOp, UOp, UOp, UOp]:
  """(the output store, the reduce, its value to stash, the output axis) for STASH(global o, reduce r), or KernelOptError.
  The reduce runs over r alone, once per value of the store's other loops, before the loop over o (innermost) opens;
  r and o have one size; the value depends on r and, with o for r, the output computes it outside every reduce. Then
  the reduce's loop over r visits each element of the output's row once, and the loop over o reads them back before
  the next row's reduce. Of several such values the biggest is stashed (softmax's exp, not the x - max under it)."""
  if not 0 <= opt.amount < len(ax) or ax[opt.amount].arg[1] is not AxisKind.REDUCE: raise KernelOptError(f"{opt}: STASH needs a reduce axis as amount")
  o, r = ax[opt.axis], ax[opt.amount]
  if any(u.op is Ops.RANGE and u.arg[1] not in (AxisKind.GLOBAL, AxisKind.REDUCE) or u.op is Ops.CORE_ID for u in ast.toposort):
    raise KernelOptError(f"{opt}: STASH comes before the opts that split axes")
  if const_size(o) is None or const_size(o) != const_size(r): raise KernelOptError(f"{opt}: axes {opt.axis} and {opt.amount} differ in size")
  ends = [u for u in ast.toposort if u.op is Ops.END and u.src[0].op is Ops.STORE]
  if len(ends) != 1 or ends[0].src[1] is not o: raise KernelOptError(f"{opt}: axis {opt.axis} isn't the innermost loop of the kernel's one store")
  st = ends[0].src[0]
  idx, out = st.src[0], st.src[0].src[0]
  if len(idx.src) != 2 or any(out in u.src for u in ast.toposort if u is not idx):
    raise KernelOptError(f"{opt}: the output is gated or read by the kernel: the stash would overwrite what it reads")
  computed = outside_reduces(st.src[1])
  reds = [u for u in computed if u.op is Ops.REDUCE and u.src[1:] == (r,)]
  if len(reds) != 1 or bound_ranges(reds[0].src[0]) - {r} != bound_ranges(idx) - {o}:
    raise KernelOptError(f"{opt}: no reduce over axis {opt.amount} alone that runs once per row of the output")
  red = reds[0]
  values = [v for v in red.src[0].toposort if v.dtype == out.dtype.base and r in v.toposort and v.substitute({r: o}) in computed]
  if not values: raise KernelOptError(f"{opt}: the output computes nothing the reduce over axis {opt.amount} does")
  return st, red, max(values, key=lambda v: len(v.toposort)), o

def apply_stash(ast: UOp, st: UOp, red: UOp, value: UOp, o: UOp) -> UOp:
  r = red.src[1]
  idx, out = st.src[0], st.src[0].src[0]
  stash = out.index(idx.src[1].substitute({o: r})).store(value)
  stashed = red.replace(src=(red.src[0].substitute({value: value.after(stash)}), r))
  # the output's loop reads the value back once the reduce (and so its stores) is done
  reread, again = out.after(stashed).index(idx.src[1]).load(), value.substitute({r: o})
  memo: dict[UOp, UOp] = {again: reread, red: stashed}
  def rebuild(u: UOp) -> UOp:  # the value read back outside every reduce only: another reduce may run before this one
    if u not in memo: memo[u] = u if u.op is Ops.REDUCE else u.replace(src=tuple(map(rebuild, u.src)))
    return memo[u]
  # and the reduce is the stashing one everywhere, inside other reduces too: else it would be computed twice
  return ast.substitute({st: st.replace(src=(idx, rebuild(st.src[1]).substitute({red: stashed})))})

PACK_MAX = 1 << 17  # elements of one scratch: it lives on the stack of each core's call (8 MB: runtime/threadpool.py). A weight
# gradient over 4096 tokens packs panels of 4096 x 32: 24 -> 77 GFLOPS on one core (without the pack, the swap alone: 39)

def apply_pack(ast: UOp, opt: Opt, r: UOp) -> UOp:
  """The reads of one input inside a reduce that depend on global axis r, and otherwise only on loops
  inside it that aren't global (a matmul's right operand: k rows of the 32 columns of an upcast tile),
  are copied once per iteration of r to a scratch (DEFINE_REG), laid out in the order the reduce reads
  it, and read from there. The copy is per call, so each core packs its own slice; rows of a big
  matrix are a power of two apart and would otherwise all compete for the same few cache sets."""
  globs = global_ranges(ast)
  outside = set(globs[:globs.index(r)])  # loops open in the order of their ids
  def inner_ranges(ld: UOp) -> list[UOp] | None:
    rs = [u for u in ld.src[0].src[1].toposort if u.op is Ops.RANGE and u is not r and u not in outside]
    return None if any(x.arg[1] is AxisKind.GLOBAL or const_size(x) is None for x in rs) else rs
  reads = [ld for red in ast.toposort if red.op is Ops.REDUCE for ld in red.src[0].toposort
           if ld.op is Ops.LOAD and ld.src[0].src[0].op is Ops.PARAM and len(ld.src[0].src) == 2 and r in ld.src[0].src[1].toposort]
  if len(loads := set(reads)) != 1 or (rs := inner_ranges(read := loads.pop())) is None:
    raise KernelOptError(f"{opt}: PACK needs one read inside a reduce along axis {opt.axis} that no other global axis moves")
  # the reduce's loops outermost, the written-out (upcast) ones innermost: each step of the reduce reads one contiguous row
  rs = sorted(rs, key=lambda x: (x.arg[1] is not AxisKind.REDUCE, x.arg))
  if (size := prod(const_size(x) for x in rs)) > PACK_MAX: raise KernelOptError(f"{opt}: a {size}-element scratch is over {PACK_MAX}")
  nreg = sum(1 for u in ast.toposort if u.op is Ops.DEFINE_REG)
  scratch = UOp(Ops.DEFINE_REG, read.dtype.ptr(size, "reg"), (), nreg)
  def offset(ranges: list[UOp]) -> UOp:
    return functools.reduce(lambda acc, x: acc * const_size(x[1]) + x[0], zip(ranges[1:], rs[1:]), ranges[0])
  first = fresh_range_id(ast)
  loops = [UOp(Ops.RANGE, x.dtype, x.src, (first + n, AxisKind.PACK)) for n, x in enumerate(rs)]
  copy = scratch.index(offset(loops)).store(read.substitute(dict(zip(rs, loops)))).end(*loops)
  return graph_rewrite(ast.substitute({read: scratch.after(copy).index(offset(rs)).load()}), symbolic, name="apply_opts/pack")

# ***** GPU work-groups (the thread ids themselves come from codegen/gpudims.py) *****

def apply_local(ast: UOp, opt: Opt, r: UOp) -> UOp:
  """Global axis r of size S -> g*n + l: g a global axis of size S/n, l a local axis of size n."""
  if any(u.op is Ops.DEFINE_LOCAL for u in ast.toposort): raise KernelOptError(f"{opt}: LOCAL opts come before GROUP")
  size = split_size(r, opt)
  outer = UOp(Ops.RANGE, r.dtype, (UOp.const(r.dtype, size // opt.amount),), r.arg)
  inner = UOp(Ops.RANGE, r.dtype, (UOp.const(r.dtype, opt.amount),), (fresh_range_id(ast), AxisKind.LOCAL))
  ends = {u: UOp(Ops.END, u.dtype, (UOp(Ops.END, u.dtype, (u.src[0], inner)), outer)) for u in ast.toposort if u.op is Ops.END and u.src[1] is r}
  return graph_rewrite(ast.substitute(ends).substitute({r: outer * opt.amount + inner}), symbolic, name="apply_opts/local")

def apply_group(ast: UOp, opt: Opt, r: UOp) -> UOp:
  """REDUCE over reduce axis r of size S -> n partial reduces (thread l takes elements l, l+n, ...)
  stored to local memory, a barrier, and a reduce over the n partials."""
  size, n = split_size(r, opt), opt.amount
  red = next(u for u in ast.toposort if u.op is Ops.REDUCE and r in u.src[1:])
  # local memory is written once per thread: a reduce inside another loop would overwrite it while
  # other threads still read it
  nested = {x for u in red.src[0].toposort if u.op is Ops.REDUCE for x in u.src[1:]}
  if (loops := [x for x in red.live_ranges - set(red.src[1:]) - nested if x.arg[1] is AxisKind.REDUCE]):
    raise KernelOptError(f"{opt}: the reduce is inside loop r{loops[0].arg[0]}: GROUP needs it outside every loop")
  new = fresh_range_id(ast)
  rr = UOp(Ops.RANGE, r.dtype, (UOp.const(r.dtype, size // n),), r.arg)
  lid = UOp(Ops.RANGE, r.dtype, (UOp.const(r.dtype, n),), (new, AxisKind.LOCAL))
  dt = dtypes.float32 if red.dtype in NARROW_FLOATS else red.dtype  # partials of narrow floats stay float32
  value = red.src[0].substitute({r: rr * n + lid}).cast(dt)
  partial = UOp(Ops.REDUCE, dt, (value, *(rr if x is r else x for x in red.src[1:])), red.arg)
  # threads of other local axes (LOCAL opts) reduce their own rows: each gets its own n slots
  others = sorted((x for x in partial.live_ranges if x.arg[1] is AxisKind.LOCAL and x is not lid), key=lambda x: x.arg)
  row, slots = UOp.const(r.dtype, 0), n
  for x in others: row, slots = row * x.src[0].arg + x, slots * x.src[0].arg
  nlocal = sum(1 for u in ast.toposort if u.op is Ops.DEFINE_LOCAL)
  buf = UOp(Ops.DEFINE_LOCAL, dt.ptr(slots, "local"), (), nlocal)
  barrier = UOp(Ops.BARRIER, dtypes.void, (buf.index(row * n + lid).store(partial).end(lid),))
  lid2 = UOp(Ops.RANGE, r.dtype, (UOp.const(r.dtype, n),), (new + 1, AxisKind.REDUCE))
  final = UOp(Ops.REDUCE, dt, (buf.after(barrier).index(row * n + lid2).load(), lid2), red.arg).cast(red.dtype)
  return graph_rewrite(ast.substitute({red: final}), symbolic, name="apply_opts/group")


def _try(ast: UOp, opts: list[Opt], *new: Opt) -> UOp:
  """Apply the opts and record them, or (if one doesn't apply) leave the kernel as it is."""
  try: out = apply_opts(ast, list(new))
  except KernelOptError: return ast
  opts.extend(new)
  return out

def unit_stride(index: UOp, r: UOp) -> bool:
  """Do neighbouring iterations of loop r read neighbouring elements?"""
  step = graph_rewrite(index.substitute({r: r + 1}) - index, symbolic, name="heuristics/unit_stride")
  return step.op is Ops.CONST and step.arg == 1

def _first(ast: UOp, opts: list[Opt], *choices: Opt | tuple[Opt, ...]) -> UOp:
  """The first of the choices (an Opt or a sequence of them) that applies: a smaller tile when a wider one is over the
  budget of written-out code."""
  for choice in choices:
    seq = list(choice) if isinstance(choice, tuple) else [choice]
    try: out = apply_opts(ast, seq)
    except KernelOptError: continue
    opts.extend(seq)
    return out
  return ast

def _dividing(size: int | None, amounts: tuple[int, ...]) -> tuple[int, ...]:
  return tuple(a for a in amounts if size is not None and size % a == 0 and size >= a)

def _largest(size: int | None, amounts: tuple[int, ...]) -> int | None:
  return next((a for a in amounts if size is not None and size % a == 0 and size >= a), None)

FULL_TILE = 8  # registers of accumulators: 16x6 written out (of 8-float registers), a SIMD loop of 16 by 6 rows, 8x8

def _tile_rows(ast: UOp, opts: list[Opt], i: int, cap: int) -> UOp:
  """A tile's rows: 6, where they divide the axis or the padding's reads stay in the spare page after a buffer (a padded
  row gates every read of its copy otherwise: 1024^3 fell from 53 to 47), else 8 down to 2, with the accumulators in at
  most `cap`. (Measured on written-out columns; a SIMD loop's tile, a conv's, keeps its 8 rows.)"""
  rows = const_size(axes(ast)[i]) or 0
  padded = -(-rows // 6) * 6
  reduced = prod(const_size(r) or 0 for r in axes(ast) if r.arg[1] is AxisKind.REDUCE)
  six = ((Opt(OptOps.PADTO, i, 6),) if padded != rows else ()) + (Opt(OptOps.UPCAST, i, 6),)
  fits = (padded - rows) * reduced * 4 <= 4096 and copies(ast) * 6 <= cap and not ranges_of(ast, AxisKind.SIMD)
  return _first(ast, opts, *((six,) if fits else ()),
                *(Opt(OptOps.UPCAST, i, a) for a in _dividing(rows, (8, 6, 4, 5, 3, 2)) if copies(ast) * a <= cap))

def scatter_opts(ast: UOp, threads: int) -> list[Opt]:
  """A scatter-add (schedule.py's scatter_kernel: serial loops over the table's rows and the tokens inside the output's
  other loops): 16 columns of a token's row per step as a SIMD loop, which lowering moves inside the token loop (one
  vector read, add and write of the row the token picks; written-out copies, each gated by the index's range, stayed
  scalar in gcc), and the columns split across the cores when the work is big. The serial loops are no axis: never
  split."""
  opts: list[Opt] = []
  glob = global_ranges(ast)
  if not glob: return opts
  j = len(glob) - 1  # the innermost output loop, if it is the one contiguous in memory (the table's row axis may be)
  stores = [st for st in ast.toposort if st.op is Ops.STORE and st.src[0].src[0].op is Ops.PARAM]
  if all(unit_stride(st.src[0].src[1], glob[j]) for st in stores):
    ast = _first(ast, opts, *(Opt(OptOps.SIMD, j, a) for a in _dividing(const_size(glob[j]), (16, 8))))
  # iterations of the loops around each store: every column's fill and its adds
  work = sum(prod(const_size(r) or 1 << 10 for r in st.live_ranges) for st in stores)
  # an iteration is one add: a small transformer's embedding gradient (64 columns, 90 rows, 1024 tokens) took 18 us on
  # one core, 30-80 us on two
  if threads >= 2 and work >= 1 << 18:
    for k, r in enumerate(axes(ast)):
      if (n := next((n for n in (4 * threads, threads) if (const_size(r) or 0) % n == 0 and (const_size(r) or 0) >= n), None)):
        ast = _try(ast, opts, Opt(OptOps.THREAD, k, n)); break
  return opts

def hand_coded_opts(ast: UOp, threads: int, simd: int = 8) -> list[Opt]:
  """Opts for common kernel shapes, chosen from the AST alone:
  - a reduce whose inputs are each re-read along some output axis (matmul, conv): a register tile,
    UPCAST of the output's contiguous axis (up to 32 wide) and of an axis another input doesn't
    depend on (8), so each loaded value feeds many multiply-adds held in registers;
  - any other float sum or max over a contiguous axis: 16 partial accumulators (a SIMD register);
  - a small reduce loop (conv's 3x3 window) is unrolled;
  - big kernels are split across the cores (THREAD), on the outermost axis that splits evenly.
  - a transcendental that the output and a reduce both compute per element (softmax's exp) is STASHed;
  Elementwise loops are left to the C compiler's loop vectorizer."""
  if ranges_of(ast, AxisKind.SERIAL): return scatter_opts(ast, threads)
  opts: list[Opt] = []
  ax = axes(ast)
  glob = [i for i, r in enumerate(ax) if r.arg[1] is AxisKind.GLOBAL]
  # a transcendental that both the output and a reduce compute per element (softmax's exp) is computed once
  for g, k in ((g, k) for g in glob for k, r in enumerate(ax) if r.arg[1] is AxisKind.REDUCE):
    try: value = stash_plan(ast, Opt(OptOps.STASH, g, k), ax)[2]
    except KernelOptError: continue
    if any(u.op in GroupOp.Transcendental for u in value.toposort): ast = _try(ast, opts, Opt(OptOps.STASH, g, k))
  reds = [u for u in ast.toposort if u.op is Ops.REDUCE]
  work = prod(const_size(r) or 1 for r in ax)
  # what the gated loads' gates depend on (a padded conv's input gradient gates its reads along the window and the width)
  gates = [u.src[0].src[2].toposort for red in reds for u in red.src[0].toposort if u.op is Ops.LOAD and len(u.src[0].src) == 3]
  tiled = False
  if len(reds) == 1 and reds[0].arg is Ops.ADD and len(glob) >= 2:
    # what a load reads is decided by its address: a pad's gate (which a conv's gradient puts on every load) doesn't
    # make a weight vary along the image
    loads = [u.src[0].src[1].toposort for u in reds[0].src[0].toposort if u.op is Ops.LOAD]
    j = glob[-1]
    # the other tile axis: one that no input read along j depends on, and preferably another input does (matmul's rows,
    # conv's channels; not a batch axis, which only a bias read along j doesn't depend on; an embedding's gradient
    # compares its rows' index with the tokens, and no input is read along it)
    along_j = [ld for ld in loads if ax[j] in ld]
    tile_axes = [g for g in glob[:-1] if along_j and all(ax[g] not in ld for ld in along_j) and (const_size(ax[g]) or 0) >= 8]
    # of several (a batched matmul's batch and rows), the innermost: its loop is the one around j's, which SWAP exchanges
    i = next((g for g in reversed(tile_axes) if any(ax[g] in ld for ld in loads)), tile_axes[-1] if tile_axes else None)
    # a tile pays when each load is reused along one of its axes: one that varies along both (a layernorm's gradient,
    # whose rows are summed with the rows' own statistics) would be loaded once per output of the tile anyway
    if i is not None and len(along_j) < len(loads) and work >= 1 << 16 and not any(ax[i] in ld and ax[j] in ld for ld in loads):
      # the tile's width: a multiple of 8 (a SIMD register) where the axis allows, else 8-12 outputs
      # (conv's 30 -> 10: measured faster than padding to 32, whose gated reads don't vectorize)
      gated_along_j = any(ax[j] in g for g in gates)
      # a SIMD loop over j reads whole vectors only where the reads along j are contiguous (a linear layer's (out, in)
      # weight is read along out with a stride: a loop over it gathers, written-out copies load one value each)
      contiguous_j = all(unit_stride(u.src[0].src[1], ax[j]) for u in reds[0].src[0].toposort if u.op is Ops.LOAD and ax[j] in u.src[0].src[1].toposort)
      if (const_size(ax[j]) or 99) <= 4:
        # a small output window (a conv's weight gradient is 3x3 per channel pair): every small axis that an input
        # doesn't read along is written out whole, so each value loaded (and whatever is fused into it, a relu's
        # gradient) feeds all of the window; scalar accumulators, so fewer of the other axis (measured: 4 x 3x3)
        for g in glob:
          if (const_size(ax[g]) or 99) <= 4 and any(ax[g] not in ld for ld in loads): ast = _try(ast, opts, Opt(OptOps.UPCAST, g, const_size(ax[g])))
        # and 2 partial sums along the innermost reduce axis (the image's rows) where it splits, in place of half the
        # other axis: twice the independent adds per loaded value (conv1's 26-wide weight gradient, measured 1.45x)
        inner = max((k for k, r in enumerate(ax) if r.arg[1] is AxisKind.REDUCE), default=None)
        if inner is not None and (const_size(ax[inner]) or 0) % 2 == 0: ast = _try(ast, opts, Opt(OptOps.UPCAST, inner, 2))
        ast = _tile_rows(ast, opts, i, min(36, TILE_REGISTERS * simd))
      elif (n := const_size(ax[j]) or 0) % 8 and ((padded := -(-n // 16) * 16) - n <= n // 8 or gated_along_j) and contiguous_j:
        # a width no multiple of 8 divides (a conv's 30): written out, its outputs don't line up with SIMD registers
        # and gcc vectorizes them poorly (measured 42 vs 64 GFLOPS); padded to 16s, it is one innermost loop. Reads
        # gated along it (a padded conv's input gradient, 13 wide) are masked loads in that loop, where written-out
        # copies are a select each: padded even at more cost (3/16 more lanes, measured 2.4x faster)
        if padded != n: ast = _try(ast, opts, Opt(OptOps.PADTO, j, padded))
        ast = _tile_rows(_try(ast, opts, Opt(OptOps.SIMD, j, 16)), opts, i, TILE_REGISTERS * simd)
      else:
        # the first width written out whose tile (with its rows) holds FULL_TILE accumulators, else the tile holding
        # most: a costly value computed from the tile's sums (a GELU's gradient, ~100 nodes) written out for each of a
        # 16x6 tile's outputs is over the budget, and a SIMD loop over the width keeps 6 of it. A transcendental computed
        # from them goes in a SIMD loop first: written out, gcc leaves its copies scalar (32x4 tile with a GELU's
        # gradient after it, 4.9 ms; a SIMD loop of 16 by 8 rows, 0.69)
        written = [Opt(OptOps.UPCAST, j, a) for a in _dividing(const_size(ax[j]), tuple(dict.fromkeys((2 * simd, 16, 32, 8, 12, 10, 9, 4))))]
        looped = [Opt(OptOps.SIMD, j, a) for a in _dividing(const_size(ax[j]), (16, 8))]
        after = set(ast.toposort) - set(reds[0].toposort) - {reds[0]}
        widths = looped + written if any(u.op in GroupOp.Transcendental for u in after) else written + looped
        best: tuple[int, UOp, list[Opt]] = (0, ast, [])
        for width in widths:
          if (tile := _try(ast, tried := [], width)) is ast: continue
          tile = _tile_rows(tile, tried, i, TILE_REGISTERS * simd)
          if copies(tile) > best[0]: best = (copies(tile), tile, tried)
          if best[0] >= FULL_TILE * simd: break
        ast = best[1]; opts += best[2]
      reduced = prod(const_size(r) or 0 for r in ax if r.arg[1] is AxisKind.REDUCE)
      tiled = True
      big = len(glob) == 2 and (const_size(ax[i]) or 0) >= 256 and reduced * (const_size(ax[j]) or 0) >= 1 << 20
      if big or not contiguous_j:
        # the loop over column panels goes outside the rows loop, and each panel (k rows of the tile's width) is packed
        # once, so every row block streams it contiguously from cache: a big matmul's panel would fall out of it, and
        # a strided one (x @ w.T reads w along its rows) would be read a value at a time (35 -> 50 GFLOPS on one core).
        # Unless the rows' operand is read across its rows (transposed: each step of the sum a new cache line per row) and
        # too big for the cache to hold between panels: then each row block packs its panels (a weight gradient summed
        # over 4096 tokens, 1152 x 4096 floats: 24 -> 44 GFLOPS; a row-major 2048^3 operand wants the swap, 18 -> 52)
        inner = max((r for r in ax if r.arg[1] is AxisKind.REDUCE), key=lambda r: r.arg)
        rows_read = [u.src[0].src[1] for u in reds[0].src[0].toposort if u.op is Ops.LOAD and ax[j] not in u.src[0].src[1].toposort]
        across = any(inner in ix.toposort and not unit_stride(ix, inner) for ix in rows_read)
        swap = not across or (const_size(ax[i]) or 0) * reduced <= SWAP_MAX_ROWS
        ast = _first(ast, opts, (*((Opt(OptOps.SWAP, i, j),) if swap else ()), Opt(OptOps.PACK, i, 0)), *((Opt(OptOps.SWAP, i, j),) if swap else ()))
  # a small window (3x3, a pool's 2x2) is written out from its innermost axis, unless reads along it are gated (a conv's
  # input gradient, padded): then each copy tests its own gate, measured slower than the loop. Written out, a pool's
  # window leaves a plain loop over its outputs that gcc vectorizes (measured 5x)
  # (only a reduce with no reduce inside it: written-out copies of a loop around another loop are not lowered)
  innermost = {ax.index(r) for red in reds if not any(u.op is Ops.REDUCE for u in red.src[0].toposort) for r in red.src[1:] if r in ax}
  for k, r in reversed(list(enumerate(axes(ast)))):
    if k in innermost and r.arg[1] is AxisKind.REDUCE and (const_size(r) or 99) <= 4 and not any(ax[k] in g for g in gates):
      ast = _try(ast, opts, Opt(OptOps.UNROLL, k, const_size(r)))
  if not tiled:
    for red in reds:
      if not (red.arg in (Ops.ADD, Ops.MAX) and dtypes.is_float(red.dtype)): continue
      # reads contiguous along an output axis, not along the reduce (a column sum, x.sum(0) of a row-major matrix): a
      # row of outputs is written out, up to 128 wide (as many independent accumulators, each row read is a contiguous
      # run), leaving a slice of it per core; partial sums along the reduce would read one float per cache line
      # (sum(0) of (4096, 1024): 14.4 -> 0.24 ms, torch 0.66)
      cur = axes(ast)
      reads = [u.src[0].src[1] for u in red.src[0].toposort if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.PARAM]
      inner = max((r for r in red.src[1:] if r.arg[1] is AxisKind.REDUCE), key=lambda r: r.arg, default=None)
      along = [k for k, r in enumerate(cur) if r.arg[1] is AxisKind.GLOBAL and any(unit_stride(i, r) for i in reads)]
      # (reads that don't vary along the row, a layernorm's per-token statistics in its weight's gradient, are one value
      # for all of it)
      if along and inner is not None and not any(unit_stride(i, inner) for i in reads if cur[along[-1]] in i.toposort):
        size = const_size(cur[along[-1]]) or 0
        widths = [w for w in (128, 64, 32, 16, 8) if size % w == 0]
        if (w := next((w for w in widths if size // w >= threads), widths[0] if widths else None)) is not None:
          # narrower where a costly value summed (a GELU's gradient) would write out too much; then a SIMD loop
          n = len(opts)
          ast = _first(ast, opts, *(Opt(OptOps.UPCAST, along[-1], x) for x in widths if x <= w),
                       *(Opt(OptOps.SIMD, along[-1], x) for x in (16, 8) if size % x == 0))
          if len(opts) > n: continue
      # partial accumulators: 16 (a SIMD register) from the innermost reduce axis when they divide it; else factors of the
      # axes from the innermost outward, up to 8, so the adds don't wait on each other (a conv's bias gradient over
      # batch x 26 x 26: 2x2x2, measured 7x). A max that keeps NaN is a compare, a test and a select per step, twice an
      # add's latency: 32 of them keep two registers' chains in flight (row max of (4096, 1024): 0.35 -> 0.27 ms)
      rs = [ax.index(r) for r in sorted((r for r in red.src[1:] if r.arg[1] is AxisKind.REDUCE), key=lambda r: r.arg, reverse=True)]
      if rs and (a := _largest(const_size(axes(ast)[rs[0]]), (32, 16, 8, 4) if red.arg is Ops.MAX else (16, 8, 4))) is not None:
        ast = _try(ast, opts, Opt(OptOps.UPCAST, rs[0], a)); continue
      lanes = 1
      for k in rs:
        if (a := _largest(const_size(axes(ast)[k]), tuple(a for a in (8, 4, 2) if lanes * a <= 8))) is None: continue
        n = len(opts)
        ast = _try(ast, opts, Opt(OptOps.UPCAST, k, a))
        if len(opts) > n: lanes *= a
    # an output axis that an index divides (a pool's gradient reads pooled[x//2]): written out in steps of the divisor,
    # each copy's index is a constant offset, and the loop over the rest vectorizes (measured 5x on a pool's gradient)
    cur = axes(ast)
    divs = sorted({(cur.index(u.src[0]), u.src[1].arg) for u in ast.toposort if u.op in (Ops.IDIV, Ops.MOD) and u.src[0] in cur
                   and u.src[0].arg[1] is AxisKind.GLOBAL and u.src[1].op is Ops.CONST}, reverse=True)
    for k, c in divs:
      if 2 <= c <= 8 and (const_size(axes(ast)[k]) or 0) % c == 0 and copies(ast) * c <= 16: ast = _try(ast, opts, Opt(OptOps.UPCAST, k, c))
  if threads >= 2 and work >= 1 << 16:  # below that, a launch on another core costs more than it saves
    # a big kernel is cut in 4 slices per core, which the cores take as they come free (engine/realize.py):
    # on a machine shared with other work, a core that another process holds back leaves its slices to the rest
    counts = (4 * threads, threads) if work >= 1 << 22 else (threads,)
    for k, r in enumerate(axes(ast)):
      if r.arg[1] is AxisKind.GLOBAL and (n := next((n for n in counts if (const_size(r) or 0) % n == 0 and (const_size(r) or 0) >= n), None)):
        ast = _try(ast, opts, Opt(OptOps.THREAD, k, n)); break
  return opts
