"""Movement ops become index arithmetic: an AT placed at a kernel's store is pushed down the
tensor graph by these rules, turning reshape into div/mod, permute into swapped indices, expand
into a dropped index, pad into a validity gate, shrink into an offset and flip into a mirrored
index (DESIGN §3.3). What arrives at a buffer is a gated LOAD; what arrives at a reduce opens
new reduce ranges."""
from __future__ import annotations
from dataclasses import dataclass, field
from attograd.dtype import dtypes, DType
from attograd.helpers import strides_for_shape
from attograd.uop.ops import AxisKind, UOp, Ops, GroupOp, sint, substitute_sym
from attograd.uop.patterns import UPat, PatternMatcher

@dataclass
class IndexingContext:
  idx_dtype: DType
  n_ranges: int                                   # ranges 0..n-1 are the output's; reduces take the next ids
  params: dict[UOp, UOp] = field(default_factory=dict)  # BUFFER -> PARAM, numbered in order of first use
  def new_range(self, size: int, kind: AxisKind) -> UOp:
    r = UOp(Ops.RANGE, self.idx_dtype, (UOp.const(self.idx_dtype, size),), (self.n_ranges, kind))
    self.n_ranges += 1
    return r
  def param(self, buf: UOp) -> UOp:
    if buf not in self.params: self.params[buf] = UOp(Ops.PARAM, buf.dtype.ptr(buf.arg.size), (), len(self.params))
    return self.params[buf]

def tindex(x: UOp, gate: UOp, idxs: tuple[UOp, ...]) -> UOp:
  """x (shaped) read at idxs, where gate says whether the read is valid at all."""
  assert len(idxs) == len(x.shape), f"index rank {len(idxs)} for shape {x.shape}"
  return UOp(Ops.AT, x.dtype, (x, gate, *idxs))

def as_index_size(x: UOp, dtype: DType) -> UOp:
  """A symbolic size (integer math over Variables) computed in the kernel's index dtype."""
  if x.dtype == dtype: return x
  new: dict[UOp, UOp] = {}
  for u in x.toposort:
    if u.op is Ops.CONST: new[u] = UOp.const(dtype, u.arg)
    elif u.op is Ops.DEFINE_VAR: new[u] = u.cast(dtype)
    else: new[u] = u.replace(dtype=dtype, src=tuple(new[s] for s in u.src))
  return new[x]

def sizes_in_index_dtype(value: UOp, shape: tuple[sint, ...], dtype: DType) -> tuple[UOp, tuple[sint, ...]]:
  """The graph and shape with every symbolic size in the index dtype, so index math never mixes dtypes."""
  if all(x.dtype == dtype for u in value.toposort for x in u.sym_args) and all(s.dtype == dtype for s in shape if isinstance(s, UOp)):
    return value, shape
  f = lambda x: as_index_size(x, dtype)
  return substitute_sym(value, {}, f), tuple(f(s) if isinstance(s, UOp) else s for s in shape)

def linearize_index(idxs: tuple[UOp, ...], shape: tuple[sint, ...], zero: UOp) -> UOp:
  ret = zero
  for i, st in zip(idxs, strides_for_shape(shape)): ret = ret + i * st
  return ret

def unflatten_index(lin: UOp, shape: tuple[sint, ...]) -> tuple[UOp, ...]:
  # lin < prod(shape), so the outermost axis needs no modulo (with a symbolic size no bound could drop it)
  outer = next((d for d, s in enumerate(shape) if s != 1), None)
  return tuple(lin.const_like(0) if s == 1 else lin // st if d == outer else (lin // st) % s
               for d, (s, st) in enumerate(zip(shape, strides_for_shape(shape))))

def push_reshape(r: UOp, gate: UOp, idxs: tuple[UOp, ...], ctx: IndexingContext) -> UOp:
  src = r.src[0]
  if [s for s in r.shape if s != 1] == [s for s in src.shape if s != 1]:
    # only size-1 axes come or go: each other axis keeps its index (no div/mod, which a symbolic size couldn't simplify)
    kept = iter(i for i, s in zip(idxs, r.shape) if s != 1)
    return tindex(src, gate, tuple(next(kept) if s != 1 else UOp.const(ctx.idx_dtype, 0) for s in src.shape))
  return tindex(src, gate, unflatten_index(linearize_index(idxs, r.shape, UOp.const(ctx.idx_dtype, 0)), src.shape))

def push_pad(p: UOp, gate: UOp, idxs: tuple[UOp, ...]) -> UOp:
  src = p.src[0]
  valid = UOp.const(dtypes.bool, True)
  for i, s, (b, a) in zip(idxs, src.shape, p.arg):
    if b != 0: valid = valid & (i > b - 1)  # != 0, not truthiness: an amount can be symbolic
    if a != 0: valid = valid & (i < b + s)
  new = tuple(i - b if b != 0 else i for i, (b, _) in zip(idxs, p.arg))
  return valid.where(tindex(src, gate & valid, new), UOp.const(p.dtype, 0))

def push_reduce(red: UOp, gate: UOp, idxs: tuple[UOp, ...], ctx: IndexingContext) -> UOp:
  op, axes = red.arg
  src = red.src[0]
  new_ranges = {a: ctx.new_range(src.shape[a], AxisKind.REDUCE) for a in axes if src.shape[a] != 1}
  inner = tindex(src, gate, tuple(new_ranges.get(a, idxs[a].const_like(0)) if a in axes else idxs[a] for a in range(len(idxs))))
  return UOp(Ops.REDUCE, red.dtype, (inner, *new_ranges.values()), op)

def push_load(buf: UOp, gate: UOp, idx: UOp, ctx: IndexingContext) -> UOp:
  ptr = UOp(Ops.INDEX, buf.dtype.ptr(buf.arg.size), (ctx.param(buf), idx) + (() if gate.op is Ops.CONST and gate.arg else (gate,)))
  return UOp(Ops.LOAD, buf.dtype, (ptr,))

def tpat(op: Ops | set[Ops]) -> UPat:
  return UPat(Ops.AT, src=(UPat(op, name="x"), UPat(name="gate")), allow_any_len=True, name="ix")
def I(ix: UOp) -> tuple[UOp, ...]: return ix.src[2:]

pushdown = PatternMatcher([
  (tpat(Ops.RESHAPE), lambda ctx, ix, x, gate: push_reshape(x, gate, I(ix), ctx)),
  (tpat(Ops.PERMUTE), lambda ix, x, gate: tindex(x.src[0], gate, tuple(I(ix)[x.arg.index(i)] for i in range(len(x.arg))))),
  (tpat(Ops.EXPAND), lambda ix, x, gate: tindex(x.src[0], gate, tuple(
    i.const_like(0) if s == 1 and n != 1 else i for i, s, n in zip(I(ix), x.src[0].shape, x.shape)))),
  (tpat(Ops.PAD), lambda ix, x, gate: push_pad(x, gate, I(ix))),
  (tpat(Ops.SHRINK), lambda ix, x, gate: tindex(x.src[0], gate, tuple(i + b if b != 0 else i for i, (b, _) in zip(I(ix), x.arg)))),
  (tpat(Ops.FLIP), lambda ix, x, gate: tindex(x.src[0], gate, tuple((s - 1) - i if f else i for i, s, f in zip(I(ix), x.shape, x.arg)))),
  (tpat(GroupOp.Elementwise), lambda ix, x, gate: x.replace(src=tuple(tindex(s, gate, I(ix)) for s in x.src))),
  (tpat({Ops.DETACH, Ops.CONTIGUOUS, Ops.CONTIGUOUS_BACKWARD}), lambda ix, x, gate: tindex(x.src[0], gate, I(ix))),
  (tpat(Ops.CONST), lambda ix, x, gate: UOp.const(x.dtype, x.arg)),
  (tpat(Ops.DEFINE_VAR), lambda ix, x, gate: x),
  (tpat(Ops.IOTA), lambda ix, x, gate: I(ix)[0].cast(x.dtype)),
  (tpat(Ops.REDUCE_AXIS), lambda ctx, ix, x, gate: push_reduce(x, gate, I(ix), ctx)),
  (tpat(Ops.BUFFER), lambda ctx, ix, x, gate: push_load(x, gate, I(ix)[0], ctx)),
])
