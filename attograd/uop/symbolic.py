"""Rewrite rules for integer (index) arithmetic and constant folding.
Every rule holds under C's truncating division (DESIGN §4.4); rules that would change a
float result (reassociation, x*0) are restricted to integers."""
from __future__ import annotations
import functools, math
from attograd.dtype import dtypes, DType, INTS
from attograd.uop.ops import UOp, Ops, GroupOp, exec_alu
from attograd.uop.patterns import UPat, PatternMatcher, graph_rewrite

INT_TYPES = INTS
BOOL_INT = (dtypes.bool, *INTS)

@functools.lru_cache(maxsize=None)
def _key(u: UOp) -> tuple:
  """A deterministic order for terms (same across processes, unlike id()): r0 before r1."""
  return (u.op.value, str(u.arg), u.dtype.name, tuple(_key(s) for s in u.src))

def split_terms(u: UOp) -> tuple[list[tuple[UOp, int]], int]:
  """An integer sum as [(node, coefficient)], constant."""
  if u.op is Ops.ADD:
    (a, ca), (b, cb) = split_terms(u.src[0]), split_terms(u.src[1])
    return a + b, ca + cb
  if u.op is Ops.CONST: return [], u.arg
  if u.op is Ops.MUL and u.src[1].op is Ops.CONST:
    terms, c = split_terms(u.src[0])
    return [(n, k * u.src[1].arg) for n, k in terms], c * u.src[1].arg
  return [(u, 1)], 0

def build_sum(dtype: DType, terms: list[tuple[UOp, int]], const: int) -> UOp:
  merged: dict[UOp, int] = {}
  for n, k in terms: merged[n] = merged.get(n, 0) + k
  parts = [n if k == 1 else UOp(Ops.MUL, dtype, (n, UOp.const(dtype, k))) for n, k in sorted(merged.items(), key=lambda t: _key(t[0])) if k != 0]
  if const != 0 or not parts: parts.append(UOp.const(dtype, const))
  ret = parts[0]
  for p in parts[1:]: ret = UOp(Ops.ADD, dtype, (ret, p))
  return ret

def normalize_sum(x: UOp) -> UOp | None:
  """Collect like terms and constants of an integer sum into one canonical form."""
  terms, const = split_terms(x)
  return build_sum(x.dtype, terms, const)

def fold_divmod(x: UOp, c: UOp, d: UOp) -> UOp | None:
  """x // c and x % c for a constant c > 0. Each term n*k of x splits as n*(k//c)*c + n*(k%c),
  so x = c*Q + R; with x >= 0 and R >= 0 truncation is floor division, x//c = Q + R//c and
  x%c = R%c exactly. Bounds then often decide R//c = 0 and R%c = R."""
  cv = c.arg
  if cv <= 0: return None
  if not x.exact: return None  # the rules below reason about magnitudes, which wraparound breaks
  if x.vmin >= 0 and x.vmax < cv: return x if d.op is Ops.MOD else x.const_like(0)
  if x.vmin >= 0 and x.vmin // cv == x.vmax // cv and d.op is Ops.IDIV: return x.const_like(x.vmin // cv)
  terms, const = split_terms(x)
  if all(0 <= k < cv for _, k in terms) and 0 <= const < cv: return None
  rest = build_sum(x.dtype, [(n, k % cv) for n, k in terms], const % cv)
  if x.vmin < 0 or rest.vmin < 0 or not (x.exact and rest.exact): return None
  if d.op is Ops.MOD: return UOp(Ops.MOD, x.dtype, (rest, c))
  return build_sum(x.dtype, [(n, k // cv) for n, k in terms] + [(UOp(Ops.IDIV, x.dtype, (rest, c)), 1)], const // cv)

def fold_const(a: UOp) -> UOp: return a.const_like(exec_alu(a.op, a.dtype, [s.arg for s in a.src]))

def decided_by_bounds(x: UOp) -> UOp | None:
  if (dtypes.is_int(x.dtype) or dtypes.is_bool(x.dtype)) and x.vmin == x.vmax: return x.const_like(x.vmin)
  return None

x, y, z, c1, c2 = UPat.var("x"), UPat.var("y"), UPat.var("z"), UPat.cvar("c1"), UPat.cvar("c2")
ix, iy = UPat.var("x", INT_TYPES), UPat.var("y", INT_TYPES)

symbolic = PatternMatcher([
  # constant folding, and integer values that bounds pin to one number
  (UPat(GroupOp.ALU, src=UPat(Ops.CONST), name="a"), fold_const),
  (UPat(Ops.CAST, src=(UPat(Ops.CONST, name="c"),), name="a"), lambda a, c: UOp.const(a.dtype, c.arg)),
  (UPat(GroupOp.ALU | {Ops.CAST}, dtype=BOOL_INT, name="x"), decided_by_bounds),
  # constants go on the right of commutative ops, so the rules below see one form
  (UPat(GroupOp.Commutative, src=(UPat(Ops.CONST), UPat(name="b")), name="a"),
   lambda a, b: a.replace(src=(b, a.src[0])) if b.op is not Ops.CONST else None),
  # identities
  (x + UPat.const(None, 0), lambda x: x), (x - UPat.const(None, 0), lambda x: x),
  (x * UPat.const(None, 1), lambda x: x), (ix * UPat.const(None, 0), lambda x: x.const_like(0)),
  (x // UPat.const(None, 1), lambda x: x), (UPat(Ops.FDIV, src=(x, UPat.const(None, 1.0))), lambda x: x),
  (ix % UPat.const(None, 1), lambda x: x.const_like(0)),
  (ix - ix, lambda x: x.const_like(0)), (x.maximum(x), lambda x: x),
  (UPat(Ops.NEG, src=(UPat(Ops.NEG, src=(x,)),)), lambda x: x),
  (x & UPat.const(dtypes.bool, True), lambda x: x), (x | UPat.const(dtypes.bool, False), lambda x: x),
  (x & UPat.const(dtypes.bool, False), lambda x: x.const_like(False)), (x | UPat.const(dtypes.bool, True), lambda x: x.const_like(True)),
  (UPat((Ops.AND, Ops.OR), dtype=dtypes.bool, src=(x, x)), lambda x: x),
  (UPat(Ops.WHERE, src=(UPat(Ops.CONST, name="c"), x, y)), lambda c, x, y: x if c.arg else y),
  (UPat(Ops.WHERE, src=(UPat.var(), x, x)), lambda x: x),
  (UPat(Ops.CAST, name="a", src=(x,)), lambda a, x: x if a.dtype == x.dtype else None),
  (UPat((Ops.CMPLT, Ops.CMPNE), src=(ix, ix)), lambda x: UOp.const(dtypes.bool, False)),
  (UPat(Ops.MAX, src=(x, y)), lambda x, y: (x if x.vmin >= y.vmax else y if y.vmin >= x.vmax else None)
     if dtypes.is_int(x.dtype) else None),
  # integer sums in one canonical form: like terms and constants collected
  (UPat(Ops.SUB, dtype=INT_TYPES, src=(x, y)), lambda x, y: x + y * -1),
  (UPat(Ops.MUL, dtype=INT_TYPES, src=(UPat(Ops.ADD, name="s"), c1)),
   lambda s, c1: build_sum(s.dtype, [(n, k * c1.arg) for n, k in split_terms(s)[0]], split_terms(s)[1] * c1.arg)),
  (UPat(Ops.MUL, dtype=INT_TYPES, src=(UPat(Ops.MUL, src=(x, c1)), c2)), lambda x, c1, c2: x * (c1.arg * c2.arg)),
  (UPat(Ops.ADD, dtype=INT_TYPES, name="s"), lambda s: r if (r := normalize_sum(s)) is not s else None),
  # division and remainder by constants
  (UPat((Ops.IDIV, Ops.MOD), dtype=INT_TYPES, src=(ix, c1), name="d"), lambda x, c1, d: fold_divmod(x, c1, d)),
  (UPat(Ops.IDIV, src=(UPat(Ops.MUL, src=(ix, c1), name="m"), c2)),
   lambda x, c1, c2, m: (x * (c1.arg // c2.arg) if c1.arg % c2.arg == 0 else x // (c2.arg // c1.arg) if c2.arg % c1.arg == 0 else None)
     if c1.arg > 0 and c2.arg > 0 and m.exact else None),
  (UPat(Ops.IDIV, src=(UPat(Ops.IDIV, src=(ix, c1)), c2)), lambda x, c1, c2: x // (c1.arg * c2.arg) if c1.arg > 0 and c2.arg > 0 else None),
  (UPat(Ops.MOD, src=(UPat(Ops.MOD, src=(ix, c1)), c2)), lambda x, c1, c2: x % c2 if c2.arg != 0 and c1.arg % c2.arg == 0 else None),
  # comparisons against constants move the constants to one side
  (UPat(Ops.CMPLT, src=(UPat(Ops.ADD, dtype=INT_TYPES, src=(x, c1), name="a"), c2)),
   lambda x, c1, c2, a: x < (c2.arg - c1.arg) if a.exact and x.dtype.scalar() == a.dtype and
     dtypes.min(a.dtype) <= c2.arg - c1.arg <= dtypes.max(a.dtype) else None),
  (UPat(Ops.CMPLT, src=(UPat(Ops.MUL, dtype=INT_TYPES, src=(x, c1), name="m"), c2)),
   lambda x, c1, c2, m: x < -(-c2.arg // c1.arg) if c1.arg > 0 and m.exact else None),
])

def simplify(u: UOp) -> UOp: return graph_rewrite(u, symbolic)
UOp.simplifier = simplify
