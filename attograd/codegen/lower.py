"""Kernel AST -> loop-level UOps: reductions become accumulators with explicit loop ends, and
narrow float math is done in float32 (DESIGN §3.5)."""
from __future__ import annotations
from attograd.dtype import dtypes, DType
from attograd.uop.ops import UOp, Ops, GroupOp
from attograd.uop.patterns import UPat, PatternMatcher, graph_rewrite
from attograd.uop.symbolic import symbolic
from attograd.codegen.divmod import divmod_lowering

NARROW_FLOATS = (dtypes.float16, dtypes.bfloat16)

def reduce_identity(op: Ops, dtype: DType) -> float | int | bool:
  if op is Ops.ADD: return 0
  if op is Ops.MUL: return 1
  if op is Ops.MAX: return dtypes.min(dtype)
  raise NotImplementedError(f"no identity for reduce {op}")

def lower_reduce(ctx: list[int], red: UOp) -> UOp:
  """REDUCE(x, r...) -> an accumulator: init before the loops, update inside, read after their END."""
  value, ranges = red.src[0], red.src[1:]
  if not ranges: return value
  if red.dtype in NARROW_FLOATS:  # accumulate narrow floats in float32, as PyTorch does
    return UOp(Ops.REDUCE, dtypes.float32, (value.cast(dtypes.float32), *ranges), red.arg).cast(red.dtype)
  acc = UOp(Ops.DEFINE_REG, red.dtype.ptr(1, "reg"), (), ctx[0]); ctx[0] += 1
  outer = tuple(sorted(value.live_ranges - set(ranges), key=lambda r: r.arg))
  zero = UOp.const(dtypes.int32, 0)
  init = acc.after(*outer).index(zero).store(UOp.const(red.dtype, reduce_identity(red.arg, red.dtype)))
  acc_val = acc.after(init, *ranges).index(zero).load()
  update = acc.index(zero).store(acc_val.alu(red.arg, value)).end(*ranges)
  return acc.after(update).index(zero).load()

def compute_in_float32(a: UOp) -> UOp | None:
  """Math on float16/bfloat16 is done in float32 and rounded once, as PyTorch's CPU kernels do."""
  if not (a.dtype in NARROW_FLOATS or any(s.dtype in NARROW_FLOATS for s in a.src)): return None
  srcs = tuple(s.cast(dtypes.float32) if s.dtype in NARROW_FLOATS else s for s in a.src)
  return UOp(a.op, dtypes.float32 if a.dtype in NARROW_FLOATS else a.dtype, srcs, a.arg).cast(a.dtype)

lowerer = PatternMatcher([
  (UPat(Ops.REDUCE, name="red"), lower_reduce),
  (UPat(GroupOp.ALU, name="a"), compute_in_float32),
])

def lower(ast: UOp) -> UOp:
  # division by constants goes last: its multiply-shift form is no longer one the symbolic rules read
  return graph_rewrite(graph_rewrite(graph_rewrite(ast, lowerer, ctx=[0]), symbolic), divmod_lowering)
