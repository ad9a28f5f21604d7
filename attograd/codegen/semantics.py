"""The IR's own results where hardware has none or other ones, written once as plain ops: the `ir_semantics` pass.

The IR defines (as the PYTHON device computes them, uop/ops.py exec_alu):
- `divmod`: integer x/0 = x%0 = 0, and for signed types x/-1 = -x (wrapping) and x%-1 = 0 (hardware traps or is
  undefined there: C, LLVM, PTX);
- `nan_max`: a float MAX with a NaN operand is NaN, as in torch (C's a > b ? a : b, PTX's max and LLVM's maxnum drop it);
- `shift_mask`: a shift amount is taken modulo the operand's width (C and LLVM leave larger ones undefined, PTX clamps);
- `bool_math`: ADD, SUB, MUL and MAX on bool are or, xor, and, or (on a 1-bit register, add is xor);
- `bool_compare`: CMPLT, CMPNE and CMPEQ on bools (PTX's setp has no predicate operands, WGSL no ordering of bool);
- `float_to_int`: a float converts to any integer type, truncating toward zero and wrapping modulo 2**bits, NaN and inf
  to 0. A target without it (LLVM, PTX) converts floats to int64 only (saturating beyond it: README says so): a narrower
  type is that int64 narrowed, and uint64 above 2**63 is x - 2**63 converted, plus 2**63.
A renderer names in `Renderer.native` those its target's instructions already have; this pass rewrites the rest into
ops every target has, so a renderer only spells ops. It runs last, after the renderer's own rewrites, whose float64
series may make any of these."""
from __future__ import annotations
import functools
from attograd.dtype import dtypes
from attograd.uop.ops import UOp, Ops
from attograd.uop.patterns import UPat, PatternMatcher, graph_rewrite
from attograd.renderer import IR_SEMANTICS

def _guarded(y: UOp) -> UOp:
  """The test that y is a divisor the hardware can't take: 0, or -1 for a signed type (INT_MIN/-1 overflows)."""
  zero = y.eq(0)
  return zero if dtypes.is_unsigned(y.dtype) else zero | y.eq(-1)

def _never_traps(y: UOp) -> bool:
  """Is y never 0 (nor -1, signed): by its bounds, or because it is the safe divisor this pass writes."""
  bad = (0,) if dtypes.is_unsigned(y.dtype) else (0, -1)
  if not any(y.vmin <= b <= y.vmax for b in bad): return True
  return y.op is Ops.WHERE and y.src[1].op is Ops.CONST and y.src[1].arg == 1 and y.src[0] is _guarded(y.src[2])

def _divmod(d: UOp, x: UOp, y: UOp) -> UOp | None:
  if _never_traps(y): return None
  if y.op is Ops.CONST: return -x if d.op is Ops.IDIV and y.arg == -1 else d.const_like(0)
  bad = _guarded(y)
  q = d.replace(src=(x, bad.where(y.const_like(1), y)))  # a divisor that can't trap; its result is replaced below
  if d.op is Ops.MOD or dtypes.is_unsigned(d.dtype): return bad.where(d.const_like(0), q)
  return y.eq(0).where(d.const_like(0), y.eq(-1).where(-x, q))

def _shift(s: UOp, x: UOp, y: UOp) -> UOp | None:
  bits = 8 * s.dtype.itemsize
  if 0 <= y.vmin and y.vmax < bits: return None
  return s.replace(src=(x, y.const_like(y.arg % bits) if y.op is Ops.CONST else y & (bits - 1)))

def _not(x: UOp) -> UOp: return x ^ True

def _float_to_int(c: UOp, x: UOp) -> UOp | None:
  if not (dtypes.is_float(x.dtype) and dtypes.is_int(c.dtype)) or c.dtype == dtypes.int64: return None
  if c.dtype != dtypes.uint64: return x.cast(dtypes.int64).cast(c.dtype)
  if x.dtype.itemsize < 4: return x.cast(dtypes.float32).cast(c.dtype)  # no arithmetic in 16-bit floats here
  small, big = x.cast(dtypes.int64).cast(c.dtype), (x - 2.0**63).cast(dtypes.int64).cast(c.dtype) + 2**63
  return (x.ne(x) | (x < 2.0**63)).where(small, big)  # NaN: the small side's 0

RULES: dict[str, list] = {
  "divmod": [(UPat((Ops.IDIV, Ops.MOD), name="d", src=(UPat.var("x"), UPat.var("y"))), _divmod)],
  # max(a, b) = a when a is NaN, else the greater (b when they are unordered: b's NaN comes through too). Two selects,
  # not one on (a != a) | (b < a): the inner one alone is an ordinary max (one instruction: C compilers see it), where
  # the or-ed condition became a branch per element in scalar code (a 2x2 max pool: 33 -> 8 ms)
  "nan_max": [(UPat(Ops.MAX, name="m", src=(UPat.var("a"), UPat.var("b"))),
               lambda m, a, b: a.ne(a).where(a, (b < a).where(a, b)) if dtypes.is_float(m.dtype) else None)],
  "shift_mask": [(UPat((Ops.SHL, Ops.SHR), name="s", src=(UPat.var("x"), UPat.var("y"))), _shift)],
  "bool_math": [(UPat(op, dtype=dtypes.bool, src=(UPat.var("a"), UPat.var("b"))), lambda a, b, o=logic: a.alu(o, b))
                for op, logic in ((Ops.ADD, Ops.OR), (Ops.MAX, Ops.OR), (Ops.SUB, Ops.XOR), (Ops.MUL, Ops.AND))],
  "bool_compare": [
    (UPat(Ops.CMPNE, src=(UPat.var("a", dtypes.bool), UPat.var("b"))), lambda a, b: a ^ b),
    (UPat(Ops.CMPEQ, src=(UPat.var("a", dtypes.bool), UPat.var("b"))), lambda a, b: _not(a ^ b)),
    (UPat(Ops.CMPLT, src=(UPat.var("a", dtypes.bool), UPat.var("b"))), lambda a, b: _not(a) & b)],
  "float_to_int": [(UPat(Ops.CAST, name="c", src=(UPat.var("x"),)), _float_to_int)],
}

assert RULES.keys() == IR_SEMANTICS, "a semantic without rules (or rules for one renderers can't name)"

@functools.cache
def semantics_for(native: frozenset[str]) -> PatternMatcher | None:
  """The rules of every semantic a target lacks (None: it has them all)."""
  if unknown := native - IR_SEMANTICS: raise ValueError(f"unknown IR semantics {sorted(unknown)}: these exist: {sorted(IR_SEMANTICS)}")
  return PatternMatcher([r for name in sorted(IR_SEMANTICS - native) for r in RULES[name]]) if native != IR_SEMANTICS else None

def ir_semantics(sink: UOp, native: frozenset[str]) -> UOp:
  """sink with every semantic the target hasn't natively (`native`) written as plain ops."""
  return sink if (pm := semantics_for(native)) is None else graph_rewrite(sink, pm, name="ir_semantics")
