"""float64 exp2, log2 and sin from arithmetic and bit operations, as UOp rewrites, for targets that
have no such instructions (PTX has them for float32 only). Each is a range reduction to a small
interval and a series on it, summed with Horner's rule; all stay within a few ulp of the correctly
rounded result (sin: for |x| < 2**20 * pi/2, where the three-part pi/2 keeps the reduction exact)."""
from __future__ import annotations
import math
from attograd.dtype import dtypes
from attograd.uop.ops import UOp, Ops
from attograd.uop.patterns import UPat, PatternMatcher

F64, I64 = dtypes.float64, dtypes.int64
def c(v: float) -> UOp: return UOp.const(F64, v)
def trunc(x: UOp) -> UOp: return x.alu(Ops.TRUNC)
def rint(x: UOp) -> UOp: return trunc(x + (x < c(0.0)).where(c(-0.5), c(0.5)))  # halves away from zero: any tie-break works here
def horner(x: UOp, coeffs: list[float]) -> UOp:
  """coeffs[0] + coeffs[1]*x + coeffs[2]*x**2 + ..."""
  acc = c(coeffs[-1])
  for k in reversed(coeffs[:-1]): acc = acc * x + c(k)
  return acc
def pow2i(n: UOp) -> UOp:
  """2**n for an integer-valued float64 n in [-1022, 1023], built from its exponent bits."""
  return ((n.cast(I64) + UOp.const(I64, 1023)) << UOp.const(I64, 52)).bitcast(F64)

def exp2(x: UOp) -> UOp:
  # clamping keeps the scale's exponent valid; beyond it the result is inf or 0 anyway (NaN stays NaN)
  x = (x < c(-1080.0)).where(c(-1080.0), (c(1030.0) < x).where(c(1030.0), x))
  n = rint(x)
  f = (x - n) * c(math.log(2))  # |f| <= ln(2)/2: the Taylor series of e**f to degree 13 is exact to 1e-17
  p = horner(f, [1 / math.factorial(k) for k in range(14)])
  half = trunc(n * c(0.5))  # 2**n in two factors: each stays a normal double where 2**n alone would not
  return p * pow2i(half) * pow2i(n - half)

def log2(x: UOp) -> UOp:
  tiny = x < c(2.0 ** -1022)  # subnormals first become normal
  y = tiny.where(x * c(2.0 ** 54), x)
  b = y.bitcast(I64)
  e = ((b >> UOp.const(I64, 52)) & UOp.const(I64, 0x7ff)).cast(F64) - tiny.where(c(1023.0 + 54), c(1023.0))
  m = ((b & UOp.const(I64, (1 << 52) - 1)) | UOp.const(I64, 1023 << 52)).bitcast(F64)  # mantissa in [1, 2)
  big = c(math.sqrt(2)) < m
  m, e = big.where(m * c(0.5), m), big.where(e + c(1.0), e)  # m in [sqrt(2)/2, sqrt(2)]
  s = (m - c(1.0)) / (m + c(1.0))  # ln(m) = 2 atanh(s), |s| <= 0.172: 12 odd terms reach 1e-17
  ln_m = c(2.0) * s * horner(s * s, [1 / (2 * k + 1) for k in range(12)])
  out = e + ln_m * c(1 / math.log(2))
  # the edges: log2(0) = -inf, log2(inf) = inf, negative and NaN give NaN
  out = (x.eq(c(0.0))).where(c(-math.inf), (x.eq(c(math.inf))).where(c(math.inf), out))
  return (x < c(0.0)).where(c(math.nan), x.ne(x).where(x, out))

# pi/2 in three parts whose products with a quadrant count below 2**20 are exact (Cody and Waite)
PIO2 = (1.57079632673412561417e+00, 6.07710050630396597660e-11, 2.02226624871116645580e-21)
def sin(x: UOp) -> UOp:
  k = rint(x * c(2 / math.pi))
  r = ((x - k * c(PIO2[0])) - k * c(PIO2[1])) - k * c(PIO2[2])  # |r| <= pi/4
  r2 = r * r
  s = r * horner(r2, [(-1) ** i / math.factorial(2 * i + 1) for i in range(9)])
  co = horner(r2, [(-1) ** i / math.factorial(2 * i) for i in range(10)])
  q = k.cast(I64) & UOp.const(I64, 3)  # the quadrant: sin, cos, -sin, -cos of r
  v = (q & UOp.const(I64, 1)).ne(UOp.const(I64, 0)).where(co, s)
  v = (q & UOp.const(I64, 2)).ne(UOp.const(I64, 0)).where(-v, v)
  return (x - x).ne(c(0.0)).where(c(math.nan), v)  # inf and NaN: x - x is NaN

float64_math = PatternMatcher([
  (UPat(Ops.EXP2, dtype=F64, src=(UPat.var("x"),)), exp2),
  (UPat(Ops.LOG2, dtype=F64, src=(UPat.var("x"),)), log2),
  (UPat(Ops.SIN, dtype=F64, src=(UPat.var("x"),)), sin),
])
