"""Stateless layers (activations, dropout, pooling, reshaping) as Modules over nn.functional, torch's names and arguments."""
from __future__ import annotations
from typing import Any, Sequence
from attograd.errors import ArgumentError  # a ValueError and a RuntimeError: code written for torch catches it
from attograd.tensor import Tensor
from attograd.nn.module import Module
import attograd.nn.functional as F

class _Fn(Module):
  """A module applying F.<fn> with the keyword arguments given at construction (inplace is accepted and ignored:
  attograd's tensors are values, the result is the same)."""
  fn: Any = None
  def __init__(self, **kw: Any):
    super().__init__()
    self.kw = {k: v for k, v in kw.items() if k != "inplace"}
  def forward(self, x: Tensor) -> Tensor: return type(self).fn(x, **self.kw)
  def extra_repr(self) -> str: return ", ".join(f"{k}={v}" for k, v in self.kw.items())

def _layer(name: str, fn: Any, *argnames: str, **defaults: Any) -> type:
  """class name(_Fn) whose __init__ takes argnames positionally (then as keywords), defaulting to defaults."""
  def __init__(self, *args: Any, **kw: Any) -> None:
    if len(args) > len(argnames): raise TypeError(f"{name}() takes at most {len(argnames)} positional arguments")
    _Fn.__init__(self, **{**defaults, **dict(zip(argnames, args)), **kw})
  return type(name, (_Fn,), {"fn": staticmethod(fn), "__init__": __init__, "__module__": __name__})

ReLU = _layer("ReLU", F.relu, "inplace")
ReLU6 = _layer("ReLU6", F.relu6, "inplace")
LeakyReLU = _layer("LeakyReLU", F.leaky_relu, "negative_slope", "inplace", negative_slope=0.01)
GELU = _layer("GELU", F.gelu, "approximate", approximate="none")
SiLU = _layer("SiLU", F.silu, "inplace")
Mish = _layer("Mish", F.mish, "inplace")
ELU = _layer("ELU", F.elu, "alpha", "inplace", alpha=1.0)
SELU = _layer("SELU", F.selu, "inplace")
CELU = _layer("CELU", F.celu, "alpha", "inplace", alpha=1.0)
Tanh = _layer("Tanh", F.tanh)
Sigmoid = _layer("Sigmoid", F.sigmoid)
LogSigmoid = _layer("LogSigmoid", F.logsigmoid)
Softplus = _layer("Softplus", F.softplus, "beta", "threshold", beta=1.0, threshold=20.0)
Softsign = _layer("Softsign", F.softsign)
Hardswish = _layer("Hardswish", F.hardswish, "inplace")
Hardsigmoid = _layer("Hardsigmoid", F.hardsigmoid, "inplace")
Hardtanh = _layer("Hardtanh", F.hardtanh, "min_val", "max_val", "inplace", min_val=-1.0, max_val=1.0)
GLU = _layer("GLU", F.glu, "dim", dim=-1)
Softmax = _layer("Softmax", F.softmax, "dim", dim=None)
LogSoftmax = _layer("LogSoftmax", F.log_softmax, "dim", dim=None)
Softmin = _layer("Softmin", F.softmin, "dim", dim=None)
MaxPool1d = _layer("MaxPool1d", F.max_pool1d, "kernel_size", "stride", "padding", "dilation", "return_indices", "ceil_mode")
MaxPool2d = _layer("MaxPool2d", F.max_pool2d, "kernel_size", "stride", "padding", "dilation", "return_indices", "ceil_mode")
MaxPool3d = _layer("MaxPool3d", F.max_pool3d, "kernel_size", "stride", "padding", "dilation", "return_indices", "ceil_mode")
AvgPool1d = _layer("AvgPool1d", F.avg_pool1d, "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad")
AvgPool2d = _layer("AvgPool2d", F.avg_pool2d, "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")
AvgPool3d = _layer("AvgPool3d", F.avg_pool3d, "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")
AdaptiveAvgPool1d = _layer("AdaptiveAvgPool1d", F.adaptive_avg_pool1d, "output_size")
AdaptiveAvgPool2d = _layer("AdaptiveAvgPool2d", F.adaptive_avg_pool2d, "output_size")
Upsample = _layer("Upsample", F.interpolate, "size", "scale_factor", "mode", "align_corners", mode="nearest")
PixelShuffle = _layer("PixelShuffle", F.pixel_shuffle, "upscale_factor")

class Identity(Module):
  def __init__(self, *args: Any, **kw: Any): super().__init__()  # (torch's Identity ignores its arguments too)
  def forward(self, x: Any) -> Any: return x

class Flatten(Module):
  def __init__(self, start_dim: int = 1, end_dim: int = -1):
    super().__init__()
    self.start_dim, self.end_dim = start_dim, end_dim
  def forward(self, x: Tensor) -> Tensor: return x.flatten(self.start_dim, self.end_dim)

class Unflatten(Module):
  def __init__(self, dim: int, unflattened_size: Sequence[int]):
    super().__init__()
    self.dim, self.unflattened_size = dim, tuple(unflattened_size)
  def forward(self, x: Tensor) -> Tensor: return x.unflatten(self.dim, self.unflattened_size)

class Dropout(Module):
  """Drops in training mode: the module's own (after train()/eval()), else Tensor.training."""
  def __init__(self, p: float = 0.5, inplace: bool = False):
    super().__init__()
    if not 0 <= p <= 1: raise ArgumentError(f"dropout probability {p} must be in [0, 1]")
    self.p = p
  def forward(self, x: Tensor) -> Tensor: return F.dropout(x, self.p, self.training)
  def extra_repr(self) -> str: return f"p={self.p}"
