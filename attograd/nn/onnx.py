"""Run ONNX models on attograd: `OnnxRunner(model)(inputs) -> {name: Tensor}`.

The model is parsed with the `onnx` package (`pip install 'attograd[onnx]'`). Each node becomes one call of a small
function over the public Tensor API, looked up in OPS by op_type; attributes arrive as keyword arguments with the
defaults the ONNX schema of the model's opset gives, so a function only spells out the attributes it honours. A node
setting an attribute its function doesn't take, or an op without a function, is refused when the model is loaded.
The whole run builds one lazy graph: nothing executes until the caller reads an output.

Values that depend only on the input shapes (Shape -> Slice -> Concat -> Reshape chains, weights folded by
Transpose/Cast) are realized once per input-shape signature and reused, so later runs schedule only the model. At load,
Constant nodes become weights and Conv -> BatchNormalization pairs with fixed parameters become one Conv
(_fuse_conv_bn). An op not in OPS whose schema defines a function body runs as that body (_FunctionOp). ONNX types
attograd has no dtype for are carried decoded in a tagged wider tensor (NARROW)."""
from __future__ import annotations
import inspect, itertools, math, os, weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence
from attograd.tensor import Tensor
from attograd.runtime.device import Device
from attograd.dtype import DType, dtypes
from attograd.uop.ops import Ops
from attograd.engine.realize import buffer_of

__all__ = ["OnnxRunner", "OPS", "ONNX_DTYPES", "NARROW", "narrow_type", "to_numpy"]

def _onnx():
  try: import onnx
  except ImportError as e: raise ImportError("attograd.nn.onnx needs the onnx package: pip install 'attograd[onnx]'") from e
  return onnx

# TensorProto.DataType numbers (stable in the spec) -> attograd dtypes; numbers missing here have no attograd dtype
ONNX_DTYPES: dict[int, DType] = {1: dtypes.float32, 2: dtypes.uint8, 3: dtypes.int8, 4: dtypes.uint16, 5: dtypes.int16, 6: dtypes.int32,
                                 7: dtypes.int64, 9: dtypes.bool, 10: dtypes.float16, 11: dtypes.float64, 12: dtypes.uint32,
                                 13: dtypes.uint64, 16: dtypes.bfloat16}
_ONNX_TYPE_NAMES = {8: "string", 14: "complex64", 15: "complex128", 17: "float8e4m3fn", 18: "float8e4m3fnuz", 19: "float8e5m2",
                    20: "float8e5m2fnuz", 21: "uint4", 22: "int4", 23: "float4e2m1", 24: "float8e8m0", 25: "uint2", 26: "int2"}

def onnx_dtype(t: int) -> DType:
  if t in ONNX_DTYPES: return ONNX_DTYPES[t]
  raise NotImplementedError(f"ONNX element type {_ONNX_TYPE_NAMES.get(t, t)} has no attograd dtype")

# ***** narrow ONNX types attograd has no dtype for: float8 variants, float4, 4- and 2-bit integers *****
# Their values are carried decoded, exactly, in a wider "carrier" tensor (float32 for the floats, int8/uint8 for the
# integers) that the runner tags with the ONNX type. Cast/CastLike/QuantizeLinear round onto the narrow type's grid,
# DequantizeLinear and Cast read the carrier; movement ops keep the tag; any other op refuses a tagged input, and
# to_numpy() gives an output back in its ml_dtypes type.

@dataclass(frozen=True)
class Narrow:
  name: str          # ONNX's name; numpy: the ml_dtypes name below
  np_name: str
  bits: int = 0      # integers: width
  signed: bool = False
  mbits: int = 0     # floats: mantissa bits, smallest normal exponent, largest finite value
  emin: int = 0
  max: float = 0.0
  overflow: str = "nan"  # a finite value rounding beyond max without saturation: "nan", "inf" or "max"
  neg_zero: bool = True  # fnuz types have no -0
  nan_to: float = math.nan  # what NaN becomes (float4 has no NaN: ml_dtypes makes it -0)
  exponent_only: bool = False  # float8e8m0: a power of two, rounded as Cast's round_mode says
  @property
  def is_float(self) -> bool: return self.bits == 0
  @property
  def carrier(self) -> DType: return dtypes.float32 if self.is_float else dtypes.int8 if self.signed else dtypes.uint8

NARROW: dict[int, Narrow] = {
  17: Narrow("float8e4m3fn", "float8_e4m3fn", mbits=3, emin=-6, max=448.0),
  18: Narrow("float8e4m3fnuz", "float8_e4m3fnuz", mbits=3, emin=-7, max=240.0, neg_zero=False),
  19: Narrow("float8e5m2", "float8_e5m2", mbits=2, emin=-14, max=57344.0, overflow="inf"),
  20: Narrow("float8e5m2fnuz", "float8_e5m2fnuz", mbits=2, emin=-15, max=57344.0, neg_zero=False),
  23: Narrow("float4e2m1", "float4_e2m1fn", mbits=1, emin=0, max=6.0, overflow="max", nan_to=-0.0),
  24: Narrow("float8e8m0", "float8_e8m0fnu", exponent_only=True),
  21: Narrow("uint4", "uint4", bits=4), 22: Narrow("int4", "int4", bits=4, signed=True),
  25: Narrow("uint2", "uint2", bits=2), 26: Narrow("int2", "int2", bits=2, signed=True),
}
_NARROW_BY_NP = {n.np_name: t for t, n in NARROW.items()}
_TAGS: dict[int, tuple[weakref.ref, int]] = {}

def narrow_type(t: Any) -> int | None:
  """The ONNX type number of a carrier tensor (None for an ordinary tensor)."""
  ref, ty = _TAGS.get(id(t), (None, None))
  return ty if ref is not None and ref() is t else None
def _tag(t: Tensor, ty: int | None) -> Tensor:
  if ty is not None: _TAGS[id(t)] = (weakref.ref(t, lambda _, k=id(t): _TAGS.pop(k, None)), ty)
  return t

def _round_float(x: Tensor, f: Narrow, saturate: bool) -> Tensor:
  """float32 values rounded (half to even) onto the grid of a narrow float type, as ml_dtypes' cast does."""
  bits = x.bitcast(dtypes.int32)
  a = x.abs()
  e = (((a.bitcast(dtypes.int32) >> 23) & 0xFF) - 127).maximum(f.emin)  # the exponent of the grid step (subnormals: emin)
  step = ((e - f.mbits + 127) << 23).bitcast(dtypes.float32)
  r = (a / step).round() * step
  over = f.max if saturate or f.overflow == "max" else math.inf if f.overflow == "inf" else math.nan
  r = (r > f.max).where(over, r)
  r = (bits < 0).where(-r, r)
  if not f.neg_zero: r = r.eq(0).where(0.0, r)
  return x.isnan().where(f.nan_to, r).cast(dtypes.float32)
def _wrap_int(x: Tensor, f: Narrow) -> Tensor:
  """Values to a narrow integer type as ml_dtypes casts: floats truncated, then wrapped modulo 2**bits."""
  v = x.trunc().cast(dtypes.int32) if dtypes.is_float(x.dtype) else x.cast(dtypes.int32)
  half = 1 << (f.bits - 1) if f.signed else 0
  return ((v + half).mod(1 << f.bits) - half).cast(f.carrier)
def _round_e8m0(x: Tensor, saturate: bool, round_mode: str) -> Tensor:
  """float32 -> the power of two float8e8m0 keeps: float32's exponent field, rounded up/down/to nearest by the mantissa
  (the sign is dropped; NaN and infinity become NaN; code 0 is 2**-127)."""
  bits = x.bitcast(dtypes.int32) & 0x7FFFFFFF
  e, frac = bits >> 23, bits & 0x7FFFFF
  if round_mode == "up": inc = frac > 0
  elif round_mode == "nearest": inc = (frac & 0x400000).ne(0) & ((frac & 0x3FFFFF).ne(0) | (e > 0))
  elif round_mode == "down": inc = frac < 0
  else: raise NotImplementedError(f"float8e8m0 round_mode {round_mode!r}")
  if saturate: inc = inc & e.ne(0xFE)
  e = e.eq(0xFF).where(0xFF, e + inc.cast(dtypes.int32))
  return e.eq(0xFF).where(math.nan, e.eq(0).where(0x400000, e << 23).bitcast(dtypes.float32))
def _to_narrow(x: Tensor, ty: int, saturate: bool, round_mode: str = "up") -> Tensor:
  f = NARROW[ty]
  if f.exponent_only: out = _round_e8m0(x.cast(dtypes.float32), saturate, round_mode)
  elif f.is_float: out = _round_float(x.cast(dtypes.float32), f, saturate)
  else: out = _wrap_int(x, f)
  return _tag(out, ty)

def to_numpy(v: Any) -> Any:
  """An output as numpy: sequences as lists, None as None, bfloat16 and the narrow types in their ml_dtypes type."""
  if v is None or isinstance(v, list): return v if v is None else [to_numpy(x) for x in v]
  ty = narrow_type(v)
  if ty is not None or v.dtype == dtypes.bfloat16:
    import ml_dtypes
    if ty is not None: return v.numpy().astype(getattr(ml_dtypes, NARROW[ty].np_name))
    return v.bitcast(dtypes.uint16).numpy().view(ml_dtypes.bfloat16)
  return v.numpy()

def _from_numpy(a: Any, device: str | None = None) -> Tensor:
  import numpy as np
  a = np.asarray(a)
  if a.dtype.kind in "OSU": raise NotImplementedError(f"string tensors are not supported (got numpy dtype {a.dtype})")
  a = a if a.flags.c_contiguous else a.copy()  # (np.ascontiguousarray would make a 0-d array 1-d)
  if a.dtype.name == "bfloat16": return Tensor(a.view(np.uint16), device=device).bitcast(dtypes.bfloat16)
  if a.dtype.name in _NARROW_BY_NP:
    ty = _NARROW_BY_NP[a.dtype.name]
    return _tag(Tensor(a.astype(NARROW[ty].carrier.name), device=device), ty)
  if a.dtype.name.startswith(("float8", "float4", "int4", "uint4", "int2", "uint2")):
    raise NotImplementedError(f"numpy dtype {a.dtype} has no attograd dtype")
  return Tensor(a, device=device)

# ***** helpers the ops share *****

# host copies of the small folded constants (shapes, axes, pads): an op reads them without touching the device, which
# also lets a TinyJit capture the run (reading device memory while capturing is refused)
# (keyed by id with a weak reference back: Tensor's == is elementwise, so it can't be a WeakKeyDictionary key)
_HOST: dict[int, tuple[weakref.ref, list]] = {}
_HOST_MAX = 1024  # elements: bigger folded values (weights) stay on the device only

def _flat(t: Tensor) -> list:
  ref, v = _HOST.get(id(t), (None, None))
  if ref is None or ref() is not t:
    v = t.tolist()
    v = v if isinstance(v, list) else [v]
    while v and isinstance(v[0], list): v = [y for x in v for y in x]
  return v
def _remember(t: Tensor, values: list) -> None: _HOST[id(t)] = (weakref.ref(t, lambda _, k=id(t): _HOST.pop(k, None)), values)
def _as_const(t: Tensor) -> Tensor:
  """A one-element value known on the host (a folded or stored scalar: hardswish's 3 and 6, an epsilon) as a constant
  node: kernels then see the number (folded, a division by it vectorized) instead of loading a one-element buffer."""
  ref, v = _HOST.get(id(t), (None, None))
  if ref is None or ref() is not t or len(v) != 1 or narrow_type(t) is not None or t.dtype == dtypes.bfloat16: return t
  c = Tensor.full(t.shape, v[0], dtype=t.dtype, device=t.device)
  _remember(c, v)
  return c
def _ints(t: Tensor | Sequence[int] | None) -> list[int] | None:
  """A shape-like input as Python ints."""
  if t is None or isinstance(t, (list, tuple)): return None if t is None else [int(v) for v in t]
  return [int(x) for x in _flat(t)]
def _floats(t: Tensor) -> list[float]: return [float(x) for x in _flat(t)]
def _scalar(t: Tensor | None, default: Any = None) -> Any:
  return default if t is None else _flat(t)[0] if t.numel() else default
def _axis(a: int, n: int) -> int:
  if not -max(n, 1) <= a < max(n, 1): raise ValueError(f"axis {a} is out of range for a tensor of rank {n}")
  return a % max(n, 1)
def _prod(xs) -> int: return math.prod(int(x) for x in xs)
def _bshape(*shapes: Sequence[int]) -> tuple[int, ...]:
  n = max(len(s) for s in shapes)
  out = []
  for dims in zip(*[(1,) * (n - len(s)) + tuple(s) for s in shapes]):
    big = {d for d in dims if d != 1}
    if len(big) > 1: raise ValueError(f"shapes {shapes} don't broadcast")
    out.append(big.pop() if big else 1)
  return tuple(out)
def _norm_index(idx: Tensor, n: int) -> Tensor: return (idx < 0).where(idx + n, idx)

# ***** elementwise *****

def _hardsigmoid(x: Tensor, alpha: float, beta: float) -> Tensor: return (x * alpha + beta).clip(0, 1)
def _shrink(x: Tensor, bias: float = 0.0, lambd: float = 0.5) -> Tensor:
  return (x < -lambd).where(x + bias, (x > lambd).where(x - bias, 0)).cast(x.dtype)
def _clip(x: Tensor, min=None, max=None) -> Tensor:  # noqa: A002 (ONNX's names)
  # a comparison keeps nan as numpy's clip does; min/max arrive as attributes (opset < 11) or inputs
  lo, hi = (_scalar(v) if isinstance(v, Tensor) else v for v in (min, max))
  if lo is not None: x = (x < lo).where(lo, x).cast(x.dtype)
  if hi is not None: x = (x > hi).where(hi, x).cast(x.dtype)
  return x
def _div(a: Tensor, b: Tensor) -> Tensor: return a / b if dtypes.is_float(a.dtype) else a.div(b, rounding_mode="trunc")
def _pow(x: Tensor, y: Tensor) -> Tensor:
  if dtypes.is_int(x.dtype) and dtypes.is_int(y.dtype): return x.pow(y.cast(x.dtype))
  if dtypes.is_float(x.dtype): return x.pow(y.cast(x.dtype))
  p = x.cast(dtypes.float64).pow(y.cast(dtypes.float64))  # exp2(y*log2(x)) is a hair off an exact integer power: round those
  return ((p - p.round()).abs() < 1e-9 * (p.abs() + 1)).where(p.round(), p).cast(x.dtype)
def _mod(a: Tensor, b: Tensor, fmod: int = 0) -> Tensor:
  if dtypes.is_int(a.dtype): return a - a.div(b, rounding_mode="trunc") * b if fmod else a.mod(b)
  # C's fmod (the sign of the dividend), with fmod(x, +-inf) = x for a finite x; fmod=0 then moves it to the divisor's sign
  # as numpy's mod does, a zero taking the divisor's sign
  r = (b.isinf() & ~a.isinf()).where(a, a - (a / b).trunc() * b)
  if not fmod:
    r = (r.ne(0) & ((r < 0) ^ (b < 0))).where(r + b, r)
    r = r.eq(0).where(b.sign() * 0, r)
  return r.cast(a.dtype)
def _variadic(fn: Callable) -> Callable:
  def op(*xs: Tensor) -> Tensor:
    out = xs[0]
    for x in xs[1:]: out = fn(out, x)
    return out
  return op
def _mean(*xs: Tensor) -> Tensor: return (_variadic(Tensor.add)(*xs) / len(xs)).cast(xs[0].dtype)
def _bitshift(x: Tensor, y: Tensor, direction: str) -> Tensor: return x.lshift(y) if direction == "LEFT" else x.rshift(y)
def _isinf(x: Tensor, detect_negative: int = 1, detect_positive: int = 1) -> Tensor:
  return x.isinf() & (((x > 0) & bool(detect_positive)) | ((x < 0) & bool(detect_negative)))
def _gelu(x: Tensor, approximate: str = "none") -> Tensor: return x.gelu(approximate=approximate)
def _elu(x: Tensor, alpha: float = 1.0) -> Tensor: return (x > 0).where(x, (x.exp() - 1) * alpha).cast(x.dtype)
def _selu(x: Tensor, alpha: float, gamma: float) -> Tensor: return ((x > 0).where(x, (x.exp() - 1) * alpha) * gamma).cast(x.dtype)
def _celu(x: Tensor, alpha: float = 1.0) -> Tensor:
  xf = x.cast(dtypes.float32) if x.dtype in (dtypes.float16, dtypes.bfloat16) else x  # exp(x)-1 in a half type loses all digits near 0
  return (xf.maximum(0) + ((xf / alpha).exp() - 1).minimum(0) * alpha).cast(x.dtype)
def _leaky(x: Tensor, alpha: float = 0.01) -> Tensor: return (x < 0).where(x * alpha, x).cast(x.dtype)
def _thresholded(x: Tensor, alpha: float = 1.0) -> Tensor: return (x > alpha).where(x, 0).cast(x.dtype)
def _prelu(x: Tensor, slope: Tensor) -> Tensor: return (x < 0).where(x * slope, x).cast(x.dtype)
def _softplus(x: Tensor) -> Tensor: return (x.maximum(0) + (-x.abs()).exp().log1p()).cast(x.dtype)
def _mish(x: Tensor) -> Tensor: return x * x.softplus().tanh()
def _hardswish(x: Tensor) -> Tensor: return x * _hardsigmoid(x, 1 / 6, 0.5)
def _where(c: Tensor, x: Tensor, y: Tensor) -> Tensor: return c.where(x, y)
def _swish(x: Tensor, alpha: float = 1.0) -> Tensor: return x * (x * alpha).sigmoid()

UNARY: dict[str, Callable[[Tensor], Tensor]] = {
  "Abs": Tensor.abs, "Neg": Tensor.neg, "Exp": Tensor.exp, "Log": Tensor.log, "Sqrt": Tensor.sqrt, "Reciprocal": Tensor.reciprocal,
  "Floor": Tensor.floor, "Ceil": Tensor.ceil, "Round": Tensor.round, "Sign": Tensor.sign, "Sin": Tensor.sin, "Cos": Tensor.cos,
  "Tan": Tensor.tan, "Asin": Tensor.asin, "Acos": Tensor.acos, "Atan": Tensor.atan, "Sinh": Tensor.sinh, "Cosh": Tensor.cosh,
  "Asinh": Tensor.asinh, "Acosh": Tensor.acosh, "Atanh": Tensor.atanh, "Erf": Tensor.erf, "Relu": Tensor.relu,
  "Sigmoid": Tensor.sigmoid, "Tanh": Tensor.tanh, "Softsign": Tensor.softsign, "Not": Tensor.logical_not, "IsNaN": Tensor.isnan,
  "Mish": _mish, "BitwiseNot": Tensor.bitwise_not, "Softplus": _softplus, "HardSwish": _hardswish,
}
BINARY: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
  "Add": Tensor.add, "Sub": Tensor.sub, "Mul": Tensor.mul, "Div": _div, "Pow": _pow, "Equal": Tensor.eq, "Less": Tensor.lt,
  "LessOrEqual": Tensor.le, "Greater": Tensor.gt, "GreaterOrEqual": Tensor.ge, "And": Tensor.logical_and, "Or": Tensor.logical_or,
  "Xor": Tensor.bitwise_xor, "BitwiseAnd": Tensor.bitwise_and, "BitwiseOr": Tensor.bitwise_or, "BitwiseXor": Tensor.bitwise_xor,
}

# ***** reductions *****

def _reduction(fn: Callable[[Tensor, tuple[int, ...], bool], Tensor]) -> Callable:
  def op(x: Tensor, axes=None, *, keepdims: int = 1, noop_with_empty_axes: int = 0) -> Tensor:
    # axes is an attribute before opset 13/18 and an input after: it arrives here either way
    ax = _ints(axes)
    if not ax:
      if noop_with_empty_axes: return x
      ax = list(range(x.ndim))
    return fn(x, tuple(sorted({_axis(a, x.ndim) for a in ax})), bool(keepdims))
  return op
def _rsum(x: Tensor, ax, k) -> Tensor: return x.sum(ax, keepdim=k).cast(x.dtype)
def _rmean(x: Tensor, ax, k) -> Tensor:
  n = _prod(x.shape[a] for a in ax)
  total = x.sum(ax, keepdim=k, dtype=x.dtype if dtypes.is_float(x.dtype) else None)
  return (total / n).cast(x.dtype) if n else (total * math.nan).cast(x.dtype)  # the mean of nothing is nan, as numpy's
def _rmax(x: Tensor, ax, k) -> Tensor:
  if any(x.shape[a] == 0 for a in ax): return _empty_reduce(x, ax, k, -math.inf if dtypes.is_float(x.dtype) else dtypes.min(x.dtype))
  return x.max(axis=ax, keepdim=k)
def _rmin(x: Tensor, ax, k) -> Tensor:
  if any(x.shape[a] == 0 for a in ax): return _empty_reduce(x, ax, k, math.inf if dtypes.is_float(x.dtype) else dtypes.max(x.dtype))
  return x.min(axis=ax, keepdim=k)
def _empty_reduce(x: Tensor, ax, k, value) -> Tensor:
  shape = tuple(1 if i in ax else s for i, s in enumerate(x.shape) if k or i not in ax)
  return Tensor.full(shape, value, dtype=x.dtype, device=x.device)
def _rlogsumexp(x: Tensor, ax, k) -> Tensor:
  if any(x.shape[a] == 0 for a in ax): return _empty_reduce(x, ax, k, -math.inf)
  m = x.max(axis=ax, keepdim=True)
  m = m.isinf().where(0, m)
  out = (x - m).exp().sum(ax, keepdim=True).log() + m
  return (out if k else out.reshape(tuple(s for i, s in enumerate(out.shape) if i not in ax))).cast(x.dtype)

REDUCE: dict[str, Callable] = {
  "ReduceSum": _rsum, "ReduceMean": _rmean, "ReduceMax": _rmax, "ReduceMin": _rmin,
  "ReduceProd": lambda x, ax, k: x.prod(ax, keepdim=k).cast(x.dtype),
  "ReduceL1": lambda x, ax, k: x.abs().sum(ax, keepdim=k).cast(x.dtype),
  "ReduceL2": lambda x, ax, k: x.square().sum(ax, keepdim=k).sqrt().cast(x.dtype),
  "ReduceLogSum": lambda x, ax, k: x.sum(ax, keepdim=k).log().cast(x.dtype),
  "ReduceLogSumExp": _rlogsumexp,
  "ReduceSumSquare": lambda x, ax, k: x.square().sum(ax, keepdim=k).cast(x.dtype),
}

def _argext(largest: bool) -> Callable:
  def op(x: Tensor, *, axis: int = 0, keepdims: int = 1, select_last_index: int = 0) -> Tensor:
    a = _axis(axis, x.ndim)
    y = x.flip(a) if select_last_index else x
    i = y.argmax(a, keepdim=bool(keepdims)) if largest else y.argmin(a, keepdim=bool(keepdims))
    return ((x.shape[a] - 1) - i if select_last_index else i).cast(dtypes.int64)
  return op

# ***** shapes and indexing *****

def _reshape(x: Tensor, shape: Tensor, *, allowzero: int = 0) -> Tensor:
  s = _ints(shape)
  if not allowzero: s = [x.shape[i] if d == 0 else d for i, d in enumerate(s)]
  return x.reshape(*s) if s else x.reshape(())
def _shape(x: Tensor, *, start: int = 0, end: int | None = None) -> Tensor:
  dims = list(x.shape[start:end])
  return Tensor(dims, dtype=dtypes.int64, device=x.device) if dims else Tensor.zeros(0, dtype=dtypes.int64, device=x.device)
def _size(x: Tensor) -> Tensor: return Tensor(_prod(x.shape), dtype=dtypes.int64, device=x.device)
def _transpose(x: Tensor, *, perm: list[int] | None = None) -> Tensor:
  return x.permute(*(perm if perm is not None else range(x.ndim - 1, -1, -1)))
def _flatten(x: Tensor, *, axis: int = 1) -> Tensor:
  a = axis + x.ndim if axis < 0 else axis
  return x.reshape(_prod(x.shape[:a]), _prod(x.shape[a:]))
def _squeeze(x: Tensor, axes=None) -> Tensor:
  ax = _ints(axes)
  ax = {_axis(a, x.ndim) for a in ax} if ax else {i for i, s in enumerate(x.shape) if s == 1}
  if any(x.shape[a] != 1 for a in ax): raise ValueError(f"Squeeze of axes {sorted(ax)} of shape {x.shape}: not all are 1")
  return x.reshape(tuple(s for i, s in enumerate(x.shape) if i not in ax))
def _unsqueeze(x: Tensor, axes=None) -> Tensor:
  ax = _ints(axes)
  n = x.ndim + len(ax)
  ax = {_axis(a, n) for a in ax}
  it = iter(x.shape)
  return x.reshape(tuple(1 if i in ax else next(it) for i in range(n)))
def _concat(*xs: Tensor, axis: int) -> Tensor: return xs[0].cat(*xs[1:], dim=_axis(axis, xs[0].ndim)) if len(xs) > 1 else xs[0]
def _split(x: Tensor, split=None, *, axis: int = 0, num_outputs: int | None = None, n_outputs: int) -> tuple[Tensor, ...]:
  a = _axis(axis, x.ndim)
  sizes = _ints(split)
  if not sizes:
    n = num_outputs or n_outputs
    chunk = -(-x.shape[a] // n)  # the last part is smaller when the axis doesn't divide
    sizes = [min(chunk, x.shape[a] - i * chunk) for i in range(n)]
  if sum(sizes) != x.shape[a]: raise ValueError(f"Split sizes {sizes} don't add up to axis {a} of shape {x.shape}")
  outs, start = [], 0
  for s in sizes:
    outs.append(x.shrink(tuple((start, start + s) if i == a else None for i in range(x.ndim))))
    start += s
  return tuple(outs)
def _slice(x: Tensor, starts=None, ends=None, axes=None, steps=None) -> Tensor:
  st, en = _ints(starts), _ints(ends)
  ax = _ints(axes) if axes is not None else list(range(len(st)))
  sp = _ints(steps) if steps is not None else [1] * len(st)
  for s, e, a, step in zip(st, en, ax, sp):
    a = _axis(a, x.ndim)
    if step == 0: raise ValueError("Slice step 0")
    n = x.shape[a]
    b, stop, step = slice(s, e, step).indices(n)  # ONNX clamps as Python does
    cnt = len(range(b, stop, step))
    if step < 0: x, b, step = x.flip(a), n - 1 - b, -step
    x = x.shrink(tuple((b, b + (cnt - 1) * step + 1) if i == a and cnt else (0, 0) if i == a else None for i in range(x.ndim)))
    if step > 1 and cnt: x = x[(slice(None),) * a + (slice(None, None, step),)]
  return x
def _expand(x: Tensor, shape: Tensor) -> Tensor: return x.expand(_bshape(x.shape, _ints(shape)))
def _tile(x: Tensor, repeats: Tensor) -> Tensor: return x.repeat(*_ints(repeats)) if x.ndim else x
def _gather(x: Tensor, indices: Tensor, *, axis: int = 0) -> Tensor:
  a = _axis(axis, x.ndim)
  idx = _norm_index(indices, x.shape[a]).cast(dtypes.int64)
  return x.index_select(a, idx.reshape(-1)).reshape(*x.shape[:a], *indices.shape, *x.shape[a + 1:])
def _gather_elements(x: Tensor, indices: Tensor, *, axis: int = 0) -> Tensor:
  a = _axis(axis, x.ndim)
  return x.gather(a, _norm_index(indices, x.shape[a]).cast(dtypes.int64))
def _gather_nd(x: Tensor, indices: Tensor, *, batch_dims: int = 0) -> Tensor:
  b, k = batch_dims, indices.shape[-1]
  bshape, kshape, rest = x.shape[:b], x.shape[b:b + k], x.shape[b + k:]
  idx = indices.cast(dtypes.int64)
  lin = Tensor.zeros(*indices.shape[:-1], dtype=dtypes.int64, device=x.device)
  for j, n in enumerate(kshape): lin = lin * n + _norm_index(idx[..., j], n)
  if b:  # each batch element reads its own block of the flattened data
    boff = Tensor.arange(_prod(bshape), dtype=dtypes.int64, device=x.device).reshape(*bshape, *(1,) * (idx.ndim - 1 - b))
    lin = lin + boff * _prod(kshape)
  flat = x.reshape(_prod(bshape) * _prod(kshape), *rest)
  return flat.index_select(0, lin.reshape(-1)).reshape(*indices.shape[:-1], *rest)
def _scatter_elements(x: Tensor, indices: Tensor, updates: Tensor, *, axis: int = 0, reduction: str = "none") -> Tensor:
  a = _axis(axis, x.ndim)
  idx = _norm_index(indices, x.shape[a]).cast(dtypes.int64)
  if reduction == "none": return x.scatter(a, idx, updates)
  return x.scatter_reduce(a, idx, updates, {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}[reduction])
def _pad(x: Tensor, pads=None, constant_value=None, axes=None, *, mode: str = "constant", value: float = 0.0) -> Tensor:
  p = _ints(pads)
  ax = [_axis(a, x.ndim) for a in _ints(axes)] if axes is not None else list(range(x.ndim))
  n = len(ax)
  pairs: list[tuple[int, int]] = [(0, 0)] * x.ndim
  for i, a in enumerate(ax): pairs[a] = (p[i], p[i + n])
  v = _scalar(constant_value, value)
  if mode == "constant": return x.pad(pairs, value=v)
  modes = {"reflect": "reflect", "edge": "replicate", "wrap": "circular"}
  if mode not in modes: raise NotImplementedError(f"Pad mode {mode!r}")
  return x.pad(pairs, mode=modes[mode])
def _constant_of_shape(shape: Tensor, *, value: Any = None) -> Tensor:
  v = _onnx().numpy_helper.to_array(value) if value is not None else None
  dt, fill = (dtypes.float32, 0.0) if v is None else (_from_numpy(v[:0]).dtype, v.reshape(-1)[0].item())
  return Tensor.full(tuple(_ints(shape)), fill, dtype=dt)
def _constant(*, value=None, value_float=None, value_floats=None, value_int=None, value_ints=None, sparse_value=None,
              value_string=None, value_strings=None) -> Tensor:
  if value is not None: return _numpy_attr(value)
  if value_float is not None: return Tensor(value_float, dtype=dtypes.float32)
  if value_floats is not None: return Tensor(list(value_floats), dtype=dtypes.float32)
  if value_int is not None: return Tensor(value_int, dtype=dtypes.int64)
  if value_ints is not None: return Tensor(list(value_ints), dtype=dtypes.int64)
  if sparse_value is not None: raise NotImplementedError("Constant with a sparse_value")
  raise NotImplementedError("string tensors are not supported (Constant value_string)")
def _numpy_attr(t: Any) -> Tensor: return _from_numpy(_onnx().numpy_helper.to_array(t))
def _cast(x: Tensor, *, to: int, saturate: int = 1, round_mode: str = "up") -> Tensor:
  # a narrow source's carrier holds its exact values, so casting it is casting the carrier
  # (a new Tensor: a cast to the carrier's own dtype would return the tagged carrier itself)
  return _to_narrow(x, to, bool(saturate), round_mode) if to in NARROW else Tensor(x.cast(onnx_dtype(to)).uop)
def _castlike(x: Tensor, like: Tensor, *, saturate: int = 1, round_mode: str = "up") -> Tensor:
  ty = narrow_type(like)
  return _to_narrow(x, ty, bool(saturate), round_mode) if ty is not None else Tensor(x.cast(like.dtype).uop)
def _range(start: Tensor, limit: Tensor, delta: Tensor) -> Tensor:
  s, l, d = _scalar(start), _scalar(limit), _scalar(delta)
  n = max(math.ceil((l - s) / d), 0)
  return (Tensor.arange(n, dtype=start.dtype, device=start.device) * d + s).cast(start.dtype) if n else \
    Tensor.zeros(0, dtype=start.dtype, device=start.device)
def _trilu(x: Tensor, k=None, *, upper: int = 1) -> Tensor:
  kk = int(_scalar(k, 0))
  if 0 in x.shape: return x
  return x.triu(kk) if upper else x.tril(kk)
def _onehot(indices: Tensor, depth: Tensor, values: Tensor, *, axis: int = -1) -> Tensor:
  d = int(_scalar(depth))
  a = _axis(axis, indices.ndim + 1)
  idx = _norm_index(indices, d).unsqueeze(a)
  rng = Tensor.arange(d, dtype=idx.dtype, device=idx.device).reshape(*(d if i == a else 1 for i in range(idx.ndim)))
  return (idx == rng).where(values[1], values[0])
def _eyelike(x: Tensor, *, dtype: int | None = None, k: int = 0) -> Tensor:
  n, m = x.shape
  dt = onnx_dtype(dtype) if dtype is not None else x.dtype
  r, c = Tensor.arange(n, device=x.device).reshape(n, 1), Tensor.arange(m, device=x.device).reshape(1, m)
  return (c - r == k).cast(dt)
def _depth_to_space(x: Tensor, *, blocksize: int, mode: str = "DCR") -> Tensor:
  n, c, h, w = x.shape
  b = blocksize
  if mode == "DCR": y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
  else: y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
  return y.reshape(n, c // (b * b), h * b, w * b)
def _space_to_depth(x: Tensor, *, blocksize: int, mode: str = "DCR") -> Tensor:
  n, c, h, w = x.shape
  b = blocksize
  y = x.reshape(n, c, h // b, b, w // b, b)
  y = y.permute(0, 3, 5, 1, 2, 4) if mode == "DCR" else y.permute(0, 1, 3, 5, 2, 4)
  return y.reshape(n, c * b * b, h // b, w // b)
def _cumsum(x: Tensor, axis: Tensor, *, exclusive: int = 0, reverse: int = 0) -> Tensor:
  a = _axis(int(_scalar(axis)), x.ndim)
  y = x.flip(a) if reverse else x
  if exclusive: y = y.pad(tuple((1, -1) if i == a else (0, 0) for i in range(x.ndim)))
  y = y.cumsum(a).cast(x.dtype)
  return y.flip(a) if reverse else y
def _topk(x: Tensor, k: Tensor, *, axis: int = -1, largest: int = 1, sorted: int = 1) -> tuple[Tensor, Tensor]:  # noqa: A002
  v, i = x.topk(int(_scalar(k)), dim=_axis(axis, x.ndim), largest=bool(largest), sorted=True)
  return v, i.cast(dtypes.int64)
def _nonzero(x: Tensor) -> Tensor: return x.nonzero().transpose(0, 1).cast(dtypes.int64) if x.ndim else \
  Tensor.zeros(0, int(bool(x.item())), dtype=dtypes.int64)
def _dropout(x: Tensor, ratio=None, training_mode=None, *, seed: int | None = None, n_outputs: int = 1):
  if training_mode is not None and _scalar(training_mode) and _scalar(ratio, 0.5) != 0:
    raise NotImplementedError("Dropout with training_mode=True (its random mask can't match another runtime's)")
  return (x, Tensor.full(x.shape, True, dtype=dtypes.bool, device=x.device))[:n_outputs]
def _identity(x: Tensor) -> Tensor: return x
def _einsum(*xs: Tensor, equation: str) -> Tensor: return Tensor.einsum(equation.replace(" ", ""), *xs)

# ***** linear algebra, convolution, pooling, normalization *****

def _gemm(a: Tensor, b: Tensor, c: Tensor | None = None, *, alpha: float = 1.0, beta: float = 1.0, transA: int = 0, transB: int = 0):
  y = (a.T if transA else a) @ (b.T if transB else b)
  if alpha != 1.0: y = y * alpha
  if c is not None: y = y + (c * beta if beta != 1.0 else c)
  return y.cast(a.dtype)
def _softmax_like(fn: Callable[[Tensor, int], Tensor]) -> Callable:
  def op(x: Tensor, *, axis: int = -1, opset: int) -> Tensor:
    a = _axis(axis, x.ndim)
    if opset >= 13: return fn(x, a)
    # before opset 13 the op works on the input flattened to 2-D at axis
    return fn(x.reshape(_prod(x.shape[:a]), _prod(x.shape[a:])), 1).reshape(x.shape)
  return op
def _hardmax(x: Tensor, a: int) -> Tensor:
  n = x.shape[a]
  i = x.argmax(a, keepdim=True)
  return (i == Tensor.arange(n, device=x.device).reshape(*(n if j == a else 1 for j in range(x.ndim)))).cast(x.dtype)

def _same_pads(ins, kernel, strides, dilations, auto_pad: str) -> list[int]:
  begin, end = [], []
  for i, k, s, d in zip(ins, kernel, strides, dilations):
    out = -(-i // s)
    total = max(0, (out - 1) * s + (k - 1) * d + 1 - i)
    small, big = total // 2, total - total // 2
    begin.append(small if auto_pad == "SAME_UPPER" else big)
    end.append(big if auto_pad == "SAME_UPPER" else small)
  return begin + end
def _geometry(x: Tensor, kernel, strides, dilations, pads, auto_pad: str):
  n = len(kernel)
  strides, dilations = list(strides or [1] * n), list(dilations or [1] * n)
  if auto_pad in ("SAME_UPPER", "SAME_LOWER"): pads = _same_pads(x.shape[2:], kernel, strides, dilations, auto_pad)
  elif auto_pad == "VALID" or not pads: pads = [0] * (2 * n)
  elif auto_pad != "NOTSET": raise NotImplementedError(f"auto_pad {auto_pad!r}")
  return strides, dilations, list(pads)
def _conv(x: Tensor, w: Tensor, b: Tensor | None = None, *, auto_pad: str = "NOTSET", dilations=None, group: int = 1,
          kernel_shape=None, pads=None, strides=None) -> Tensor:
  kernel = list(kernel_shape or w.shape[2:])
  n = len(kernel)
  strides, dilations, pads = _geometry(x, kernel, strides, dilations, pads, auto_pad)
  if group == 1 and all(k == 1 for k in kernel) and all(v == 1 for v in strides) and not any(pads):
    # a pointwise conv is a matmul over channels: the matmul kernel's register tiles beat the generic window reduce
    n, cin, sp = x.shape[0], x.shape[1], x.shape[2:]
    y = (w.reshape(w.shape[0], cin) @ x.reshape(n, cin, _prod(sp))).reshape(n, w.shape[0], *sp)
    return y if b is None else y + _channel(b, y)
  if group == 1 and n == 2 and any(v > 1 for v in strides) and all(d == 1 for d in dilations) and \
     all(isinstance(v, int) for v in x.shape) and x.shape[1] * _prod(strides) <= S2D_MAX_CHANNELS:
    return _strided_conv(x, w, b, kernel, strides, pads)
  return x.conv2d(w, b, groups=group, stride=strides, dilation=dilations, padding=[v for i in range(n) for v in (pads[i], pads[i + n])])

# a strided conv of few input channels (a network's stem: RGB in, stride 2) as a stride-1 conv of its input cut in
# stride x stride blocks (space to depth): the strided reads kept the kernel's register tile from vectorizing (PP-OCR
# det's 3 -> 16 channels 3x3 at 640x640, one core: 30 -> 6.4 ms, the input's reshuffle one copy). Up to this many
# channels after the reshuffle: the zero taps it adds (3x3 -> 2 x 2x2 blocks: 16/9 the multiply-adds) cost more
# than the strided reads save where the channels are many
S2D_MAX_CHANNELS = 32

def _strided_conv(x: Tensor, w: Tensor, b: Tensor | None, kernel: list[int], strides: list[int], pads: list[int]) -> Tensor:
  (sh, sw), (kh, kw), (H, W) = strides, kernel, x.shape[2:]
  qh, qw = -(-kh // sh), -(-kw // sw)  # the kernel's size in blocks
  ho, wo = (H + pads[0] + pads[2] - kh) // sh + 1, (W + pads[1] + pads[3] - kw) // sw + 1
  hs, ws = ho + qh - 1, wo + qw - 1  # blocks the outputs read
  # padded (or cropped) to exactly those blocks: rows -pads[0] .. sh*hs - pads[0]
  xp = x.pad(((0, 0), (0, 0), (pads[0], sh * hs - H - pads[0]), (pads[1], sw * ws - W - pads[1])))
  n, c, o = x.shape[0], x.shape[1], w.shape[0]
  xs = xp.reshape(n, c, hs, sh, ws, sw).permute(0, 1, 3, 5, 2, 4).reshape(n, c * sh * sw, hs, ws).contiguous()
  ws_ = w.pad(((0, 0), (0, 0), (0, qh * sh - kh), (0, qw * sw - kw))).reshape(o, c, qh, sh, qw, sw).permute(0, 1, 3, 5, 2, 4)
  return xs.conv2d(ws_.reshape(o, c * sh * sw, qh, qw), b)
def _conv_transpose(x: Tensor, w: Tensor, b: Tensor | None = None, *, auto_pad: str = "NOTSET", dilations=None, group: int = 1,
                    kernel_shape=None, output_padding=None, output_shape=None, pads=None, strides=None) -> Tensor:
  kernel = list(kernel_shape or w.shape[2:])
  n = len(kernel)
  strides, dilations = list(strides or [1] * n), list(dilations or [1] * n)
  opad = list(output_padding or [0] * n)
  full = [(i - 1) * s + (k - 1) * d + 1 + op for i, s, k, d, op in zip(x.shape[2:], strides, kernel, dilations, opad)]
  if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
    want = list(output_shape)[-n:] if output_shape is not None else [i * s for i, s in zip(x.shape[2:], strides)]
    tot = [f - o for f, o in zip(full, want)]
    upper = auto_pad != "SAME_LOWER"
    half = [int(t / 2) for t in tot]  # C division: a negative total (output_shape bigger than the full result) pads at the end
    pads = [h if upper else t - h for t, h in zip(tot, half)] + [t - h if upper else h for t, h in zip(tot, half)]
  elif auto_pad == "VALID" or not pads: pads = [0] * (2 * n)
  # the full transposed conv, then cut the pads off (pads may differ per side, which conv_transpose2d doesn't take)
  y = x.conv_transpose2d(w, None, groups=group, stride=strides, dilation=dilations, padding=0, output_padding=0)
  y = y.pad(((0, 0), (0, 0)) + tuple((-pads[i], opad[i] - pads[i + n]) for i in range(n)))
  return y if b is None else y + b.reshape(1, -1, *(1,) * n)

def _pool_geometry(x: Tensor, kernel, strides, dilations, pads, auto_pad: str, ceil_mode: int):
  """Explicit (before, after) padding per spatial axis, the extra right padding ceil_mode needs, and the output size."""
  n = len(kernel)
  strides, dilations, pads = _geometry(x, kernel, strides, dilations, pads, auto_pad)
  before, after, extra, outs = pads[:n], pads[n:], [], []
  for i, k, s, d, pb, pe in zip(x.shape[2:], kernel, strides, dilations, before, after):
    span = i + pb + pe - ((k - 1) * d + 1)
    o = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (o - 1) * s >= i + pb: o -= 1  # the last window starts inside the input or the left padding
    outs.append(o)
    extra.append(max(0, (o - 1) * s + (k - 1) * d + 1 - (i + pb + pe)))
  return strides, dilations, before, after, extra, outs
def _windows(x: Tensor, fn: str, kernel, strides, dilations, outs) -> Tensor:
  n = len(kernel)
  y = getattr(x, f"{fn}{n}d")(list(kernel), list(strides), list(dilations), 0)
  return y.shrink(((0, y.shape[0]), (0, y.shape[1])) + tuple((0, o) for o in outs))
def _maxpool(x: Tensor, *, auto_pad: str = "NOTSET", ceil_mode: int = 0, dilations=None, kernel_shape, pads=None,
             storage_order: int = 0, strides=None, n_outputs: int = 1) -> Tensor:
  s, d, pb, pe, extra, outs = _pool_geometry(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
  low = -math.inf if dtypes.is_float(x.dtype) else dtypes.min(x.dtype)
  geo = ((0, 0), (0, 0)) + tuple((b, e + ex) for b, e, ex in zip(pb, pe, extra))
  xp = x.pad(geo, value=low)
  if n_outputs == 1: return _windows(xp, "max_pool", kernel_shape, s, d, outs)
  # with Indices: walk the window offsets keeping the first maximum and its flat index into x (row- or column-major)
  sp = x.shape[2:]
  order = tuple(range(len(sp))) if not storage_order else tuple(reversed(range(len(sp))))
  flat = Tensor.arange(_prod(x.shape), dtype=dtypes.int64, device=x.device).reshape(*x.shape[:2], *(sp[a] for a in order))
  flat = flat.permute(0, 1, *(2 + order.index(a) for a in range(len(sp)))).pad(geo, value=-1)
  best_v = best_i = None
  for offs in itertools.product(*(range(k) for k in kernel_shape)):
    sl = (slice(None), slice(None)) + tuple(slice(o * dd, o * dd + (n - 1) * ss + 1, ss) for o, dd, ss, n in zip(offs, d, s, outs))
    v, i = xp[sl], flat[sl]
    if best_v is None: best_v, best_i = v, i
    else:
      take = v > best_v
      best_v, best_i = take.where(v, best_v), take.where(i, best_i)
  return best_v, best_i
def _avgpool(x: Tensor, *, auto_pad: str = "NOTSET", ceil_mode: int = 0, count_include_pad: int = 0, dilations=None,
             kernel_shape, pads=None, strides=None) -> Tensor:
  s, d, pb, pe, extra, outs = _pool_geometry(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
  n = len(kernel_shape)
  geo = ((0, 0), (0, 0))
  total = _windows(x.pad(geo + tuple((b, e + ex) for b, e, ex in zip(pb, pe, extra))), "avg_pool", kernel_shape, s, d, outs)
  # what each window averages over: the input, plus the explicit pads when count_include_pad (never ceil_mode's extra)
  ones = Tensor.ones(1, 1, *x.shape[2:], device=x.device)
  ones = ones.pad(geo + tuple((b, e) for b, e in zip(pb, pe)), value=1.0 if count_include_pad else 0.0).pad(geo + tuple((0, ex) for ex in extra))
  count = _windows(ones, "avg_pool", kernel_shape, s, d, outs)
  return (total / count).cast(x.dtype) if n else total
def _lppool(x: Tensor, *, auto_pad: str = "NOTSET", ceil_mode: int = 0, dilations=None, kernel_shape, p: int = 2, pads=None,
            strides=None) -> Tensor:
  s, d, pb, pe, extra, outs = _pool_geometry(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
  xp = x.abs().pow(p).pad(((0, 0), (0, 0)) + tuple((b, e + ex) for b, e, ex in zip(pb, pe, extra)))
  return (_windows(xp, "avg_pool", kernel_shape, s, d, outs) * _prod(kernel_shape)).pow(1 / p).cast(x.dtype)
def _global(fn: str) -> Callable:
  def op(x: Tensor) -> Tensor: return getattr(x, fn)(tuple(range(2, x.ndim)), keepdim=True)
  return op
def _global_lp(x: Tensor, *, p: int = 2) -> Tensor: return x.abs().pow(p).sum(tuple(range(2, x.ndim)), keepdim=True).pow(1 / p)
def _channel(t: Tensor, x: Tensor) -> Tensor: return t.reshape(1, -1, *(1,) * (x.ndim - 2))
def _batchnorm(x: Tensor, scale: Tensor, b: Tensor, mean: Tensor, var: Tensor, *, epsilon: float = 1e-5, momentum: float = 0.9,
               training_mode: int = 0, spatial: int = 1, is_test: int = 1, n_outputs: int = 1):
  if training_mode:  # normalize by the batch's statistics; also return the updated running ones
    ax = tuple(i for i in range(x.ndim) if i != 1)
    bm, bv = x.mean(ax), x.var(ax, correction=0)
    y = ((x - _channel(bm, x)) * _channel(scale * (bv + epsilon).rsqrt(), x) + _channel(b, x)).cast(x.dtype)
    return (y, (mean * momentum + bm * (1 - momentum)).cast(mean.dtype), (var * momentum + bv * (1 - momentum)).cast(var.dtype))[:n_outputs]
  k = scale * (var + epsilon).rsqrt()
  return (x * _channel(k, x) + _channel(b - mean * k, x)).cast(x.dtype)
def _instancenorm(x: Tensor, scale: Tensor, b: Tensor, *, epsilon: float = 1e-5) -> Tensor:
  ax = tuple(range(2, x.ndim))
  y = x - x.mean(ax, keepdim=True)
  return y * (y.square().mean(ax, keepdim=True) + epsilon).rsqrt() * _channel(scale, x) + _channel(b, x)
def _layernorm(x: Tensor, scale: Tensor, b: Tensor | None = None, *, axis: int = -1, epsilon: float = 1e-5, stash_type: int = 1,
               n_outputs: int = 1):
  a = _axis(axis, x.ndim)
  ax = tuple(range(a, x.ndim))
  xf = x.cast(onnx_dtype(stash_type)) if stash_type != 0 else x
  mean = xf.mean(ax, keepdim=True)
  y = xf - mean
  inv = (y.square().mean(ax, keepdim=True) + epsilon).rsqrt()
  out = (y * inv).cast(x.dtype) * scale
  if b is not None: out = out + b
  return (out, mean, inv)[:n_outputs]
def _groupnorm(x: Tensor, scale: Tensor, bias: Tensor, *, epsilon: float = 1e-5, num_groups: int, stash_type: int = 1) -> Tensor:
  n, c = x.shape[:2]
  g = x.reshape(n, num_groups, -1).cast(onnx_dtype(stash_type))
  g = g - g.mean(-1, keepdim=True)
  y = (g * (g.square().mean(-1, keepdim=True) + epsilon).rsqrt()).reshape(x.shape).cast(x.dtype)
  if scale.numel() != c:  # opset 18 had one scale per group
    scale, bias = scale.reshape(-1, 1).expand(num_groups, c // num_groups).reshape(c), bias.reshape(-1, 1).expand(num_groups, c // num_groups).reshape(c)
  return y * _channel(scale, x) + _channel(bias, x)
def _lrn(x: Tensor, *, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0, size: int) -> Tensor:
  n, c = x.shape[:2]
  sq = x.square().reshape(n, c, -1).permute(0, 2, 1).pad(((0, 0), (0, 0), ((size - 1) // 2, size // 2)))
  s = sq.avg_pool1d(size, 1, 1, 0) * size
  s = s.permute(0, 2, 1).reshape(x.shape)
  return (x / (s * (alpha / size) + bias).pow(beta)).cast(x.dtype)
def _mvn(x: Tensor, *, axes=(0, 2, 3)) -> Tensor:
  ax = tuple(_axis(a, x.ndim) for a in axes)
  y = x - x.mean(ax, keepdim=True)
  return y / (y.square().mean(ax, keepdim=True).sqrt() + 1e-9)
def _lpnorm(x: Tensor, *, axis: int = -1, p: int = 2) -> Tensor:
  a = _axis(axis, x.ndim)
  nrm = x.abs().sum(a, keepdim=True) if p == 1 else x.square().sum(a, keepdim=True).sqrt()
  return (nrm == 0).where(0, x / nrm).cast(x.dtype)

# ***** losses, more normalization, windows *****

def _nll(x: Tensor, target: Tensor, weight: Tensor | None = None, *, ignore_index: int | None = None, reduction: str = "mean") -> Tensor:
  t = target.cast(dtypes.int64)
  keep = t != ignore_index if ignore_index is not None else Tensor.full(t.shape, True, dtype=dtypes.bool, device=t.device)
  safe = keep.where(t, 0)
  picked = -x.gather(1, safe.unsqueeze(1)).squeeze(1)
  w = (weight[safe] if weight is not None else Tensor.ones(*t.shape, dtype=x.dtype, device=x.device)) * keep.cast(x.dtype)
  loss = picked * w
  if reduction == "none": return loss.cast(x.dtype)
  if reduction == "sum": return loss.sum().cast(x.dtype)
  if reduction == "mean": return (loss.sum() / w.sum()).cast(x.dtype)
  raise NotImplementedError(f"reduction {reduction!r}")
def _softmax_ce(scores: Tensor, labels: Tensor, weights: Tensor | None = None, *, ignore_index: int | None = None,
                reduction: str = "mean", n_outputs: int = 1):
  logp = scores.log_softmax(1)
  return (_nll(logp, labels, weights, ignore_index=ignore_index, reduction=reduction), logp)[:n_outputs]
def _rmsnorm(x: Tensor, scale: Tensor, *, axis: int = -1, epsilon: float = 1e-5, stash_type: int = 1) -> Tensor:
  ax = tuple(range(_axis(axis, x.ndim), x.ndim))
  xf = x.cast(onnx_dtype(stash_type))
  return (xf * (xf.square().mean(ax, keepdim=True) + epsilon).rsqrt()).cast(x.dtype) * scale
def _cumprod(x: Tensor, axis: Tensor, *, exclusive: int = 0, reverse: int = 0) -> Tensor:
  a = _axis(int(_scalar(axis)), x.ndim)
  y = x.flip(a) if reverse else x
  if exclusive: y = y.pad(tuple((1, -1) if i == a else (0, 0) for i in range(x.ndim)), value=1)
  y = y.cumprod(a).cast(x.dtype)
  return y.flip(a) if reverse else y
def _window(terms: tuple[float, ...]) -> Callable:
  """A cosine-sum window: sum_k (-1)^k a_k cos(2 pi k n / N), N = size (periodic) or size - 1 (symmetric)."""
  def op(size: Tensor, *, output_datatype: int = 1, periodic: int = 1) -> Tensor:
    import numpy as np
    n = int(_scalar(size))
    m = n if periodic else n - 1
    k = np.arange(n, dtype=np.float64)
    w = sum((-1) ** i * a * np.cos(2 * np.pi * i * k / m) for i, a in enumerate(terms)) if m > 0 else np.ones(n)
    return _from_numpy(np.asarray(w, np.float32), size.device).cast(onnx_dtype(output_datatype))
  return op
def _bitcast(x: Tensor, *, to: int) -> Tensor: return x.bitcast(onnx_dtype(to))
def _center_crop_pad(x: Tensor, shape: Tensor, *, axes=None) -> Tensor:
  ax = [_axis(a, x.ndim) for a in axes] if axes is not None else list(range(x.ndim))
  want = dict(zip(ax, _ints(shape)))
  # one shrink and one pad for all axes (two shrinks in a row hit a lowering bug: "C renderer can't render Ops.BIND")
  crop = tuple(((s - want[i]) // 2, (s - want[i]) // 2 + want[i]) if i in want and s > want[i] else None for i, s in enumerate(x.shape))
  x = x.shrink(crop)
  return x.pad(tuple(((want[i] - s) // 2, want[i] - s - (want[i] - s) // 2) if i in want and s < want[i] else (0, 0) for i, s in enumerate(x.shape)))
def _scatter_nd(x: Tensor, indices: Tensor, updates: Tensor, *, reduction: str = "none") -> Tensor:
  k = indices.shape[-1]
  kshape, rest = x.shape[:k], x.shape[k:]
  lin = Tensor.zeros(*indices.shape[:-1], dtype=dtypes.int64, device=x.device)
  for j, n in enumerate(kshape): lin = lin * n + _norm_index(indices[..., j].cast(dtypes.int64), n)
  m, r = _prod(indices.shape[:-1]), _prod(rest)
  flat, upd = x.reshape(_prod(kshape), r), updates.reshape(m, r)
  idx = lin.reshape(m, 1).expand(m, r)
  if reduction == "none": out = flat.scatter(0, idx, upd)
  else: out = flat.scatter_reduce(0, idx, upd, {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}[reduction])
  return out.reshape(x.shape)
def _compress(x: Tensor, condition: Tensor, *, axis: int | None = None) -> Tensor:
  import numpy as np
  keep = np.nonzero(np.asarray(_flat(condition), bool))[0]  # the output's size depends on the values: read them
  if axis is None: x, a = x.reshape(-1), 0
  else: a = _axis(axis, x.ndim)
  idx = Tensor(keep.astype(np.int64), device=x.device)
  return x.index_select(a, idx) if len(keep) else x.shrink(tuple((0, 0) if i == a else None for i in range(x.ndim)))
def _reverse_sequence(x: Tensor, sequence_lens: Tensor, *, batch_axis: int = 1, time_axis: int = 0) -> Tensor:
  t_len, b_len = x.shape[time_axis], x.shape[batch_axis]
  shp = [1] * x.ndim
  shp[time_axis], shp[batch_axis] = t_len, b_len
  tt = Tensor.arange(t_len, dtype=dtypes.int64, device=x.device).reshape(*(t_len if i == time_axis else 1 for i in range(x.ndim)))
  ln = sequence_lens.cast(dtypes.int64).reshape(*(b_len if i == batch_axis else 1 for i in range(x.ndim)))
  idx = (tt < ln).where(ln - 1 - tt, tt).expand(*x.shape)
  return x.gather(time_axis, idx)

# ***** quantization: integer results computed as ONNX says (round half to even, saturate to the type) *****

def _qparam(p: Tensor, x: Tensor, axis: int, block_size: int) -> Tensor:
  """A scale or zero point shaped to broadcast against x: a scalar, one per channel of axis, or one per block of it."""
  if p.ndim == 0 or p.numel() == 1 and x.ndim != p.ndim: return p.reshape(())
  a = _axis(axis, x.ndim)
  if p.ndim == 1 and not block_size: return p.reshape(*(-1 if i == a else 1 for i in range(x.ndim)))
  if block_size:  # each entry covers block_size consecutive elements along axis
    p = p.unsqueeze(a + 1).expand(*p.shape[:a + 1], block_size, *p.shape[a + 1:]).reshape(*p.shape[:a], p.shape[a] * block_size, *p.shape[a + 1:])
    return p.shrink(tuple((0, x.shape[a]) if i == a else None for i in range(x.ndim)))
  return p
def _quantize(x: Tensor, y_scale: Tensor, y_zero_point: Tensor | None = None, *, axis: int = 1, block_size: int = 0,
              output_dtype: int = 0, saturate: int = 1, precision: int = 0) -> Tensor:
  ty = narrow_type(y_zero_point) if y_zero_point is not None else output_dtype if output_dtype in NARROW else None
  if ty is not None and NARROW[ty].is_float:  # float8/float4: onto the type's grid (float8 ignores the zero point, which is 0)
    y = x.cast(dtypes.float32) / _qparam(y_scale, x, axis, block_size).cast(dtypes.float32)
    if y_zero_point is not None and not NARROW[ty].name.startswith("float8"): y = y + _qparam(y_zero_point, x, axis, block_size)
    return _to_narrow(y, ty, bool(saturate))
  dt = NARROW[ty].carrier if ty is not None else y_zero_point.dtype if y_zero_point is not None else \
    onnx_dtype(output_dtype) if output_dtype else dtypes.uint8
  if not dtypes.is_int(dt): raise NotImplementedError(f"QuantizeLinear to {dt}")
  lo, hi = ((-(1 << NARROW[ty].bits - 1), (1 << NARROW[ty].bits - 1) - 1) if NARROW[ty].signed else (0, (1 << NARROW[ty].bits) - 1)) \
    if ty is not None else (dtypes.min(dt), dtypes.max(dt))
  y = (x.cast(dtypes.float32) / _qparam(y_scale, x, axis, block_size).cast(dtypes.float32)).round()
  if y_zero_point is not None: y = y + _qparam(y_zero_point, x, axis, block_size).cast(dtypes.float32)
  return _tag(y.clip(lo, hi).cast(dt), ty)
def _dequantize(x: Tensor, x_scale: Tensor, x_zero_point: Tensor | None = None, *, axis: int = 1, block_size: int = 0,
                output_dtype: int = 0) -> Tensor:
  if narrow_type(x) is not None and NARROW[narrow_type(x)].is_float:  # float8/float4: the carrier holds the values
    xf = x if x_zero_point is None else x - _qparam(x_zero_point, x, axis, block_size)
    out = onnx_dtype(output_dtype) if output_dtype else x_scale.dtype
    return (xf * _qparam(x_scale, x, axis, block_size).cast(dtypes.float32)).cast(out)
  if not dtypes.is_int(x.dtype): raise NotImplementedError(f"DequantizeLinear from {x.dtype}")
  xi = x.cast(dtypes.int64 if x.dtype in (dtypes.uint32, dtypes.int64, dtypes.uint64) else dtypes.int32)
  if x_zero_point is not None: xi = xi - _qparam(x_zero_point, x, axis, block_size).cast(xi.dtype)
  out = onnx_dtype(output_dtype) if output_dtype else x_scale.dtype
  return (xi.cast(dtypes.float32) * _qparam(x_scale, x, axis, block_size).cast(dtypes.float32)).cast(out)
def _dynamic_quantize(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
  lo, hi = x.min().minimum(0), x.max().maximum(0)
  scale = (hi - lo) / 255
  zp = (-lo / scale).round().clip(0, 255).cast(dtypes.uint8)
  y = ((x / scale).round() + zp.cast(dtypes.float32)).clip(0, 255).cast(dtypes.uint8)
  return y, scale.cast(dtypes.float32), zp
def _zp_sub(t: Tensor, zp: Tensor | None, row_axis: int | None = None) -> Tensor:
  ti = t.cast(dtypes.int32)
  if zp is None: return ti
  z = zp.cast(dtypes.int32)
  if row_axis is not None and z.ndim == 1 and z.numel() > 1: z = z.reshape(*(-1 if i == row_axis else 1 for i in range(t.ndim)))
  return ti - z
def _matmul_integer(a: Tensor, b: Tensor, a_zero_point: Tensor | None = None, b_zero_point: Tensor | None = None) -> Tensor:
  return _zp_sub(a, a_zero_point, a.ndim - 2) @ _zp_sub(b, b_zero_point)
def _conv_integer(x: Tensor, w: Tensor, x_zero_point: Tensor | None = None, w_zero_point: Tensor | None = None, *,
                  auto_pad: str = "NOTSET", dilations=None, group: int = 1, kernel_shape=None, pads=None, strides=None) -> Tensor:
  return _conv(_zp_sub(x, x_zero_point), _zp_sub(w, w_zero_point, 0), None, auto_pad=auto_pad, dilations=dilations, group=group,
               kernel_shape=kernel_shape, pads=pads, strides=strides)
def _requantize(acc: Tensor, scale: Tensor, y_scale: Tensor, y_zp: Tensor | None, dt) -> Tensor:
  y = (acc.cast(dtypes.float32) * (scale / y_scale).cast(dtypes.float32)).round()
  if y_zp is not None: y = y + y_zp.cast(dtypes.float32)
  return y.clip(dtypes.min(dt), dtypes.max(dt)).cast(dt)
def _qlinear_matmul(a: Tensor, a_scale: Tensor, a_zp: Tensor, b: Tensor, b_scale: Tensor, b_zp: Tensor, y_scale: Tensor,
                    y_zp: Tensor) -> Tensor:
  acc = _matmul_integer(a, b, a_zp, b_zp)
  sa = a_scale.reshape(-1, 1) if a_scale.numel() > 1 else a_scale.reshape(())
  return _requantize(acc, sa * b_scale, y_scale, y_zp, y_zp.dtype)
def _qlinear_conv(x: Tensor, x_scale: Tensor, x_zp: Tensor, w: Tensor, w_scale: Tensor, w_zp: Tensor, y_scale: Tensor, y_zp: Tensor,
                  b: Tensor | None = None, *, auto_pad: str = "NOTSET", dilations=None, group: int = 1, kernel_shape=None, pads=None,
                  strides=None) -> Tensor:
  acc = _conv(_zp_sub(x, x_zp), _zp_sub(w, w_zp, 0), None, auto_pad=auto_pad, dilations=dilations, group=group,
              kernel_shape=kernel_shape, pads=pads, strides=strides)
  if b is not None: acc = acc + _channel(b.cast(dtypes.int32), acc)
  ws = _channel(w_scale, acc) if w_scale.numel() > 1 else w_scale.reshape(())
  return _requantize(acc, x_scale.reshape(()) * ws, y_scale, y_zp, y_zp.dtype)

# ***** attention (opset 23+), following the spec's order of operations so results match its reference *****

def _bias_from_mask(m: Tensor, dt) -> Tensor: return m.where(0.0, -math.inf).cast(dt) if m.dtype == dtypes.bool else m.cast(dt)
def _window_bias(q: int, kv: int, offset: Tensor | int, left: int, right: int, causal: bool, dev) -> Tensor:
  """0 where query i may see key j, -inf elsewhere: j <= i + offset (causal) and inside the sliding window."""
  i = Tensor.arange(q, device=dev).reshape(q, 1)
  j = Tensor.arange(kv, device=dev).reshape(1, kv)
  if isinstance(offset, Tensor): i = i.reshape(1, 1, q, 1) + offset.cast(dtypes.int64).reshape(-1, 1, 1, 1)
  else: i = i + offset
  ok = (j <= i) if causal else (j >= j)
  if left >= 0: ok = ok & (i - j <= left)
  if right >= 0: ok = ok & (j - i <= right)
  return ok.where(0.0, -math.inf)
def _attention(Q: Tensor, K: Tensor, V: Tensor, attn_mask: Tensor | None = None, past_key: Tensor | None = None,
               past_value: Tensor | None = None, nonpad_kv_seqlen: Tensor | None = None, *, is_causal: int = 0,
               kv_num_heads: int | None = None, q_num_heads: int | None = None, qk_matmul_output_mode: int = 0, scale: float | None = None,
               softcap: float = 0.0, softmax_precision: int | None = None, left_window_size: int = -1, right_window_size: int = -1,
               n_outputs: int = 1):
  dt, three_d = Q.dtype, Q.ndim == 3
  if dt in (dtypes.float16, dtypes.bfloat16):  # computed in float32, rounded once at the end (as onnxruntime does)
    y, *rest = _attention(*(t.cast(dtypes.float32) if isinstance(t, Tensor) and t.dtype == dt else t for t in
                            (Q, K, V, attn_mask, past_key, past_value)), nonpad_kv_seqlen, is_causal=is_causal, kv_num_heads=kv_num_heads,
                          q_num_heads=q_num_heads, qk_matmul_output_mode=qk_matmul_output_mode, scale=scale, softcap=softcap,
                          softmax_precision=softmax_precision, left_window_size=left_window_size, right_window_size=right_window_size,
                          n_outputs=4)
    return tuple(t.cast(dt) for t in (y, *rest))[:n_outputs]
  if three_d:  # (B, S, heads*size) -> (B, heads, S, size)
    Q, K, V = (t.reshape(t.shape[0], t.shape[1], h, -1).permute(0, 2, 1, 3) for t, h in ((Q, q_num_heads), (K, kv_num_heads), (V, kv_num_heads)))
  sc = math.sqrt(scale if scale is not None else 1 / math.sqrt(Q.shape[3]))  # the reference scales q and k by sqrt(scale) each
  if past_key is not None: K, V = past_key.cat(K, dim=2), past_value.cat(V, dim=2)
  present_k, present_v = K, V
  q, kv = Q.shape[2], K.shape[2]
  bias = Tensor.zeros(q, kv, dtype=dt, device=Q.device)
  if attn_mask is not None and attn_mask.shape[-1] < kv:
    attn_mask = attn_mask.pad(((0, 0),) * (attn_mask.ndim - 1) + ((0, kv - attn_mask.shape[-1]),),
                              value=False if attn_mask.dtype == dtypes.bool else -math.inf)
  offset: Tensor | int = (nonpad_kv_seqlen - q) if past_key is None and nonpad_kv_seqlen is not None else (past_key.shape[2] if past_key is not None else 0)
  if attn_mask is not None: bias = bias + _bias_from_mask(attn_mask, dt)
  if is_causal or left_window_size >= 0 or right_window_size >= 0:
    bias = bias + _window_bias(q, kv, offset, left_window_size, right_window_size, bool(is_causal), Q.device).cast(dt)
  if nonpad_kv_seqlen is not None:
    pad = Tensor.arange(kv, device=Q.device).reshape(1, kv) < nonpad_kv_seqlen.cast(dtypes.int64).reshape(-1, 1)
    bias = bias + pad.reshape(-1, 1, 1, kv).where(0.0, -math.inf).cast(dt)
  hq, hk = Q.shape[1], K.shape[1]
  if hq != hk and hq % hk == 0:  # grouped-query attention: each k/v head serves hq // hk query heads
    K, V = (t.unsqueeze(2).expand(t.shape[0], hk, hq // hk, *t.shape[2:]).reshape(t.shape[0], hq, *t.shape[2:]) for t in (K, V))
  qk = (Q * sc) @ (K.transpose(-1, -2) * sc)
  if softcap and softcap > 0: qk = (qk / softcap).tanh() * softcap
  with_bias = qk + bias
  qk_out = with_bias if qk_matmul_output_mode == 2 else qk
  x = with_bias.cast(onnx_dtype(softmax_precision)) if softmax_precision is not None else with_bias
  m = x.max(axis=-1, keepdim=True)
  e = (x - m.isinf().where(0, m)).exp()
  ssum = e.sum(-1, keepdim=True)
  p = e / (ssum == 0).where(1, ssum)
  p = bias.max(axis=-1, keepdim=True).isinf().where(0, p)  # a row that sees nothing gives 0, not nan
  if qk_matmul_output_mode == 3: qk_out = p
  y = p.cast(dt) @ V
  if three_d: y = y.permute(0, 2, 1, 3).reshape(y.shape[0], y.shape[2], -1)
  return (y, present_k, present_v, qk_out.cast(dt))[:n_outputs]

# ***** recurrent layers: RNN, GRU, LSTM unrolled over the (static) sequence length *****

_RNN_ACTS: dict[str, Callable] = {  # name -> (x, alpha, beta) -> y; alpha/beta come from activation_alpha/beta in order
  "relu": lambda x, a, b: x.relu(), "tanh": lambda x, a, b: x.tanh(), "sigmoid": lambda x, a, b: x.sigmoid(),
  "affine": lambda x, a, b: x * a + b, "leakyrelu": lambda x, a, b: _leaky(x, a), "thresholdedrelu": lambda x, a, b: _thresholded(x, a),
  "scaledtanh": lambda x, a, b: (x * b).tanh() * a, "hardsigmoid": lambda x, a, b: _hardsigmoid(x, a, b), "elu": lambda x, a, b: _elu(x, a),
  "softsign": lambda x, a, b: x.softsign(), "softplus": lambda x, a, b: _softplus(x)}
_RNN_DEFAULT_AB = {"affine": (1.0, 0.0), "leakyrelu": (0.01, 0.0), "thresholdedrelu": (1.0, 0.0), "scaledtanh": (1.0, 1.0),
                   "hardsigmoid": (0.2, 0.5), "elu": (1.0, 0.0)}
def _rnn_acts(names: list[str], alphas, betas, per_dir: int, n_dir: int) -> list[list[Callable]]:
  alphas, betas, out = list(alphas or []), list(betas or []), []
  for d in range(n_dir):
    fs = []
    for nm in names[d * per_dir:(d + 1) * per_dir]:
      key = nm.lower()
      if key not in _RNN_ACTS: raise NotImplementedError(f"activation {nm!r}")
      da, db = _RNN_DEFAULT_AB.get(key, (0.0, 0.0))
      a = alphas.pop(0) if key in _RNN_DEFAULT_AB and alphas else da
      b = betas.pop(0) if key in ("affine", "scaledtanh", "hardsigmoid") and betas else db
      fs.append(lambda x, f=_RNN_ACTS[key], a=a, b=b: f(x, a, b))
    out.append(fs)
  return out
def _recurrent(kind: str, n_gates: int, default_acts: list[str]) -> Callable:
  def op(X: Tensor, W: Tensor, R: Tensor, B: Tensor | None = None, sequence_lens: Tensor | None = None, initial_h: Tensor | None = None,
         initial_c: Tensor | None = None, P: Tensor | None = None, *, activation_alpha=None, activation_beta=None, activations=None,
         clip: float | None = None, direction: str = "forward", hidden_size: int | None = None, layout: int = 0,
         linear_before_reset: int = 0, input_forget: int = 0, n_outputs: int = 1):
    if input_forget: raise NotImplementedError("LSTM input_forget=1")
    if layout: X = X.transpose(0, 1)  # (batch, seq, in) -> (seq, batch, in)
    n_dir = 2 if direction == "bidirectional" else 1
    h = hidden_size or R.shape[-1]
    seq, batch = X.shape[0], X.shape[1]
    acts = _rnn_acts(activations or default_acts * n_dir, activation_alpha, activation_beta, len(default_acts), n_dir)
    if initial_h is not None and layout: initial_h = initial_h.transpose(0, 1)
    if initial_c is not None and layout: initial_c = initial_c.transpose(0, 1)
    lens = sequence_lens.cast(dtypes.int64).reshape(batch, 1) if sequence_lens is not None else None
    ys, hs, cs = [], [], []
    for d in range(n_dir):
      Wd, Rd = W[d], R[d]
      bias = (B[d][:n_gates * h] + B[d][n_gates * h:]) if B is not None else None
      Rb = B[d][n_gates * h:] if B is not None else None
      H = initial_h[d] if initial_h is not None else Tensor.zeros(batch, h, dtype=X.dtype, device=X.device)
      C = initial_c[d] if initial_c is not None else Tensor.zeros(batch, h, dtype=X.dtype, device=X.device)
      xw = X @ Wd.T  # (seq, batch, gates*h): the input side of every step at once
      steps = range(seq - 1, -1, -1) if (direction == "reverse" or d == 1) else range(seq)
      out = [None] * seq
      for t in steps:
        g = xw[t] + H @ Rd.T
        cl = (lambda v: v.clip(-clip, clip)) if clip else (lambda v: v)
        if kind == "RNN":
          Hn = acts[d][0](cl(g + bias if bias is not None else g))
          Cn = C
        elif kind == "GRU":
          wb = B[d][:3 * h] if B is not None else None
          xz, xr, xh = (xw[t][:, i * h:(i + 1) * h] for i in range(3))
          hz, hr = (H @ Rd[i * h:(i + 1) * h].T for i in range(2))
          bz = (wb[:h] + Rb[:h]) if B is not None else 0
          br = (wb[h:2 * h] + Rb[h:2 * h]) if B is not None else 0
          z, r = acts[d][0](cl(xz + hz + bz)), acts[d][0](cl(xr + hr + br))
          rbh, wbh = (Rb[2 * h:], wb[2 * h:]) if B is not None else (0, 0)
          hh = (r * (H @ Rd[2 * h:].T + rbh)) if linear_before_reset else ((r * H) @ Rd[2 * h:].T + rbh)
          Hn = (1 - z) * acts[d][1](cl(xh + hh + wbh)) + z * H
          Cn = C
        else:  # LSTM, gates i, o, f, c
          gb = g + bias if bias is not None else g
          gi, go, gf, gc = (gb[:, i * h:(i + 1) * h] for i in range(4))
          pi, po, pf = ((P[d][i * h:(i + 1) * h] for i in range(3)) if P is not None else (0, 0, 0))
          i_ = acts[d][0](cl(gi + pi * C))
          f_ = acts[d][0](cl(gf + pf * C))
          Cn = f_ * C + i_ * acts[d][1](cl(gc))
          o_ = acts[d][0](cl(go + po * Cn))
          Hn = o_ * acts[d][2](Cn)
        if lens is not None:  # past a sequence's end its state stays and its output is 0
          live = lens > t
          Hn, Cn = live.where(Hn, H), live.where(Cn, C)
          out[t] = live.where(Hn, 0).cast(X.dtype)
        else: out[t] = Hn
        H, C = Hn.cast(X.dtype), Cn.cast(X.dtype)
      ys.append(_stack(out, 0))  # (seq, batch, h)
      hs.append(H)
      cs.append(C)
    Y = _stack(ys, 1)  # (seq, dir, batch, h)
    Yh, Yc = _stack(hs, 0), _stack(cs, 0)
    if layout: Y, Yh, Yc = Y.permute(2, 0, 1, 3), Yh.transpose(0, 1), Yc.transpose(0, 1)
    return (Y, Yh, Yc)[:n_outputs]
  return op

# ***** transformer pieces: rotary embedding, SwiGLU, KV-cache writes *****

def _rotary(x: Tensor, cos_cache: Tensor, sin_cache: Tensor, position_ids: Tensor | None = None, *, interleaved: int = 0,
            num_heads: int | None = None, rotary_embedding_dim: int = 0) -> Tensor:
  shape = x.shape
  y = x.transpose(1, 2) if x.ndim == 4 else x.reshape(shape[0], shape[1], num_heads, shape[2] // num_heads)  # (B, S, H, D)
  d = rotary_embedding_dim or y.shape[3]
  rot, keep = y[..., :d], y[..., d:]
  if position_ids is not None: cos_cache, sin_cache = cos_cache[position_ids.cast(dtypes.int64)], sin_cache[position_ids.cast(dtypes.int64)]
  c, s_ = cos_cache.unsqueeze(-2), sin_cache.unsqueeze(-2)  # (B, S, 1, D/2)
  if interleaved: x1, x2 = rot[..., 0::2], rot[..., 1::2]
  else: x1, x2 = rot[..., :d // 2], rot[..., d // 2:]
  re, im = c * x1 - s_ * x2, s_ * x1 + c * x2
  r = re.unsqueeze(-1).cat(im.unsqueeze(-1), dim=-1).reshape(rot.shape) if interleaved else re.cat(im, dim=-1)
  out = r.cat(keep, dim=-1) if keep.shape[-1] else r
  return (out.transpose(1, 2) if x.ndim == 4 else out.reshape(shape)).cast(x.dtype)
def _swiglu(a: Tensor, b: Tensor, *, alpha: float = 1.0) -> Tensor: return (a * (a * alpha).sigmoid() * b).cast(a.dtype)
def _tensor_scatter(past: Tensor, update: Tensor, write_indices: Tensor | None = None, *, mode: str = "linear", axis: int = -2) -> Tensor:
  a = _axis(axis, past.ndim)
  L, S, B = past.shape[a], update.shape[a], past.shape[0]
  w = write_indices.cast(dtypes.int64).reshape(B, *(1,) * (past.ndim - 1)) if write_indices is not None else 0
  pos = Tensor.arange(L, dtype=dtypes.int64, device=past.device).reshape(*(L if i == a else 1 for i in range(past.ndim)))
  j = pos - w
  if mode == "circular": j = j % L
  ok = (j >= 0) & (j < S)
  idx = ok.where(j, 0).expand(*past.shape[:a], L, *past.shape[a + 1:])
  src = update.pad(tuple((0, L - S) if i == a else (0, 0) for i in range(past.ndim)))
  return ok.where(src.gather(a, idx), past)

def _unique(x: Tensor, *, axis: int | None = None, sorted: int = 1, n_outputs: int = 1) -> tuple:  # noqa: A002
  """The output's size depends on the values, so they are read and grouped on the host (numpy), as NonZero's are."""
  import numpy as np
  a = np.asarray(x.cast(dtypes.float32).numpy() if x.dtype == dtypes.bfloat16 else x.numpy())  # (numpy has no bfloat16)
  ax = None if axis is None else _axis(axis, a.ndim)
  y, idx, inv, cnt = np.unique(a if ax is not None else a.reshape(-1), return_index=True, return_inverse=True, return_counts=True, axis=ax)
  if not sorted:  # in order of first occurrence
    order = np.argsort(idx, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    y, idx, cnt, inv = np.take(y, order, axis=ax if ax is not None else 0), idx[order], cnt[order], rank[inv.reshape(-1)]
  outs = (_from_numpy(y, x.device).cast(x.dtype), *(Tensor(v.reshape(-1).astype(np.int64), device=x.device) for v in (idx, inv, cnt)))
  return outs[:n_outputs]
def _nms(boxes: Tensor, scores: Tensor, max_output_boxes_per_class: Tensor | None = None, iou_threshold: Tensor | None = None,
         score_threshold: Tensor | None = None, *, center_point_box: int = 0) -> Tensor:
  """Greedy non-maximum suppression per batch and class. Its output's size depends on the values, so (as Unique's)
  it runs on the host: the boxes and scores are read, the selected [batch, class, box] triples come back."""
  import numpy as np
  b, sc = boxes.cast(dtypes.float32).numpy().astype(np.float64), scores.cast(dtypes.float32).numpy()
  limit = max(int(_scalar(max_output_boxes_per_class, 0)), 0)
  iou_t, score_t = float(_scalar(iou_threshold, 0.0)), _scalar(score_threshold)
  if center_point_box: lo, hi = np.stack([b[..., 1] - b[..., 3] / 2, b[..., 0] - b[..., 2] / 2], -1), np.stack([b[..., 1] + b[..., 3] / 2, b[..., 0] + b[..., 2] / 2], -1)
  else: lo, hi = np.minimum(b[..., :2], b[..., 2:]), np.maximum(b[..., :2], b[..., 2:])  # (y, x) corners
  area = np.prod(hi - lo, -1)
  out = []
  for n in range(sc.shape[0]):
    for c in range(sc.shape[1]):
      s = sc[n, c]
      cand = [i for i in range(len(s)) if score_t is None or s[i] > score_t]
      cand.sort(key=lambda i: (-s[i], i))  # best first, the lower index among equals
      kept: list[int] = []
      for i in cand:
        if len(kept) >= limit: break
        inter = np.prod(np.clip(np.minimum(hi[n, i], hi[n, kept]) - np.maximum(lo[n, i], lo[n, kept]), 0, None), -1) if kept else np.zeros(0)
        union = area[n, i] + area[n, kept] - inter
        ok = (inter > 0) & (area[n, i] > 0) & (area[n, kept] > 0) & (union > 0)
        if not np.any(ok & (inter / np.where(union > 0, union, 1) > iou_t)): kept.append(i)
      out += [[n, c, i] for i in kept]
  return Tensor(np.array(out, np.int64).reshape(-1, 3), device=boxes.device)
def _det(x: Tensor) -> Tensor:
  """Laplace expansion along the first row: exact in the Tensor ops, fine for the small matrices ONNX models hold."""
  n = x.shape[-1]
  if n > 6: raise NotImplementedError(f"Det of {n}x{n} matrices (up to 6x6)")
  if n == 1: return x[..., 0, 0]
  if n == 2: return x[..., 0, 0] * x[..., 1, 1] - x[..., 0, 1] * x[..., 1, 0]
  out = None
  for j in range(n):
    minor = x[..., 1:, :].shrink(tuple(None for _ in range(x.ndim - 1)) + ((0, n),))
    cols = [c for c in range(n) if c != j]
    minor = minor[..., cols] if cols else minor
    term = x[..., 0, j] * _det(minor) * (1 if j % 2 == 0 else -1)
    out = term if out is None else out + term
  return out

# ***** Resize: each resized axis is an index gather (nearest) or a matmul with a fixed weight matrix (linear, cubic) *****

def _source_coords(n_in: int, n_out: int, scale: float, mode: str, roi: tuple[float, float]):
  import numpy as np
  x = np.arange(n_out, dtype=np.float64)
  if mode == "half_pixel": return (x + 0.5) / scale - 0.5
  if mode == "half_pixel_symmetric":
    adj = n_out / (scale * n_in)
    return n_in / 2 * (1 - adj) + (x + 0.5) / scale - 0.5
  if mode == "pytorch_half_pixel": return (x + 0.5) / scale - 0.5 if n_out > 1 else np.zeros_like(x)
  # the resized length here is n_in * scale unrounded, as the spec says (it differs from n_out when scales are given)
  if mode == "align_corners": return x * (n_in - 1) / (n_in * scale - 1) if n_out > 1 else np.zeros_like(x)
  if mode == "asymmetric": return x / scale
  if mode == "tf_crop_and_resize":
    s, e = roi
    return s * (n_in - 1) + x * (e - s) * (n_in - 1) / (n_out - 1) if n_out > 1 else np.full_like(x, 0.5 * (s + e) * (n_in - 1))
  raise NotImplementedError(f"Resize coordinate_transformation_mode {mode!r}")
_NEAREST = {"round_prefer_floor": lambda np, x: np.ceil(x - 0.5), "round_prefer_ceil": lambda np, x: np.floor(x + 0.5),
            "floor": lambda np, x: np.floor(x), "ceil": lambda np, x: np.ceil(x)}  # (numpy is passed in: imported lazily)
def _resize_axis(x: Tensor, a: int, n_out: int, scale: float, roi, mode: str, ctm: str, nearest_mode: str, cubic_a: float,
                 exclude_outside: int, extrapolation: float) -> Tensor:
  import numpy as np
  n_in = x.shape[a]
  if n_in == n_out and ctm != "tf_crop_and_resize" and scale == 1.0: return x
  src = _source_coords(n_in, n_out, scale, ctm, roi)
  outside = (src < 0) | (src > n_in - 1) if ctm == "tf_crop_and_resize" else np.zeros(n_out, bool)
  if mode == "nearest":
    if nearest_mode not in _NEAREST: raise NotImplementedError(f"Resize nearest_mode {nearest_mode!r}")
    idx = np.clip(_NEAREST[nearest_mode](np, src), 0, n_in - 1).astype(np.int64)
    if n_out % n_in == 0 and np.array_equal(idx, np.arange(n_out) // (n_out // n_in)):  # an integer upscale: expand, no gather
      f = n_out // n_in
      y = x.unsqueeze(a + 1).expand(*x.shape[:a + 1], f, *x.shape[a + 1:]).reshape(*x.shape[:a], n_out, *x.shape[a + 1:])
    else: y = x.index_select(a, Tensor(idx, device=x.device))
  else:
    w = np.zeros((n_in, n_out), np.float64)
    base = np.floor(src)
    r = src - base
    if mode == "linear": taps = [(0, 1 - r), (1, r)]
    elif mode == "cubic":
      A = cubic_a
      c = lambda t: np.where(t <= 1, ((A + 2) * t - (A + 3)) * t * t + 1, ((A * t - 5 * A) * t + 8 * A) * t - 4 * A)
      taps = [(-1, c(r + 1)), (0, c(r)), (1, c(1 - r)), (2, c(2 - r))]
    else: raise NotImplementedError(f"Resize mode {mode!r}")
    cols = np.arange(n_out)
    keep = np.zeros(n_out)
    for off, wt in taps:
      i = base.astype(np.int64) + off
      inside = (i >= 0) & (i <= n_in - 1)
      wt = np.where(inside, wt, 0.0) if exclude_outside else wt
      np.add.at(w, (np.clip(i, 0, n_in - 1), cols), wt)
      keep = keep + wt
    if exclude_outside: w = w / np.where(keep == 0, 1, keep)
    dt = x.dtype if dtypes.is_float(x.dtype) else dtypes.float32
    y = (x.cast(dt).transpose(a, -1) @ Tensor(w.astype(np.float32), device=x.device).cast(dt)).transpose(a, -1)
    if not dtypes.is_float(x.dtype): y = y.round().cast(x.dtype)
  if outside.any():
    m = Tensor(outside, device=x.device).reshape(*(n_out if i == a else 1 for i in range(x.ndim)))
    y = m.where(extrapolation, y).cast(y.dtype)
  return y
def _resize(x: Tensor, roi=None, scales=None, sizes=None, *, mode: str = "nearest", coordinate_transformation_mode: str = "half_pixel",
            nearest_mode: str = "round_prefer_floor", cubic_coeff_a: float = -0.75, exclude_outside: int = 0,
            extrapolation_value: float = 0.0, antialias: int = 0, axes=None, keep_aspect_ratio_policy: str = "stretch",
            opset: int) -> Tensor:
  if opset == 10: roi, scales, coordinate_transformation_mode, nearest_mode = None, roi, "asymmetric", "floor"  # Resize-10: (X, scales)
  if antialias: raise NotImplementedError("Resize with antialias=1")
  ax = [_axis(a, x.ndim) for a in axes] if axes else list(range(x.ndim))
  sc = _floats(scales) if scales is not None and scales.numel() else None
  sz = _ints(sizes) if sizes is not None and sizes.numel() else None
  r = _floats(roi) if roi is not None and roi.numel() else None
  rois = [(r[i], r[i + len(ax)]) for i in range(len(ax))] if r else [(0.0, 1.0)] * len(ax)
  if sz is not None:
    if keep_aspect_ratio_policy != "stretch":
      pick = min if keep_aspect_ratio_policy == "not_larger" else max
      s = pick(o / x.shape[a] for o, a in zip(sz, ax))
      sc, sz = [s] * len(ax), [int(math.floor(s * x.shape[a] + 0.5)) for a in ax]
    else: sc = [o / x.shape[a] for o, a in zip(sz, ax)]
  elif sc is not None:
    sz = [int(math.floor(x.shape[a] * s * ((e - b) if coordinate_transformation_mode == "tf_crop_and_resize" else 1)))
          for a, s, (b, e) in zip(ax, sc, rois)]
  else: raise ValueError("Resize needs scales or sizes")
  for a, n, s, rr in zip(ax, sz, sc, rois):
    x = _resize_axis(x, a, n, s, rr, mode, coordinate_transformation_mode, nearest_mode, cubic_coeff_a, exclude_outside, extrapolation_value)
  return x
def _upsample(x: Tensor, scales=None, *, mode: str = "nearest", opset: int) -> Tensor:
  sc = _floats(scales) if isinstance(scales, Tensor) else [float(v) for v in scales]
  sz = [int(math.floor(n * s)) for n, s in zip(x.shape, sc)]
  mode = {"bilinear": "linear"}.get(mode, mode)
  for a, (n, s) in enumerate(zip(sz, sc)): x = _resize_axis(x, a, n, s, (0.0, 1.0), mode, "asymmetric", "floor", -0.75, 0, 0.0)
  return x

def _dft(x: Tensor, dft_length: Tensor | None = None, axis_input: Tensor | None = None, *, axis: int = 1, inverse: int = 0,
         onesided: int = 0, opset: int) -> Tensor:
  """A DFT along one axis as two matmuls with cos/sin tables (the last dim holds real, or real and imaginary)."""
  import numpy as np
  a = (int(_scalar(axis_input)) if axis_input is not None else -2 if opset >= 20 else axis) % x.ndim
  if a == x.ndim - 1: raise ValueError(f"DFT axis {a} is the real/imaginary dim")
  bins = x.shape[a]
  n = int(_scalar(dft_length)) if dft_length is not None else 2 * (bins - 1) if inverse and onesided else bins
  re, im = x[..., 0], (x[..., 1] if x.shape[-1] == 2 else None)
  re, im = (t.transpose(a, -1) if t is not None else None for t in (re, im))  # the signal axis last
  k_in = min(bins, n) if not (inverse and onesided) else bins
  re, im = (t[..., :k_in] if t is not None else None for t in (re, im))
  if k_in < n and not (inverse and onesided): re, im = (t.pad(((0, 0),) * (t.ndim - 1) + ((0, n - k_in),)) if t is not None else None for t in (re, im))
  rows = k_in if inverse and onesided else n
  cols = n if inverse or not onesided else n // 2 + 1
  ang = 2 * np.pi * ((np.arange(rows)[:, None] * np.arange(cols)[None]) % n) / n  # (reduced mod n: exact tables)
  c, sn = np.cos(ang), np.sin(ang) * (1 if inverse else -1)
  if inverse and onesided:  # the missing half of a Hermitian spectrum: every bin but DC and Nyquist counts twice
    w = np.where((np.arange(rows) == 0) | (2 * np.arange(rows) == n), 1.0, 2.0)[:, None]
    c, sn = c * w, sn * w
  if inverse: c, sn = c / n, sn / n
  C, S = (Tensor(m.astype(np.float32), device=x.device).cast(x.dtype) for m in (c, sn))
  out_re = re @ C - (im @ S if im is not None else 0)
  if inverse and onesided: return out_re.unsqueeze(-1).transpose(a, -2).cast(x.dtype)
  out_im = re @ S + (im @ C if im is not None else 0)
  return out_re.stack(out_im, dim=-1).transpose(a, -2).cast(x.dtype)

def _max_unpool(x: Tensor, indices: Tensor, output_shape: Tensor | None = None, *, kernel_shape: list[int], pads=None,
                strides=None) -> Tensor:
  """Each value written at its flat index (as MaxPool's Indices output gives them) in a tensor of zeros."""
  r = x.ndim - 2
  pads, strides = pads or [0] * 2 * r, strides or [1] * r
  shape = [*x.shape[:2], *((x.shape[2 + i] - 1) * strides[i] + kernel_shape[i] - pads[i] - pads[r + i] for i in range(r))]
  flat = Tensor.zeros(_prod(shape), dtype=x.dtype, device=x.device)
  out = flat.scatter(0, indices.reshape(-1).cast(dtypes.int64), x.reshape(-1)).reshape(*shape)
  if output_shape is None: return out
  want = _ints(output_shape)  # the indices keep counting in the default shape; a bigger output pads it at the end
  if len(want) != len(shape) or any(w < d for w, d in zip(want, shape)): raise ValueError(f"output_shape {want} is smaller than {shape}")
  return out.pad(tuple((0, w - d) for w, d in zip(want, shape)))
def _col2im(x: Tensor, image_shape: Tensor, block_shape: Tensor, *, dilations=None, pads=None, strides=None) -> Tensor:
  """The inverse of an unfold: every column's block added back into the image at its place (overlaps sum)."""
  img, blk = _ints(image_shape), _ints(block_shape)
  r = len(img)
  dil, pads, strides = dilations or [1] * r, pads or [0] * 2 * r, strides or [1] * r
  padded = [img[i] + pads[i] + pads[r + i] for i in range(r)]
  n_pos = [(padded[i] - dil[i] * (blk[i] - 1) - 1) // strides[i] + 1 for i in range(r)]
  N, C = x.shape[0], x.shape[1] // _prod(blk)
  cols = x.reshape(N, C, *blk, *n_pos)
  out: Tensor | None = None
  for offs in itertools.product(*(range(b) for b in blk)):
    part = cols[(slice(None), slice(None), *offs)]  # (N, C, *n_pos): this block offset at every position
    for i in range(r):  # positions spread out by the stride, then shifted to the offset within the padded image
      ax, s = 2 + i, strides[i]
      if s > 1:
        part = part.unsqueeze(ax + 1).pad(tuple((0, s - 1) if a == ax + 1 else None for a in range(part.ndim + 1)))
        part = part.reshape(*part.shape[:ax], n_pos[i] * s, *part.shape[ax + 2:])
        part = part.shrink(tuple((0, (n_pos[i] - 1) * s + 1) if a == ax else None for a in range(part.ndim)))
      lo = offs[i] * dil[i]
      part = part.pad(tuple((lo, padded[i] - lo - part.shape[ax]) if a == ax else None for a in range(part.ndim)))
    out = part if out is None else out + part
  assert out is not None
  return out.shrink(tuple(None if a < 2 else (pads[a - 2], pads[a - 2] + img[a - 2]) for a in range(out.ndim)))
def _reflect(v: Tensor, lo: float, hi: float) -> Tensor:
  """Fold coordinates outside [lo, hi] back in, bouncing off the borders as often as needed."""
  rng = hi - lo
  def fold(d: Tensor, near: float, far: float) -> Tensor:
    n = (d / rng).trunc()
    r = d - n * rng
    return (n.mod(2) == 0).where(near + r * (1 if near == lo else -1), far + r * (1 if far == lo else -1))
  return (v < lo).where(fold(lo - v, lo, hi), (v > hi).where(fold(v - hi, hi, lo), v))
def _cubic_coeffs(f: Tensor, a: float = -0.75) -> list[Tensor]:
  return [((a * (f + 1) - 5 * a) * (f + 1) + 8 * a) * (f + 1) - 4 * a, ((a + 2) * f - (a + 3)) * f * f + 1,
          ((a + 2) * (1 - f) - (a + 3)) * (1 - f) * (1 - f) + 1, ((a * (2 - f) - 5 * a) * (2 - f) + 8 * a) * (2 - f) - 4 * a]
def _grid_sample(X: Tensor, grid: Tensor, *, align_corners: int = 0, mode: str = "linear", padding_mode: str = "zeros") -> Tensor:
  mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
  if mode not in ("nearest", "linear", "cubic") or padding_mode not in ("zeros", "border", "reflection"):
    raise NotImplementedError(f"GridSample with mode={mode!r}, padding_mode={padding_mode!r}")
  N, C, dims, out = X.shape[0], X.shape[1], X.shape[2:], grid.shape[1:-1]
  L = _prod(out)
  g = grid.cast(dtypes.float32).reshape(N, L, len(dims))
  per_dim = []  # for each spatial dim: a list of taps (index as float, weight)
  for k, d in enumerate(dims):
    v = g[:, :, len(dims) - 1 - k]  # the grid's last dim lists x (the last spatial dim) first
    v = (v + 1) / 2 * (d - 1) if align_corners else ((v + 1) * d - 1) / 2
    lo, hi = (0.0, d - 1.0) if align_corners else (-0.5, d - 0.5)
    if mode == "nearest": v = v.round()
    if padding_mode == "border": v = ((v < lo) | (v > hi)).where(v.clip(0, d - 1), v)
    elif padding_mode == "reflection": v = _reflect(v, lo, hi)
    if mode == "nearest": taps = [(v, None)]
    else:
      x0 = v.floor()
      f = v - x0
      taps = [(x0, 1 - f), (x0 + 1, f)] if mode == "linear" else [(x0 + o, w) for o, w in zip((-1, 0, 1, 2), _cubic_coeffs(f))]
    fixed = []
    for i, w in taps:  # an index outside the image: zero, the nearest border pixel, or its mirror image
      if padding_mode == "zeros": ok, i = (i >= 0) & (i < d), i.clip(0, d - 1)
      elif padding_mode == "border": ok, i = None, i.clip(0, d - 1)
      else: ok, i = None, _reflect(i, lo, hi).trunc().clip(0, d - 1)
      wt = w if ok is None else ok.where(w if w is not None else 1.0, 0.0)
      fixed.append((i.cast(dtypes.int32), wt))
    per_dim.append(fixed)
  flat = X.reshape(N, C, -1)
  strides = [_prod(dims[k + 1:]) for k in range(len(dims))]
  out_t: Tensor | None = None
  for combo in itertools.product(*per_dim):
    idx = sum((i * st for (i, _), st in zip(combo, strides)), Tensor.zeros(N, L, dtype=dtypes.int32, device=X.device))
    wts = [w for _, w in combo if w is not None]
    val = flat.gather(2, idx.reshape(N, 1, L).expand(N, C, L)).cast(dtypes.float32)
    if wts: val = val * math.prod(wts[1:], start=wts[0]).reshape(N, 1, L)
    out_t = val if out_t is None else out_t + val
  assert out_t is not None
  return out_t.reshape(N, C, *out).cast(X.dtype)

# ***** ai.onnx.preview.training: one optimizer step over n tensors (inputs R, T, then n of each state kind) *****

def _optimizer(n_states: int, step: Callable) -> Callable:
  def op(R: Tensor, T: Tensor, *xs: Tensor, **attrs: Any) -> tuple:
    n = len(xs) // (2 + n_states)
    if n * (2 + n_states) != len(xs): raise ValueError(f"{len(xs)} tensors don't split into X, G and {n_states} state(s)")
    r, t = float(_scalar(R)), int(_scalar(T))
    outs = [step(r, t, *(xs[k * n + i] for k in range(2 + n_states)), **attrs) for i in range(n)]
    return tuple(o[j].cast(xs[j * n].dtype) for j in range(1 + n_states) for o in outs)
  return op
def _adagrad_step(r: float, t: int, x: Tensor, g: Tensor, h: Tensor, *, decay_factor: float = 0.0, epsilon: float = 1e-6,
                  norm_coefficient: float = 0.0) -> tuple[Tensor, Tensor]:
  g = x * norm_coefficient + g
  h = h + g * g
  return x - g / (h.sqrt() + epsilon) * (r / (1 + t * decay_factor)), h
def _momentum_step(r: float, t: int, x: Tensor, g: Tensor, v: Tensor, *, alpha: float, beta: float, mode: str,
                   norm_coefficient: float) -> tuple[Tensor, Tensor]:
  g = x * norm_coefficient + g
  v = v * alpha + g * (beta if t > 0 else 1.0)
  return x - (v if mode == "standard" else g + v * alpha) * r, v
def _adam_step(r: float, t: int, x: Tensor, g: Tensor, v: Tensor, h: Tensor, *, alpha: float = 0.9, beta: float = 0.999,
               epsilon: float = 1e-6, norm_coefficient: float = 0.0, norm_coefficient_post: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
  g = x * norm_coefficient + g
  v, h = v * alpha + g * (1 - alpha), h * beta + g * g * (1 - beta)
  ra = r * math.sqrt(1 - beta ** t) / (1 - alpha ** t) if t > 0 else r
  return (x - v / (h.sqrt() + epsilon) * ra) * (1 - norm_coefficient_post), v, h

def _with_attrs(fn: Callable, step: Callable) -> Callable:
  """fn(*inputs, **attrs) that declares step's attributes, so loading checks them as for any op."""
  ps = [p for p in inspect.signature(step).parameters.values() if p.kind == p.KEYWORD_ONLY]
  fn.__signature__ = inspect.Signature([inspect.Parameter("inputs", inspect.Parameter.VAR_POSITIONAL), *ps])  # type: ignore[attr-defined]
  return fn

# ops of other domains than the default one, by (domain, op_type)
DOMAIN_OPS: dict[tuple[str, str], Callable] = {
  ("ai.onnx.preview.training", "Adagrad"): _with_attrs(_optimizer(1, _adagrad_step), _adagrad_step),
  ("ai.onnx.preview.training", "Momentum"): _with_attrs(_optimizer(1, _momentum_step), _momentum_step),
  ("ai.onnx.preview.training", "Adam"): _with_attrs(_optimizer(2, _adam_step), _adam_step),
}

# ***** the table: op_type -> function(*inputs, **attributes) *****

OPS: dict[str, Callable] = {
  **UNARY, **BINARY, **{k: _reduction(v) for k, v in REDUCE.items()},
  "Identity": _identity, "HardSigmoid": _hardsigmoid, "Shrink": _shrink, "Clip": _clip, "Mod": _mod, "BitShift": _bitshift,
  "IsInf": _isinf, "Gelu": _gelu, "Elu": _elu, "Selu": _selu, "Celu": _celu, "LeakyRelu": _leaky, "ThresholdedRelu": _thresholded,
  "PRelu": _prelu, "Where": _where, "Swish": _swish,
  "Max": _variadic(Tensor.maximum), "Min": _variadic(Tensor.minimum), "Sum": _variadic(Tensor.add), "Mean": _mean,
  "ArgMax": _argext(True), "ArgMin": _argext(False),
  "Reshape": _reshape, "Shape": _shape, "Size": _size, "Transpose": _transpose, "Flatten": _flatten, "Squeeze": _squeeze,
  "Unsqueeze": _unsqueeze, "Concat": _concat, "Split": _split, "Slice": _slice, "Expand": _expand, "Tile": _tile,
  "Gather": _gather, "GatherElements": _gather_elements, "GatherND": _gather_nd, "ScatterElements": _scatter_elements,
  "Scatter": _scatter_elements, "Pad": _pad, "ConstantOfShape": _constant_of_shape, "Constant": _constant, "Cast": _cast,
  "CastLike": _castlike, "Range": _range, "Trilu": _trilu, "OneHot": _onehot, "EyeLike": _eyelike, "DepthToSpace": _depth_to_space,
  "SpaceToDepth": _space_to_depth, "CumSum": _cumsum, "TopK": _topk, "NonZero": _nonzero, "Dropout": _dropout, "Einsum": _einsum,
  "MatMul": Tensor.matmul, "Gemm": _gemm, "Softmax": _softmax_like(Tensor.softmax), "LogSoftmax": _softmax_like(Tensor.log_softmax),
  "Hardmax": _softmax_like(_hardmax), "Conv": _conv, "ConvTranspose": _conv_transpose, "MaxPool": _maxpool, "AveragePool": _avgpool,
  "LpPool": _lppool, "GlobalAveragePool": _global("mean"), "GlobalMaxPool": _global("max"), "GlobalLpPool": _global_lp,
  "BatchNormalization": _batchnorm, "InstanceNormalization": _instancenorm, "LayerNormalization": _layernorm,
  "GroupNormalization": _groupnorm, "LRN": _lrn, "MeanVarianceNormalization": _mvn, "LpNormalization": _lpnorm,
  "Resize": _resize, "Upsample": _upsample,
  "NegativeLogLikelihoodLoss": _nll, "SoftmaxCrossEntropyLoss": _softmax_ce, "RMSNormalization": _rmsnorm, "CumProd": _cumprod,
  "HannWindow": _window((0.5, 0.5)), "HammingWindow": _window((25 / 46, 21 / 46)), "BlackmanWindow": _window((0.42, 0.5, 0.08)),
  "BitCast": _bitcast, "CenterCropPad": _center_crop_pad, "ScatterND": _scatter_nd, "Compress": _compress,
  "ReverseSequence": _reverse_sequence, "QuantizeLinear": _quantize, "DequantizeLinear": _dequantize,
  "DynamicQuantizeLinear": _dynamic_quantize, "MatMulInteger": _matmul_integer, "ConvInteger": _conv_integer,
  "QLinearMatMul": _qlinear_matmul, "QLinearConv": _qlinear_conv, "Attention": _attention,
  "RNN": _recurrent("RNN", 1, ["Tanh"]), "GRU": _recurrent("GRU", 3, ["Sigmoid", "Tanh"]),
  "LSTM": _recurrent("LSTM", 4, ["Sigmoid", "Tanh", "Tanh"]),
  "RotaryEmbedding": _rotary, "SwiGLU": _swiglu, "TensorScatter": _tensor_scatter, "Unique": _unique, "Det": _det, "DFT": _dft, "GridSample": _grid_sample,
  "MaxUnpool": _max_unpool, "Col2Im": _col2im, "NonMaxSuppression": _nms,
}
# ops whose result is not a function of their inputs' values: never folded into the per-shape constants
# (and control flow: a body may read any value around it, not only the node's inputs)
_NOT_FOLDABLE = {"Dropout", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial", "If", "Loop",
                 "Scan", "SequenceMap"}
# ops whose result depends only on their inputs' shapes
_SHAPE_ONLY = {"Shape", "Size"}

# ***** loading *****

@dataclass
class _Node:
  op: str
  name: str
  inputs: list[str]
  outputs: list[str]
  attrs: dict[str, Any]
  fn: Callable
  opset: int
  wants_scope: bool = False  # control flow: the function gets the values visible at the node (its subgraphs read them)
  def where(self) -> str: return f"node {self.name!r} ({self.op}, opset {self.opset})"

def _attr_value(a: Any) -> Any:
  v = _onnx().helper.get_attribute_value(a)
  if isinstance(v, bytes): return v.decode()
  if isinstance(v, list) and v and isinstance(v[0], bytes): return [s.decode() for s in v]
  return v

def _params(fn: Callable) -> tuple[set[str], bool, int | None]:
  """The keyword names a function takes, whether it takes **kw, and how many inputs (None: any number)."""
  try: sig = inspect.signature(fn)
  except (TypeError, ValueError): return set(), False, None
  ps = list(sig.parameters.values())
  kw = {p.name for p in ps if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
  npos = None if any(p.kind == p.VAR_POSITIONAL for p in ps) else sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in ps)
  return kw, any(p.kind == p.VAR_KEYWORD for p in ps), npos

def _compile_node(n: Any, opsets: dict[str, int], subgraph: Callable[[Any], Any] | None = None) -> _Node:
  onnx = _onnx()
  domain = "" if n.domain in ("", "ai.onnx") else n.domain
  name = n.name or (n.output[0] if n.output else "?")
  version = opsets.get(domain)
  if version is None: raise NotImplementedError(f"node {name!r} ({n.op_type}) uses domain {domain!r}, which the model doesn't import")
  try: schema = onnx.defs.get_schema(n.op_type, version, domain)
  except Exception: schema = None
  opset = schema.since_version if schema is not None else version
  where = f"node {name!r} ({n.op_type}, opset {version})"
  if (domain, n.op_type) in DOMAIN_OPS: fn = DOMAIN_OPS[(domain, n.op_type)]
  elif domain != "" or n.op_type not in OPS:
    if schema is not None and (schema.has_function or schema.has_context_dependent_function) and subgraph is not None:
      fn = _FunctionOp(n, schema, version, opsets, subgraph)
      return _Node(n.op_type, name, [i for i in n.input], list(n.output), {}, fn, opset)
    raise NotImplementedError(f"unsupported op {n.op_type!r} in {where}")
  else: fn = OPS[n.op_type]
  takes, any_kw, npos = _params(fn)
  attrs: dict[str, Any] = {}
  if schema is not None:  # the spec's defaults, for the attributes this function honours
    for an, a in schema.attributes.items():
      if an in takes and a.default_value is not None and a.default_value.name: attrs[an] = _attr_value(a.default_value)
  for a in n.attribute:
    if a.name not in takes and not any_kw: raise NotImplementedError(f"attribute {a.name!r} of {where} is not supported")
    if a.type in (a.GRAPH, a.GRAPHS):
      if subgraph is None: raise NotImplementedError(f"subgraph attribute {a.name!r} of {where} is not supported")
      attrs[a.name] = subgraph(a.g) if a.type == a.GRAPH else [subgraph(x) for x in a.graphs]
    else: attrs[a.name] = _attr_value(a)
  if "opset" in takes: attrs["opset"] = opset
  if "n_outputs" in takes: attrs["n_outputs"] = len(n.output)
  inputs = list(n.input)
  while inputs and inputs[-1] == "": inputs.pop()
  if npos is not None and len(inputs) > npos: raise NotImplementedError(f"{where} has {len(inputs)} inputs; only {npos} are supported")
  return _Node(n.op_type, name, inputs, list(n.output), attrs, fn, opset, "scope" in takes)

# ops that take values of the narrow types (carried decoded, see NARROW); those in _KEEPS_NARROW move them unchanged
_KEEPS_NARROW = {"Identity", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze"}
_TAKES_NARROW = {"Cast", "CastLike", "QuantizeLinear", "DequantizeLinear", "Shape", "Size", *_KEEPS_NARROW}

class _FunctionOp:
  """An op without a function in OPS whose ONNX schema defines it as a function of other ops: run as that body.
  A context-dependent body (built for the node's input types) is built on the first run of each input signature."""
  def __init__(self, n: Any, schema: Any, version: int, opsets: dict[str, int], subgraph: Callable[[Any], Any]):
    self.n, self.schema, self.opsets, self.subgraph = n, schema, opsets, subgraph
    self.fixed = schema.has_function
    pick = lambda vs: max([v for v in vs if v <= version] or vs)
    self.version = pick(schema.function_opset_versions if self.fixed else schema.context_dependent_function_opset_versions)
    self.bodies: dict[tuple, Any] = {}
    if self.fixed: self.bodies[()] = self._graph(schema.get_function_with_opset_version(self.version))

  def _graph(self, raw: bytes) -> Any:
    onnx = _onnx()
    f = onnx.FunctionProto()
    f.ParseFromString(raw)
    given = {a.name: a for a in self.n.attribute}
    for an, a in self.schema.attributes.items():
      if an not in given and a.default_value is not None and a.default_value.name: given[an] = a.default_value
    nodes = []
    for fn_node in f.node:  # attributes that refer to the caller's (ref_attr_name) take its value, or the schema default
      m = onnx.NodeProto()
      m.CopyFrom(fn_node)
      del m.attribute[:]
      for a in fn_node.attribute:
        if not a.ref_attr_name: m.attribute.append(a)
        elif a.ref_attr_name in given:
          b = onnx.AttributeProto()
          b.CopyFrom(given[a.ref_attr_name])
          b.name = a.name
          m.attribute.append(b)
      nodes.append(m)
    opsets = {**self.opsets, **{("" if o.domain in ("", "ai.onnx") else o.domain): o.version for o in f.opset_import}}
    g = onnx.helper.make_graph(nodes, f.name, [onnx.helper.make_empty_tensor_value_info(i) for i in f.input],
                               [onnx.helper.make_empty_tensor_value_info(o) for o in f.output])
    return _Graph(g, opsets, "", set(), None)

  def __call__(self, *args: Any) -> tuple:
    key = () if self.fixed else tuple(None if a is None else (a.dtype, a.shape, narrow_type(a)) for a in args)
    if key not in self.bodies:
      onnx, rev = _onnx(), {v: k for k, v in ONNX_DTYPES.items()}
      types = [onnx.TypeProto() if a is None else
               onnx.helper.make_tensor_type_proto(narrow_type(a) or rev[a.dtype], list(a.shape)) for a in args]
      self.bodies[key] = self._graph(self.schema.get_context_dependent_function_with_opset_version(
        self.version, self.n.SerializeToString(), [t.SerializeToString() for t in types]))
    body = self.bodies[key]
    return tuple(body.run({}, list(args) + [None] * (len(body.input_names) - len(args))))

def _exec(node: _Node, args: list, scope: dict | None) -> tuple:
  """One node: its function on its inputs, errors naming the node. A tuple is several outputs; a list is one sequence."""
  tys = [t for t in (narrow_type(a) for a in args if isinstance(a, Tensor)) if t is not None]
  if tys and node.op not in _TAKES_NARROW:
    raise NotImplementedError(f"{node.where()}: {node.op} of {NARROW[tys[0]].name} values (attograd has no such dtype; only "
                              f"{', '.join(sorted(_TAKES_NARROW))} take them)")
  try: out = node.fn(*args, **node.attrs, scope=scope) if node.wants_scope else node.fn(*args, **node.attrs)
  except NotImplementedError as e: raise NotImplementedError(f"{node.where()}: {e}") from e
  except (ValueError, TypeError, IndexError, KeyError) as e: raise type(e)(f"{node.where()}: {e}") from e
  outs = out if isinstance(out, tuple) else (out,)
  if tys and node.op in _KEEPS_NARROW: outs = (_tag(outs[0], tys[0]), *outs[1:])
  if len(outs) < len([o for o in node.outputs if o]): raise NotImplementedError(f"{node.where()}: only {len(outs)} outputs are computed")
  return outs

class _Graph:
  """A graph's nodes compiled once: the model's own, or an If/Loop/Scan body that also reads the names around it."""
  def __init__(self, g: Any, opsets: dict[str, int], base_dir: str, outer: set[str], device: str | None):
    self.base_dir, self.device = base_dir, (None if device is None else Device.canonicalize(device))
    self.inits = {t.name: t for t in g.initializer}
    self.weights: dict[str, Tensor] = {}
    self.derived: dict[str, Callable[[], Tensor]] = {}  # weights computed from initializers at load (see _fuse_conv_bn)
    self.input_names = [i.name for i in g.input]
    self.outputs = [o.name for o in g.output]
    known = set(outer) | set(self.inits) | set(self.input_names)
    self.nodes: list[_Node] = []
    for n in g.node:
      # every name a node reads must exist before it: catches broken graphs at load time, not mid-run
      node = _compile_node(n, opsets, lambda sg, k=frozenset(known): _Graph(sg, opsets, base_dir, k, device))
      for i in node.inputs:
        if i and i not in known: raise ValueError(f"{node.where()} reads {i!r}, which no earlier node, input or initializer makes")
      known.update(o for o in node.outputs if o)
      self.nodes.append(node)
    for o in self.outputs:
      if o not in known: raise ValueError(f"graph output {o!r} is made by no node, input or initializer")

  def placed(self, t: Any) -> Any:
    """t on the graph's device: an op with no tensor inputs (Constant, RandomNormal) makes its value on the default one."""
    return t if self.device is None or not isinstance(t, Tensor) or t.device == self.device else t.to(self.device)

  def weight(self, name: str) -> Tensor:
    if name in self.derived and name not in self.weights:
      t = self.placed(self.derived[name]()).realize()
      if isinstance(t.numel(), int) and t.numel() <= _HOST_MAX and t.dtype != dtypes.bfloat16: _remember(t, _flat(t))
      self.weights[name] = _as_const(t)
    if name not in self.weights:  # initializers are converted on first use (external data read then)
      arr = _onnx().numpy_helper.to_array(self.inits[name], base_dir=self.base_dir)
      t = _from_numpy(arr, self.device).realize()
      if arr.size <= _HOST_MAX and arr.dtype.kind in "biuf" and arr.dtype.name != "bfloat16": _remember(t, arr.reshape(-1).tolist())
      self.weights[name] = _as_const(t)
    return self.weights[name]
  def value(self, name: str, env: dict) -> Any: return env[name] if name in env else self.weight(name)

  def run(self, scope: dict, inputs: Sequence[Any] = ()) -> list:
    """A body's outputs, given the values around it and its own inputs (in order)."""
    env = {"": None, **scope, **dict(zip(self.input_names, inputs))}
    for node in self.nodes:
      for o, t in zip(node.outputs, _exec(node, [self.value(i, env) for i in node.inputs], env)):
        if o: env[o] = self.placed(t)
    return [self.value(o, env) for o in self.outputs]

def _fuse_conv_bn(graph: _Graph) -> None:
  """Conv followed by an inference BatchNormalization, all of whose parameters are initializers: the normalization's
  per-channel scale and shift go into the conv's weight and bias, computed once on first use, so a run doesn't
  reload four parameter vectors and take a square root for every output element. (Names read by a control-flow body
  aren't node inputs, so a graph with control flow is left alone.)"""
  if any(n.wants_scope for n in graph.nodes): return
  for n in graph.nodes:  # exporters often store weights as Constant nodes: those become weights made on first use
    if n.op == "Constant" and not n.inputs and len(n.outputs) == 1 and n.outputs[0] not in graph.outputs:
      graph.derived[n.outputs[0]] = lambda n=n: _exec(n, [], None)[0]
  graph.nodes = [n for n in graph.nodes if not (n.op == "Constant" and n.outputs[0] in graph.derived)]
  readers: dict[str, int] = {}
  for n in graph.nodes:
    for i in n.inputs: readers[i] = readers.get(i, 0) + 1
  fixed = (set(graph.inits) | set(graph.derived)) - set(graph.input_names)  # (an initializer that is also an input can be fed)
  by_input = {n.inputs[0]: n for n in graph.nodes if n.op == "BatchNormalization" and n.inputs}
  out, dropped = [], set()
  for n in graph.nodes:
    if id(n) in dropped: continue
    bn = by_input.get(n.outputs[0]) if n.op == "Conv" and len(n.outputs) == 1 else None
    if bn is None or readers.get(n.outputs[0]) != 1 or n.outputs[0] in graph.outputs or bn.attrs.get("training_mode") or \
       len([o for o in bn.outputs if o]) != 1 or len(bn.inputs) != 5 or not set(bn.inputs[1:]) <= fixed or not set(n.inputs[1:]) <= fixed:
      out.append(n)
      continue
    w_name, b_name = f"{n.inputs[1]}@bn:{bn.outputs[0]}", f"{n.inputs[2] if len(n.inputs) > 2 else ''}@bn:{bn.outputs[0]}"
    def scale_shift(bn: _Node = bn) -> tuple[Tensor, Tensor]:
      scale, b, mean, var = (graph.weight(i).cast(dtypes.float32) for i in bn.inputs[1:])
      k = scale * (var + bn.attrs.get("epsilon", 1e-5)).rsqrt()
      return k, b - mean * k
    def weight(n: _Node = n, ss: Callable = scale_shift) -> Tensor:
      w = graph.weight(n.inputs[1])
      return (w.cast(dtypes.float32) * ss()[0].reshape(-1, *(1,) * (w.ndim - 1))).cast(w.dtype)
    def bias(n: _Node = n, ss: Callable = scale_shift) -> Tensor:
      w, (k, t) = graph.weight(n.inputs[1]), ss()
      return ((graph.weight(n.inputs[2]).cast(dtypes.float32) * k if len(n.inputs) > 2 else 0) + t).cast(w.dtype)
    graph.derived[w_name], graph.derived[b_name] = weight, bias
    out.append(_Node(n.op, n.name, [n.inputs[0], w_name, b_name], list(bn.outputs), n.attrs, n.fn, n.opset))
    dropped.add(id(bn))
  graph.nodes = out

# a MatMul's constant right operand (k x n) of at least this many elements is also kept as column panels of PANEL_WIDTH,
# each panel's k rows one after the other, made once on first use: read in place, a kernel's column panel is k rows
# a whole matrix row apart (PP-OCR rec's 120 x 6625 head: 120 cache lines 26 KB apart per panel, re-read from memory
# every run); packed it is one run of memory. One core, the head's kernel with the same Opts: 2.9 -> 1.2 ms. (The
# kernel's own PACK copies panels per run, and only where many rows of the other operand pay for that copy: 40 don't.)
PANELS_MIN = 1 << 18
PANEL_WIDTH = 16  # columns: a SIMD loop of AVX-512 floats, or two of AVX2's

def _panels(b: Tensor) -> Tensor:
  """b (k x n) as (n / PANEL_WIDTH) panels of k x PANEL_WIDTH, the last padded with zeros; b itself where it is small."""
  if b.ndim != 2 or not all(isinstance(v, int) for v in b.shape) or _prod(b.shape) < PANELS_MIN or b.shape[1] < 2 * PANEL_WIDTH: return b
  (k, n), p = b.shape, PANEL_WIDTH
  return b.pad(((0, 0), (0, -n % p))).reshape(k, -(-n // p), p).permute(1, 0, 2).contiguous()

def _matmul_panels(a: Tensor, b: Tensor, panels: Tensor) -> Tensor:
  """MatMul with the right operand read from its panels (_panels), where it has them."""
  if panels is b or panels.ndim != 3: return a @ b
  k, n = b.shape
  return (a @ panels.permute(1, 0, 2).reshape(k, panels.shape[0] * PANEL_WIDTH)).shrink(tuple([None] * (a.ndim - 1) + [(0, n)]))

def _pack_matmul_weights(graph: _Graph) -> None:
  """Each MatMul whose right operand is a weight (an initializer, or one made at load) reads it from its panels."""
  fixed = (set(graph.inits) | set(graph.derived)) - set(graph.input_names)
  out = []
  for n in graph.nodes:
    if n.op != "MatMul" or len(n.inputs) != 2 or n.inputs[1] not in fixed:
      out.append(n)
      continue
    name = f"{n.inputs[1]}@panels"
    graph.derived[name] = lambda w=n.inputs[1]: _panels(graph.weight(w))
    out.append(_Node(n.op, n.name, [*n.inputs, name], n.outputs, n.attrs, _matmul_panels, n.opset))
  graph.nodes = out

# ***** control flow, sequences, optionals *****

def _if(cond: Tensor, *, then_branch: _Graph, else_branch: _Graph, scope: dict) -> tuple:
  return tuple((then_branch if _scalar(cond) else else_branch).run(scope))
def _stack(parts: list[Tensor], axis: int = 0) -> Tensor:
  return parts[0].unsqueeze(axis).cat(*(p.unsqueeze(axis) for p in parts[1:]), dim=axis) if len(parts) > 1 else parts[0].unsqueeze(axis)
def _loop(M: Tensor | None = None, cond: Tensor | None = None, *v_initial: Any, body: _Graph, scope: dict) -> tuple:
  trip = int(_scalar(M)) if M is not None else None
  go = bool(_scalar(cond)) if cond is not None else True
  vals, n = list(v_initial), len(v_initial)
  scans: list[list[Tensor]] = []
  i = 0
  while go and (trip is None or i < trip):
    outs = body.run(scope, [Tensor(i, dtype=dtypes.int64), Tensor(go, dtype=dtypes.bool), *vals])
    go, vals = bool(_scalar(outs[0])), outs[1:1 + n]
    for k, v in enumerate(outs[1 + n:]):
      if len(scans) <= k: scans.append([])
      scans[k].append(v)
    i += 1
  n_scan = len(body.outputs) - 1 - n
  if n_scan and not scans: raise NotImplementedError("Loop that runs no iteration but has scan outputs (their shape is unknown)")
  return tuple(vals) + tuple(_stack(p) for p in scans)
def _scan(*xs: Tensor, body: _Graph, num_scan_inputs: int, scan_input_axes=None, scan_input_directions=None, scan_output_axes=None,
          scan_output_directions=None, opset: int, scope: dict) -> tuple:
  if opset < 9: raise NotImplementedError("Scan-8 (batched, with sequence_lens)")
  n_state = len(xs) - num_scan_inputs
  states, seqs = list(xs[:n_state]), xs[n_state:]
  in_axes = [_axis(a, x.ndim) for a, x in zip(scan_input_axes or [0] * len(seqs), seqs)]
  in_dirs = scan_input_directions or [0] * len(seqs)
  steps = seqs[0].shape[in_axes[0]]
  outs: list[list[Tensor]] = []
  for t in range(steps):
    sl = [x.shrink(tuple(((steps - 1 - t) if d else t, (steps - t) if d else t + 1) if i == a else None for i in range(x.ndim))).squeeze(a)
          for x, a, d in zip(seqs, in_axes, in_dirs)]
    res = body.run(scope, [*states, *sl])
    states = res[:n_state]
    for k, v in enumerate(res[n_state:]):
      if len(outs) <= k: outs.append([])
      outs[k].append(v)
  out_axes, out_dirs = scan_output_axes or [0] * len(outs), scan_output_directions or [0] * len(outs)
  stacked = []
  for parts, a, d in zip(outs, out_axes, out_dirs):
    parts = parts[::-1] if d else parts
    stacked.append(_stack(parts, _axis(a, parts[0].ndim + 1)))
  return tuple(states) + tuple(stacked)
def _sequence_map(seq: list, *extra: Any, body: _Graph, scope: dict) -> tuple:
  res = [body.run(scope, [x, *(e[i] if isinstance(e, list) else e for e in extra)]) for i, x in enumerate(seq)]
  return tuple([r[k] for r in res] for k in range(len(body.outputs)))
def _seq_pos(seq: list, pos: Tensor | None, end: int) -> int:
  p = end if pos is None else int(_scalar(pos))
  if not -len(seq) - (end == len(seq)) <= p <= len(seq): raise IndexError(f"sequence position {p} out of range for length {len(seq)}")
  return p + len(seq) if p < 0 else p
def _seq_insert(seq: list, t: Tensor, pos: Tensor | None = None) -> list:
  out = list(seq)
  out.insert(_seq_pos(seq, pos, len(seq)), t)
  return out
def _seq_erase(seq: list, pos: Tensor | None = None) -> list:
  out = list(seq)
  del out[_seq_pos(seq, pos, -1) if pos is not None else -1]
  return out
def _concat_from_seq(seq: list, *, axis: int, new_axis: int = 0) -> Tensor:
  if new_axis: return _stack(seq, _axis(axis, seq[0].ndim + 1))
  return seq[0].cat(*seq[1:], dim=_axis(axis, seq[0].ndim)) if len(seq) > 1 else seq[0]
def _split_to_seq(x: Tensor, split: Tensor | None = None, *, axis: int = 0, keepdims: int = 1) -> list:
  a = _axis(axis, x.ndim)
  if split is None:
    parts = list(_split(x, [1] * x.shape[a], axis=a, n_outputs=x.shape[a]))
    return parts if keepdims else [p.squeeze(a) for p in parts]
  sz = _ints(split)
  if split.ndim == 0: sz = [min(sz[0], x.shape[a] - i) for i in range(0, x.shape[a], sz[0])]
  return list(_split(x, sz, axis=a, n_outputs=len(sz)))

SEQUENCE_OPS: dict[str, Callable] = {
  "SequenceEmpty": lambda *, dtype=1: [], "SequenceConstruct": lambda *xs: list(xs),
  "SequenceAt": lambda seq, pos: seq[_seq_pos(seq, pos, 0)], "SequenceInsert": _seq_insert, "SequenceErase": _seq_erase,
  "SequenceLength": lambda seq: Tensor(len(seq), dtype=dtypes.int64), "ConcatFromSequence": _concat_from_seq,
  "SplitToSequence": _split_to_seq, "Optional": lambda x=None, *, type=None: x,  # noqa: A006
  "OptionalHasElement": lambda x=None: Tensor(x is not None, dtype=dtypes.bool),
  "OptionalGetElement": lambda x: x if x is not None else (_ for _ in ()).throw(ValueError("OptionalGetElement of an empty optional")),
  "If": _if, "Loop": _loop, "Scan": _scan, "SequenceMap": _sequence_map,
}
OPS.update(SEQUENCE_OPS)

def _load_proto(model: Any) -> tuple[Any, str]:
  onnx = _onnx()
  if isinstance(model, onnx.ModelProto): return model, os.getcwd()
  try:
    if isinstance(model, (bytes, bytearray, memoryview)): return onnx.load_from_string(bytes(model)), os.getcwd()
    path = os.fspath(model)
    return onnx.load(path, load_external_data=False), os.path.dirname(os.path.abspath(path))
  except (OSError, TypeError): raise
  except Exception as e: raise ValueError(f"not a valid ONNX model ({type(e).__name__}: {e})") from e

@dataclass
class _Input:
  name: str
  dtype: DType | None
  shape: tuple[int | str | None, ...] | None

def _signature(v: Any) -> Any:
  if isinstance(v, Tensor): return (v.shape, v.dtype)
  return None if v is None else tuple(_signature(x) for x in v)

class OnnxRunner:
  """runner = OnnxRunner("model.onnx"); outs = runner({"x": array}) -> {output name: Tensor} (lazy until read)."""
  def __init__(self, model: Any, device: str | None = None, jit: bool = False):
    """jit=True replays each input-shape signature's kernels with TinyJit from its third call on: no graph building
    or scheduling per run, but the outputs are refilled in place (read them before the next call)."""
    self.model, self.base_dir = _load_proto(model)
    self.device, self.jit = device, jit
    self._jits: dict[tuple, Any] = {}
    # (input name, shape, numpy dtype) -> the tensor a replayed shape's numpy input is copied into (see _staged)
    self._staging: dict[tuple, Tensor] = {}
    g = self.model.graph
    self.opsets = {("" if o.domain in ("", "ai.onnx") else o.domain): o.version for o in self.model.opset_import}
    self.graph = _Graph(g, self.opsets, self.base_dir, set(), device)
    _fuse_conv_bn(self.graph)
    _pack_matmul_weights(self.graph)
    self._inits, self.nodes, self.outputs = self.graph.inits, self.graph.nodes, self.graph.outputs
    self.inputs = {i.name: self._input_info(i) for i in g.input}  # an input with an initializer has a default
    # values fixed by the input shapes alone, folded once per shape signature
    static = (set(self._inits) | set(self.graph.derived)) - set(self.inputs)
    for node in self.nodes:
      if node.op in _NOT_FOLDABLE: continue
      if node.op in _SHAPE_ONLY or all(i in static for i in node.inputs if i): static.update(o for o in node.outputs if o)
    self._static_names = static - set(self._inits) - set(self.graph.derived)
    self._folded: dict[tuple, dict[str, Tensor]] = {}

  def _input_info(self, vi: Any) -> _Input:
    tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
    if tt is None: return _Input(vi.name, None, None)
    dt = ONNX_DTYPES.get(tt.elem_type) if tt.elem_type else None
    shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim) if tt.HasField("shape") else None
    return _Input(vi.name, dt, shape)

  def _weight(self, name: str) -> Tensor: return self.graph.weight(name)

  def _staged(self, name: str, v: Any) -> Tensor | None:
    """A numpy input of a shape the JIT replays: its bytes copied into the memory the last call's input had (making a
    Tensor and a buffer from it each call was a third of the Python time of a small model's run)."""
    if (t := self._staging.get((name, getattr(v, "shape", None), getattr(getattr(v, "dtype", None), "str", None)))) is None: return None
    a = v if v.flags.c_contiguous else v.copy()
    buffer_of(t.uop.base).copyin(memoryview(a.reshape(-1)).cast("B"))
    return t

  def _feed(self, name: str, v: Any) -> Any:
    if v is None or isinstance(v, (list, tuple)):  # an empty optional, a sequence
      return None if v is None else [x if isinstance(x, Tensor) else _from_numpy(x, self.device) for x in v]
    if not isinstance(v, Tensor) and (t := self._staged(name, v)) is not None: return t
    t = v if isinstance(v, Tensor) else _from_numpy(v, self.device)
    info = self.inputs[name]
    if info.dtype is not None and t.dtype != info.dtype:
      raise TypeError(f"input {name!r} has dtype {t.dtype}, the model declares {info.dtype}")
    if info.shape is not None:
      if len(info.shape) != t.ndim: raise ValueError(f"input {name!r} has shape {t.shape}, the model declares rank {len(info.shape)} {info.shape}")
      for want, got in zip(info.shape, t.shape):
        if isinstance(want, int) and want > 0 and want != got: raise ValueError(f"input {name!r} has shape {t.shape}, the model declares {info.shape}")
    return t

  def __call__(self, inputs: dict[str, Any] | None = None, **kw: Any) -> dict[str, Tensor]:
    feeds = {**(inputs or {}), **kw}
    for k in feeds:
      if k not in self.inputs: raise KeyError(f"{k!r} is not an input of this model (inputs: {list(self.inputs)})")
    env: dict[str, Tensor | None] = {}
    for name in self.inputs:
      if name not in feeds:
        if name in self._inits: continue
        raise KeyError(f"missing input {name!r} (inputs: {list(self.inputs)})")
      env[name] = self._feed(name, feeds[name])
    sig = tuple((k, _signature(v)) for k, v in env.items())
    if not self.jit or sig not in self._folded: return self._run(env, sig)  # the first run of a shape folds its constants
    from attograd.jit import TinyJit
    if sig not in self._jits:
      def run(**feeds: Tensor) -> dict[str, Tensor]:
        outs = self._run(dict(feeds), sig)
        Tensor.realize_all(list(outs.values()))
        return outs
      self._jits[sig] = TinyJit(run)
    outs = (jit := self._jits[sig])(**env)
    if jit.cnt == 2:  # replays from now on, and they refill the outputs: the next call's numpy inputs may reuse this memory
      for k, t in env.items():
        if not isinstance(feeds[k], Tensor) and isinstance(t, Tensor) and t.uop.base.op is Ops.BUFFER and narrow_type(t) is None:
          self._staging.setdefault((k, feeds[k].shape, feeds[k].dtype.str), t)
    return outs

  def _run(self, env: dict[str, Tensor | None], sig: tuple) -> dict[str, Tensor]:
    env = {"": None, **env}
    folded = self._folded.get(sig)
    if folded is not None: env.update(folded)
    for node in self.nodes:
      if folded is not None and node.outputs and all(o in folded or not o for o in node.outputs): continue
      for o, t in zip(node.outputs, _exec(node, [self.graph.value(i, env) for i in node.inputs], env)):
        if o: env[o] = self.graph.placed(t)
    if folded is None:  # (also with nothing to fold: the entry says the shape ran once, so the next call captures the JIT)
      keep = {k: env[k] for k in self._static_names if isinstance(env.get(k), Tensor)}
      Tensor.realize_all(list(keep.values()))
      for t in keep.values():
        if isinstance(t.numel(), int) and t.numel() <= _HOST_MAX and t.dtype != dtypes.bfloat16: _remember(t, _flat(t))
      self._folded[sig] = {k: _as_const(t) for k, t in keep.items()}
    return {o: env[o] if o in env else self._weight(o) for o in self.outputs}

# ***** python -m attograd.nn.onnx MODEL.onnx [--dim NAME=SIZE ...] [--runs N] *****

def _main(argv: list[str] | None = None) -> None:
  import argparse, statistics, time
  import numpy as np
  ap = argparse.ArgumentParser(prog="python -m attograd.nn.onnx", description="Run an ONNX model on random inputs; compare with onnxruntime.")
  ap.add_argument("model")
  ap.add_argument("--dim", action="append", default=[], help="a symbolic input dimension, NAME=SIZE (unnamed dims default to 1)")
  ap.add_argument("--shape", action="append", default=[], help="an input's whole shape, INPUT=D0,D1,... (for dims with no name)")
  ap.add_argument("--runs", type=int, default=5)
  args = ap.parse_args(argv)
  def pairs(flag: str, items: list[str], value) -> dict:
    try: return {k: value(v) for k, v in (d.split("=", 1) for d in items)}
    except ValueError: ap.error(f"{flag} takes NAME=VALUE with an integer value (comma-separated for --shape), got {items}")
  dims = pairs("--dim", args.dim, int)
  shapes = pairs("--shape", args.shape, lambda v: tuple(int(x) for x in v.split(",")))
  runner = OnnxRunner(args.model, jit=True)
  if unknown := set(shapes) - set(runner.inputs): ap.error(f"--shape names no input of the model: {sorted(unknown)} (inputs: {list(runner.inputs)})")
  rng, feeds = np.random.default_rng(0), {}
  for name, info in runner.inputs.items():
    if name in runner._inits: continue
    shape = shapes.get(name) or tuple(d if isinstance(d, int) and d > 0 else dims.get(d, 1) if isinstance(d, str) else 1 for d in (info.shape or ()))
    dt = info.dtype or dtypes.float32
    print(f"input  {name}: {dt} {info.shape} -> {shape}")
    np_dt = np.dtype(dt.name) if dt != dtypes.bfloat16 else np.float32
    feeds[name] = (rng.random(shape) if dtypes.is_float(dt) else rng.integers(0, 2, shape)).astype(np_dt)
  def timed(fn) -> tuple[Any, list[float]]:
    ts, out = [], None
    for _ in range(args.runs + 2):  # the first two: compile and fold, JIT capture
      t = time.perf_counter()
      out = fn()
      ts.append((time.perf_counter() - t) * 1e3)
    return out, ts[2:]
  try: ours, t_ours = timed(lambda: {k: v.numpy() if isinstance(v, Tensor) else v for k, v in runner(feeds).items()})
  except (ValueError, TypeError, IndexError) as e:  # the model refuses these inputs (a free dim left at 1 is the usual cause)
    raise SystemExit(f"the model does not run on these inputs: {e}\n(set free dims with --dim NAME=SIZE or whole shapes with --shape INPUT=D0,D1,...)") from None
  for k, v in ours.items(): print(f"output {k}: {getattr(v, 'dtype', type(v).__name__)} {getattr(v, 'shape', '')}")
  print(f"attograd:    median {statistics.median(t_ours):.2f} ms over {args.runs} runs")
  try: import onnxruntime as ort
  except ImportError: return print("onnxruntime is not installed: no comparison")
  sess = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
  theirs, t_theirs = timed(lambda: dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds))))
  print(f"onnxruntime: median {statistics.median(t_theirs):.2f} ms over {args.runs} runs")
  for k, v in theirs.items():
    a, b = np.asarray(ours[k], np.float64), np.asarray(v, np.float64)
    print(f"  {k}: max |attograd - onnxruntime| = {np.abs(a - b).max() if a.size else 0:.3g} (max |onnxruntime| {np.abs(b).max() if b.size else 0:.3g})")

if __name__ == "__main__": _main()
