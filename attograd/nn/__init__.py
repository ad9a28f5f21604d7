"""Layers, with PyTorch's parameter layout and initialization, so state dicts port both ways. Every layer is an
nn.Module (module.py); nn.state's get_parameters/get_state_dict still work on plain classes holding them."""
from __future__ import annotations
import math
from typing import Any, Sequence
from attograd.errors import ArgumentError  # a ValueError and a RuntimeError: code written for torch catches it
from attograd.tensor import Tensor
from attograd.dtype import dtypes
from attograd.nn.module import Module, Parameter, own_memory
from attograd.nn.containers import Sequential, ModuleList, ModuleDict
from attograd.nn import functional
from attograd.nn.activation import (ReLU, ReLU6, LeakyReLU, GELU, SiLU, Mish, ELU, SELU, CELU, Tanh, Sigmoid, LogSigmoid, Softplus,
                                    Softsign, Hardswish, Hardsigmoid, Hardtanh, GLU, Softmax, LogSoftmax, Softmin, MaxPool1d, MaxPool2d,
                                    MaxPool3d, AvgPool1d, AvgPool2d, AvgPool3d, AdaptiveAvgPool1d, AdaptiveAvgPool2d, Upsample,
                                    PixelShuffle, Identity, Flatten, Unflatten, Dropout)

def _uniform(shape: tuple[int, ...], bound: float) -> Parameter:
  return Parameter((Tensor.rand(*shape) * (2 * bound) - bound).contiguous())

def _tuple(v: int | Sequence[int], n: int) -> tuple[int, ...]: return (v,) * n if isinstance(v, int) else tuple(v)

class Linear(Module):
  def __init__(self, in_features: int, out_features: int, bias: bool = True):
    super().__init__()
    self.in_features, self.out_features = in_features, out_features
    bound = 1 / math.sqrt(in_features)  # torch's kaiming_uniform(a=sqrt(5)) comes to this bound
    self.weight = _uniform((out_features, in_features), bound)
    self.bias = _uniform((out_features,), bound) if bias else None
  def forward(self, x: Tensor) -> Tensor: return x.linear(self.weight, self.bias)
  def extra_repr(self) -> str: return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

class Conv2d(Module):
  """Also 1-D and 3-D: the kernel size's length picks the number of spatial axes."""
  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], stride=1, padding=0, dilation=1,
               groups: int = 1, bias: bool = True, _dims: int = 2):
    super().__init__()
    self.kernel_size = _tuple(kernel_size, _dims)
    self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
    fan_in = in_channels // groups * math.prod(self.kernel_size)
    bound = 1 / math.sqrt(fan_in)
    self.weight = _uniform((out_channels, in_channels // groups, *self.kernel_size), bound)
    self.bias = _uniform((out_channels,), bound) if bias else None
  def forward(self, x: Tensor) -> Tensor:
    return x.conv2d(self.weight, self.bias, groups=self.groups, stride=self.stride, dilation=self.dilation, padding=self.padding)

class Conv1d(Conv2d):
  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], stride=1, padding=0, dilation=1, groups=1, bias=True):
    super().__init__(in_channels, out_channels, _tuple(kernel_size, 1), stride, padding, dilation, groups, bias, _dims=1)

class Conv3d(Conv2d):
  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], stride=1, padding=0, dilation=1, groups=1, bias=True):
    super().__init__(in_channels, out_channels, _tuple(kernel_size, 3), stride, padding, dilation, groups, bias, _dims=3)

class ConvTranspose2d(Module):
  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], stride=1, padding=0, output_padding=0,
               dilation=1, groups: int = 1, bias: bool = True):
    super().__init__()
    self.kernel_size = _tuple(kernel_size, 2)
    self.stride, self.padding, self.output_padding, self.dilation, self.groups = stride, padding, output_padding, dilation, groups
    bound = 1 / math.sqrt(out_channels // groups * math.prod(self.kernel_size))
    self.weight = _uniform((in_channels, out_channels // groups, *self.kernel_size), bound)
    self.bias = _uniform((out_channels,), bound) if bias else None
  def forward(self, x: Tensor) -> Tensor:
    return x.conv_transpose2d(self.weight, self.bias, groups=self.groups, stride=self.stride, dilation=self.dilation,
                              padding=self.padding, output_padding=self.output_padding)

class BatchNorm(Module):
  """BatchNorm over axis 1 of (N, C, ...) inputs. In training mode it normalizes with the batch's
  statistics and updates the running ones (running_var with the unbiased estimate, as torch); momentum=None keeps
  their cumulative average instead. Arguments in tinygrad's order; BatchNorm1d/2d/3d take torch's."""
  def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True, track_running_stats: bool = True, momentum: float | None = 0.1):
    super().__init__()
    self.num_features, self.eps, self.momentum, self.track_running_stats = num_features, eps, momentum, track_running_stats
    self.weight = _ones(num_features) if affine else None
    self.bias = _zeros(num_features) if affine else None
    if track_running_stats:
      self.register_buffer("running_mean", own_memory(Tensor.zeros(num_features)))
      self.register_buffer("running_var", own_memory(Tensor.ones(num_features)))
      # 0-d, as torch's: its state dicts load as they are
      self.register_buffer("num_batches_tracked", own_memory(Tensor.zeros((), dtype=dtypes.int64)))
  def forward(self, x: Tensor) -> Tensor:
    axes = (0, *range(2, x.ndim))
    if self.training or not self.track_running_stats:
      mean = x.mean(axes)
      var = (x - mean.reshape(1, -1, *(1,) * (x.ndim - 2))).square().mean(axes)
      if self.training and self.track_running_stats:
        n = x.numel() // x.shape[1]
        count = self.num_batches_tracked.assign(self.num_batches_tracked + 1)
        f = self.momentum if self.momentum is not None else 1 / count.cast(dtypes.float32)  # (None: the cumulative average)
        self.running_mean.assign((1 - f) * self.running_mean + f * mean.detach())
        self.running_var.assign((1 - f) * self.running_var + f * (n / max(n - 1, 1)) * var.detach())
    else: mean, var = self.running_mean, self.running_var
    return x.batchnorm(self.weight, self.bias, mean, (var + self.eps).rsqrt())

class BatchNorm2d(BatchNorm):
  """torch's argument order: (num_features, eps, momentum, affine, track_running_stats)."""
  def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True, track_running_stats: bool = True):
    super().__init__(num_features, eps, affine, track_running_stats, momentum)
class BatchNorm1d(BatchNorm2d): pass
class BatchNorm3d(BatchNorm2d): pass

class LayerNorm(Module):
  def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True):
    super().__init__()
    self.normalized_shape = _tuple(normalized_shape, 1)
    self.eps = eps
    self.weight = _ones(*self.normalized_shape) if elementwise_affine else None
    self.bias = _zeros(*self.normalized_shape) if elementwise_affine and bias else None
  def forward(self, x: Tensor) -> Tensor:
    if x.shape[-len(self.normalized_shape):] != self.normalized_shape:
      raise ArgumentError(f"LayerNorm over {self.normalized_shape} got input of shape {x.shape}")
    return functional._layer_norm(x, self.weight, self.bias, len(self.normalized_shape), self.eps)

class GroupNorm(Module):
  def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
    super().__init__()
    if num_channels % num_groups: raise ArgumentError(f"{num_channels} channels can't be split into {num_groups} groups")
    self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
    self.weight = _ones(num_channels) if affine else None
    self.bias = _zeros(num_channels) if affine else None
  def forward(self, x: Tensor) -> Tensor:
    y = x.reshape(x.shape[0], self.num_groups, -1).layernorm(-1, self.eps).reshape(x.shape)
    if self.weight is None: return y
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return y * self.weight.reshape(shape) + self.bias.reshape(shape)

# machine epsilon: torch's RMSNorm adds it when no eps is given
_FLOAT_EPS = {dtypes.float16: 2.0 ** -10, dtypes.bfloat16: 2.0 ** -7, dtypes.float32: 2.0 ** -23, dtypes.float64: 2.0 ** -52}

class RMSNorm(Module):
  """torch.nn.RMSNorm: over the trailing normalized_shape axes; eps=None means the input dtype's machine epsilon, as in torch."""
  def __init__(self, normalized_shape: int | Sequence[int], eps: float | None = None, elementwise_affine: bool = True):
    super().__init__()
    self.normalized_shape, self.eps = _tuple(normalized_shape, 1), eps
    self.weight = _ones(*self.normalized_shape) if elementwise_affine else None
  def forward(self, x: Tensor) -> Tensor:
    if x.shape[-len(self.normalized_shape):] != self.normalized_shape:
      raise ArgumentError(f"RMSNorm over {self.normalized_shape} got input of shape {x.shape}")
    eps = self.eps if self.eps is not None else _FLOAT_EPS.get(x.dtype, _FLOAT_EPS[dtypes.float32])
    return functional._rms_norm(x, self.weight, len(self.normalized_shape), eps)

class Embedding(Module):
  """torch.nn.Embedding; padding_idx's row starts at zero and gets no gradient, as in torch."""
  def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None, _weight: Tensor | None = None):
    super().__init__()
    if padding_idx is not None and not -num_embeddings <= padding_idx < num_embeddings:
      raise ArgumentError(f"padding_idx {padding_idx} is out of range for {num_embeddings} embeddings")
    self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
    self.padding_idx = None if padding_idx is None else padding_idx % num_embeddings
    w = Tensor.randn(num_embeddings, embedding_dim) if _weight is None else _weight
    if self.padding_idx is not None: w = (Tensor.arange(num_embeddings).unsqueeze(1) == self.padding_idx).where(0.0, w)
    self.weight = Parameter(w.contiguous())
  def forward(self, idx: Tensor) -> Tensor: return functional.embedding(idx, self.weight, self.padding_idx)
  @classmethod
  def from_pretrained(cls, embeddings: Tensor, freeze: bool = True, padding_idx: int | None = None) -> Embedding:
    if embeddings.ndim != 2: raise ArgumentError(f"from_pretrained needs a 2-D weight, got shape {embeddings.shape}")
    m = cls(*embeddings.shape, padding_idx=padding_idx, _weight=embeddings)
    m.weight.requires_grad = not freeze
    return m

def _ones(*shape: int) -> Parameter: return Parameter(Tensor.ones(*shape).contiguous())
def _zeros(*shape: int) -> Parameter: return Parameter(Tensor.zeros(*shape).contiguous())

class MultiheadAttention(Module):
  """torch.nn.MultiheadAttention: the same parameters (in_proj_weight, in_proj_bias, out_proj.weight/.bias, or
  q/k/v_proj_weight when kdim/vdim differ from embed_dim) and the same values given the same weights. A bool attn_mask
  or key_padding_mask marks with True the positions NOT attended (torch's MHA convention, unlike sdpa's)."""
  def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True, add_bias_kv: bool = False,
               add_zero_attn: bool = False, kdim: int | None = None, vdim: int | None = None, batch_first: bool = False):
    super().__init__()
    if embed_dim % num_heads: raise ArgumentError(f"embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
    if add_bias_kv or add_zero_attn: raise NotImplementedError("MultiheadAttention: add_bias_kv and add_zero_attn")
    self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
    self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
    self.head_dim = embed_dim // num_heads
    self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
    xavier = lambda *shape: Parameter(Tensor.glorot_uniform(*shape).contiguous())
    if self._qkv_same_embed_dim: self.in_proj_weight = xavier(3 * embed_dim, embed_dim)
    else:
      self.q_proj_weight, self.k_proj_weight = xavier(embed_dim, embed_dim), xavier(embed_dim, self.kdim)
      self.v_proj_weight = xavier(embed_dim, self.vdim)
    self.in_proj_bias = _zeros(3 * embed_dim) if bias else None
    self.out_proj = Linear(embed_dim, embed_dim, bias=bias)
    if bias: self.out_proj.bias = _zeros(embed_dim)
  def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None, need_weights: bool = True,
              attn_mask: Tensor | None = None, average_attn_weights: bool = True, is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
    batched = query.ndim == 3
    if not batched: query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
    elif not self.batch_first: query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
    B, L, E = query.shape
    S, H, D = key.shape[1], self.num_heads, self.head_dim
    if E != self.embed_dim: raise ArgumentError(f"MultiheadAttention of embed_dim {self.embed_dim} got a query of shape {query.shape}")
    if self._qkv_same_embed_dim: wq, wk, wv = self.in_proj_weight.chunk(3, 0)
    else: wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
    bq, bk, bv = self.in_proj_bias.chunk(3, 0) if self.in_proj_bias is not None else (None, None, None)
    heads = lambda x, n: x.reshape(B, n, H, D).transpose(1, 2)  # (B, H, n, D)
    q, k, v = heads(query.linear(wq, bq), L), heads(key.linear(wk, bk), S), heads(value.linear(wv, bv), S)
    scores = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(D))
    if attn_mask is None and is_causal: attn_mask = Tensor.ones(L, S, dtype=dtypes.bool, device=query.device).triu(1)
    for mask, shape in ((attn_mask, None), (key_padding_mask, (B, 1, 1, S))):
      if mask is None: continue
      if shape is None: mask = mask.reshape(B, H, L, S) if mask.ndim == 3 else mask
      elif mask.ndim == 1: mask = mask.reshape(1, 1, 1, S)  # an unbatched query's key_padding_mask
      else: mask = mask.reshape(shape)
      scores = mask.where(-math.inf, scores) if mask.dtype == dtypes.bool else scores + mask
    weights = scores.softmax(-1)
    if self.dropout > 0 and self.training: weights = weights.dropout(self.dropout)
    out = (weights @ v).transpose(1, 2).reshape(B, L, E)
    out = self.out_proj(out)
    if not batched: out = out.squeeze(0)
    elif not self.batch_first: out = out.transpose(0, 1)
    if not need_weights: return out, None
    w = weights.mean(1) if average_attn_weights else weights
    return out, (w if batched else w.squeeze(0))

# after the layers: these import from nn (as `from attograd import nn` then nn.init works, as in tinygrad)
from attograd.nn import init, utils, state  # noqa: E402

def __getattr__(name: str) -> Any:
  # imported on first use, as `from attograd import nn` then nn.optim.SGD (tinygrad's nn.datasets.mnist()): the optimizers
  # and their schedulers (0.6 MiB resident) aren't needed to run a model, nor the datasets (they pull in http and zlib)
  if name == "datasets":
    import attograd.nn.datasets as datasets
    return datasets
  if name == "optim":
    import attograd.nn.optim as optim
    return optim
  raise AttributeError(f"module 'attograd.nn' has no attribute {name!r}")
