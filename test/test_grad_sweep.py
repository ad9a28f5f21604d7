"""Forward values and gradients of every differentiable op against torch at ordinary and special points (issue 16):
0 and -0, +-1, the edges of domains (sqrt/log at 0, acos at +-1), kinks and ties (abs, relu, clamp, max), large
magnitudes, +-inf and NaN. PyTorch's value wins: where torch gives NaN we must give NaN, where it gives 0 we must too.

Every public Tensor method and nn.functional function is named here: in a sweep table, or in NOT_DIFFERENTIABLE /
ELSEWHERE with the reason. A new op without an entry fails test_every_op_is_accounted_for.
ATTOGRAD_FULL_GRADS=1 adds denser grids (more points, every pair of the binary grid with more values)."""
from __future__ import annotations
import math, os
from typing import Any, Callable
import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from attograd import Tensor
import attograd.nn.functional as F

FULL = os.getenv("ATTOGRAD_FULL_GRADS") == "1"
inf, nan = math.inf, math.nan

# the points every unary op is taken at: ordinary ones, the special ones, and the largest float32 magnitudes
POINTS = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 0.25, 2.0, -2.0, 3.0, -3.0, 6.0, 1e-6, -1e-6, 1e-30, 10.0, -10.0, 20.0, -20.0,
          30.0, 88.0, -88.0, 100.0, -100.0, 300.0, -300.0, 400.0, -400.0, 1e10, -1e10, 3e38, -3e38, inf, -inf, nan]
if FULL: POINTS += [float(v) for v in np.linspace(-8, 8, 97)] + [1e-3, -1e-3, 0.999, -0.999, 1.001, -1.001, 5e-39, 87.0, 89.0, 1e20]

def _compare(what: str, ours: np.ndarray, ref32: np.ndarray, ref64: np.ndarray, x: Any, rtol: float, atol: float) -> None:
  """ours against torch's float32 result; where that is only rounding away from the float64 result, against that.
  NaN must meet NaN, an infinity the same infinity; finite values within tolerance."""
  ours, ref64 = np.asarray(ours, np.float64), np.asarray(ref64, np.float64)
  def close(ref):
    ref = np.asarray(ref, np.float64)
    both_nan = np.isnan(ours) & np.isnan(ref)
    with np.errstate(invalid="ignore"):
      near = np.isfinite(ours) & np.isfinite(ref) & (np.abs(ours - ref) <= atol + rtol * np.abs(ref))
    return both_nan | (ours == ref) | near
  ok = close(ref32) | close(ref64.astype(np.float32))
  if not ok.all():
    bad = np.flatnonzero(~ok)[:8]
    xs = [tuple(np.asarray(v).reshape(-1)[i] for v in x) if isinstance(x, tuple) else np.asarray(x).reshape(-1)[i] for i in bad]
    raise AssertionError(f"{what}: at {xs} ours {ours.reshape(-1)[bad]} torch {np.asarray(ref32).reshape(-1)[bad]}")

def _run(fa: Callable, ft: Callable, data: list[np.ndarray], rtol: float, atol: float, grad_rtol: float, grad_atol: float,
         upstream: np.ndarray | None = None, forward_only: bool = False) -> None:
  """f's value and the gradient of sum(f * upstream) with respect to every input, against torch in float32 and float64."""
  ours = [Tensor(d.astype(np.float32), requires_grad=True) for d in data]
  out = fa(*ours)
  refs = {}
  for tdt in (torch.float32, torch.float64):
    ts = [torch.tensor(d, dtype=tdt, requires_grad=True) for d in data]
    o = ft(*ts)
    if forward_only: o = o.detach().requires_grad_()
    w = torch.ones_like(o) if upstream is None else torch.tensor(upstream, dtype=tdt)
    gs = [None] * len(ts) if forward_only else torch.autograd.grad(o, ts, grad_outputs=w, allow_unused=True)
    refs[tdt] = (o.detach().numpy(), [np.zeros_like(d) if g is None else g.numpy() for d, g in zip(data, gs)])
  w = Tensor.ones(*out.shape) if upstream is None else Tensor(upstream.astype(np.float32))
  grads = out.gradient(*ours, gradient=w)
  Tensor.realize_all([out, *grads])
  x = tuple(data) if len(data) > 1 else data[0]
  assert out.shape == tuple(refs[torch.float32][0].shape), f"shape {out.shape} vs torch {refs[torch.float32][0].shape}"
  _compare("value", out.numpy(), refs[torch.float32][0], refs[torch.float64][0], x, rtol, atol)
  for i, g in enumerate([] if forward_only else grads):
    _compare(f"gradient {i}", g.numpy(), refs[torch.float32][1][i], refs[torch.float64][1][i], x, grad_rtol, grad_atol)

# ***** unary elementwise ops: name -> (attograd, torch); None means the same spelling works on both *****
def _m(name: str, *args, **kw) -> Callable: return lambda x: getattr(x, name)(*args, **kw)
def _tf(name: str, *args, **kw) -> Callable: return lambda x: getattr(TF, name)(x, *args, **kw)
UNARY: dict[str, tuple[Callable, Callable | None]] = {
  **{n: (_m(n), None) for n in ("abs", "neg", "exp", "exp2", "log", "log2", "log10", "log1p", "expm1", "sqrt", "rsqrt", "reciprocal",
                                "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
                                "sigmoid", "relu", "erf", "erfc", "square", "sign", "floor", "ceil", "round", "trunc",
                                "arcsin", "arccos", "arctan", "arcsinh", "arccosh", "arctanh")},
  **{n: (_m(n), _tf(n)) for n in ("relu6", "hardtanh", "hardsigmoid", "hardswish", "elu", "celu", "selu", "silu", "gelu",
                                  "mish", "softsign", "logsigmoid", "softplus")},
  "swish": (_m("swish"), TF.silu), "gelu_tanh": (_m("gelu", "tanh"), _tf("gelu", approximate="tanh")),
  "quick_gelu": (_m("quick_gelu"), lambda x: x * torch.sigmoid(1.702 * x)),
  "leaky_relu": (_m("leaky_relu", 0.1), _tf("leaky_relu", 0.1)), "elu_a": (_m("elu", 0.5), _tf("elu", 0.5)),
  "celu_a": (_m("celu", 2.0), _tf("celu", 2.0)), "softplus_b": (_m("softplus", 2.0, 5.0), _tf("softplus", 2.0, 5.0)),
  "hardtanh_b": (_m("hardtanh", -2.0, 0.5), _tf("hardtanh", -2.0, 0.5)),
  "clamp": (_m("clamp", -1.0, 1.0), None), "clamp_min": (_m("clamp", min=0.0), None), "clamp_max": (_m("clamp", max=0.5), None),
  "clip": (_m("clip", -0.5, 2.0), None),
  **{f"pow{e}": (lambda x, e=e: x ** e, None) for e in (0, 1, 2, 3, -1, -2, 0.5, -0.5, 1.5, 2.5, 0.0, 2.0, -3.0)},
  "rpow2": (lambda x: 2.0 ** x, None), "rpow_half": (lambda x: 0.5 ** x, None), "rpow0": (lambda x: 0.0 ** x, None),
  "rpow_neg": (lambda x: (-2.0) ** x, None),
  "add_c": (lambda x: x + 2, None), "rsub_c": (lambda x: 1 - x, None), "mul_c": (lambda x: x * -3, None),
  "div_c": (lambda x: x / 4, None), "rdiv_c": (lambda x: 1 / x, None), "rdiv_neg": (lambda x: -2 / x, None),
  "max_c": (lambda x: x.maximum(0.5), lambda x: torch.maximum(x, torch.tensor(0.5, dtype=x.dtype))),
  "min_c": (lambda x: x.minimum(-1.0), lambda x: torch.minimum(x, torch.tensor(-1.0, dtype=x.dtype))),
  "copysign_c": (lambda x: x.copysign(-1.0), lambda x: torch.copysign(x, torch.tensor(-1.0, dtype=x.dtype))),
  "fmod_c": (lambda x: x.fmod(1.5), lambda x: torch.fmod(x, 1.5)), "mod_c": (lambda x: x % 1.5, None),
  "floordiv_c": (lambda x: x // 1.5, None),
  "lerp_c": (lambda x: x.lerp(x * 0 + 2.0, 0.25), lambda x: torch.lerp(x, x * 0 + 2.0, 0.25)),
  "isclose_w": (lambda x: x * x.isclose(x * 0 + 1.0).float(), lambda x: x * torch.isclose(x, x * 0 + 1.0).float()),
  "cast_f16": (lambda x: x.half().float(), None), "cast_f64": (lambda x: x.double().float(), None),
  "contiguous": (lambda x: x.contiguous() * 2, None), "clone": (lambda x: x.clone() * 2, None),
  "nan_to_num": (_m("nan_to_num"), None),
}
UNARY_TOL = {"erf": 2e-6, "erfc": 2e-6, "gelu": 2e-6, "tan": 1e-5}
# known differences in VALUES (not gradients), kept out of the points with the reason: float fmod/mod are x - trunc(x/y)*y,
# exact only while x/y keeps its integer part in float32's 24 bits (torch's fmod is exact for every x)
MAX_MAGNITUDE = {"fmod_c": 1e6, "mod_c": 1e6, "floordiv_c": 1e6}
FORWARD_ONLY = {"floordiv_c"}  # torch has no derivative for floor_divide (ours is 0)
# torch's own gradient at a NaN input of these piecewise ops is 0 or 1 depending on whether its vectorized loop or its
# scalar tail handles the element (it changes with the tensor's length): ours is the scalar loop's; NaN isn't swept
NAN_GRAD_EITHER = {"relu6", "hardtanh", "hardtanh_b", "hardswish", "elu", "celu", "selu", "elu_a", "celu_a"}

@pytest.mark.parametrize("name", list(UNARY))
def test_unary(name: str) -> None:
  fa, ft = UNARY[name]
  tol = UNARY_TOL.get(name, 1e-6)
  pts = np.array([p for p in POINTS if not abs(p) > MAX_MAGNITUDE.get(name, inf) and not (name in NAN_GRAD_EITHER and math.isnan(p))],
                 np.float64)
  _run(fa, ft or fa, [pts], rtol=1e-4, atol=tol, grad_rtol=1e-4, grad_atol=tol, forward_only=name in FORWARD_ONLY)

# ***** binary ops, on every pair of a grid of special values (equal inputs are ties, tiny divisors overflow) *****
GRID = [0.0, -0.0, 1.0, -1.0, 0.5, -2.0, 3.0, 1e-20, -1e-30, 300.0, inf, -inf, nan]
if FULL: GRID += [2.0, -0.5, 1e-6, 1e10, -1e10, 88.0, -100.0, 1e-38]
BINARY: dict[str, tuple[Callable, Callable | None]] = {
  "add": (lambda a, b: a + b, None), "sub": (lambda a, b: a - b, None), "mul": (lambda a, b: a * b, None),
  "div": (lambda a, b: a / b, None), "pow": (lambda a, b: a ** b, None), "maximum": (lambda a, b: a.maximum(b), torch.maximum),
  "minimum": (lambda a, b: a.minimum(b), torch.minimum), "copysign": (lambda a, b: a.copysign(b), torch.copysign),
  "fmod": (lambda a, b: a.fmod(b), torch.fmod), "mod": (lambda a, b: a % b, None),
  "remainder": (lambda a, b: a.remainder(b), torch.remainder),
  "addcmul": (lambda a, b: a.addcmul(a, b, value=0.5), lambda a, b: torch.addcmul(a, a, b, value=0.5)),
  "mul_add": (lambda a, b: a.mul_add(b, a), lambda a, b: a * b + a),
  "addcdiv": (lambda a, b: a.addcdiv(a, b, value=0.5), lambda a, b: torch.addcdiv(a, a, b, value=0.5)),
  "logaddexp": (lambda a, b: a.logaddexp(b), torch.logaddexp),
  "lerp": (lambda a, b: a.lerp(b, 0.25), lambda a, b: torch.lerp(a, b, 0.25)),
  "lerp_w": (lambda a, b: (a * 0 + 1).lerp(a * 0 + 3, b), lambda a, b: torch.lerp(a * 0 + 1, a * 0 + 3, b)),
  "where": (lambda a, b: (a > b).where(a, b), lambda a, b: torch.where(a > b, a, b)),
  "where_ge": (lambda a, b: (a >= b).where(a * b, b), lambda a, b: torch.where(a >= b, a * b, b)),
  "clamp_t": (lambda a, b: a.clamp(b, b + 1), lambda a, b: torch.clamp(a, b, b + 1)),
  "clamp_min_t": (lambda a, b: a.clamp(min=b), lambda a, b: torch.clamp(a, min=b)),
  "max_t": (lambda a, b: a.max(b), lambda a, b: a.max(b)), "min_t": (lambda a, b: a.min(b), lambda a, b: a.min(b)),
  "max_stack": (lambda a, b: Tensor.stack(a, b).max(axis=0), lambda a, b: torch.stack([a, b]).amax(0)),
  "min_stack": (lambda a, b: Tensor.stack(a, b).min(axis=0), lambda a, b: torch.stack([a, b]).amin(0)),
  "hypot_like": (lambda a, b: (a * a + b * b).sqrt(), lambda a, b: (a * a + b * b).sqrt()),
  "mse": (lambda a, b: F.mse_loss(a, b, reduction="none"), lambda a, b: TF.mse_loss(a, b, reduction="none")),
  "l1": (lambda a, b: F.l1_loss(a, b, reduction="none"), lambda a, b: TF.l1_loss(a, b, reduction="none")),
  "smooth_l1": (lambda a, b: F.smooth_l1_loss(a, b, reduction="none"), lambda a, b: TF.smooth_l1_loss(a, b, reduction="none")),
  "huber": (lambda a, b: F.huber_loss(a, b, reduction="none"), lambda a, b: TF.huber_loss(a, b, reduction="none")),
}
BINARY_MAX_MAGNITUDE = {"fmod": 1e6, "mod": 1e6, "remainder": 1e6}  # the values' known limit, as MAX_MAGNITUDE
SUBNORMAL_FLUSHED = {"fmod", "mod", "remainder"}  # torch's vectorized fmod flushes a subnormal divisor to 0 (nan); ours divides by it

@pytest.mark.parametrize("name", list(BINARY))
def test_binary(name: str) -> None:
  fa, ft = BINARY[name]
  g = np.array([v for v in GRID if not abs(v) > BINARY_MAX_MAGNITUDE.get(name, inf) and not (name in SUBNORMAL_FLUSHED and 0 < abs(v) < 1.2e-38)],
               np.float64)
  a, b = np.repeat(g, len(g)), np.tile(g, len(g))
  if name in BINARY_MAX_MAGNITUDE:  # and quotients past float32's integers, the same limit of x - trunc(x/y)*y
    with np.errstate(all="ignore"): keep = ~(np.isfinite(a) & np.isfinite(b) & (np.abs(a / b) > 2.0 ** 23))
    a, b = a[keep], b[keep]
  _run(fa, ft or fa, [a, b], rtol=1e-4, atol=1e-6, grad_rtol=1e-4, grad_atol=1e-6)

# ***** reductions, softmax, norms and scans, over rows that hold the special cases: zeros (norms and prod at 0), ties
# (max, sort), one and two zeros (prod), -inf (softmax's masked entries; a row of them), inf, NaN, large and tiny *****
ROWS = [[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0], [2.0, 2.0, 1.0, 2.0], [0.0, 1.0, -2.0, 3.0], [0.0, 0.0, 2.0, -3.0],
        [-inf, 1.0, 2.0, 3.0], [-inf, -inf, -inf, -inf], [inf, 1.0, 2.0, 3.0], [nan, 1.0, 2.0, 3.0],
        [400.0, -400.0, 300.0, 0.0], [1e-20, -1e-20, 0.0, 1e-30], [-1.0, -1.0, -1.0, -1.0]]
if FULL: ROWS += [[inf, inf, 1.0, 0.0], [-inf, inf, 0.0, 1.0], [nan, nan, nan, nan], [3e38, 3e38, -3e38, 1.0], [5.0, 5.0, 5.0, -5.0]]
REDUCE: dict[str, tuple[Callable, Callable | None]] = {
  "sum": (lambda x: x.sum(-1), None), "sum_all": (lambda x: x.sum(), None), "mean": (lambda x: x.mean(-1), None),
  "prod": (lambda x: x.prod(-1), None), "prod_all": (lambda x: x[:5].prod(), None),
  "amax": (lambda x: x.amax(-1), None), "amin": (lambda x: x.amin(-1), None), "amax_all": (lambda x: x.amax(), None),
  "max_dim": (lambda x: x.max(-1).values, None), "min_dim": (lambda x: x.min(-1).values, None), "max_all": (lambda x: x.max(), None),
  "var": (lambda x: x.var(-1), None), "var_biased": (lambda x: x.var(-1, unbiased=False), None), "std": (lambda x: x.std(-1), None),
  "std_biased": (lambda x: x.std(dim=-1, unbiased=False), None),
  "norm2": (lambda x: x.norm(dim=-1), None), "norm1": (lambda x: x.norm(1, dim=-1), None),
  "norm_inf": (lambda x: x.norm(inf, dim=-1), None), "norm3": (lambda x: x.norm(3, dim=-1), None),
  "norm_all": (lambda x: x[1:3].norm(), None), "norm_zero_all": (lambda x: x[1:2].norm(), None),
  "logsumexp": (lambda x: x.logsumexp(-1), None), "softmax": (lambda x: x.softmax(-1), None),
  "log_softmax": (lambda x: x.log_softmax(-1), None), "softmax0": (lambda x: x.softmax(0), None),
  "softmin": (lambda x: F.softmin(x, -1), lambda x: TF.softmin(x, -1)),
  "cumsum": (lambda x: x.cumsum(-1), None), "cumprod": (lambda x: x.cumprod(-1), None),
  "cummax": (lambda x: x.cummax(-1)[0], lambda x: x.cummax(-1).values), "cummin": (lambda x: x.cummin(-1)[0], lambda x: x.cummin(-1).values),
  "logcumsumexp": (lambda x: x.logcumsumexp(-1), None),
  "sort": (lambda x: x.sort(-1)[0], lambda x: x.sort(-1).values), "topk": (lambda x: x.topk(2, -1)[0], lambda x: x.topk(2, -1).values),
  "median": (lambda x: x.median(-1)[0], lambda x: x.median(-1).values),
  "normalize": (lambda x: F.normalize(x, dim=-1), lambda x: TF.normalize(x, dim=-1)),
  "normalize1": (lambda x: F.normalize(x, p=1, dim=-1), lambda x: TF.normalize(x, p=1, dim=-1)),
  "layer_norm": (lambda x: F.layer_norm(x, (4,)), lambda x: TF.layer_norm(x, (4,))),
  "rms_norm": (lambda x: F.rms_norm(x, (4,)), lambda x: TF.rms_norm(x, (4,))),
  "cosine_similarity": (lambda x: F.cosine_similarity(x, x.flip(-1) + 1, dim=-1), lambda x: TF.cosine_similarity(x, x.flip(-1) + 1, dim=-1)),
  "glu": (lambda x: F.glu(x, -1), lambda x: TF.glu(x, -1)),
  "cross_entropy": (lambda x: F.cross_entropy(x, Tensor([1, 2, 0, 3] * 5)[:x.shape[0]], reduction="none"),
                    lambda x: TF.cross_entropy(x, torch.tensor([1, 2, 0, 3] * 5)[:x.shape[0]], reduction="none")),
  "cross_entropy_smooth": (lambda x: F.cross_entropy(x, Tensor([1, 2, 0, 3] * 5)[:x.shape[0]], reduction="none", label_smoothing=0.1),
                           lambda x: TF.cross_entropy(x, torch.tensor([1, 2, 0, 3] * 5)[:x.shape[0]], reduction="none", label_smoothing=0.1)),
  "bce_logits": (lambda x: F.binary_cross_entropy_with_logits(x, x * 0 + 0.25, reduction="none"),
                 lambda x: TF.binary_cross_entropy_with_logits(x, x * 0 + 0.25, reduction="none")),
  "bce": (lambda x: F.binary_cross_entropy(x.sigmoid(), x.full_like(0.25), reduction="none"),
          lambda x: TF.binary_cross_entropy(x.sigmoid(), torch.full_like(x, 0.25), reduction="none")),
  "kl_div": (lambda x: F.kl_div(x.log_softmax(-1), x.softmax(-1).detach() * 0 + 0.25, reduction="none"),
             lambda x: TF.kl_div(x.log_softmax(-1), x.softmax(-1).detach() * 0 + 0.25, reduction="none")),
  "matmul": (lambda x: x @ x.T, None), "linear": (lambda x: F.linear(x, x[:3]), lambda x: TF.linear(x, x[:3])),
}

# rows left out of an op's sweep, with the reason: each a known difference from torch, documented in docs/pytorch-tensor.md
NONFINITE = lambda r: not all(math.isfinite(v) for v in r)
HUGE = lambda r: any(math.isfinite(v) and abs(v) > 1e30 for v in r)
_OVERFLOW = (HUGE, "values near float32's largest overflow in intermediate squares and sums (torch rescales, or rounds its result "
                   "so that exp(x - result) is 1 where ours is exact)")
SKIP_ROWS: dict[str, tuple[Callable[[list[float]], bool], str]] = {
  "prod": (NONFINITE, "torch's gradient at an infinite/NaN input depends on whether the tensor holds a zero anywhere"),
  "prod_all": (NONFINITE, "as prod"),
  "max_all": (lambda r: any(math.isnan(v) for v in r), "x.max() with NaN: torch sends the gradient to the NaN entries, "
              "ours is NaN everywhere (as torch's amax)"),
  "norm_inf": (lambda r: any(math.isnan(v) for v in r), "as max_all"),
  "topk": (lambda r: len(set(r)) < len(r), "which of tied values topk picks (torch leaves it unspecified)"),
  "bce": (lambda r: any(math.isnan(v) for v in r), "torch refuses a NaN probability"),
  **{n: _OVERFLOW for n in ("std", "std_biased", "var", "var_biased", "norm2", "norm3", "normalize", "cosine_similarity", "cumsum",
                            "logcumsumexp", "logsumexp", "glu", "layer_norm", "rms_norm")},
}

@pytest.mark.parametrize("name", list(REDUCE))
def test_reduce(name: str) -> None:
  fa, ft = REDUCE[name]
  skip = SKIP_ROWS.get(name, (lambda r: False, ""))[0]
  x = np.array([r for r in ROWS if not skip(r)], np.float64)
  shape = tuple((ft or fa)(torch.tensor(x)).shape)
  up = np.linspace(-1.0, 1.5, int(np.prod(shape))).reshape(shape) if shape else np.array(0.75)
  _run(fa, ft or fa, [x], rtol=1e-4, atol=1e-6, grad_rtol=1e-4, grad_atol=1e-6, upstream=up)

# ***** ops over windows and channels: the ROWS laid out as (1, 3, 4, 4) images, so pooling windows hold ties, -inf, inf
# and NaN; attention with fully masked rows *****
def _img(x): return x.reshape(1, 3, 4, 4)
STRUCT: dict[str, tuple[Callable, Callable | None]] = {
  "max_pool2d": (lambda x: _img(x).max_pool2d(2), lambda x: TF.max_pool2d(_img(x), 2)),
  "max_pool2d_s1": (lambda x: _img(x).max_pool2d(2, 1), lambda x: TF.max_pool2d(_img(x), 2, 1)),
  "avg_pool2d": (lambda x: _img(x).avg_pool2d(2), lambda x: TF.avg_pool2d(_img(x), 2)),
  "conv2d": (lambda x: _img(x).conv2d(Tensor.full((2, 3, 2, 2), 0.5)), lambda x: TF.conv2d(_img(x), torch.full((2, 3, 2, 2), 0.5, dtype=x.dtype))),
  "layer_norm_img": (lambda x: F.layer_norm(_img(x), (4, 4)), lambda x: TF.layer_norm(_img(x), (4, 4))),
  "group_norm": (lambda x: F.group_norm(_img(x), 3), lambda x: TF.group_norm(_img(x), 3)),
  "batch_norm": (lambda x: F.batch_norm(_img(x), None, None, training=True), lambda x: TF.batch_norm(_img(x), None, None, training=True)),
  "sdpa_masked": (lambda x: F.scaled_dot_product_attention(_img(x), _img(x) * 0.5, _img(x), attn_mask=Tensor([[True, False, True, False]] * 3 + [[False] * 4])),
                  lambda x: TF.scaled_dot_product_attention(_img(x), _img(x) * 0.5, _img(x), attn_mask=torch.tensor([[True, False, True, False]] * 3 + [[False] * 4]))),
}
FINITE_ROWS = {"conv2d", "avg_pool2d", "layer_norm_img", "group_norm", "batch_norm", "sdpa_masked"}  # inf*0 spreads NaN: both agree, nothing to learn

@pytest.mark.parametrize("name", list(STRUCT))
def test_struct(name: str) -> None:
  fa, ft = STRUCT[name]
  rows = [r if name not in FINITE_ROWS or not NONFINITE(r) else [0.5, -1.0, 2.0, 0.25] for r in ROWS[:12]]
  x = np.array(rows, np.float64)
  shape = tuple((ft or fa)(torch.tensor(x)).shape)
  up = np.linspace(-1.0, 1.5, int(np.prod(shape))).reshape(shape)
  _run(fa, ft or fa, [x], rtol=1e-4, atol=1e-5, grad_rtol=1e-4, grad_atol=1e-5, upstream=up)

# ***** every op is accounted for *****
# the Tensor methods and nn.functional functions the tables above sweep (a table's key, or the spelling its entry uses)
SWEPT = {n for t in (UNARY, BINARY, REDUCE, STRUCT) for n in t} | {
  "pow", "clamp", "clip", "maximum", "minimum", "add", "sub", "mul", "div", "mod", "fmod", "copysign", "lerp", "logaddexp",
  "where", "max", "min", "sum", "mean", "prod", "amax", "amin", "var", "std", "norm", "logsumexp", "softmax", "log_softmax",
  "cumsum", "cumprod", "cummax", "cummin", "logcumsumexp", "sort", "topk", "median", "matmul", "linear", "cross_entropy",
  "binary_crossentropy", "binary_crossentropy_logits", "half", "float", "double", "cast", "contiguous", "clone",
  "isclose", "floor_divide", "gelu", "hardtanh", "leaky_relu", "softplus", "elu", "celu", "max_pool2d", "avg_pool2d", "conv2d",
  "scaled_dot_product_attention", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
  "binary_cross_entropy_with_logits", "kl_div", "normalize", "layer_norm", "rms_norm", "cosine_similarity", "glu",
  "group_norm", "batch_norm", "softmin",
}
# no gradient: results are ints or bools, or the op makes, reads or moves data rather than computing from it
NOT_DIFFERENTIABLE = {
  "creation": "arange empty empty_like eye full full_like linspace ones ones_like zeros zeros_like rand rand_like randn randn_like "
              "randint normal uniform glorot_uniform kaiming_normal kaiming_uniform scaled_uniform manual_seed new_empty new_full "
              "new_ones new_tensor new_zeros from_numpy multinomial",
  "ints and bools": "eq ne lt le gt ge isnan isinf isfinite allclose logical_and logical_or logical_not bitwise_and bitwise_or "
                    "bitwise_xor bitwise_not lshift rshift bitwise_left_shift bitwise_right_shift all any argmax argmin argsort nonzero unique one_hot bool byte char short int long "
                    "bitcast count_nonzero equal is_floating_point",
  "reading and running": "item numpy tolist data size numel dim ndimension element_size nbytes is_contiguous type realize "
                         "realize_all schedule backward gradient assign requires_grad_ detach detach_ to cpu train test sequential "
                         "copy_ fill_ zero_ shard shard_",
  "random": "dropout bernoulli_",
}
# differentiable, but linear selections or sums of their input (a movement, a gather, a window) or casts: no special point changes
# their gradient, which test_gradient.py, test_nn.py and test_torch_surface.py check against torch
LINEAR = ("reshape view permute expand pad shrink flip transpose t flatten unflatten squeeze unsqueeze repeat repeat_interleave "
          "cat stack split chunk gather scatter scatter_reduce index_select index_add masked_fill masked_select diag diagonal "
          "tril triu roll unfold meshgrid conv1d conv3d conv_transpose2d max_pool1d max_pool3d avg_pool1d avg_pool3d "
          "max_unpool2d interpolate batchnorm layernorm einsum dot bmm outer ger contiguous_backward sparse_categorical_crossentropy "
          "std_mean var_mean mm mv "
          "expand_as moveaxis movedim narrow ravel reshape_as swapaxes swapdims tile unbind view_as "
          "type_as bfloat16 "  # casts: the gradient is the cast back (swept for half and double)
          # nn.functional's spellings of Tensor methods (swept or linear under their Tensor name)
          "embedding pad pixel_shuffle upsample adaptive_avg_pool1d adaptive_avg_pool2d conv_transpose1d conv_transpose3d "
          "max_unpool1d max_unpool3d nll_loss one_hot")

def test_every_op_is_accounted_for() -> None:
  accounted = SWEPT | {n for v in NOT_DIFFERENTIABLE.values() for n in v.split()} | set(LINEAR.split())
  methods = {n for n in dir(Tensor) if not n.startswith("_") and callable(getattr(Tensor, n, None))}
  functional = {n for n in dir(F) if not n.startswith("_") and callable(getattr(F, n)) and getattr(F, n).__module__ == F.__name__}
  # an in-place op (add_) is its out-of-place op written back (tensor.INPLACE_OPS)
  missing = sorted(n for n in methods | functional if n not in accounted and not (n.endswith("_") and n[:-1] in accounted))
  assert not missing, f"ops with no entry in the gradient sweep (sweep them, or list them with the reason): {missing}"
