"""What is legal in a kernel graph, as a PatternMatcher: each rule says whether a node it matches is legal (read
with PatternMatcher.first_result; it rewrites nothing).
Tests run it over every kernel they build; a node no rule accepts is a bug upstream."""
from __future__ import annotations
from attograd.dtype import dtypes, PtrDType
from attograd.uop.ops import AxisKind, UOp, Ops, GroupOp
from attograd.uop.patterns import UPat, PatternMatcher

def _same_dtype(a: UOp) -> bool:
  values = a.src[1:] if a.op is Ops.WHERE else a.src
  return all(s.dtype == values[0].dtype for s in values) and (a.op in GroupOp.Comparison or a.dtype == values[-1].dtype) \
    if a.op not in (Ops.SHL, Ops.SHR) else a.dtype == a.src[0].dtype

kernel_spec = PatternMatcher([
  (UPat(Ops.SINK), lambda: True),
  (UPat(Ops.NOOP, dtype=dtypes.void), lambda: True),  # a group of stores (upcast copies, several accumulators)
  (UPat(Ops.PARAM, name="p"), lambda p: isinstance(p.dtype, PtrDType) and isinstance(p.arg, int)),
  (UPat(Ops.DEFINE_VAR, name="v"), lambda v: dtypes.is_int(v.dtype) and len(v.arg) == 3),
  (UPat(Ops.DEFINE_REG, name="r"), lambda r: isinstance(r.dtype, PtrDType) and r.dtype.addrspace == "reg"),
  (UPat(Ops.CONST, name="c"), lambda c: not c.src),
  (UPat(Ops.RANGE, name="r"), lambda r: dtypes.is_int(r.dtype) and r.src[0].dtype == r.dtype and type(r.arg[1]) is AxisKind),
  (UPat(Ops.SPECIAL, name="s"), lambda s: s.dtype == dtypes.int32 == s.src[0].dtype and s.arg[:4] in ("gidx", "lidx")),
  (UPat(Ops.CORE_ID, name="c"), lambda c: dtypes.is_int(c.dtype) and not c.src and isinstance(c.arg, int) and c.arg >= 1),
  (UPat(Ops.DEFINE_LOCAL, name="l"), lambda l: isinstance(l.dtype, PtrDType) and l.dtype.addrspace == "local"),
  (UPat(Ops.BARRIER, src=UPat((Ops.STORE, Ops.END))), lambda: True),
  (UPat(Ops.END, src=(UPat(), UPat(Ops.RANGE))), lambda: True),
  (UPat(Ops.AFTER, name="a"), lambda a: a.dtype == a.src[0].dtype),
  (UPat(Ops.INDEX, name="i"), lambda i: isinstance(i.dtype, PtrDType) and dtypes.is_int(i.src[1].dtype) and
     (i.gate is None or i.gate.dtype == dtypes.bool)),
  (UPat(Ops.LOAD, src=(UPat(Ops.INDEX),), name="l"), lambda l: l.dtype == l.src[0].dtype.base),
  (UPat(Ops.STORE, src=(UPat(Ops.INDEX), UPat()), name="s"), lambda s: s.src[1].dtype == s.src[0].dtype.base),
  (UPat(Ops.REDUCE, name="r"), lambda r: r.arg in (Ops.ADD, Ops.MUL, Ops.MAX) and all(x.op is Ops.RANGE for x in r.src[1:])),
  (UPat(Ops.WHERE, name="a"), lambda a: a.src[0].dtype == dtypes.bool and _same_dtype(a)),
  (UPat(GroupOp.Comparison, name="a"), lambda a: a.dtype == dtypes.bool and _same_dtype(a)),
  (UPat(GroupOp.ALU - GroupOp.Comparison - {Ops.WHERE}, name="a"), _same_dtype),
  (UPat((Ops.CAST, Ops.BITCAST)), lambda: True),
])

def verify_kernel(sink: UOp) -> None:
  """Raise if any node of a kernel AST (before or after lowering) is not legal."""
  for u in sink.toposort:
    if kernel_spec.first_result(u) is not True: raise AssertionError(f"illegal {u.op} in kernel:\n{u.op} {u.dtype} {u.arg} srcs={[s.op for s in u.src]}")
