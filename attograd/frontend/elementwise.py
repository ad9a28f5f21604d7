"""The math and activation set, random creation helpers, and composite nn functions.

Everything here is built from the differentiable primitives of tensor.py, so gradients come for free.
The transcendental functions without a primitive (erf, asin, atan, ...) are polynomials whose
coefficients were fitted for this file (least squares on Chebyshev nodes against float64 references,
then checked in float32 arithmetic); the maximum errors measured are noted next to each table."""
from __future__ import annotations
import functools, math
from typing import Sequence
from attograd.errors import ArgumentError
from attograd.dtype import dtypes
from attograd.helpers import prod
from attograd.uop.ops import UOp, Ops, Vjp
from attograd.gradient import GradMode
from attograd.schedule import flash as _flash
from attograd.schedule.flash import flash_backward
from attograd.frontend.replay import replayed

def _sum_to(t, shape: tuple):
  """t summed over the axes a broadcast to its shape added or expanded: the gradient of a broadcast input."""
  lead = t.ndim - len(shape)
  axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and t.shape[lead + i] != 1)
  return (t.sum(axes, keepdim=True) if axes else t).reshape(shape)

# erf(x)/x as a polynomial in x*x on |x| <= 1 (highest power first); abs error <= 1.5e-7 in float32 (float32 rounding of erf itself: 6e-8)
_ERF_SMALL = (-9.728409111256566e-06, 0.00011288175038620015, -0.0008487267777738448, 0.005221261499686802, -0.026865517446277343,
              0.11283784111878914, -0.3761263859043423, 1.1283791670822858)
# exp(x*x)*erfc(x) as polynomials in t = 1/x on [1, 2.5] and [2.5, 10]; relative error <= 2.2e-7 in float32
_ERFC_MID = (0.005891582994599919, -0.05340146311728656, 0.2120114509939773, -0.4846009937506538, 0.6888535874533084,
             -0.5668741181313797, 0.0709609110895966, 0.5541119342333078, 0.0006306839588767419)
_ERFC_TAIL = (-0.1958281845540558, 0.7587785425070508, -1.156985305877795, 0.8149954215772056, -0.08297160594978352,
              -0.2707826378318313, -0.000965356324477318, 0.5642364593613558, -9.86773844057571e-07)
# erfc(z) = t * exp(P(t) - z*z) with t = 1 / (1 + z/2), for every z >= 0 with relative error under 1.2e-7 (Numerical
# Recipes' erfcc, a Chebyshev fit): one exp and no branches, so a GELU costs ~35 ops and vectorizes
_ERFCC = (0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418, 0.37409196, 1.00002368,
          -1.26551223)
# asin(z)/z in z*z on |z| <= 0.5 (abs error 6e-8), atan(z)/z in z*z on |z| <= tan(pi/8) (abs error 3e-8)
_ASIN = (0.03447097986558798, 0.007657589150936929, 0.024556480167782682, 0.03012002957691565, 0.04465942361589885,
         0.07499950284915091, 0.1666666719534729, 0.9999999999942858)
_ATAN = (-0.03796789009712781, 0.0699366364327311, -0.08997352472192058, 0.11104051068013654, -0.1428542506699094,
         0.19999994285167955, -0.33333333292895584, 0.999999999999708)
_TAN_PI_8 = math.sqrt(2) - 1

_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946

def _cubic_weights(t: float, a: float = -0.75) -> tuple[float, float, float, float]:
  """The weights of the samples at -1, 0, 1, 2 for a point t in [0, 1) past sample 0 (torch's bicubic)."""
  near = lambda x: ((a + 2) * x - (a + 3)) * x * x + 1  # |x| <= 1
  far = lambda x: ((a * x - 5 * a) * x + 8 * a) * x - 4 * a  # 1 < |x| < 2
  return far(t + 1), near(t), near(1 - t), far(2 - t)

def _poly(x, coeffs: Sequence[float]):
  r = x * coeffs[0] + coeffs[1]
  for c in coeffs[2:]: r = r * x + c
  return r

def _in_range(cond, x, safe: float):
  """x where cond holds, else a harmless constant: a branch that where() discards must not see
  values that make its gradient inf or nan (0 * inf is nan)."""
  return cond.where(x, safe)

# interpolate's modes -> the input rank torch requires (None: any; 'linear' is tinygrad's on any rank)
_INTERP_RANK = {"nearest": None, "nearest-exact": None, "linear": None, "bilinear": 4, "bicubic": 4, "trilinear": 5}

def _attention_vjps(s: float, additive: bool, q, key, value, mask, attn, out) -> tuple:
  """scaled_dot_product_attention's backward, reading its probabilities attn and its output out"""
  # (the row sum has a buffer of its own, one value a row: inside dS's kernel, a register tile whose loop over column
  # panels of keys runs outside its rows, it was summed again for every panel, in scalar code, 8 times at 256 keys.
  # One core, AVX-512 (Zen 5), under load: dS of (16, 6, 256, 64) alone 13.1 -> 9.7 ms with the row sum's kernel; the
  # large transformer's step (bench/step_ab.py --model large, in one process) 1736 -> 1719 ms, its 6 dS 65.9 -> 46.4 ms)
  def d_scores(g): return attn * (g @ value.transpose(-2, -1) - (g * out).sum(-1, keepdim=True).contiguous())
  vjps = [lambda g: (d_scores(g) @ key) * s, lambda g: (d_scores(g).transpose(-2, -1) @ q) * s, lambda g: attn.transpose(-2, -1) @ g]
  return (*vjps, lambda g: _sum_to(d_scores(g), mask.shape)) if additive else tuple(vjps)

def _flash_attention_vjps(s: float, additive: bool, q, key, value, mask, out, x, empty) -> tuple:
  """scaled_dot_product_attention's backward as flash attention's (schedule/flash.py: fuse_attention_grads): the
  probabilities recomputed from q, k and the rows' logsumexp, P = exp(q @ k^T * scale + mask - lse), inside each
  gradient's kernel, where the chain rule read the T x S probabilities (and stored the scores and dS, two more T x S
  buffers). lse is the forward softmax's own max and sum over the logits x (the same nodes: no pass of its own); the
  recomputed scores are (q * scale) @ k^T, not the forward's nodes, so the forward keeps its schedule (its one-kernel
  pass over the keys needs no probabilities). empty: the rows with every key masked (None: no such test)"""
  def probs():
    m = x.amax(-1, keepdim=True).detach()
    lse = (m + (x - m).exp().sum(-1, keepdim=True).log()).contiguous()
    sc = (q * s) @ key.transpose(-2, -1)
    if mask is not None: sc = mask.where(sc, -math.inf) if mask.dtype == dtypes.bool else sc + mask
    p = (sc - lse).exp()
    return p if empty is None else empty.where(0.0, p)
  def d_scores(g): return probs() * (g @ value.transpose(-2, -1) - (g * out).sum(-1, keepdim=True))
  vjps = [lambda g: (d_scores(g) * s) @ key, lambda g: (d_scores(g) * s).transpose(-2, -1) @ q, lambda g: probs().transpose(-2, -1) @ g]
  return (*vjps, lambda g: _sum_to(d_scores(g), mask.shape)) if additive else tuple(vjps)

def _tensor_vjps(wrap, make, *captured: UOp | None) -> tuple:
  """A Vjp's functions of nodes: make's, of tensors, over the captured nodes as tensors (ElementwiseOps._with_vjp)."""
  return tuple((lambda g, vjp=vjp: vjp(wrap(g)).uop) for vjp in make(*(None if c is None else wrap(c) for c in captured)))

class ElementwiseOps:
  __slots__ = ()  # Tensor defines the slots

  # ***** helpers *****
  def _math_dtype(self):
    """(input as a float of at least 32 bits, the dtype to return): ints become float32 as in torch;
    the polynomials run in float32 for float16/bfloat16 and round once at the end."""
    x = self._float_unary()
    return (x.cast(dtypes.float32) if x.dtype.itemsize < 4 else x), x.dtype
  def _with_derivative(self, x, d, *more):
    """self, a function of x elementwise, whose derivative autograd takes to be d (uop/ops.py, WITH_DERIVATIVE): the
    gradient of a polynomial approximation is then d, one expression, not the chain rule through every step of the
    polynomial (a GELU's backward was 8 kernels of partial sums per layer); and a function built with branches for its
    special points (0, the ends of its domain, overflow) has torch's derivative there, not the chain rule through the
    branches (abs has slope 0 at 0; 0 * inf is nan). `more` gives further (x, d) pairs for functions of two tensors."""
    pairs = (x, d, *more)
    srcs = tuple(t._broadcast_to(self.shape).uop if isinstance(t, type(self)) else self._const_like(t) for t in pairs)
    return type(self)(UOp(Ops.WITH_DERIVATIVE, self.dtype, (self.uop, *srcs)))
  def _with_vjp(self, xs: tuple, make, *captured):
    """self, a function of the tensors xs: autograd takes the gradient of xs[i] to be vjps[i](g) for the gradient g flowing
    into self, where vjps = make(*captured) (tensors in place of captured, None kept), made and called only when a
    backward pass runs (uop/ops.py, Vjp). Softmax's backward then reads its own output, where the chain rule through its
    exp and row sum recomputed both in the backward pass; attention's reads its probabilities and output once each.
    make reads only captured, the tensors of this call as they are now (not a user's tensor that may be written in place
    before the backward pass): a composite replayed over other inputs (frontend/replay.py) makes its products over them."""
    if not GradMode.enabled: return self  # no_grad (inference, decoding): no backward to write
    # a symbolic size: the chain rule, as a Variable's binding must reach every node of the backward
    if any(not isinstance(n, int) for n in self.shape): return self
    vjp = Vjp(make=functools.partial(_tensor_vjps, type(self), make), captured=tuple(None if c is None else c.uop for c in captured))
    return type(self)(UOp(Ops.WITH_DERIVATIVE, self.dtype, (self.uop, *(x.uop for x in xs)), vjp))
  def _const_like(self, v: float) -> UOp: return type(self).full(self.shape, v, dtype=self.dtype, device=self.device).uop
  def _keep_nan(self, r):
    return self.isnan().where(self, r)

  # ***** math *****
  def exp(self):
    """e**x as one EXP node: codegen expands it into a range reduction and a polynomial (uop/mathlib.py), within 1 ulp."""
    return self._float_unary()._alu(Ops.EXP)
  def _exp_neg_square(self):
    """exp(-x*x) without the rounding of x*x (which costs up to 4e-6 relative at x = 9): x*x = h*h + (x-h)*(x+h) with h = x
    rounded to 8 fractional bits, so h*h is exact for |x| < 16."""
    h = (self * 256).trunc() * (1 / 256)
    return (-(h * h)).exp() * (-((self - h) * (self + h))).exp()
  def _erfc_pos(self):
    """erfc(x) for x >= 1 (relative accuracy); x must be finite and >= 1."""
    t = self.reciprocal()
    mid = _poly(t, _ERFC_MID)
    tail = _poly(t, _ERFC_TAIL)
    return (self < 2.5).where(mid, tail) * self.minimum(10)._exp_neg_square() * (self < 10).where(1.0, 0.0)
  def _erf_erfc(self):
    """(erf(x), erfc(x)) for float32-or-wider x, each accurate in its own terms."""
    a = self.abs()
    small = a <= 1
    xs = _in_range(small, self, 0.0)
    erf_small = xs * _poly(xs * xs, _ERF_SMALL)
    big = _in_range(small, 1.0, a.minimum(20.0))  # |x| >= 1, finite
    c_big = big._erfc_pos()  # erfc(|x|)
    neg = self < 0
    erf = small.where(erf_small, neg.where(c_big - 1, 1 - c_big))
    erfc = small.where(1 - erf_small, neg.where(2 - c_big, c_big))
    return self._keep_nan(erf), self._keep_nan(erfc)
  def _erf_slope(self):
    """d erf(x)/dx = 2/sqrt(pi) exp(-x*x); past |x| = 16 it is 0 in float64 too (there, and at +-inf, x - h was nan)"""
    small = (self.abs() >= 16).logical_not()  # NaN stays in: its slope is NaN, as torch's
    return _in_range(small, self, 16.0)._exp_neg_square() * small.where(2 / math.sqrt(math.pi), 0.0)
  @replayed
  def erf(self):
    """The error function; abs error <= ~1.5e-7 against float64 erf (see the tables above)."""
    x, dt = self._math_dtype()
    return x._erf_erfc()[0]._with_derivative(x, x._erf_slope()).cast(dt)
  def erfc(self):
    x, dt = self._math_dtype()
    return x._erf_erfc()[1]._with_derivative(x, -x._erf_slope()).cast(dt)
  def _asin_f(self):
    a = self.abs()
    small = a <= 0.5
    zs = _in_range(small, self, 0.0)
    r_small = zs * _poly(zs * zs, _ASIN)
    # |x| > 0.5: asin(|x|) = pi/2 - 2*asin(sqrt((1-|x|)/2)), the sqrt argument in [0, 0.25]
    s = _in_range(small, 0.25, ((1 - a) * 0.5)).sqrt()
    r_big = math.pi / 2 - 2 * (s * _poly(s * s, _ASIN))
    return small.where(r_small, (self < 0).where(-r_big, r_big))
  def asin(self):
    x, dt = self._math_dtype()
    return x._keep_nan(x._asin_f())._with_derivative(x, (1 - x * x).rsqrt()).cast(dt)
  def acos(self):
    x, dt = self._math_dtype()
    a = x.abs()
    mid = a <= 0.5
    s = _in_range(mid, 0.25, ((1 - a) * 0.5)).sqrt()  # near +-1, through asin of a small argument: no cancellation
    tail = 2 * (s * _poly(s * s, _ASIN))
    r = mid.where(math.pi / 2 - _in_range(mid, x, 0.0)._asin_f(), (x < 0).where(math.pi - tail, tail))
    return x._keep_nan(r)._with_derivative(x, -(1 - x * x).rsqrt()).cast(dt)
  def atan(self):
    x, dt = self._math_dtype()
    a = x.abs()
    inv = a > 1
    b = inv.where(_in_range(inv, a, 1.0).reciprocal(), a)  # in [0, 1]
    shift = b > _TAN_PI_8
    z = shift.where((b - 1) / (b + 1), b)  # in [-tan(pi/8), tan(pi/8)]
    r = z * _poly(z * z, _ATAN) + shift.where(math.pi / 4, 0.0)
    r = inv.where(math.pi / 2 - r, r)
    return x._keep_nan((x < 0).where(-r, r))._with_derivative(x, (1 + x * x).reciprocal()).cast(dt)
  arcsin, arccos, arctan = asin, acos, atan
  def expm1(self):
    """exp(x) - 1 without cancellation: a Taylor polynomial for |x| <= 0.5 (error < 2e-11)."""
    x, dt = self._math_dtype()
    small = x.abs() <= 0.5
    xs = _in_range(small, x, 0.0)
    p = _poly(xs, [1 / math.factorial(k) for k in range(10, 0, -1)]) * xs
    return small.where(p, x.exp() - 1)._with_derivative(x, x.exp()).cast(dt)
  def log1p(self):
    """log(1 + x) without cancellation: 2*atanh(x / (2 + x)) as a series for |x| <= 0.5."""
    x, dt = self._math_dtype()
    small = x.abs() <= 0.5
    xs = _in_range(small, x, 0.0)
    z = xs / (xs + 2)  # in [-1/3, 0.2]
    zz = z * z
    p = 2 * z * _poly(zz, [1 / (2 * k + 1) for k in range(9, -1, -1)])
    return small.where(p, (x + 1).log())._with_derivative(x, (x + 1).reciprocal()).cast(dt)
  def log10(self):
    x, dt = self._math_dtype()
    return (x.log2() * math.log10(2)).cast(dt)
  def sinh(self):
    x, dt = self._math_dtype()
    a = x.abs()
    huge = a > 20  # exp(-a) no longer matters
    e = _in_range(huge, 0.0, a).expm1()
    r = huge.where((a - math.log(2)).exp(), 0.5 * (e + e / (e + 1)))
    return (x < 0).where(-r, r)._with_derivative(x, x.cosh()).cast(dt)
  def cosh(self):
    x, dt = self._math_dtype()
    a = x.abs()
    e = (a - math.log(2)).exp()  # e^|x| / 2: finite up to cosh's own overflow
    return (e + 0.25 / e)._with_derivative(x, x._sinh_value()).cast(dt)
  def _sinh_value(self):
    """sinh without a derivative of its own (cosh's derivative; sinh's is cosh, which would recurse)"""
    a = self.abs()
    huge = a > 20
    e = _in_range(huge, 0.0, a).expm1()
    r = huge.where((a - math.log(2)).exp(), 0.5 * (e + e / (e + 1)))
    return (self < 0).where(-r, r)
  def asinh(self):
    x, dt = self._math_dtype()
    a = x.abs()
    huge = a > 1e4  # sqrt(1 + x*x) == |x| to float precision, and x*x may overflow
    s = _in_range(huge, 0.0, a)
    r = huge.where(a.log() + math.log(2), (s + s * s / (1 + (1 + s * s).sqrt())).log1p())
    return x._keep_nan((x < 0).where(-r, r))._with_derivative(x, (x * x + 1).rsqrt()).cast(dt)
  def acosh(self):
    x, dt = self._math_dtype()
    huge = x > 1e4
    s = _in_range(huge, 1.0, x)
    d = s - 1
    r = huge.where(x.log() + math.log(2), (d + (d * (s + 1)).sqrt()).log1p())
    # torch's derivative 1/sqrt(x*x - 1) is finite below -1 too, where the value is nan
    return (x < 1).where(math.nan, x._keep_nan(r))._with_derivative(x, (x * x - 1).rsqrt()).cast(dt)
  def atanh(self):
    x, dt = self._math_dtype()
    a = x.abs()  # odd: on |x|, where 1 - |x| is exact near 1
    r = 0.5 * (2 * a / (1 - a)).log1p()
    return x._keep_nan((x < 0).where(-r, r))._with_derivative(x, (1 - x * x).reciprocal()).cast(dt)
  arcsinh, arccosh, arctanh = asinh, acosh, atanh
  @replayed
  def softplus(self, beta: float = 1.0, threshold: float = 20.0):
    """log(1 + exp(beta*x)) / beta, and x itself where beta*x > threshold, as torch."""
    x, dt = self._math_dtype()
    bx = x * beta
    lin = bx > threshold
    bs = _in_range(lin, 0.0, bx)
    # log1p(exp(b)) = max(b, 0) + log1p(exp(-|b|)): stable for very negative and positive b alike
    sp = bs.maximum(0) + (-bs.abs()).exp().log1p()
    return lin.where(x, sp / beta).cast(dt)

  # ***** activations *****
  def hardtanh(self, min_val: float = -1.0, max_val: float = 1.0):
    # where, not clip: the gradient is 0 at the bounds and NaN passes through, as in torch
    if not dtypes.is_float(self.dtype) and float(min_val).is_integer() and float(max_val).is_integer():  # ints stay ints, as torch's clamp
      min_val, max_val = int(min_val), int(max_val)
    return (self <= min_val).where(min_val, (self >= max_val).where(max_val, self))
  def relu6(self): return self.hardtanh(0.0, 6.0)
  # the composite activations run in float32 for float16/bfloat16 inputs and round once, as torch does
  def hardsigmoid(self):
    x, dt = self._math_dtype()
    return ((x + 3).hardtanh(0.0, 6.0) * (1 / 6))._with_derivative(x, ((x > -3) & (x < 3)).where(1 / 6, 0.0)).cast(dt)
  def hardswish(self):
    x, dt = self._math_dtype()
    d = (x <= -3).where(0.0, (x < 3).where(x * (1 / 3) + 0.5, 1.0))  # torch's: NaN takes the last branch
    return (x * (x + 3).hardtanh(0.0, 6.0) * (1 / 6))._with_derivative(x, d).cast(dt)
  def elu(self, alpha: float = 1.0):
    x, dt = self._math_dtype()
    neg = x <= 0  # torch's test: NaN takes the identity's branch (and its slope 1)
    return neg.where(alpha * _in_range(neg, x, 0.0).expm1(), x).cast(dt)
  def celu(self, alpha: float = 1.0):
    x, dt = self._math_dtype()
    neg = x <= 0
    return neg.where(alpha * (_in_range(neg, x, 0.0) / alpha).expm1(), x).cast(dt)
  def selu(self):
    x, dt = self._math_dtype()
    return (_SELU_SCALE * x.elu(_SELU_ALPHA)).cast(dt)
  @replayed
  def silu(self):
    x, dt = self._math_dtype()
    return (x * x.sigmoid()).cast(dt)
  swish = silu
  @replayed
  def gelu(self, approximate: str = "none"):
    """x * Phi(x), with Phi's tail Phi(-|x|) = erfc(|x|/sqrt 2)/2 in relative terms, so the tiny values for very
    negative x keep their precision. gelu(inf) is inf (torch returns nan there)."""
    x, dt = self._math_dtype()
    if approximate == "tanh":
      # x (1 + tanh(u)) / 2 as x sigmoid(2u), the same function: one exp and a reciprocal an element, where tanh's expm1 is
      # a polynomial, an exp and a select (a d=128 GPT's (2048, 512) forward kernel, one core, in one process: 1.55 ->
      # 0.90 ms); and relatively exact in the tail where 1 + tanh(u) cancels (x = -7: ~-4e-16, where torch, even in
      # float64, gives -0). The derivative s + x s (1 - s) 2u' reads the s the forward stores, as tanh's read tanh(u)
      c = 2 * math.sqrt(2 / math.pi)
      s = (1 + (-c * (x + 0.044715 * x * x * x)).exp()).reciprocal()
      return (x * s)._with_derivative(x, s + x * s * (1 - s) * (c * (1 + 3 * 0.044715 * x * x))).cast(dt)
    if approximate != "none": raise ArgumentError(f"gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    z = x.abs() * (1 / math.sqrt(2))
    t = (1 + 0.5 * z).reciprocal()
    tail = 0.5 * t * (_poly(t, _ERFCC) - z * z).exp()
    pdf = (-0.5 * x * x).exp() * (1 / math.sqrt(2 * math.pi))
    cdf = (x >= 0).where(1 - tail, tail)._with_derivative(x, pdf)
    return (x * cdf)._with_derivative(x, cdf + x * pdf).cast(dt)
  def quick_gelu(self):
    x, dt = self._math_dtype()
    return (x * (1.702 * x).sigmoid()).cast(dt)
  def leaky_relu(self, neg_slope: float = 0.01):
    x = self._float_unary()
    return (x > 0).where(x, x * neg_slope)
  @replayed
  def mish(self):
    x, dt = self._math_dtype()
    t = x.softplus().tanh()
    return (x * t)._with_derivative(x, t + x * x.sigmoid() * (1 - t * t)).cast(dt)  # torch's form: 0 * inf is its nan too
  def softsign(self):
    x, dt = self._math_dtype()
    return (x / (1 + x.abs())).cast(dt)
  def logsigmoid(self):
    """-softplus(-x), stable for large |x|."""
    x, dt = self._math_dtype()
    neg = x < 0
    a = neg.where(-x, x)
    return (neg.where(x, 0.0) - (-a).exp().log1p()).cast(dt)

  # ***** random creation *****
  @classmethod
  def uniform(cls, *shape, low: float = 0.0, high: float = 1.0, dtype=None, device=None, **kw):
    r = cls.rand(*shape, dtype=dtypes.float32, device=device)
    return cls((r * (high - low) + low).cast(dtype or dtypes.default_float).uop, **kw)
  @classmethod
  def normal(cls, *shape, mean: float = 0.0, std: float = 1.0, dtype=None, device=None, **kw):
    r = cls.randn(*shape, dtype=dtypes.float32, device=device)
    return cls((r * std + mean).cast(dtype or dtypes.default_float).uop, **kw)
  @staticmethod
  def _fans(shape: tuple[int, ...]) -> tuple[int, int]:
    """torch's (fan_in, fan_out): dim 1 and dim 0, times the receptive field (the product of the rest)."""
    if len(shape) < 2: raise ArgumentError(f"fan in and fan out need at least 2 dimensions, got shape {shape}")
    rf = prod(shape[2:])
    return shape[1] * rf, shape[0] * rf
  @classmethod
  def scaled_uniform(cls, *shape, **kw):
    s = cls._shape_arg(shape)
    b = prod(s) ** -0.5
    return cls.uniform(*s, low=-b, high=b, **kw)
  @classmethod
  def glorot_uniform(cls, *shape, gain: float = 1.0, **kw):
    """torch.nn.init.xavier_uniform_: U(-b, b), b = gain * sqrt(6 / (fan_in + fan_out))."""
    s = cls._shape_arg(shape)
    fan_in, fan_out = cls._fans(s)
    b = gain * math.sqrt(6 / (fan_in + fan_out))
    return cls.uniform(*s, low=-b, high=b, **kw)
  @staticmethod
  def _kaiming_std(shape, a: float, mode: str, nonlinearity: str) -> float:
    fan_in, fan_out = ElementwiseOps._fans(shape)
    if mode not in ("fan_in", "fan_out"): raise ArgumentError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    gains = {"linear": 1.0, "sigmoid": 1.0, "tanh": 5 / 3, "relu": math.sqrt(2), "selu": 3 / 4, "leaky_relu": math.sqrt(2 / (1 + a * a))}
    if nonlinearity not in gains: raise ArgumentError(f"unsupported nonlinearity {nonlinearity!r}")
    return gains[nonlinearity] / math.sqrt(fan_in if mode == "fan_in" else fan_out)
  @classmethod
  def kaiming_uniform(cls, *shape, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu", **kw):
    """torch.nn.init.kaiming_uniform_: U(-b, b), b = gain * sqrt(3 / fan)."""
    s = cls._shape_arg(shape)
    b = math.sqrt(3) * cls._kaiming_std(s, a, mode, nonlinearity)
    return cls.uniform(*s, low=-b, high=b, **kw)
  @classmethod
  def kaiming_normal(cls, *shape, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu", **kw):
    """torch.nn.init.kaiming_normal_: N(0, (gain / sqrt(fan))^2)."""
    s = cls._shape_arg(shape)
    return cls.normal(*s, mean=0.0, std=cls._kaiming_std(s, a, mode, nonlinearity), **kw)
  @classmethod
  def linspace(cls, start: float, end: float, steps: int, dtype=None, device=None, **kw):
    """torch's linspace: the first half counts up from start, the second half down from end."""
    if steps < 0: raise ArgumentError(f"linspace needs steps >= 0, got {steps}")
    dt = dtype or dtypes.default_float
    if steps == 0: return cls.empty(0, dtype=dt, device=device, **kw)
    if steps == 1: return cls.full((1,), start, dtype=dt, device=device, **kw)
    step = (end - start) / (steps - 1)
    i = cls.arange(steps, device=device, dtype=dtypes.float64 if dt == dtypes.float64 else dtypes.float32)
    out = (i < steps // 2).where(i * step + start, end - (steps - 1 - i) * step)
    return cls(out.cast(dt).uop, **kw)
  def multinomial(self, num_samples: int = 1, replacement: bool = False):
    """Draw category indices (int64) from the rows of a 1-D or 2-D tensor of non-negative weights."""
    if self.ndim not in (1, 2): raise ArgumentError(f"multinomial needs a 1-D or 2-D weight tensor, got {self.ndim}-D")
    if num_samples < 1: raise ArgumentError(f"multinomial needs num_samples >= 1, got {num_samples}")
    n = self.shape[-1]
    if not replacement and num_samples > n: raise ArgumentError(f"cannot draw {num_samples} samples without replacement from {n} categories")
    w = (self if self.ndim == 2 else self.unsqueeze(0)).cast(dtypes.float32)
    rows = w.shape[0]
    tri = type(self).arange(n, device=self.device).unsqueeze(1) <= type(self).arange(n, device=self.device).unsqueeze(0)  # [j, k]: j <= k
    def draw(weights, count):
      cdf = (weights.unsqueeze(-1) * tri.cast(dtypes.float32)).sum(-2)  # inclusive cumulative sums along the categories
      u = type(self).rand(rows, count, 1, device=self.device, dtype=dtypes.float32) * cdf[:, -1:].unsqueeze(1)
      return (u >= cdf.unsqueeze(1)).sum(-1).minimum(n - 1).cast(dtypes.int64)  # the first k with cdf[k] > u
    if replacement: out = draw(w, num_samples)
    else:
      picks = []
      for _ in range(num_samples):
        p = draw(w, 1)  # (rows, 1)
        picks.append(p)
        w = (type(self).arange(n, device=self.device).unsqueeze(0) == p).where(0.0, w)
      # the columns side by side, through one-hot sums
      cols = type(self).arange(num_samples, device=self.device).unsqueeze(0)
      out = sum((cols == i).where(pk, 0) for i, pk in enumerate(picks))
    return out if self.ndim == 2 else out.squeeze(0)

  # ***** nn functional *****
  @classmethod
  def einsum(cls, formula: str, *operands):
    """torch.einsum for letter subscripts and '...'; a letter repeated within an operand takes the diagonal: every operand is
    permuted and reshaped onto the axes (output letters, then summed letters), broadcast, multiplied and summed."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)): operands = tuple(operands[0])
    f = formula.replace(" ", "")
    lhs, arrow, out = f.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(operands): raise ArgumentError(f"einsum {formula!r} names {len(ins)} operands, got {len(operands)}")
    if "." in f:  # '...' becomes fresh letters, right-aligned across the operands (they broadcast)
      if any(sub.count("...") != sub.count(".") / 3 or sub.count("...") > 1 for sub in ins + [out]): raise ArgumentError(f"einsum: bad '...' in {formula!r}")
      nell = max((t.ndim - len(sub) + 3 for sub, t in zip(ins, operands) if "..." in sub), default=0)
      if nell < 0: raise ArgumentError(f"einsum {formula!r}: an operand has too few dims")
      ell = "".join(chr(0x3b1 + i) for i in range(nell))  # greek letters: not used by a formula of ascii letters
      ins = [sub.replace("...", ell[nell - (t.ndim - len(sub) + 3):] if t.ndim - len(sub) + 3 > 0 else "") for sub, t in zip(ins, operands)]
      if arrow: out = out.replace("...", ell)
      else: out, arrow = ell + "".join(sorted(c for c in set("".join(ins)) if c not in ell and "".join(ins).count(c) == 1)), "->"
      lhs = ",".join(ins)
    sizes: dict[str, int] = {}
    for sub, t in zip(ins, operands):
      if not sub.isalpha() and sub != "": raise ArgumentError(f"einsum subscripts must be letters, got {sub!r}")
      if len(sub) != t.ndim: raise ArgumentError(f"einsum subscripts {sub!r} for an operand of {t.ndim} dims")
      for c, n in zip(sub, t.shape):
        if sizes.get(c, n) != n and 1 not in (n, sizes[c]): raise ArgumentError(f"einsum: subscript {c!r} has sizes {sizes[c]} and {n}")
        sizes[c] = max(sizes.get(c, n), n) if n != 1 else sizes.get(c, n)
    if not arrow: out = "".join(sorted(c for c in sizes if lhs.count(c) == 1))
    if len(set(out)) != len(out) or any(c not in sizes for c in out): raise ArgumentError(f"einsum output {out!r} is invalid")
    letters = list(out) + sorted(c for c in sizes if c not in out)
    full = tuple(sizes[c] for c in letters)
    acc = None
    for sub, t in zip(ins, operands):
      while len(set(sub)) != len(sub):  # a repeated letter takes the diagonal: mask with the identity, sum one copy away
        c = next(ch for ch in sub if sub.count(ch) > 1)
        p, q = sub.index(c), sub.index(c, sub.index(c) + 1)
        if t.shape[p] != t.shape[q]: raise ArgumentError(f"einsum: subscript {c!r} repeated with sizes {t.shape[p]} and {t.shape[q]}")
        eye = type(t).eye(t.shape[p], dtype=t.dtype, device=t.device).reshape(*[t.shape[i] if i in (p, q) else 1 for i in range(t.ndim)])
        t, sub = (t * eye).sum(q), sub[:q] + sub[q + 1:]
      present = [c for c in letters if c in sub]
      v = t.permute(*[sub.index(c) for c in present]) if t.ndim else t
      v = v.reshape(*[t.shape[sub.index(c)] if c in sub else 1 for c in letters]) if letters else v
      acc = v if acc is None else acc * v
    acc = acc.expand(*full) if full else acc
    summed = tuple(range(len(out), len(letters)))
    return acc.sum(summed) if summed else acc
  # ***** torch's small composites (issue 16) *****
  def copysign(self, other):
    """|self| with the sign of other (torch.copysign; the sign bit of -0.0 counts, as torch); always a float."""
    x = self._float_unary()
    o = other if isinstance(other, type(self)) else type(self).full((), float(other), device=self.device)
    neg = (o < 0) | ((o == 0) & ((1 / o.cast(x.dtype)) < 0)) if dtypes.is_float(o.dtype) else o < 0
    r = neg.where(-x.abs(), x.abs())
    return r._with_derivative(x, (x == 0).where(0.0, r / x))  # torch's result/self, 0 at 0 (nan at +-inf)
  def fmod(self, other):
    """C's fmod: the remainder with the sign of the dividend (torch.fmod), unlike % (Python's, the divisor's sign)."""
    if not dtypes.is_float(self.dtype) and not (isinstance(other, type(self)) and dtypes.is_float(other.dtype)) and not isinstance(other, float):
      r = self % other
      return ((r != 0) & ((r < 0) != (self < 0))).where(r - other, r)
    a, b = self._operands(other)
    if not dtypes.is_float(a.dtype): a, b = a.cast(dtypes.default_float), b.cast(dtypes.default_float)
    q = (a / b).trunc()
    return (a - q * b)._with_derivative(a, 1.0, b, -q)  # torch's: 1 and -trunc(a/b), not the chain rule's 0 * (1/0) at b = 0
  def logaddexp(self, other):
    """log(exp(a) + exp(b)) without overflow: max + log1p(exp(-|a - b|)); equal infinities give that infinity, as torch."""
    a, b = self._operands(other)
    if not dtypes.is_float(a.dtype): a, b = a.cast(dtypes.default_float), b.cast(dtypes.default_float)
    m = a.maximum(b)
    d = (a - b).abs()
    out = (m == -math.inf).where(m, m + (-(d.isnan().where(0, d))).exp().log1p())
    # torch's derivatives 1/(1 + exp(b - a)) and 1/(1 + exp(a - b)): the max's slope splits ties, and NaN must give NaN
    return out.detach()._with_derivative(a, (1 + (b - a).exp()).reciprocal(), b, (1 + (a - b).exp()).reciprocal())
  def softmin(self, axis: int = -1, dtype=None, *, dim=None):
    return (-self).softmax(axis if dim is None else dim, dtype)
  def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1):
    """torch.diagonal: the diagonal of dims (dim1, dim2) moved to the last dim; offset > 0 above the main diagonal."""
    nd = self.ndim
    d1, d2 = dim1 % nd if -nd <= dim1 < nd else dim1, dim2 % nd if -nd <= dim2 < nd else dim2
    if not (0 <= d1 < nd and 0 <= d2 < nd) or d1 == d2: raise ArgumentError(f"diagonal dims {dim1}, {dim2} of a {nd}-D tensor")
    x = self.permute(*[i for i in range(nd) if i not in (d1, d2)], d1, d2)
    a, b = x.shape[-2], x.shape[-1]
    n = max(0, min(a, b - offset) if offset >= 0 else min(a + offset, b))
    x = x[..., :n, offset:offset + n] if offset >= 0 else x[..., -offset:-offset + n, :n]
    eye = type(self).eye(n, dtype=dtypes.bool, device=self.device)
    return eye.where(x, 0).sum(-1) if n else x.sum(-1)
  def diag(self, diagonal: int = 0):
    """torch.diag: a 1-D input becomes the matrix with it on the given diagonal; a 2-D input gives that diagonal."""
    if self.ndim == 2: return self.diagonal(diagonal)
    if self.ndim != 1: raise ArgumentError(f"diag needs a 1-D or 2-D tensor, got {self.ndim}-D")
    n, k = self.shape[0], abs(diagonal)
    m = type(self).eye(n, dtype=dtypes.bool, device=self.device).where(self.unsqueeze(0), 0)
    return m.pad(((0, k), (k, 0)) if diagonal >= 0 else ((k, 0), (0, k)))
  def masked_select(self, mask):
    """torch.masked_select: the elements where mask (broadcast with self) is True, as 1-D (its size needs a realize)."""
    if mask.dtype != dtypes.bool: raise TypeError(f"masked_select needs a bool mask, got {mask.dtype}")
    a, m = self._operands(mask)  # broadcast both (in their common dtype: m != 0 is the mask again)
    return a.cast(self.dtype).flatten()[(m != 0).flatten()]
  def scaled_dot_product_attention(self, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                   enable_gqa: bool = False):
    """torch.nn.functional.scaled_dot_product_attention: softmax(q @ k^T * scale + mask) @ v; a bool mask keeps True
    positions; dropout (p > 0) is applied as torch does, whatever the training mode. enable_gqa: key/value heads
    (dim -3) are shared by groups of query heads, each repeated in place as torch does."""
    # (replayed without dropout: dropout draws new random numbers each call)
    return (self._attention if dropout_p > 0 else self._attention_replayed)(key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
  def _attention(self, key, value, attn_mask, dropout_p: float, is_causal: bool, scale: float | None, enable_gqa: bool):
    q = self
    if enable_gqa and key.ndim >= 3 and (hq := q.shape[-3]) != (hk := key.shape[-3]):
      if hq % hk or hq % value.shape[-3]:
        raise ArgumentError(f"scaled_dot_product_attention: {hq} query heads aren't a multiple of {hk} key / {value.shape[-3]} value heads")
      key, value = key.repeat_interleave(hq // hk, dim=-3), value.repeat_interleave(hq // value.shape[-3], dim=-3)
    L, S = q.shape[-2], key.shape[-2]
    s = (1 / math.sqrt(q.shape[-1])) if scale is None else scale
    attn = (q @ key.transpose(-2, -1)) * s
    if is_causal:
      if attn_mask is not None: raise ArgumentError("scaled_dot_product_attention: attn_mask and is_causal are exclusive")
      ar = type(self).arange
      attn_mask = ar(L, device=q.device).unsqueeze(1) >= ar(S, device=q.device).unsqueeze(0)
    if attn_mask is not None:
      attn = attn_mask.where(attn, -math.inf) if attn_mask.dtype == dtypes.bool else attn + attn_mask
    logits, flash_bwd = attn, flash_backward(attn.shape, attn.dtype.itemsize, q.shape[-1], value.shape[-1])
    if attn_mask is not None and not is_causal and not flash_bwd:  # a causal mask (top-left aligned) leaves every row position 0
      # torch's safe softmax: a row with every position masked attends to nothing (0), not NaN. Such a row is the one
      # whose max is -inf, and the max is the softmax's own (the same node: Tensor.softmax's detached amax), so the test
      # costs no pass over the scores of its own (where (s == -inf).all() took 4x the softmax's time: BERT's 12288 rows of
      # 16 keys; the flash pass tests its running max). The softmax's NaN there (-inf - -inf) is replaced, and the
      # gradients below read the replaced probabilities, so no NaN reaches them either
      none = attn.amax(-1, keepdim=True).detach() == -math.inf
      attn = none.where(0.0, attn.softmax(-1))
    elif attn_mask is not None and not is_causal:
      # the flash backward's recomputed probabilities read the test too, and its logsumexp (lse_kernel's pass) wants
      # finite logits: read there, the forward's max would be stored (a kernel more), so its own pass, as all(), and
      # the empty rows' logits replaced by 0 before the softmax
      none = (attn == -math.inf).all(-1, keepdim=True)
      logits = none.where(0.0, attn)
      attn = none.where(0.0, logits.softmax(-1))
    else: none, attn = None, attn.softmax(-1)
    if dropout_p > 0:
      keep = type(self).rand(*attn.shape, device=attn.device, dtype=dtypes.float32) >= dropout_p
      attn = keep.where(attn * (1 / (1 - dropout_p)), 0)
    out = attn @ value
    if dropout_p > 0: return out
    # the backward as flash attention's: dS = P * (dO @ V^T - rowsum(dO * O)), whose row sum is over the head dimension
    # (the chain rule's, sum(dP * P), is over the keys, and made the scheduler store dP = dO @ V^T to read it twice).
    # The products read this call's nodes (not the caller's tensors, which an in-place write may change before backward)
    additive = attn_mask is not None and attn_mask.dtype != dtypes.bool  # an additive float mask (a learned bias) is differentiable
    xs = (q, key, value, attn_mask) if additive else (q, key, value)
    if flash_bwd: return out._with_vjp(xs, functools.partial(_flash_attention_vjps, s, additive), q, key, value, attn_mask, out, logits, none)
    return out._with_vjp(xs, functools.partial(_attention_vjps, s, additive), q, key, value, attn_mask if additive else None, attn, out)
  # (whether the backward is flash attention's is decided by the shapes and schedule/flash.py's thresholds, which tests set)
  _attention_replayed = replayed(_attention, switches=lambda: (_flash.FLASH_BWD_MIN_KEYS, _flash.FLASH_BWD_MIN_BYTES, _flash.FLASH_MAX_COLUMNS))
  def _resize_matrix(self, n_in: int, n_out: int, mode: str, align_corners: bool | None, scale: float | None, dtype):
    """(n_in, n_out) weights taking an axis of n_in samples to n_out, torch's source-index arithmetic."""
    rows = [[0.0] * n_out for _ in range(n_in)]
    for o in range(n_out):
      if align_corners: src = o * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
      else:
        r = (1 / scale) if scale is not None else n_in / n_out
        src = (o + 0.5) * r - 0.5
        if mode != "bicubic": src = max(src, 0.0)  # torch clamps the linear modes' source index only
      if mode == "bicubic":
        # Keys' cubic convolution with torch's A = -0.75 on the 4 neighbours, reads past an edge clamped to it
        i, t = math.floor(src), src - math.floor(src)
        for k, w in zip(range(i - 1, i + 3), _cubic_weights(t)): rows[min(max(k, 0), n_in - 1)][o] += w
        continue
      i0 = min(int(math.floor(src)), n_in - 1)
      i1 = min(i0 + 1, n_in - 1)
      l1 = src - i0
      rows[i0][o] += 1 - l1
      rows[i1][o] += l1
    return type(self)(rows, dtype=dtype, device=self.device)
  def interpolate(self, size=None, scale_factor=None, mode: str = "nearest", align_corners: bool | None = None):
    """torch.nn.functional.interpolate for (N, C, *spatial) inputs of 1 to 3 spatial dims: 'nearest' and
    'nearest-exact' (a gather, exact for every dtype), 'linear' (3-D in torch; tinygrad's on any rank, as here),
    'bilinear' and 'bicubic' (4-D), 'trilinear' (5-D): each spatial axis resized by a matmul with a fixed weight
    matrix. Integer inputs to the weighted modes are computed in float32 and rounded back (torch's uint8 rule)."""
    if self.ndim not in (3, 4, 5): raise ArgumentError(f"interpolate supports 3-D, 4-D and 5-D inputs, got {self.ndim}-D")
    if mode not in _INTERP_RANK: raise NotImplementedError(f"interpolate mode {mode!r}")
    if _INTERP_RANK[mode] not in (None, self.ndim): raise ArgumentError(f"interpolate mode {mode!r} needs a {_INTERP_RANK[mode]}-D input, got {self.ndim}-D")
    nearest = mode.startswith("nearest")
    if nearest and align_corners is not None: raise ArgumentError("align_corners only applies to linear modes")
    nsp = self.ndim - 2
    if (size is None) == (scale_factor is None): raise ArgumentError("interpolate needs exactly one of size and scale_factor")
    if size is not None:
      out_sz, scales = (tuple(size) if isinstance(size, (list, tuple)) else (size,) * nsp), (None,) * nsp
    else:
      scales = tuple(scale_factor) if isinstance(scale_factor, (list, tuple)) else (scale_factor,) * nsp
      out_sz = tuple(int(math.floor(n * sc)) for n, sc in zip(self.shape[2:], scales))
    if len(out_sz) != nsp: raise ArgumentError(f"interpolate: size {size} for {nsp} spatial dims")
    x = self if nearest or dtypes.is_float(self.dtype) else self.cast(dtypes.float32)
    for ax in range(nsp):
      d, n_in, n_out = 2 + ax, self.shape[2 + ax], out_sz[ax]
      if nearest:  # torch's source index: floor(o * r) ('nearest'), floor((o + 0.5) * r) ('nearest-exact')
        r, half = (1 / scales[ax]) if scales[ax] is not None else n_in / n_out, 0.5 if mode == "nearest-exact" else 0.0
        idx = [min(int(math.floor((o + half) * r)), n_in - 1) for o in range(n_out)]
        x = x.index_select(d, type(self)(idx, dtype=dtypes.int32, device=self.device))
      else:
        m = x._resize_matrix(n_in, n_out, mode, align_corners, scales[ax], x.dtype)
        x = (x.transpose(d, -1) @ m).transpose(d, -1)
    return x if x.dtype == self.dtype else x.round().clip(dtypes.min(self.dtype), dtypes.max(self.dtype)).cast(self.dtype)
