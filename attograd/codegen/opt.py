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
from typing import Callable
from enum import Enum, auto
from attograd.dtype import dtypes, DType
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
  WIDEN = auto()    # CPU: the float16/bfloat16 values a reduce reads along a global axis (a quantized block's scales) are
                    # converted to float32 once per iteration of it, a loop of vector conversions into a scratch the reduce reads
  STASH = auto()    # CPU: a value both the output and a reduce compute per element (softmax's exp) is stored to the
                    # output inside the reduce's loop (`amount` names the reduce axis) and read back by the output's loop
  MERGE = auto()    # a global axis and the one nested directly inside it (`amount` names it) become one loop, row-major:
                    # the inner axis loops over both, the outer one is left a loop of 1 (no axis is renumbered)

@dataclass(frozen=True)
class Opt:
  op: OptOps
  axis: int         # index into axes(ast): global axes, then reduce axes
  amount: int
  def __repr__(self) -> str: return f"Opt({self.op.name}, {self.axis}, {self.amount})"

class KernelOptError(ValueError): pass

# the kind of axis an Opt applies to (True: global, False: reduce); the others take either
NEEDS = {OptOps.THREAD: True, OptOps.SWAP: True, OptOps.MERGE: True, OptOps.PACK: True, OptOps.WIDEN: True, OptOps.SIMD: True, OptOps.LOCAL: True, OptOps.STASH: True,
         OptOps.UNROLL: False, OptOps.GROUP: False}

THREADS = ContextVar("THREADS", os.cpu_count() or 1)
MAX_COPIES = 512  # upcast x unroll (x simd): the number of copies of the loop body written out
# nodes of a kernel once its copies are written out (written_out_size): a matmul's 8x32 register tile is ~2300-2600; a
# 128-wide row of a column sum with a GELU's gradient fused in was 30k, and took gcc minutes
MAX_WRITTEN_OUT = 3072

def ranges_of(ast: UOp, kind: AxisKind) -> list[UOp]:
  return list(_ranges_by_kind(ast).get(kind, ()))

# the heuristics ask a kernel for its axes a dozen times between two Opts (each a walk of the whole graph): found once per
# AST (UOps are hash-consed and immutable), for the ASTs of the kernels lowered last
@functools.lru_cache(maxsize=1024)
def _ranges_by_kind(ast: UOp) -> dict[AxisKind, tuple[UOp, ...]]:
  out: dict[AxisKind, list[UOp]] = {}
  for u in ast.toposort:
    if u.op is Ops.RANGE: out.setdefault(u.arg[1], []).append(u)
  return {k: tuple(sorted(v, key=lambda r: r.arg)) for k, v in out.items()}

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

# (ast, opt, has_local) -> the AST with opt applied: the heuristics apply each Opt as they choose it, and lowering applies
# the list again from the kernel's AST (a third of a small transformer's lowering time was this second time)
_applied: dict[tuple[UOp, Opt, bool], UOp] = {}
APPLIED_MEMO = 1024  # entries kept (the oldest go first): a few kernels' steps

def apply_opt(ast: UOp, opt: Opt, has_local: bool = False) -> UOp:
  """One Opt as a rewrite of the AST; KernelOptError when it doesn't apply to this kernel. A pure function of its
  arguments (UOps are hash-consed): remembered for the kernels lowered last."""
  if (out := _applied.get(key := (ast, opt, has_local))) is not None: return out
  out = _apply_opt(ast, opt, has_local)
  if len(_applied) >= APPLIED_MEMO: del _applied[next(iter(_applied))]
  _applied[key] = out
  return out

def _apply_opt(ast: UOp, opt: Opt, has_local: bool) -> UOp:
  if opt.op in (OptOps.LOCAL, OptOps.GROUP) and not has_local:
    raise KernelOptError(f"{opt}: {opt.op.name} needs a target with workgroups (a GPU); this one has no work-groups")
  if opt.op is not OptOps.THREAD and _copied(ast):
    # the scratch is laid out for the loops as they were: only splitting the work across cores keeps it valid
    raise KernelOptError(f"{opt}: only THREAD may follow PACK or WIDEN")
  ax = axes(ast)
  if not 0 <= opt.axis < len(ax): raise KernelOptError(f"{opt}: the kernel has {len(ax)} axes")
  r = ax[opt.axis]
  is_global = r.arg[1] is AxisKind.GLOBAL
  if opt.op in NEEDS and NEEDS[opt.op] != is_global:
    raise KernelOptError(f"{opt}: {opt.op.name} applies to a {'global' if NEEDS[opt.op] else 'reduce'} axis, axis {opt.axis} is {r.arg[1]}")
  if opt.op is OptOps.SWAP: return apply_swap(ast, opt, ax)
  if opt.op is OptOps.MERGE: return apply_merge(ast, opt, ax)
  if opt.op is OptOps.STASH:
    # on a GPU each output's thread runs the whole reduce: every thread would store the whole row
    if has_local: raise KernelOptError(f"{opt}: STASH is for a loop that runs a reduce once per row; this target has work-groups")
    return apply_stash(ast, *stash_plan(ast, opt, ax))
  if opt.op is OptOps.LOCAL: return apply_local(ast, opt, r)
  if opt.op is OptOps.GROUP: return apply_group(ast, opt, r)
  if opt.op in (OptOps.PACK, OptOps.WIDEN):
    if has_local: raise KernelOptError(f"{opt}: {opt.op.name}'s scratch is per call: a target with work-groups would share it")
    return apply_pack(ast, opt, r) if opt.op is OptOps.PACK else apply_widen(ast, opt, r)
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
  # the loop's END now closes the smaller range; every use of the old index gets the offset (one walk of the graph)
  new: dict[UOp, UOp] = {r: core * chunk + inner}
  for u in ast.toposort:
    if u in new: continue
    src = tuple([new.get(s, s) for s in u.src])
    new[u] = UOp(Ops.END, u.dtype, (src[0], inner)) if u.op is Ops.END and u.src[1] is r else u.replace(src=src)
  return graph_rewrite(new[ast], symbolic, name="apply_opts/thread")

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
      src = (src[0], src[1], valid if u.gate is None else (src[2] & valid))
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

def apply_merge(ast: UOp, opt: Opt, ax: list[UOp]) -> UOp:
  """Outer axis y (A) and inner axis x (B) -> one loop over x of A*B, y = x // B, x = x % B; y stays a loop of 1. A read
  whose row stride is B (a conv's input rows, once its output's row is padded to theirs) is then linear in the loop: a
  SIMD loop over it runs across rows, every lane busy, where one over each row alone would be padded to whole
  registers (a 5x5 conv's 20 wide rows: 20 of 32 lanes; merged at the input's 24, 20 of 24)."""
  if not 0 <= opt.amount < len(ax) or ax[opt.amount].arg[1] is not AxisKind.GLOBAL or opt.amount == opt.axis:
    raise KernelOptError(f"{opt}: MERGE needs another global axis as amount")
  y, x = ax[opt.axis], ax[opt.amount]
  if (a := const_size(y)) is None or (b := const_size(x)) is None: raise KernelOptError(f"{opt}: an axis has a symbolic size")
  if any(u.op is Ops.RANGE and len(u.arg) > 2 and u.arg[2] in (y.arg[0], x.arg[0]) for u in ast.toposort):
    raise KernelOptError(f"{opt}: an axis was split already")
  ends = {u.src[1]: u for u in ast.toposort if u.op is Ops.END and u.src[1] in (y, x)}
  if len(ends) != 2 or ends[y].src[0] is not ends[x]: raise KernelOptError(f"{opt}: axis {opt.amount} isn't the loop directly inside axis {opt.axis}")
  one = UOp(Ops.RANGE, y.dtype, (UOp.const(y.dtype, 1),), y.arg)
  both = UOp(Ops.RANGE, x.dtype, (UOp.const(x.dtype, a * b),), x.arg)
  new: dict[UOp, UOp] = {y: both // b + one, x: both % b}
  for u in ast.toposort:
    if u in new: continue
    src = tuple([new.get(s, s) for s in u.src])
    if u.op is Ops.END and u.src[1] in (y, x): src = (src[0], one if u.src[1] is y else both)
    new[u] = u.replace(src=src)
  return graph_rewrite(new[ast], symbolic, name="apply_opts/merge")

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
  # the value read back outside every reduce only (another reduce may run before this one), and the reduce is the
  # stashing one everywhere, inside other reduces too: else it would be computed twice
  outside = _outside_reduces(st.src[1], {again: reread, red: stashed})
  return ast.substitute({st: st.replace(src=(idx, outside.substitute({red: stashed})))})

def _outside_reduces(u: UOp, memo: dict[UOp, UOp]) -> UOp:
  """u with memo's replacements made outside every REDUCE (what lies inside a reduce is left as it is)."""
  if u not in memo: memo[u] = u if u.op is Ops.REDUCE else u.replace(src=tuple(_outside_reduces(s, memo) for s in u.src))
  return memo[u]

PACK_MAX = 1 << 17  # elements of one scratch: it lives on the stack of each core's call (8 MB: runtime/threadpool.py). A weight
# gradient over 4096 tokens packs panels of 4096 x 32: 24 -> 77 GFLOPS on one core (without the pack, the swap alone: 39)

def _inside(ast: UOp, r: UOp) -> Callable[[UOp], list[UOp] | None]:
  """For a read: the loops it moves along besides global axis r and the global loops around r, if they are all loops
  inside r that aren't global and of constant size (what one iteration of r reads of it), else None."""
  globs = global_ranges(ast)
  outside = set(globs[:globs.index(r)])  # loops open in the order of their ids
  def inner_ranges(ld: UOp) -> list[UOp] | None:
    rs = [u for u in ld.src[0].src[1].toposort if u.op is Ops.RANGE and u is not r and u not in outside]
    if any(x.arg[1] is AxisKind.GLOBAL or const_size(x) is None for x in rs): return None
    # the reduce's loops outermost, the written-out (upcast) ones innermost: each step of the reduce reads one contiguous row
    return sorted(rs, key=lambda x: (x.arg[1] is not AxisKind.REDUCE, x.arg))
  return inner_ranges

def _to_scratch(x: UOp) -> bool:
  """Does x only store to scratches (DEFINE_REG)?"""
  return x.op is Ops.STORE and x.src[0].src[0].op is Ops.DEFINE_REG or x.op is Ops.NOOP and all(map(_to_scratch, x.src))

def _copied(ast: UOp) -> bool:
  """Has PACK or WIDEN copied values to a scratch (_copy_once): a PACK loop, or a SIMD loop that only stores to a scratch.
  (A scratch alone doesn't say: an attention kernel's online-softmax registers are the scheduler's, schedule/flash.py.)"""
  return any(u.op is Ops.RANGE and u.arg[1] is AxisKind.PACK or u.op is Ops.END and _to_scratch(u.src[0])
             and any(r.op is Ops.RANGE and r.arg[1] is AxisKind.SIMD for r in u.src[1:]) for u in ast.toposort)

def _copy_once(ast: UOp, values: list[UOp], rs: list[UOp], dtype: DType, vector: bool = False) -> dict[UOp, UOp]:
  """values (each a function of the loops rs and of loops outside them) computed in one loop nest over rs into a scratch
  of their own (DEFINE_REG, laid out in rs's order) before they are used: each value -> its read from the scratch. With
  `vector`, the innermost loop is a SIMD loop, which the C compiler vectorizes rather than writes out (clang wrote out a
  loop of 16 float16 conversions and then gathered half of them, one word at a time: a matvec 27 -> 54 us)."""
  if (size := prod(const_size(x) for x in rs)) * len(values) > PACK_MAX:
    raise KernelOptError(f"{len(values)} scratches of {size} elements are over {PACK_MAX}")
  nreg = sum(1 for u in ast.toposort if u.op is Ops.DEFINE_REG)
  scratches = [UOp(Ops.DEFINE_REG, dtype.ptr(size, "reg"), (), nreg + i) for i in range(len(values))]
  def offset(ranges: list[UOp]) -> UOp:
    return functools.reduce(lambda acc, x: acc * const_size(x[1]) + x[0], zip(ranges[1:], rs[1:]), ranges[0])
  first = fresh_range_id(ast)
  kinds = [AxisKind.PACK] * (len(rs) - 1) + [AxisKind.SIMD if vector else AxisKind.PACK]
  loops = [UOp(Ops.RANGE, x.dtype, x.src, (first + n, kind)) for n, (x, kind) in enumerate(zip(rs, kinds))]
  stores = [s.index(offset(loops)).store(v.substitute(dict(zip(rs, loops)))) for s, v in zip(scratches, values)]
  copy = (stores[0] if len(stores) == 1 else UOp(Ops.NOOP, dtypes.void, tuple(stores))).end(*loops)
  return {v: s.after(copy).index(offset(rs)).load() for s, v in zip(scratches, values)}

def apply_pack(ast: UOp, opt: Opt, r: UOp) -> UOp:
  """The reads of one input inside a reduce that depend on global axis r, and otherwise only on loops
  inside it that aren't global (a matmul's right operand: k rows of the 32 columns of an upcast tile),
  are copied once per iteration of r to a scratch (DEFINE_REG), laid out in the order the reduce reads
  it, and read from there. The copy is per call, so each core packs its own slice; rows of a big
  matrix are a power of two apart and would otherwise all compete for the same few cache sets."""
  inner_ranges = _inside(ast, r)
  reads = [ld for red in ast.toposort if red.op is Ops.REDUCE for ld in red.src[0].toposort
           if ld.op is Ops.LOAD and ld.src[0].src[0].op is Ops.PARAM and ld.src[0].gate is None and r in ld.src[0].src[1].toposort]
  # of several reads along r, the one no other global axis moves (a conv's weight gradient summed over chunks of images:
  # the output gradient's chunk, read along the channels of a SIMD loop, not the image read along the window)
  if len(loads := set(reads)) > 1: loads = {ld for ld in loads if inner_ranges(ld) is not None}
  if len(loads) != 1 or (rs := inner_ranges(read := loads.pop())) is None:
    raise KernelOptError(f"{opt}: PACK needs one read inside a reduce along axis {opt.axis} that no other global axis moves")
  try: new = _copy_once(ast, [read], rs, read.dtype)
  except KernelOptError as e: raise KernelOptError(f"{opt}: {e}") from None
  return graph_rewrite(ast.substitute(new), symbolic, name="apply_opts/pack")

def apply_widen(ast: UOp, opt: Opt, r: UOp) -> UOp:
  """Every float16/bfloat16 read inside a reduce that is converted to float32, read one value at a time (no lane or simd
  loop moves it), depends on global axis r and otherwise only on loops inside it that aren't global (a quantized
  matvec's block scales: one per block and row of a group of rows), converted once per iteration of r in one loop nest
  over those loops (the written-out rows innermost: a contiguous run, one vector conversion per register) into a
  float32 scratch, which the reduce reads. Read in place, each copy of the reduce's body converts its own value, a
  scalar load, conversion and broadcast per block and row (three instructions more than a float32 scale loaded as a
  broadcast: one core, a Q4_1 576x1536 matvec 28-29 us with float32 scales, 36 converted in place, 28-30 widened).
  A read a vector loop moves is converted as vectors there."""
  inner_ranges = _inside(ast, r)
  widened: dict[tuple[UOp, ...], list[UOp]] = {}
  for u in dict.fromkeys(u for red in ast.toposort if red.op is Ops.REDUCE for u in red.src[0].toposort):
    if u.op is not Ops.CAST or u.dtype != dtypes.float32 or (ld := u.src[0]).op is not Ops.LOAD or ld.dtype not in NARROW_FLOATS: continue
    if ld.src[0].src[0].op is not Ops.PARAM or ld.src[0].gate is not None or r not in ld.src[0].src[1].toposort: continue
    if (rs := inner_ranges(ld)) and not any(x.arg[1] in (AxisKind.LANE, AxisKind.SIMD) for x in rs): widened.setdefault(tuple(rs), []).append(u)
  if not widened: raise KernelOptError(f"{opt}: no float16 or bfloat16 read inside a reduce, one value at a time, moves along axis {opt.axis} and loops inside it only")
  new: dict[UOp, UOp] = {}
  for rs, values in widened.items():
    try: new.update(_copy_once(ast.substitute(new) if new else ast, values, list(rs), dtypes.float32, vector=True))
    except KernelOptError as e: raise KernelOptError(f"{opt}: {e}") from None
  return graph_rewrite(ast.substitute(new), symbolic, name="apply_opts/widen")

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
