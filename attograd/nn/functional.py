"""torch.nn.functional's names and arguments over Tensor methods: `import attograd.nn.functional as F`.
Axes are passed to Tensor methods by position, so these work whatever the methods call them (axis= or dim=)."""
from __future__ import annotations
import math
from typing import Any, Sequence
from attograd.errors import ArgumentError  # a ValueError and a RuntimeError: code written for torch catches it
from attograd.tensor import Tensor
from attograd.dtype import DType, dtypes
from attograd.frontend.replay import replayed

def _check_range(idx: Tensor, hi: int, what: str, ignore: int | None = None) -> None:
  """IndexError for index values outside [0, hi) (other than ignore), as torch raises: now when idx is in memory, else
  at the next realize (a check the kernels run, frontend/indexing.py), under TinyJit at every replay."""
  idx._check_index_values(idx, 0, hi, what, ignore)

# ***** activations *****

def relu(input: Tensor, inplace: bool = False) -> Tensor: return input.relu()
def relu6(input: Tensor, inplace: bool = False) -> Tensor: return input.relu6()
def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor: return input.leaky_relu(negative_slope)
def gelu(input: Tensor, approximate: str = "none") -> Tensor: return input.gelu(approximate)
def silu(input: Tensor, inplace: bool = False) -> Tensor: return input.silu()
def mish(input: Tensor, inplace: bool = False) -> Tensor: return input.mish()
def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor: return input.elu(alpha)
def selu(input: Tensor, inplace: bool = False) -> Tensor: return input.selu()
def celu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor: return input.celu(alpha)
def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor: return input.softplus(beta, threshold)
def softsign(input: Tensor) -> Tensor: return input.softsign()
def hardswish(input: Tensor, inplace: bool = False) -> Tensor: return input.hardswish()
def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor: return input.hardsigmoid()
def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor: return input.hardtanh(min_val, max_val)
def sigmoid(input: Tensor) -> Tensor: return input.sigmoid()
def tanh(input: Tensor) -> Tensor: return input.tanh()
def logsigmoid(input: Tensor) -> Tensor: return input.logsigmoid()
def glu(input: Tensor, dim: int = -1) -> Tensor:
  if input.shape[dim] % 2: raise ArgumentError(f"glu halves dim {dim}, of odd size {input.shape[dim]}")
  a, b = input.chunk(2, dim)
  return a * b.sigmoid()

def _softmax_dim(input: Tensor, dim: int | None) -> int:
  return dim if dim is not None else (0 if input.ndim in (0, 1, 3) else 1)  # torch's implicit choice when dim is None
def _cast(input: Tensor, dtype: DType | None) -> Tensor: return input if dtype is None else input.cast(dtype)
def softmax(input: Tensor, dim: int | None = None, dtype: DType | None = None) -> Tensor:
  return _cast(input, dtype).softmax(_softmax_dim(input, dim))
def log_softmax(input: Tensor, dim: int | None = None, dtype: DType | None = None) -> Tensor:
  return _cast(input, dtype).log_softmax(_softmax_dim(input, dim))
def softmin(input: Tensor, dim: int | None = None, dtype: DType | None = None) -> Tensor:
  return (-_cast(input, dtype)).softmax(_softmax_dim(input, dim))

# ***** losses *****

def _reduce(loss: Tensor, reduction: str) -> Tensor:
  if reduction == "mean": return loss.mean()
  if reduction == "sum": return loss.sum()
  if reduction == "none": return loss
  raise ArgumentError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")

def _check_reduction(reduction: str) -> None:
  if reduction not in ("mean", "sum", "none"): raise ArgumentError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")

def _class_view(v: Tensor, ndim: int) -> Tensor:
  """A (C,) per-class vector shaped to broadcast along axis 1 of an (N, C, ...) input (or axis 0 of a (C,) one)."""
  return v.reshape(-1, *(1,) * (ndim - 2)) if ndim > 1 else v

def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100, reduction: str = "mean") -> Tensor:
  """Negative log likelihood of log-probabilities input (N, C, ...) or (C,) at class indices target (N, ...) or ()."""
  _check_reduction(reduction)
  if dtypes.is_float(target.dtype): raise TypeError(f"nll_loss needs integer class indices, got {target.dtype}")
  cdim = 1 if input.ndim > 1 else 0
  if target.shape != input.shape[:cdim] + input.shape[cdim + 1:]:
    raise ArgumentError(f"nll_loss: target of shape {target.shape} doesn't match input of shape {input.shape}")
  n = input.shape[cdim]
  _check_range(target, n, "target", ignore_index)
  hit = target.unsqueeze(cdim) == _class_view(Tensor.arange(n, device=input.device), input.ndim)
  w = (hit.where(_class_view(weight, input.ndim), 0.0) if weight is not None else hit.cast(input.dtype)).sum(cdim)  # weight of each target
  w = target.ne(ignore_index).where(w, 0.0)
  loss = -(hit.where(input, 0.0).sum(cdim) * w)
  if reduction == "none": return loss
  return loss.sum() if reduction == "sum" else loss.sum() / w.sum()

def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average: Any = None, ignore_index: int = -100,
                  reduce: Any = None, reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
  """torch's cross_entropy of logits (N, C, ...) or (C,) against class indices or class probabilities."""
  _check_reduction(reduction)
  if not 0.0 <= label_smoothing <= 1.0: raise ArgumentError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
  cdim = 1 if input.ndim > 1 else 0
  n = input.shape[cdim]
  logp = input.log_softmax(cdim)
  wlogp = logp * _class_view(weight, input.ndim) if weight is not None else logp
  if dtypes.is_float(target.dtype):  # class probabilities: a mean is over the batch elements, whatever the weights
    if target.shape != input.shape: raise ArgumentError(f"cross_entropy: probabilities of shape {target.shape} for input of shape {input.shape}")
    loss = -(wlogp * (target * (1 - label_smoothing) + label_smoothing / n)).sum(cdim)
    return _reduce(loss, reduction)
  nll = nll_loss(logp, target, weight, ignore_index, "none")
  if label_smoothing == 0: loss = nll
  else:
    smooth = target.ne(ignore_index).where(-wlogp.sum(cdim), 0.0)
    loss = nll * (1 - label_smoothing) + smooth * (label_smoothing / n)
  if reduction != "mean": return _reduce(loss, reduction)
  valid = target.ne(ignore_index)
  if weight is None: return loss.sum() / valid.sum().cast(loss.dtype)
  hit = target.unsqueeze(cdim) == _class_view(Tensor.arange(n, device=input.device), input.ndim)
  return loss.sum() / valid.where(hit.where(_class_view(weight, input.ndim), 0.0).sum(cdim), 0.0).sum()

def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor: return _reduce((input - target).square(), reduction)
def l1_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor: return _reduce((input - target).abs(), reduction)
def smooth_l1_loss(input: Tensor, target: Tensor, reduction: str = "mean", beta: float = 1.0) -> Tensor:
  d = (input - target).abs()
  if beta == 0: return _reduce(d, reduction)
  # the square only sees the small ones: its slope 2d at d = inf would make 0 * inf = nan in the other branch. NaN takes
  # the square (torch's test is the other way round: a NaN difference gives a NaN gradient)
  small = (d >= beta).logical_not()
  return _reduce(small.where(0.5 * small.where(d, 0.0).square() / beta, d - 0.5 * beta), reduction)
def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0) -> Tensor:
  d = (input - target).abs()
  small = (d >= delta).logical_not()  # as smooth_l1_loss
  return _reduce(small.where(0.5 * small.where(d, 0.0).square(), delta * (d - 0.5 * delta)), reduction)

def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, reduction: str = "mean") -> Tensor:
  _check_reduction(reduction)
  loss = input.binary_crossentropy(target, reduction="none")
  return _reduce(loss * weight if weight is not None else loss, reduction)

def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Tensor | None = None, reduction: str = "mean",
                                     pos_weight: Tensor | None = None) -> Tensor:
  """(1 - y) x + (1 + (pw - 1) y) softplus(-x), the stable form of -[pw y log s(x) + (1 - y) log(1 - s(x))]."""
  _check_reduction(reduction)
  sp = (-input).maximum(0) + (1 + (-input.abs()).exp()).log()  # softplus(-x), finite for large |x|
  loss = (1 - target) * input + (sp if pos_weight is None else (1 + (pos_weight - 1) * target) * sp)
  return _reduce(loss * weight if weight is not None else loss, reduction)

def kl_div(input: Tensor, target: Tensor, reduction: str = "mean", log_target: bool = False) -> Tensor:
  if log_target: loss = target.exp() * (target - input)
  else:  # torch's xlogy(t, t) - t * input: 0 log 0 is 0, a negative or NaN target gives NaN
    loss = (target == 0).where(0.0, target * (target == 0).where(1.0, target).log()) - target * input
  if reduction == "batchmean": return loss.sum() / (input.shape[0] if input.ndim else 1)
  return _reduce(loss, reduction)

def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
  # torch's: each input divided by its norm (at least eps) first; a zero vector's norm passes no gradient
  return ((x1 / x1.norm(2, dim, True).clamp(min=eps)) * (x2 / x2.norm(2, dim, True).clamp(min=eps))).sum(dim)

# ***** layers as functions *****

def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor: return input.linear(weight, bias)
def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
  """torch's F.dropout: drops whenever training is True (its default), whatever Tensor.training says."""
  if not 0 <= p <= 1: raise ArgumentError(f"dropout probability {p} must be in [0, 1]")
  if not training or p == 0: return input
  if p == 1: return input * 0
  keep = Tensor.rand(*input.shape, device=input.device, dtype=dtypes.float32) >= p
  return keep.where(input * (1 / (1 - p)), 0)

def layer_norm(input: Tensor, normalized_shape: Sequence[int] | int, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
  shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
  if input.shape[input.ndim - len(shape):] != shape: raise ArgumentError(f"layer_norm over {shape} got input of shape {input.shape}")
  return _layer_norm(input, weight, bias, len(shape), eps)

@replayed
def _layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, dims: int, eps: float) -> Tensor:
  """x normalized over its last dims axes, times weight, plus bias (either may be None)"""
  y = x.layernorm(tuple(range(-dims, 0)), eps)
  if weight is not None: y = y * weight
  return y + bias if bias is not None else y

def rms_norm(input: Tensor, normalized_shape: Sequence[int] | int, weight: Tensor | None = None, eps: float | None = None) -> Tensor:
  shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
  eps = eps if eps is not None else {dtypes.float16: 2.0 ** -10, dtypes.bfloat16: 2.0 ** -7, dtypes.float64: 2.0 ** -52}.get(input.dtype, 2.0 ** -23)
  return _rms_norm(input, weight, len(shape), eps)

@replayed
def _rms_norm(x: Tensor, weight: Tensor | None, dims: int, eps: float) -> Tensor:
  """x over the root mean square of its last dims axes, times weight (None: none)"""
  y = x * (x.square().mean(tuple(range(-dims, 0)), keepdim=True) + eps).rsqrt()
  return y if weight is None else y * weight

def group_norm(input: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
  if input.shape[1] % num_groups: raise ArgumentError(f"{input.shape[1]} channels can't be split into {num_groups} groups")
  y = input.reshape(input.shape[0], num_groups, -1).layernorm(-1, eps).reshape(input.shape)
  shape = (1, -1) + (1,) * (input.ndim - 2)
  if weight is not None: y = y * weight.reshape(shape)
  return y + bias.reshape(shape) if bias is not None else y

def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None = None, bias: Tensor | None = None,
               training: bool = False, momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
  """Batch statistics when training (and then the running ones are updated in place, as torch does), else the running ones."""
  axes = (0, *range(2, input.ndim))
  if training:
    mean = input.mean(axes)
    var = (input - mean.reshape(1, -1, *(1,) * (input.ndim - 2))).square().mean(axes)
    n = input.numel() // input.shape[1]
    if running_mean is not None: running_mean.assign((1 - momentum) * running_mean + momentum * mean.detach())
    if running_var is not None: running_var.assign((1 - momentum) * running_var + momentum * (n / max(n - 1, 1)) * var.detach())
  else:
    if running_mean is None or running_var is None: raise ArgumentError("batch_norm outside training needs running_mean and running_var")
    mean, var = running_mean, running_var
  return input.batchnorm(weight, bias, mean, (var + eps).rsqrt())

def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None, max_norm: float | None = None, norm_type: float = 2.0,
              scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
  """Rows of weight picked by integer indices (the gradient of padding_idx's row is zero)."""
  if max_norm is not None or scale_grad_by_freq or sparse: raise NotImplementedError("embedding: max_norm, scale_grad_by_freq and sparse")
  if dtypes.is_float(input.dtype): raise TypeError(f"embedding indices must be integers, got {input.dtype}")
  _check_range(input, weight.shape[0], "embedding index")
  return _embedding_rows(input, weight, padding_idx)

@replayed
def _embedding_rows(input: Tensor, weight: Tensor, padding_idx: int | None) -> Tensor:
  n = weight.shape[0]
  rows = Tensor.arange(n, device=input.device)
  if padding_idx is not None: weight = (rows.unsqueeze(1) == padding_idx % n).where(weight.detach(), weight)
  hit = input.unsqueeze(-1) == rows
  return (hit.unsqueeze(-1).where(weight, 0.0)).sum(-2)

def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor: return tensor.one_hot(num_classes)

def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Tensor:
  return query.scaled_dot_product_attention(key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

def pad(input: Tensor, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> Tensor:
  return input.pad(tuple(pad), 0 if value is None else value, mode)

def conv1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1, groups: int = 1) -> Tensor:
  return input.conv2d(weight, bias, groups, stride, dilation, padding)
conv2d = conv3d = conv1d
def conv_transpose1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, output_padding=0, groups: int = 1, dilation=1) -> Tensor:
  return input.conv_transpose2d(weight, bias, groups, stride, dilation, padding, output_padding)
conv_transpose2d = conv_transpose3d = conv_transpose1d

def _max_pool(n: int, input: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False, return_indices: bool = False) -> Tensor:
  return input._max_pool(n, kernel_size, stride, dilation, padding, ceil_mode, return_indices)
def max_pool1d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False, return_indices: bool = False) -> Tensor:
  return _max_pool(1, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)
def max_pool2d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False, return_indices: bool = False) -> Tensor:
  return _max_pool(2, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)
def max_unpool1d(input: Tensor, indices: Tensor, kernel_size, stride=None, padding=0, output_size=None) -> Tensor:
  return input._max_unpool(1, indices, kernel_size, stride, 1, padding, output_size)
def max_unpool2d(input: Tensor, indices: Tensor, kernel_size, stride=None, padding=0, output_size=None) -> Tensor:
  return input._max_unpool(2, indices, kernel_size, stride, 1, padding, output_size)
def max_unpool3d(input: Tensor, indices: Tensor, kernel_size, stride=None, padding=0, output_size=None) -> Tensor:
  return input._max_unpool(3, indices, kernel_size, stride, 1, padding, output_size)
def max_pool3d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False, return_indices: bool = False) -> Tensor:
  return _max_pool(3, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)
def _avg_pool(n: int, input: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True,
              divisor_override: int | None = None) -> Tensor:
  if divisor_override is not None:
    k = (kernel_size,) * n if isinstance(kernel_size, int) else tuple(kernel_size)
    return getattr(input, f"avg_pool{n}d")(kernel_size, stride, 1, padding, ceil_mode, True) * (math.prod(k) / divisor_override)
  return getattr(input, f"avg_pool{n}d")(kernel_size, stride, 1, padding, ceil_mode, count_include_pad)
def avg_pool1d(input: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
  return _avg_pool(1, input, kernel_size, stride, padding, ceil_mode, count_include_pad)
def avg_pool2d(input: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True, divisor_override=None) -> Tensor:
  return _avg_pool(2, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
def avg_pool3d(input: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True, divisor_override=None) -> Tensor:
  return _avg_pool(3, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)

def _adaptive_matrix(n_in: int, n_out: int, device: str) -> Tensor:
  """(n_in, n_out) averaging weights: output i averages inputs floor(i n_in / n_out) .. ceil((i+1) n_in / n_out) - 1, torch's windows."""
  rows = [[0.0] * n_out for _ in range(n_in)]
  for o in range(n_out):
    lo, hi = (o * n_in) // n_out, -(-((o + 1) * n_in) // n_out)
    for i in range(lo, hi): rows[i][o] = 1.0 / (hi - lo)
  return Tensor(rows, device=device)
def adaptive_avg_pool1d(input: Tensor, output_size: int) -> Tensor: return adaptive_avg_pool2d(input.unsqueeze(-2), (1, output_size)).squeeze(-2)
def adaptive_avg_pool2d(input: Tensor, output_size: int | Sequence[int | None]) -> Tensor:
  """Each spatial axis averaged by one matmul with a fixed (in, out) matrix of torch's windows."""
  sizes = (output_size,) * 2 if isinstance(output_size, int) else tuple(output_size)
  x = input
  for ax, o in zip((-2, -1), sizes):
    if o is None or o == x.shape[ax]: continue
    m = _adaptive_matrix(x.shape[ax], o, x.device).cast(x.dtype)
    x = (x.transpose(ax, -1) @ m).transpose(ax, -1)
  return x

def interpolate(input: Tensor, size=None, scale_factor=None, mode: str = "nearest", align_corners: bool | None = None,
                recompute_scale_factor: bool | None = None, antialias: bool = False) -> Tensor:
  if antialias: raise NotImplementedError("interpolate with antialias=True")
  if recompute_scale_factor and scale_factor is not None:  # torch then resizes to the floor of the scaled size, as if given as size
    sf = scale_factor if isinstance(scale_factor, (list, tuple)) else (scale_factor,) * (input.ndim - 2)
    size, scale_factor = [int(math.floor(n * s)) for n, s in zip(input.shape[2:], sf)], None
  return input.interpolate(size, scale_factor, mode, align_corners)
def upsample(input: Tensor, size=None, scale_factor=None, mode: str = "nearest", align_corners: bool | None = None) -> Tensor:
  return interpolate(input, size, scale_factor, mode, align_corners)

def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
  """input / max(||input||_p along dim, eps)."""
  return input / input.norm(p, dim, True).clamp(min=eps)  # Tensor.norm: a zero vector's norm passes no gradient, as torch

def unfold(input: Tensor, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
  """torch's im2col: (N, C, H, W) -> (N, C*kh*kw, L), each column one window (channel-major, then kernel row, column),
  the windows in row-major order; an unbatched (C, H, W) gives (C*kh*kw, L)."""
  if input.ndim == 3: return unfold(input.unsqueeze(0), kernel_size, dilation, padding, stride).squeeze(0)
  if input.ndim != 4: raise ArgumentError(f"unfold takes a 3-D or 4-D input, got shape {input.shape}")
  kernel, dil, st = Tensor._tuple(kernel_size, 2, "kernel_size"), Tensor._tuple(dilation, 2, "dilation"), Tensor._tuple(stride, 2, "stride")
  pad = Tensor._tuple(padding, 2, "padding")
  w = input.pad(((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))._pool(kernel, st, dil)  # (N, C, oh, ow, kh, kw)
  n, c, oh, ow = w.shape[:4]
  return w.permute(0, 1, 4, 5, 2, 3).reshape(n, c * kernel[0] * kernel[1], oh * ow)

def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:
  *b, c, h, w = input.shape
  r = upscale_factor
  if c % (r * r): raise ArgumentError(f"pixel_shuffle: {c} channels is not divisible by {r}^2")
  x = input.reshape(*b, c // (r * r), r, r, h, w)
  n = len(b)
  return x.permute(*range(n), n, n + 3, n + 1, n + 4, n + 2).reshape(*b, c // (r * r), h * r, w * r)
