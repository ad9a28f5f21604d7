"""Division and remainder by constants, lowered to multiply-and-shift (DESIGN §3.5).

A hardware divide takes tens of cycles; a multiply and a shift take a few. x // d for a constant d
is floor(x * M / 2**s) with a "magic" M chosen from the dividend's bounds, so every backend gets the
cheap form, proven over the bounds (test/test_symbolic_proofs.py proves each rule with Z3, for the
whole int32 range and for int64 dividends as wide as the product allows).

The pass runs last in lowering: after it, index math is no longer in the form the symbolic rules
read, so nothing simplifies it again."""
from __future__ import annotations
from attograd.dtype import dtypes, DType
from attograd.uop.ops import UOp, Ops
from attograd.uop.patterns import UPat, PatternMatcher

def magic(d: int, n: int) -> tuple[int, int]:
  """(M, s) with floor(x*M / 2**s) == floor(x/d) for 0 <= x <= n. With M = ceil(2**s / d) the product
  overshoots x/d by x*e/(d*2**s), e = M*d - 2**s < d; that stays under the 1/d gap to the next
  multiple of d while n*e < 2**s. The smallest such s keeps M, and so the product, smallest."""
  s = 0
  while n * (-(1 << s) % d) >= 1 << s: s += 1
  return -(-(1 << s) // d), s

def wide_enough(dt: DType, n: int, m: int) -> DType | None:
  """The dtype the product x*M is computed in: the dividend's own if it fits, else int64 for int32."""
  if n * m <= dtypes.max(dt): return dt
  if dt == dtypes.int32 and n * m <= dtypes.max(dtypes.int64): return dtypes.int64
  return None  # an int64 dividend near its full range would need a 128-bit product: a divide is cheaper

def fast_div(x: UOp, d: int) -> UOp | None:
  """x // d (C truncation) without a divide, for a constant d > 1, or None where that isn't cheaper."""
  dt = x.dtype
  if not x.exact: return None  # bounds of a wrapping value say nothing
  if d & (d - 1) == 0:  # a power of two is a shift; negative x first moves up by d-1 (truncation rounds toward 0)
    k = d.bit_length() - 1
    if x.vmin >= 0: return x >> UOp.const(dt, k)
    # x >> (bits-1) is -1 for negative x and 0 otherwise: masked, it is the d-1 that only negative x get
    return (x + ((x >> UOp.const(dt, 8 * dt.itemsize - 1)) & UOp.const(dt, d - 1))) >> UOp.const(dt, k)
  # floor((x*M) >> s) for x < 0 is floor(x/d) - 1 when d divides x (e > 0 pushes the product below
  # x/d) and floor(x/d) otherwise: one more is truncation in both cases, under the same bound on |x|
  n = max(x.vmax, -x.vmin)
  m, s = magic(d, n)
  if (wide := wide_enough(dt, n, m)) is None: return None
  q = ((x.cast(wide) * UOp.const(wide, m)) >> UOp.const(wide, s)).cast(dt)
  return q if x.vmin >= 0 else q + (x < 0).cast(dt)

def fast_mod(x: UOp, d: int) -> UOp | None:
  """x % d = x - (x//d)*d, and for x >= 0 and d a power of two, a mask."""
  if d & (d - 1) == 0 and x.vmin >= 0 and x.exact: return x & UOp.const(x.dtype, d - 1)
  return None if (q := fast_div(x, d)) is None else x - q * UOp.const(x.dtype, d)

SIGNED_INDEX = (dtypes.int32, dtypes.int64)
divmod_lowering = PatternMatcher([
  (UPat(Ops.IDIV, dtype=SIGNED_INDEX, src=(UPat.var("x"), UPat.cvar("c"))), lambda x, c: fast_div(x, c.arg) if c.arg > 1 else None),
  (UPat(Ops.MOD, dtype=SIGNED_INDEX, src=(UPat.var("x"), UPat.cvar("c"))), lambda x, c: fast_mod(x, c.arg) if c.arg > 1 else None),
])
