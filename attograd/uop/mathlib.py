"""Transcendentals from arithmetic and bit operations, as UOp rewrites: exp for every target (`exp_math`), and
float64 exp2, log2 and sin for targets that have no such instructions (PTX has them for float32 only). Each is a
range reduction to a small interval and a polynomial on it, summed with Horner's rule; all stay within a few ulp
of the correctly rounded result (sin: for |x| < 2**20 * pi/2, where the three-part pi/2 keeps the reduction exact)."""
from __future__ import annotations
import math, struct
from attograd.dtype import DType, dtypes
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

# ln 2 to 60 digits (Decimal(2).ln() at precision 60), as an integer over 10**60: the split below is exact integer
# arithmetic, so the decimal module (0.8 MiB resident with its library, in every process importing attograd) isn't needed
_LN2_DIGITS = 693147180559945309417232121458176568075500134360255254120680

def _ln2_split(bits: int) -> tuple[float, float]:
  """ln 2 = hi + lo with hi holding `bits` fractional bits (so n*hi is exact for the n exp meets) and lo the rest,
  both correctly rounded from a 60-digit ln 2 (an int's true division rounds correctly)."""
  scale = 10 ** 60
  hi = _LN2_DIGITS * 2 ** bits // scale  # hi * 2**-bits: ln 2 truncated to `bits` fractional bits
  return hi / 2 ** bits, (_LN2_DIGITS * 2 ** bits - hi * scale) / (scale * 2 ** bits)

# e**r on |r| <= ln(2)/2, lowest power first. float32: a minimax fit (Lawson's weighted least squares on 4000
# Chebyshev nodes) of relative error 3.1e-9, 0.71 ulp evaluated in float32 with fma; float64: Taylor to r**13 (4e-18).
_EXP_POLY = {dtypes.float32: (1.0, 1.0, 0.4999999403953552, 0.1666652113199234, 0.04166838899254799, 0.008368730545043945,
                              0.0013814570847898722),
             dtypes.float64: tuple(1 / math.factorial(k) for k in range(14))}
# per dtype: the clamp for x (just past overflow and past half the smallest subnormal, so the results there are
# still inf and 0 and n = round(x/ln2) fits two normal half-scales), ln 2 split, exponent bias, mantissa bits, int type
_EXP = {dtypes.float32: ((-104.0, 89.0), _ln2_split(16), 127, 23, dtypes.int32),
        dtypes.float64: ((-746.0, 710.0), _ln2_split(32), 1023, 52, dtypes.int64)}

def _bits(v: float, dt: DType) -> int:
  fmt = {dtypes.float32: ("<f", "<i", "<I"), dtypes.float64: ("<d", "<q", "<Q")}[dt]
  return struct.unpack(fmt[1] if v >= 0 else fmt[2], struct.pack(fmt[0], v))[0]

def exp(x: UOp) -> UOp:
  """e**x = 2**n * e**r with n = round(x/ln2) and r = x - n*ln2 (ln2 in two parts, so r is exact up to the small
  part's rounding). Branch-free and with no call, so a CPU loop around it vectorizes."""
  dt = x.dtype
  (lo, hi), (ln2_hi, ln2_lo), bias, mbits, idt = _EXP[dt]
  udt = {dtypes.int32: dtypes.uint32, dtypes.int64: dtypes.uint64}[idt]
  # the clamp as integer compares of the bits (past lo, a negative float's bits are the larger unsigned number; past
  # hi, a positive float's are the larger signed one): a float compare-and-select per side costs gcc's AVX-512 code
  # four mask instructions. inf becomes the bound, which gives inf. Below lo (-inf: a causal mask) the result is 0,
  # selected at the end: computing it as an underflow costs the CPU a microcode assist per element (exp of -inf measured
  # 8.7x slower than of 0), so those lanes compute exp(0) instead. NaN is put back at the end
  u = x.bitcast(udt)
  above_lo = u < _bits(lo, dt)
  u = above_lo.where(u, u.const_like(0)).bitcast(idt)
  c = (u < _bits(hi, dt)).where(u, u.const_like(_bits(hi, dt))).bitcast(dt)
  # n = round(x/ln2) as an integer: the low mantissa bits of x/ln2 + 1.5*2**mbits (a sum whose last bit is worth 1, so
  # adding rounds to an integer), then as a float by a conversion: no TRUNC (exp of 1M floats on one core 411 -> 376 us).
  # Not (y + k) - k, which shader compilers (WGSL's) fold to y
  magic = 1.5 * 2.0 ** mbits
  ni = c.alu(Ops.MULACC, 1 / math.log(2), magic).bitcast(idt) - _bits(magic, dt)
  n = ni.cast(dt)
  # c - n*ln2_hi is exact (n*ln2_hi has few bits and is close to c): a fused multiply-add rounds only its last step
  r = n.alu(Ops.MULACC, -ln2_lo, n.alu(Ops.MULACC, -ln2_hi, c))
  coeffs = _EXP_POLY[dt]
  p = x.const_like(coeffs[-1])
  for k in reversed(coeffs[:-1]): p = p.alu(Ops.MULACC, r, k)
  # 2**n in two factors: each stays a normal float where 2**n alone would not, so a subnormal result rounds once
  n1 = ni >> 1
  scale = lambda k: ((k + bias) << mbits).bitcast(dt)
  return x.ne(x).where(x, above_lo.where(p * scale(n1) * scale(ni - n1), x.const_like(0.0)))

exp_math = PatternMatcher([(UPat(Ops.EXP, dtype=(dtypes.float32, dtypes.float64), src=(UPat.var("x"),)), exp)])
