"""Layers, with PyTorch's parameter layout and initialization, so state dicts port both ways."""
from __future__ import annotations
import math
from typing import Sequence
from attograd.tensor import Tensor
from attograd.dtype import dtypes

def _uniform(shape: tuple[int, ...], bound: float) -> Tensor:
  return (Tensor.rand(*shape) * (2 * bound) - bound).contiguous().requires_grad_()

def _tuple(v: int | Sequence[int], n: int) -> tuple[int, ...]: return (v,) * n if isinstance(v, int) else tuple(v)

class Linear:
  def __init__(self, in_features: int, out_features: int, bias: bool = True):
    bound = 1 / math.sqrt(in_features)  # torch's kaiming_uniform(a=sqrt(5)) comes to this bound
    self.weight = _uniform((out_features, in_features), bound)
    self.bias = _uniform((out_features,), bound) if bias else None
  def __call__(self, x: Tensor) -> Tensor: return x.linear(self.weight, self.bias)

class Conv2d:
  """Also 1-D and 3-D: the kernel size's length picks the number of spatial axes."""
  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], stride=1, padding=0, dilation=1,
               groups: int = 1, bias: bool = True, _dims: int = 2):
    self.kernel_size = _tuple(kernel_size, _dims)
    self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
    fan_in = in_channels // groups * math.prod(self.kernel_size)
    bound = 1 / math.sqrt(fan_in)
    self.weight = _uniform((out_channels, in_channels // groups, *self.kernel_size), bound)
    self.bias = _uniform((out_channels,), bound) if bias else None
  def __call__(self, x: Tensor) -> Tensor:
    return x.conv2d(self.weight, self.bias, groups=self.groups, stride=self.stride, dilation=self.dilation, padding=self.padding)

def Conv1d(in_channels: int, out_channels: int, kernel_size: int | Sequence[int], stride=1, padding=0, dilation=1, groups=1, bias=True) -> Conv2d:
  return Conv2d(in_channels, out_channels, _tuple(kernel_size, 1), stride, padding, dilation, groups, bias, _dims=1)

class ConvTranspose2d:
  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], stride=1, padding=0, output_padding=0,
               dilation=1, groups: int = 1, bias: bool = True):
    self.kernel_size = _tuple(kernel_size, 2)
    self.stride, self.padding, self.output_padding, self.dilation, self.groups = stride, padding, output_padding, dilation, groups
    bound = 1 / math.sqrt(out_channels // groups * math.prod(self.kernel_size))
    self.weight = _uniform((in_channels, out_channels // groups, *self.kernel_size), bound)
    self.bias = _uniform((out_channels,), bound) if bias else None
  def __call__(self, x: Tensor) -> Tensor:
    return x.conv_transpose2d(self.weight, self.bias, groups=self.groups, stride=self.stride, dilation=self.dilation,
                              padding=self.padding, output_padding=self.output_padding)

class BatchNorm:
  """BatchNorm over axis 1 of (N, C, ...) inputs. In training mode it normalizes with the batch's
  statistics and updates the running ones (running_var with the unbiased estimate, as torch)."""
  def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True, track_running_stats: bool = True, momentum: float = 0.1):
    self.eps, self.momentum, self.track_running_stats = eps, momentum, track_running_stats
    self.weight = Tensor.ones(num_features).contiguous().requires_grad_() if affine else None
    self.bias = Tensor.zeros(num_features).contiguous().requires_grad_() if affine else None
    if track_running_stats:
      self.running_mean = Tensor.zeros(num_features).contiguous()
      self.running_var = Tensor.ones(num_features).contiguous()
      self.num_batches_tracked = Tensor.zeros((), dtype=dtypes.int64).contiguous()  # 0-d, as torch's: its state dicts load as they are
  def __call__(self, x: Tensor) -> Tensor:
    axes = (0, *range(2, x.ndim))
    if Tensor.training or not self.track_running_stats:
      mean = x.mean(axes)
      var = (x - mean.reshape(1, -1, *(1,) * (x.ndim - 2))).square().mean(axes)
      if Tensor.training and self.track_running_stats:
        n = x.numel() // x.shape[1]
        self.running_mean.assign((1 - self.momentum) * self.running_mean + self.momentum * mean.detach())
        self.running_var.assign((1 - self.momentum) * self.running_var + self.momentum * (n / max(n - 1, 1)) * var.detach())
        self.num_batches_tracked.assign(self.num_batches_tracked + 1)
    else: mean, var = self.running_mean, self.running_var
    return x.batchnorm(self.weight, self.bias, mean, (var + self.eps).rsqrt())
BatchNorm1d = BatchNorm2d = BatchNorm3d = BatchNorm

class LayerNorm:
  def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True):
    self.normalized_shape = _tuple(normalized_shape, 1)
    self.eps = eps
    self.weight = Tensor.ones(*self.normalized_shape).contiguous().requires_grad_() if elementwise_affine else None
    self.bias = Tensor.zeros(*self.normalized_shape).contiguous().requires_grad_() if elementwise_affine else None
  def __call__(self, x: Tensor) -> Tensor:
    if x.shape[-len(self.normalized_shape):] != self.normalized_shape:
      raise ValueError(f"LayerNorm over {self.normalized_shape} got input of shape {x.shape}")
    y = x.layernorm(tuple(range(-len(self.normalized_shape), 0)), self.eps)
    return y if self.weight is None else y * self.weight + self.bias

class GroupNorm:
  def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
    if num_channels % num_groups: raise ValueError(f"{num_channels} channels can't be split into {num_groups} groups")
    self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
    self.weight = Tensor.ones(num_channels).contiguous().requires_grad_() if affine else None
    self.bias = Tensor.zeros(num_channels).contiguous().requires_grad_() if affine else None
  def __call__(self, x: Tensor) -> Tensor:
    y = x.reshape(x.shape[0], self.num_groups, -1).layernorm(-1, self.eps).reshape(x.shape)
    if self.weight is None: return y
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return y * self.weight.reshape(shape) + self.bias.reshape(shape)

# machine epsilon: torch's RMSNorm adds it when no eps is given
_FLOAT_EPS = {dtypes.float16: 2.0 ** -10, dtypes.bfloat16: 2.0 ** -7, dtypes.float32: 2.0 ** -23, dtypes.float64: 2.0 ** -52}

class RMSNorm:
  """torch.nn.RMSNorm: over the trailing normalized_shape axes; eps=None means the input dtype's machine epsilon, as in torch."""
  def __init__(self, normalized_shape: int | Sequence[int], eps: float | None = None, elementwise_affine: bool = True):
    self.normalized_shape, self.eps = _tuple(normalized_shape, 1), eps
    self.weight = Tensor.ones(*self.normalized_shape).contiguous().requires_grad_() if elementwise_affine else None
  def __call__(self, x: Tensor) -> Tensor:
    if x.shape[-len(self.normalized_shape):] != self.normalized_shape:
      raise ValueError(f"RMSNorm over {self.normalized_shape} got input of shape {x.shape}")
    eps = self.eps if self.eps is not None else _FLOAT_EPS.get(x.dtype, _FLOAT_EPS[dtypes.float32])
    y = x * (x.square().mean(tuple(range(-len(self.normalized_shape), 0)), keepdim=True) + eps).rsqrt()
    return y if self.weight is None else y * self.weight

class Embedding:
  def __init__(self, num_embeddings: int, embedding_dim: int):
    self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
    self.weight = Tensor.randn(num_embeddings, embedding_dim).contiguous().requires_grad_()
  def __call__(self, idx: Tensor) -> Tensor:
    if dtypes.is_float(idx.dtype): raise TypeError(f"Embedding indices must be integers, got {idx.dtype}")
    hit = idx.unsqueeze(-1) == Tensor.arange(self.num_embeddings, device=idx.device)
    return (hit.unsqueeze(-1).where(self.weight, 0.0)).sum(-2)
