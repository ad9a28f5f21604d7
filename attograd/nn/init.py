"""torch.nn.init: fill a tensor in place (by assign, so Parameters keep their identity) and return it."""
from __future__ import annotations
import math
from attograd.errors import ArgumentError  # a ValueError and a RuntimeError: code written for torch catches it
from attograd.tensor import Tensor
from attograd.dtype import dtypes

_GAINS = {"linear": 1.0, "identity": 1.0, "conv1d": 1.0, "conv2d": 1.0, "conv3d": 1.0, "conv_transpose1d": 1.0, "conv_transpose2d": 1.0,
          "conv_transpose3d": 1.0, "sigmoid": 1.0, "tanh": 5 / 3, "relu": math.sqrt(2.0), "selu": 3 / 4}

def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
  if nonlinearity == "leaky_relu": return math.sqrt(2.0 / (1 + (0.01 if param is None else param) ** 2))
  if nonlinearity not in _GAINS: raise ArgumentError(f"unsupported nonlinearity {nonlinearity!r}")
  return _GAINS[nonlinearity]

def _fill(t: Tensor, values: Tensor) -> Tensor:
  if not isinstance(t, Tensor): raise TypeError(f"nn.init fills a Tensor, not {type(t).__name__}")
  t.assign(values.cast(t.dtype).to(t.device))
  return t

def _fans(t: Tensor) -> tuple[int, int]:
  if t.ndim < 2: raise ArgumentError(f"fan in and fan out can't be computed for a tensor of shape {t.shape} (fewer than 2 dims)")
  rf = math.prod(t.shape[2:])
  return t.shape[1] * rf, t.shape[0] * rf

def _fan(t: Tensor, mode: str) -> int:
  if mode not in ("fan_in", "fan_out"): raise ArgumentError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
  return _fans(t)[0 if mode == "fan_in" else 1]

def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0, generator=None) -> Tensor:
  return _fill(tensor, Tensor.rand(*tensor.shape, device=tensor.device) * (b - a) + a)
def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator=None) -> Tensor:
  return _fill(tensor, Tensor.randn(*tensor.shape, device=tensor.device) * std + mean)
def constant_(tensor: Tensor, val: float) -> Tensor: return _fill(tensor, Tensor.full(tensor.shape, val, dtype=tensor.dtype, device=tensor.device))
def zeros_(tensor: Tensor) -> Tensor: return constant_(tensor, 0)
def ones_(tensor: Tensor) -> Tensor: return constant_(tensor, 1)
def eye_(tensor: Tensor) -> Tensor:
  if tensor.ndim != 2: raise ArgumentError(f"eye_ needs a 2-D tensor, got shape {tensor.shape}")
  return _fill(tensor, Tensor.eye(*tensor.shape, device=tensor.device))
def dirac_(tensor: Tensor, groups: int = 1) -> Tensor:
  if tensor.ndim not in (3, 4, 5): raise ArgumentError(f"dirac_ needs a 3-, 4- or 5-D tensor, got shape {tensor.shape}")
  out_g, cin = tensor.shape[0] // groups, tensor.shape[1]
  o = Tensor.arange(tensor.shape[0]).reshape(-1, 1, *(1,) * (tensor.ndim - 2))
  i = Tensor.arange(cin).reshape(1, -1, *(1,) * (tensor.ndim - 2))
  centre = 1
  for ax, k in enumerate(tensor.shape[2:]):
    r = Tensor.arange(k).reshape(*(1,) * (2 + ax), k, *(1,) * (tensor.ndim - 3 - ax))
    centre = (r == k // 2) * centre
  return _fill(tensor, ((o % out_g == i) & (o % out_g < cin)) * centre)

def xavier_uniform_(tensor: Tensor, gain: float = 1.0, generator=None) -> Tensor:
  fan_in, fan_out = _fans(tensor)
  b = gain * math.sqrt(6.0 / (fan_in + fan_out))
  return uniform_(tensor, -b, b)
def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator=None) -> Tensor:
  fan_in, fan_out = _fans(tensor)
  return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)))
def kaiming_uniform_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu", generator=None) -> Tensor:
  b = math.sqrt(3.0) * calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode))
  return uniform_(tensor, -b, b)
def kaiming_normal_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu", generator=None) -> Tensor:
  return normal_(tensor, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode)))

def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0, generator=None) -> Tensor:
  """N(mean, std) conditioned on [a, b], by rejection: each element takes the first of k draws inside [a, b], k chosen so
  that all k missing has probability < 1e-12 (such an element, or any element when [a, b] holds almost no mass, is
  drawn uniformly in [a, b] instead)."""
  if not a < b: raise ArgumentError(f"trunc_normal_ needs a < b, got a={a}, b={b}")
  cdf = lambda x: 0.5 * (1 + math.erf((x - mean) / (std * math.sqrt(2))))
  p_in = cdf(b) - cdf(a)
  k = 0 if p_in < 1e-3 else 1 if p_in >= 1 else min(64, math.ceil(math.log(1e-12) / math.log1p(-p_in)))
  out = Tensor.rand(*tensor.shape, device=tensor.device) * (b - a) + a
  for _ in range(k):
    x = Tensor.randn(*tensor.shape, device=tensor.device) * std + mean
    out = ((x >= a) & (x <= b)).where(x, out)
  return _fill(tensor, out)

def orthogonal_(tensor: Tensor, gain: float = 1.0, generator=None) -> Tensor:
  """A (semi-)orthogonal matrix from the QR of a Gaussian one (numpy's QR, once at init), signs fixed as torch's."""
  import numpy as np
  if tensor.ndim < 2: raise ArgumentError(f"orthogonal_ needs at least 2 dims, got shape {tensor.shape}")
  rows, cols = tensor.shape[0], math.prod(tensor.shape[1:])
  flat = Tensor.randn(rows, cols).numpy().astype(np.float64)
  if rows < cols: flat = flat.T
  q, r = np.linalg.qr(flat)
  q *= np.sign(np.diag(r))
  if rows < cols: q = q.T
  return _fill(tensor, Tensor((gain * q).astype(np.float32)).reshape(tensor.shape))

# tinygrad / older torch spellings
uniform, normal, constant, xavier_uniform, xavier_normal, kaiming_uniform, kaiming_normal = (
  uniform_, normal_, constant_, xavier_uniform_, xavier_normal_, kaiming_uniform_, kaiming_normal_)
