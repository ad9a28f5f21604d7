"""The math, activations, random creation helpers and composite nn functions of
attograd/frontend/elementwise.py against PyTorch on both devices: values, dtypes, edge values and gradients.
PYTHON cases stay tiny: the interpreter is slow."""
import math
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from attograd import Tensor, dtypes
from helpers import DEVICES, check, compare, grad_check

pytestmark = pytest.mark.parametrize("device", DEVICES)
f32, f16, f64, i32, i64 = dtypes.float32, dtypes.float16, dtypes.float64, dtypes.int32, dtypes.int64

def n_for(device: str, n: int = 64) -> int: return n if device == "CPU" else 8

# name: (attograd fn, torch fn, low, high)
MATH = {
  "asin": (Tensor.asin, torch.asin, -1, 1), "acos": (Tensor.acos, torch.acos, -1, 1), "atan": (Tensor.atan, torch.atan, -20, 20),
  "sinh": (Tensor.sinh, torch.sinh, -10, 10), "cosh": (Tensor.cosh, torch.cosh, -10, 10), "asinh": (Tensor.asinh, torch.asinh, -50, 50),
  "acosh": (Tensor.acosh, torch.acosh, 1, 50), "atanh": (Tensor.atanh, torch.atanh, -1, 1), "erf": (Tensor.erf, torch.erf, -5, 5),
  "erfc": (Tensor.erfc, torch.erfc, -5, 9), "log1p": (Tensor.log1p, torch.log1p, -1, 10), "expm1": (Tensor.expm1, torch.expm1, -5, 5),
  "log10": (Tensor.log10, torch.log10, 0, 1000), "softplus": (Tensor.softplus, F.softplus, -30, 30),
  "softplus_beta": (lambda x: x.softplus(beta=2.0, threshold=5.0), lambda x: F.softplus(x, beta=2.0, threshold=5.0), -10, 10),
}
EDGE = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-7, -1e-7, 1e-30, 0.5, -0.5, 1.0, -1.0, 0.9999, -0.9999, 3.0, 30.0, -30.0, 100.0, -100.0, 1e20, -1e20, 1e38]

@pytest.mark.parametrize("name", MATH)
def test_math(device, name):
  fa, ft, lo, hi = MATH[name]
  check(fa, ft, [(n_for(device),)], device=device, low=lo, high=hi, atol=1e-6, rtol=2e-6 if name not in ("sinh", "cosh", "expm1") else 1e-5)
  check(fa, ft, [], vals=[EDGE], device=device, atol=1e-6, rtol=1e-5)

@pytest.mark.parametrize("name", MATH)
def test_math_dtypes(device, name):
  fa, ft, lo, hi = MATH[name]
  if device == "CPU":
    check(fa, ft, [(16,)], dtype=f16, device=device, low=lo, high=min(hi, 8), atol=2e-3, rtol=2e-3)
    check(fa, ft, [(16,)], dtype=f64, device=device, low=lo, high=hi, atol=1e-6, rtol=1e-5)
  if name not in ("softplus", "softplus_beta"):  # torch's softplus refuses ints
    check(fa, ft, [(6,)], dtype=i32, device=device, low=max(lo, -3), high=max(hi, 2), atol=1e-6, rtol=1e-5)

def test_erf_accuracy(device):
  n = 20001 if device == "CPU" else 41
  x = np.concatenate([np.linspace(-6, 6, n), [-1.0, 1.0, 2.5, -2.5, 1e-6]]).astype(np.float32)
  got = Tensor(x, device=device).erf().numpy().astype(np.float64)
  want = torch.erf(torch.from_numpy(x).double()).numpy()
  assert np.abs(got - want).max() < 2e-7
  wc = torch.erfc(torch.from_numpy(x).double()).numpy()
  gc = Tensor(x, device=device).erfc().numpy().astype(np.float64)
  assert (np.abs(gc - wc) / wc).max() < 1e-5  # relative, out in the tail

def test_tanh_accuracy_near_zero_and_far(device):
  # relative to float64: 2*sigmoid(2x)-1 lost every digit of tanh(1e-8) (it gave 0) and most of tanh(0.01)
  x = np.concatenate([np.geomspace(1e-30, 1, 200), -np.geomspace(1e-12, 30, 200), [0.0, 9.0, 25.0, np.inf, -np.inf]]).astype(np.float32)
  got = Tensor(x, device=device).tanh().numpy().astype(np.float64)
  want = torch.tanh(torch.from_numpy(x).double()).numpy()
  assert (np.abs(got - want) / np.maximum(np.abs(want), 1e-38)).max() < 4e-7
  assert np.isnan(Tensor([np.nan], device=device).tanh().numpy()).all()

EXP_RANGE = {np.float32: (-104.0, 89.0, 1.5e-7), np.float64: (-746.0, 710.0, 3e-16)}

@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_exp_accuracy(device, dt):
  """exp over its whole range (past overflow and past the smallest denormal): within about one ulp of float64 exp
  (float32) or of torch (float64); denormal results within one denormal step; inf, -inf, nan, overflow, underflow exact."""
  lo, hi, tol = EXP_RANGE[dt]
  n = 400_001 if device == "CPU" else 101
  x = np.linspace(lo, hi, n).astype(dt)
  got = Tensor(x, device=device).exp().numpy()
  want = torch.from_numpy(x).exp().numpy()
  ref = np.exp(x.astype(np.float64)) if dt == np.float32 else want
  normal = np.isfinite(want) & (want >= np.finfo(dt).tiny)
  rel = np.abs(got[normal].astype(np.float64) - ref[normal]) / ref[normal]
  assert rel.max() < tol, f"max relative error {rel.max()} at x={x[normal][rel.argmax()]}"
  sub = ~normal
  np.testing.assert_array_equal(np.isinf(got[sub]), np.isinf(want[sub]))
  assert np.abs(np.nan_to_num(got[sub], posinf=0) - np.nan_to_num(want[sub], posinf=0)).max() <= np.finfo(dt).smallest_subnormal
  special = np.array([math.inf, -math.inf, math.nan, 0.0, -0.0, 1e30, -1e30, 2000.0, -2000.0], dtype=dt)
  np.testing.assert_array_equal(Tensor(special, device=device).exp().numpy(), torch.from_numpy(special).exp().numpy())

def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
  """|got - want| in units in the last place of want as a float32 (the subnormal spacing below the normals)."""
  step = np.spacing(np.maximum(np.abs(want), np.finfo(np.float32).tiny).astype(np.float32)).astype(np.float64)
  return np.abs(got.astype(np.float64) - want) / step

def test_exp_ulp_sweep(device):
  """float32 exp on a stride through every bit pattern (all signs and exponents, subnormals, inf and NaN) and the edges
  of its range: within 1 ulp of the exact result and of torch's exp, non-finite results exactly torch's."""
  stride = 997 if device in ("CPU", "LLVM") else 2 ** 20 + 7
  x = np.arange(0, 2 ** 32, stride, dtype=np.uint64).astype(np.uint32).view(np.float32)
  edges = [88.72283, 88.722839, 88.72284, -87.33654, -103.27893, -103.9721, -104.0, 89.0, 0.34657359, -0.34657359]
  x = np.concatenate([x, np.array(edges + [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-45, -1e-45], np.float32)])
  got = Tensor(x, device=device).exp().numpy()
  want = torch.from_numpy(x).exp().numpy()
  with np.errstate(over="ignore", invalid="ignore"): exact = np.exp(x.astype(np.float64))
  fin = np.isfinite(want)
  np.testing.assert_array_equal(got[~fin], want[~fin])
  assert _ulps(got[fin], exact[fin]).max() < 1.0 and _ulps(got[fin], want[fin].astype(np.float64)).max() <= 1.0

def test_exp_dtypes_and_grad(device):
  for dt in (f16, dtypes.bfloat16):
    check(Tensor.exp, torch.exp, [(16,)], dtype=dt, device=device, low=-12, high=11, atol=0, rtol=1e-3 if dt == f16 else 8e-3)
  check(Tensor.exp, torch.exp, [], vals=[[-20000.0, 11.0, -17.0, 12.0, math.inf, -math.inf]], dtype=f16, device=device)
  x = np.random.default_rng(4).uniform(-80, 80, n_for(device, 32))
  grad_check(Tensor.exp, torch.exp, [x], device, atol=0, rtol=2e-6)
  grad_check(lambda t: (t * 1e3).exp(), lambda t: (t * 1e3).exp(), [[0.5, -0.5, 0.1]], device)  # overflow: inf, underflow: 0

@pytest.mark.parametrize("name", [n for n in MATH if n not in ("acosh",)])
def test_math_grad(device, name):
  if device == "PYTHON" and name not in ("erf", "asin", "atan", "log1p", "expm1", "asinh"): pytest.skip("covered on CPU")
  fa, ft, lo, hi = MATH[name]
  lo, hi = max(lo, -4), min(hi, 4)
  if name in ("asin", "acos", "atanh"): lo, hi = -0.95, 0.95
  if name == "log1p": lo = -0.9
  x = np.random.default_rng(1).uniform(lo, hi, n_for(device, 32))
  grad_check(fa, ft, [x], device)

def test_acosh_grad(device):
  grad_check(Tensor.acosh, torch.acosh, [np.random.default_rng(2).uniform(1.05, 30, n_for(device, 32))], device)

ACT = {
  "relu6": (Tensor.relu6, F.relu6), "hardsigmoid": (Tensor.hardsigmoid, F.hardsigmoid), "elu": (Tensor.elu, F.elu),
  "elu_a": (lambda x: x.elu(0.5), lambda x: F.elu(x, 0.5)), "celu": (lambda x: x.celu(1.5), lambda x: F.celu(x, 1.5)),
  "selu": (Tensor.selu, F.selu), "silu": (Tensor.silu, F.silu), "swish": (Tensor.swish, F.silu), "gelu": (Tensor.gelu, F.gelu),
  "gelu_tanh": (lambda x: x.gelu(approximate="tanh"), lambda x: F.gelu(x, approximate="tanh")),
  "quick_gelu": (Tensor.quick_gelu, lambda x: x * torch.sigmoid(1.702 * x)), "leaky_relu": (Tensor.leaky_relu, F.leaky_relu),
  "leaky_relu_2": (lambda x: x.leaky_relu(0.2), lambda x: F.leaky_relu(x, 0.2)), "mish": (Tensor.mish, F.mish),
  "softsign": (Tensor.softsign, F.softsign), "hardswish": (Tensor.hardswish, F.hardswish), "hardtanh": (Tensor.hardtanh, F.hardtanh),
  "hardtanh_r": (lambda x: x.hardtanh(-2.0, 0.5), lambda x: F.hardtanh(x, -2.0, 0.5)), "logsigmoid": (Tensor.logsigmoid, F.logsigmoid),
}
ACT_EDGE = [0.0, 1e-7, -1e-7, 0.5, -0.5, 2.0, -2.0, 5.9, 6.5, -3.5, 30.0, -30.0, 100.0, -100.0, 1e4, -1e4]

@pytest.mark.parametrize("name", ACT)
def test_activation(device, name):
  fa, ft = ACT[name]
  check(fa, ft, [(n_for(device),)], device=device, low=-8, high=8, atol=1e-6, rtol=1e-5)
  check(fa, ft, [], vals=[ACT_EDGE], device=device, atol=1e-6, rtol=1e-5)
  if device == "CPU" and name in ("elu", "selu", "silu", "gelu", "mish", "softsign", "hardswish", "logsigmoid"):
    check(fa, ft, [(16,)], dtype=f16, device=device, low=-8, high=8, atol=3e-3, rtol=3e-3)
    check(fa, ft, [(16,)], dtype=f64, device=device, low=-8, high=8, atol=1e-6, rtol=1e-5)

@pytest.mark.parametrize("name", ACT)
def test_activation_grad(device, name):
  if device == "PYTHON" and name not in ("elu", "gelu", "mish", "hardswish", "logsigmoid"): pytest.skip("covered on CPU")
  fa, ft = ACT[name]
  x = np.random.default_rng(3).uniform(-8, 8, n_for(device, 32))
  grad_check(fa, ft, [x], device)

def test_activation_inf_nan(device):
  v = [math.inf, -math.inf, math.nan]
  for name in ("relu6", "hardtanh", "elu", "selu", "leaky_relu", "softsign", "logsigmoid", "hardsigmoid", "silu", "mish"):
    fa, ft = ACT[name]
    check(fa, ft, [], vals=[v], device=device)
  assert Tensor([math.inf], device=device).gelu().item() == math.inf  # torch says nan (documented difference)

def test_activation_int(device):
  check(Tensor.relu6, F.relu6, [(8,)], dtype=i64, device=device, low=-10, high=10)
  check(Tensor.hardtanh, F.hardtanh, [(8,)], dtype=i32, device=device, low=-3, high=3)
  check(Tensor.silu, lambda x: F.silu(x.float()), [(8,)], dtype=i32, device=device, low=-3, high=3)

def test_logsigmoid_stable(device):
  x = Tensor([-1e4, -200.0, 200.0, 1e4], device=device)
  np.testing.assert_allclose(x.logsigmoid().numpy(), [-1e4, -200.0, 0.0, 0.0])
  xg = Tensor([-200.0, 200.0], device=device, requires_grad=True)
  xg.logsigmoid().sum().backward()
  np.testing.assert_allclose(xg.grad.numpy(), [1.0, 0.0])

def test_tanh_gelu_as_a_sigmoid_keeps_its_tail_and_gradient(device):
  # x (1 + tanh(u)) / 2 is computed as x sigmoid(2u): against the float64 exact value of either form, over the range and
  # in the tail where 1 + tanh(u) cancels (torch's float32 and float64 both give -0 from about x = -7), with the gradient
  xs = np.concatenate([np.linspace(-6, 6, n_for(device, 97)), [-7.0, -8.0, -9.0, 0.0, 1e-8, -1e-8, 30.0, -30.0]]).astype(np.float32)
  x64 = xs.astype(np.float64)
  c = 2 * math.sqrt(2 / math.pi)
  u2 = c * (x64 + 0.044715 * x64 ** 3)
  with np.errstate(over="ignore"): s = 1 / (1 + np.exp(-u2))
  exact, dexact = x64 * s, s + x64 * s * (1 - s) * c * (1 + 3 * 0.044715 * x64 ** 2)
  t = Tensor(xs, device=device, requires_grad=True)
  y = t.gelu(approximate="tanh")
  y.sum().backward()
  np.testing.assert_allclose(y.numpy(), exact, rtol=2e-5, atol=1e-30)
  np.testing.assert_allclose(t.grad.numpy(), dexact, rtol=2e-5, atol=1e-6)
  assert y.numpy()[len(xs) - 8] < 0  # x = -7: -4e-16, not -0
  tt = torch.tensor(xs, dtype=torch.float64, requires_grad=True)
  F.gelu(tt, approximate="tanh").sum().backward()
  np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), atol=1e-5)
  assert math.isnan(Tensor([-math.inf], device=device).gelu(approximate="tanh").item())  # -inf * 0, as torch
  assert Tensor([math.inf], device=device).gelu(approximate="tanh").item() == math.inf

def test_gelu_bad_approximate(device):
  with pytest.raises(ValueError): Tensor([1.0], device=device).gelu(approximate="fast")

# ***** creation *****

@pytest.mark.parametrize("args", [(0, 1, 5), (-3, 7, 11), (1.5, -2.5, 4), (0, 1, 1), (2, 3, 0), (0, 10, 100)])
def test_linspace(device, args):
  compare(Tensor.linspace(*args, device=device), torch.linspace(*args), atol=1e-6)
  compare(Tensor.linspace(*args, dtype=f64, device=device), torch.linspace(*args, dtype=torch.float64), atol=1e-12)

def test_linspace_int(device):
  compare(Tensor.linspace(0, 10, 4, dtype=i64, device=device), torch.linspace(0, 10, 4, dtype=torch.int64))

def test_uniform_normal(device):
  n = 4000 if device == "CPU" else 200
  tol = 4 / math.sqrt(n)
  Tensor.manual_seed(5)
  u = Tensor.uniform(n, low=-2.0, high=3.0, device=device).numpy()
  assert u.dtype == np.float32 and u.min() >= -2 and u.max() < 3 and abs(u.mean() - 0.5) < 5 * tol
  z = Tensor.normal(n, mean=3.0, std=0.5, device=device).numpy()
  assert abs(z.mean() - 3) < tol and abs(z.std() - 0.5) < tol
  Tensor.manual_seed(5)
  np.testing.assert_array_equal(Tensor.uniform(n, low=-2.0, high=3.0, device=device).numpy(), u)
  Tensor.manual_seed(5)
  np.testing.assert_array_equal(Tensor.uniform(n, low=-2.0, high=3.0, device="CPU").numpy(), u)  # same on every device
  assert Tensor.normal(2, 3, dtype=f16, device=device).dtype == f16
  assert Tensor.uniform(2, 3, device=device, requires_grad=True).requires_grad

def test_init_helpers(device):
  shape = (64, 32, 3, 3) if device == "CPU" else (4, 3, 2, 2)
  fan_in, fan_out = shape[1] * prod(shape[2:]), shape[0] * prod(shape[2:])
  Tensor.manual_seed(0)
  g = Tensor.glorot_uniform(*shape, device=device).numpy()
  b = math.sqrt(6 / (fan_in + fan_out))
  assert g.shape == shape and np.abs(g).max() <= b and np.abs(g).max() > 0.8 * b
  k = Tensor.kaiming_uniform(*shape, device=device).numpy()
  b = math.sqrt(2) * math.sqrt(3 / fan_in)  # torch's default a=0: gain sqrt(2)
  assert np.abs(k).max() <= b and np.abs(k).max() > 0.8 * b
  k = Tensor.kaiming_uniform(shape, a=math.sqrt(5), device=device).numpy()  # what nn.Linear/Conv use
  assert np.abs(k).max() <= 1 / math.sqrt(fan_in) + 1e-7
  s = Tensor.scaled_uniform(*shape, device=device).numpy()
  assert np.abs(s).max() <= prod(shape) ** -0.5
  if device == "CPU":
    kn = Tensor.kaiming_normal(*shape, device=device).numpy()
    assert abs(kn.std() - math.sqrt(2 / fan_in)) < 0.05 * math.sqrt(2 / fan_in)
    kn = Tensor.kaiming_normal(*shape, mode="fan_out", nonlinearity="relu", device=device).numpy()
    assert abs(kn.std() - math.sqrt(2 / fan_out)) < 0.05 * math.sqrt(2 / fan_out)
  with pytest.raises(ValueError): Tensor.glorot_uniform(5, device=device)

def prod(s):
  return math.prod(s)

def test_multinomial(device):
  Tensor.manual_seed(11)
  w = Tensor([0.0, 1.0, 3.0, 0.0], device=device)
  n = 2000 if device == "CPU" else 60
  s = w.multinomial(n, replacement=True).numpy()
  assert s.dtype == np.int64 and s.shape == (n,) and set(np.unique(s)) <= {1, 2}
  if device == "CPU": assert abs((s == 2).mean() - 0.75) < 0.05
  rows = Tensor([[1.0, 1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 5.0, 1.0, 0.0]], device=device)
  s = rows.multinomial(2).numpy()
  assert s.shape == (2, 2) and len(set(s[0])) == 2 and sorted(s[1]) == [2, 3]
  perm = Tensor.ones(5, device=device).multinomial(5).numpy()
  assert sorted(perm) == [0, 1, 2, 3, 4]
  with pytest.raises(ValueError): Tensor.ones(3, device=device).multinomial(4)

# ***** nn functional *****

EINSUM = [("ij,jk->ik", [(3, 4), (4, 5)]), ("ij->ji", [(3, 4)]), ("ij->", [(3, 4)]), ("i,i->", [(5,), (5,)]), ("i,j->ij", [(3,), (4,)]),
          ("bij,bjk->bik", [(2, 3, 4), (2, 4, 2)]), ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]), ("ij,jk", [(2, 3), (3, 2)]),
          ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]), ("ijk->kj", [(2, 3, 4)]), ("ij,j->i", [(3, 4), (4,)]), ("ij,ij->ij", [(1, 4), (3, 4)]),
          ("...ij,...jk->...ik", [(2, 3, 4), (4, 2)]), ("...i->i...", [(2, 3, 4)]), ("b...,b...", [(2, 3), (2, 3)]), ("i...->...", [(3, 2, 2)]),
          ("ii->i", [(3, 3)]), ("ii", [(3, 3)]), ("iij,jk->ik", [(2, 2, 3), (3, 2)])]

@pytest.mark.parametrize("eq,shapes", EINSUM)
def test_einsum(device, eq, shapes):
  check(lambda *xs: Tensor.einsum(eq, *xs), lambda *xs: torch.einsum(eq, *xs), shapes, device=device, atol=1e-5)

def test_einsum_grad_and_errors(device):
  rng = np.random.default_rng(4)
  grad_check(lambda a, b: Tensor.einsum("ij,jk->ik", a, b), lambda a, b: torch.einsum("ij,jk->ik", a, b), [rng.normal(size=(2, 3)), rng.normal(size=(3, 2))], device)
  a = Tensor.ones(2, 3, device=device)
  with pytest.raises(ValueError): Tensor.einsum("ij,jk->ik", a)
  with pytest.raises(ValueError): Tensor.einsum("ijk->i", a)
  with pytest.raises(ValueError): Tensor.einsum("ij,jk->ik", a, Tensor.ones(4, 2, device=device))

SDPA = [dict(), dict(is_causal=True), dict(scale=0.3), dict(mask="bool"), dict(mask="float")]

@pytest.mark.parametrize("kw", SDPA, ids=[str(k) for k in SDPA])
def test_sdpa(device, kw):
  kw = dict(kw)
  shp = ((2, 2, 4, 8), (2, 2, 5, 8), (2, 2, 5, 3)) if device == "CPU" else ((1, 1, 3, 2), (1, 1, 3, 2), (1, 1, 3, 2))
  L, S = shp[0][-2], shp[1][-2]
  rng = np.random.default_rng(6)
  vals = [rng.normal(size=s) for s in shp]
  mask = kw.pop("mask", None)
  if mask == "bool": m = rng.random((L, S)) < 0.7; m[:, 0] = True
  elif mask == "float": m = rng.normal(size=(L, S))
  if mask is not None:
    kwa = dict(kw, attn_mask=Tensor(m.astype(np.float32) if mask == "float" else m, device=device))
    kwt = dict(kw, attn_mask=torch.from_numpy(m.astype(np.float32) if mask == "float" else m))
  else: kwa, kwt = kw, kw
  fa = lambda q, k, v: q.scaled_dot_product_attention(k, v, **kwa)
  ft = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwt)
  check(fa, ft, [], vals=[v.astype(np.float32) for v in vals], device=device, atol=1e-5)
  grad_check(fa, ft, vals, device)

def test_sdpa_dropout(device):
  q = Tensor.ones(1, 2, 4, device=device)
  v = Tensor([[1.0], [2.0]], device=device).reshape(1, 2, 1)
  Tensor.manual_seed(0)
  out = q.scaled_dot_product_attention(q, v, dropout_p=0.5).numpy()
  assert set(np.round(out.flatten() * 2, 5)) <= {0.0, 1.0, 2.0, 3.0}  # each weight 0.5 is dropped or doubled
  assert q.scaled_dot_product_attention(q, v, dropout_p=0.0).numpy().flatten().tolist() == [1.5, 1.5]

INTERP = [((1, 2, 5), dict(size=8, mode="nearest")), ((1, 2, 6), dict(scale_factor=2, mode="nearest")), ((1, 1, 7), dict(size=3, mode="nearest")),
          ((1, 2, 5), dict(size=9, mode="linear")), ((1, 2, 5), dict(size=9, mode="linear", align_corners=True)),
          ((1, 1, 6), dict(size=4, mode="linear")), ((1, 2, 3, 4), dict(size=(5, 7), mode="nearest")),
          ((1, 2, 3, 4), dict(size=(6, 3), mode="bilinear")), ((2, 1, 3, 4), dict(size=(5, 5), mode="bilinear", align_corners=True)),
          ((1, 1, 4, 4), dict(scale_factor=1.5, mode="bilinear")), ((1, 1, 3, 3), dict(scale_factor=(2, 0.5), mode="nearest")),
          ((1, 2, 3, 4), dict(size=(7, 9), mode="bicubic")), ((2, 1, 5, 4), dict(size=(3, 6), mode="bicubic", align_corners=True)),
          ((1, 1, 6, 5), dict(size=(2, 3), mode="bicubic")), ((1, 1, 4, 4), dict(scale_factor=2.5, mode="bicubic")),
          ((1, 1, 1, 3), dict(size=(4, 1), mode="bicubic", align_corners=True)), ((1, 1, 2, 2), dict(size=(5, 5), mode="bicubic")),
          ((1, 1, 5, 3), dict(scale_factor=(0.5, 3), mode="bicubic", align_corners=False))]

@pytest.mark.parametrize("shape,kw", INTERP, ids=[f"{s}-{k}" for s, k in INTERP])
def test_interpolate(device, shape, kw):
  check(lambda x: x.interpolate(**kw), lambda x: F.interpolate(x, **kw), [shape], device=device, atol=1e-5)

def test_interpolate_grad_and_errors(device):
  x = np.random.default_rng(8).normal(size=(1, 1, 3, 3))
  grad_check(lambda t: t.interpolate(size=(4, 5), mode="bilinear"), lambda t: F.interpolate(t, size=(4, 5), mode="bilinear"), [x], device)
  t = Tensor.ones(1, 1, 3, 3, device=device)
  assert t.interpolate(size=4, mode="linear").shape == (1, 1, 4, 4)  # tinygrad's linear on 4-D (torch: bilinear only)
  with pytest.raises(ValueError): t.interpolate()
  with pytest.raises(ValueError): t.reshape(1, 3, 3).interpolate(size=4, mode="bicubic")
  with pytest.raises(ValueError): t.interpolate(size=4, mode="trilinear")  # needs 5-D
  with pytest.raises(NotImplementedError): t.interpolate(size=4, mode="area")
  for ac in (False, True):
    kw = dict(size=(5, 7), mode="bicubic", align_corners=ac)
    grad_check(lambda t: t.interpolate(**kw), lambda t: F.interpolate(t, **kw), [np.random.default_rng(9).normal(size=(1, 2, 4, 3))], device)
  assert t[:, :0].interpolate(size=(4, 5), mode="bicubic").shape == (1, 0, 4, 5)  # torch refuses an empty input
  # a non-contiguous input, and float64
  check(lambda x: x.permute(0, 1, 3, 2).interpolate(size=(6, 5), mode="bicubic"), lambda x: F.interpolate(x.permute(0, 1, 3, 2), size=(6, 5), mode="bicubic"),
        [(1, 2, 3, 4)], device=device, atol=1e-5)
  check(lambda x: x.interpolate(size=(6, 5), mode="bicubic", align_corners=True), lambda x: F.interpolate(x, size=(6, 5), mode="bicubic", align_corners=True),
        [(1, 1, 3, 4)], dtype=dtypes.float64, device=device, atol=1e-12)

@pytest.mark.parametrize("dt", [f32, f16, f64])
def test_abs_clears_the_sign_as_torch(device, dt):
  """abs(+0.0) is +0.0 (max(x, -x) gave -0.0: 1/abs(0) was -inf), NaN stays NaN; the gradient is sign(x), 0 at 0."""
  tdt = {f32: torch.float32, f16: torch.float16, f64: torch.float64}[dt]
  vals = [0.0, -0.0, 1.5, -2.0, math.inf, -math.inf, math.nan]
  x = Tensor(vals, dtype=dt, device=device, requires_grad=True)
  t = torch.tensor(vals, dtype=tdt, requires_grad=True)
  y, ty = x.abs(), t.abs()
  np.testing.assert_array_equal((1 / y).numpy().astype(np.float64), (1 / ty).detach().numpy().astype(np.float64))
  y.sum().backward(); ty.sum().backward()
  np.testing.assert_array_equal(x.grad.numpy().astype(np.float64), t.grad.numpy().astype(np.float64))
