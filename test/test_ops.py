"""Every op of the Tensor front end against PyTorch, on both devices: values, shapes and dtypes,
broadcasting, non-contiguous inputs and the errors bad input raises.
PYTHON cases stay small (<= ~200 elements): the interpreter is slow."""
import math
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from attograd import Tensor, dtypes
from attograd.errors import ArgumentError
from helpers import DEVICES, FROM_TORCH, check, compare, expect_refusal, make_pair, to_torch_dtype

pytestmark = pytest.mark.parametrize("device", DEVICES)

f32, f16, bf16, f64 = dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64
i32, i64, i8, u8, bool_ = dtypes.int32, dtypes.int64, dtypes.int8, dtypes.uint8, dtypes.bool
# tolerances for the narrow floats: both sides round once from float32
NARROW = {f16: dict(atol=2e-3, rtol=2e-3), bf16: dict(atol=2e-2, rtol=2e-2)}

def T(data, device, dtype=None) -> Tensor: return Tensor(data, device=device, dtype=dtype)

# ***** creation *****

@pytest.mark.parametrize("shape", [(), (2, 3), (2, 0, 3)])
def test_zeros_ones_full(device, shape):
  compare(Tensor.zeros(*shape, device=device), torch.zeros(shape))
  compare(Tensor.ones(shape, device=device), torch.ones(shape))
  compare(Tensor.zeros(shape, dtype=i32, device=device), torch.zeros(shape, dtype=torch.int32))
  compare(Tensor.full(shape, 3, device=device), torch.full(shape, 3))  # an int fill is int64, as in torch
  compare(Tensor.full(shape, True, device=device), torch.full(shape, True))
  compare(Tensor.full(shape, -7, dtype=i8, device=device), torch.full(shape, -7, dtype=torch.int8))

@pytest.mark.parametrize("shape", [(0,), (5,), (2, 3), (2, 0)])
def test_empty(device, shape):
  t = Tensor.empty(*shape, device=device)
  assert t.shape == shape and t.dtype == f32 and t.device == device and t.numpy().shape == shape
  assert Tensor.empty(shape, dtype=i64, device=device).dtype == i64

@pytest.mark.parametrize("args", [(5,), (0,), (2, 7), (0, 10, 3), (10, 0, -3), (-5, 5, 2), (5, 5),
                                  (0.0, 1.0, 0.1), (1.0, -1.0, -0.25), (0.5, 3), (-3, 2.5, 0.7), (10, -10, -1.5)])
def test_arange(device, args):
  compare(Tensor.arange(*args, device=device), torch.arange(*args), atol=1e-5)

def test_arange_dtype(device):
  compare(Tensor.arange(2, 9, 2, dtype=i32, device=device), torch.arange(2, 9, 2, dtype=torch.int32))
  compare(Tensor.arange(6, dtype=f32, device=device), torch.arange(6, dtype=torch.float32))
  compare(Tensor.arange(1, 4, 0.5, dtype=f64, device=device), torch.arange(1, 4, 0.5, dtype=torch.float64))

@pytest.mark.parametrize("args", [(3,), (2, 4), (4, 2), (0,), (1,)])
def test_eye(device, args):
  compare(Tensor.eye(*args, device=device), torch.eye(*args))
  compare(Tensor.eye(*args, dtype=i32, device=device), torch.eye(*args, dtype=torch.int32))

def test_rand_determinism_and_range(device):
  Tensor.manual_seed(1234)
  a, b = Tensor.rand(6, 7, device=device).numpy(), Tensor.rand(6, 7, device=device).numpy()
  Tensor.manual_seed(1234)
  a2 = Tensor.rand(6, 7, device=device).numpy()
  np.testing.assert_array_equal(a, a2)
  assert not np.array_equal(a, b), "two calls after one seed must differ"
  Tensor.manual_seed(99)
  assert not np.array_equal(Tensor.rand(6, 7, device=device).numpy(), a), "another seed, other numbers"
  assert a.dtype == np.float32 and a.shape == (6, 7)
  assert a.min() >= 0 and a.max() < 1 and len(np.unique(a)) == a.size

def test_rand_same_on_every_device(device):
  Tensor.manual_seed(7)
  a = Tensor.rand(50, device=device).numpy()
  Tensor.manual_seed(7)
  np.testing.assert_array_equal(a, Tensor.rand(50, device="CPU").numpy())

def test_randn_randint(device):
  n = 4000 if device == "CPU" else 200
  Tensor.manual_seed(3)
  z = Tensor.randn(n, device=device).numpy()
  assert z.dtype == np.float32 and np.isfinite(z).all()
  tol = 4 / math.sqrt(n)
  assert abs(z.mean()) < tol and abs(z.std() - 1) < 2 * tol
  Tensor.manual_seed(3)
  np.testing.assert_array_equal(z, Tensor.randn(n, device=device).numpy())
  r = Tensor.randint(5, 6, low=-3, high=4, device=device)
  assert r.dtype == i64 and r.shape == (5, 6)
  rv = r.numpy()
  assert rv.min() >= -3 and rv.max() < 4 and len(np.unique(rv)) > 1
  assert Tensor.rand(3, dtype=f16, device=device).dtype == f16
  assert Tensor.randn(2, 3, dtype=f64, device=device).numpy().dtype == np.float64

def test_like(device):
  x = T([[1, 2, 3], [4, 5, 6]], device, i32)
  tx = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32)
  compare(x.zeros_like(), torch.zeros_like(tx))
  compare(x.ones_like(), torch.ones_like(tx))
  compare(x.full_like(7), torch.full_like(tx, 7))
  compare(x.full_like(2.5), torch.full_like(tx, 2.5))  # keeps the int dtype: 2
  compare(x.full_like(2.5, dtype=f32), torch.full_like(tx, 2.5, dtype=torch.float32))
  compare(x.zeros_like(dtype=f16), torch.zeros_like(tx, dtype=torch.float16))
  for t in (x.empty_like(), x.rand_like(dtype=f32), x.randn_like(dtype=f32)):
    assert t.shape == x.shape and t.device == device
  assert x.empty_like().dtype == i32 and x.rand_like(dtype=f32).dtype == f32
  y = T([[0.5, 1.5]], device)
  r = y.rand_like()
  assert r.dtype == f32 and r.shape == (1, 2) and (0 <= r.numpy()).all() and (r.numpy() < 1).all()

def test_tensor_from_python_and_numpy(device):
  compare(T([[1, 2], [3, 4]], device), torch.tensor([[1, 2], [3, 4]]))
  compare(T([1.5, 2], device), torch.tensor([1.5, 2]))
  compare(T([True, False], device), torch.tensor([True, False]))
  compare(T(3.5, device), torch.tensor(3.5))
  compare(T([], device), torch.tensor([]))
  compare(T([1, 2], device, f16), torch.tensor([1, 2], dtype=torch.float16))
  compare(T(np.arange(6, dtype=np.int16).reshape(2, 3), device), torch.arange(6, dtype=torch.int16).reshape(2, 3))
  compare(T(np.arange(6.0).reshape(3, 2).T, device), torch.arange(6.0, dtype=torch.float64).reshape(3, 2).T)

def test_tensor_from_lists_packs_like_each_value_alone(device):
  # a list packs in one call when every value fits its format as it is, else value by value as the dtype stores it:
  # both ways give the same bytes (ints wrap, floats round to the type or go to inf, floats into ints truncate)
  cases = [([1, True, 3], None), ([1, 2.5], None), ([True, False], None), ([2**63 + 5, -1], i64), ([300, -1], dtypes.uint8),
           ([1.7, -2.9], i32), ([1e300, -1e300, 0.1], f32), ([70000.0, 1 / 3], f16), ([0, 2, -0.0], dtypes.bool)]
  for data, dt in cases:
    got = T(data, device, dt)
    assert got.tolist() == [T(v, device, got.dtype).item() for v in data], (data, dt)
  assert Tensor([[1, 2], [3, 4]]).dtype == i64 and Tensor([[1.0, 2], [3, 4]]).dtype == f32 and Tensor([[True], [False]]).dtype == dtypes.bool
  for bad in ([[1, 2], [3]], [[1, 2], 3], [1, [2]]):
    with pytest.raises(ArgumentError, match="not rectangular"): T(bad, device)
  with pytest.raises(TypeError, match="holding str"): T([1, "a"], device)

# ***** elementwise unary *****

UNARY = {  # name: (attograd fn, torch fn or None for the same, low, high)
  "neg": (lambda x: -x, None, -3, 3), "exp": (lambda x: x.exp(), None, -4, 4), "log": (lambda x: x.log(), None, 0.01, 8),
  "exp2": (lambda x: x.exp2(), None, -4, 4), "log2": (lambda x: x.log2(), None, 0.01, 8), "sqrt": (lambda x: x.sqrt(), None, 0, 9),
  "rsqrt": (lambda x: x.rsqrt(), None, 0.1, 9), "reciprocal": (lambda x: x.reciprocal(), None, 0.2, 5),
  "sin": (lambda x: x.sin(), None, -7, 7), "cos": (lambda x: x.cos(), None, -7, 7), "tan": (lambda x: x.tan(), None, -1.3, 1.3),
  "trunc": (lambda x: x.trunc(), None, -5, 5), "floor": (lambda x: x.floor(), None, -5, 5), "ceil": (lambda x: x.ceil(), None, -5, 5),
  "round": (lambda x: x.round(), None, -5, 5), "abs": (lambda x: x.abs(), None, -5, 5), "sign": (lambda x: x.sign(), None, -3, 3),
  "square": (lambda x: x.square(), None, -5, 5), "relu": (lambda x: x.relu(), None, -3, 3),
  "sigmoid": (lambda x: x.sigmoid(), None, -8, 8), "tanh": (lambda x: x.tanh(), None, -5, 5),
  "clip": (lambda x: x.clip(-1, 1.5), None, -3, 3), "clip_min": (lambda x: x.clip(0.5), None, -3, 3),
  "clip_max": (lambda x: x.clip(None, 0), None, -3, 3),
  "isnan": (lambda x: x.isnan(), None, -3, 3), "isinf": (lambda x: x.isinf(), None, -3, 3),
}

@pytest.mark.parametrize("name", list(UNARY))
def test_unary_float32(device, name):
  fa, ft, lo, hi = UNARY[name]
  check(fa, ft, [(3, 4, 5)], f32, device, atol=1e-5, rtol=1e-5, low=lo, high=hi)

# values every rounding op must get right: halves (to even), negatives, signed zero
ROUNDING_VALS = [-3.5, -2.5, -1.5, -0.5, -0.49, -0.0, 0.0, 0.49, 0.5, 0.51, 1.5, 2.5, 3.5, 4.5, -4.7, 4.7, 1e6 + 0.5, -7.0, 123456.5]
@pytest.mark.parametrize("name", ["trunc", "floor", "ceil", "round", "sign", "abs"])
def test_rounding_special_values(device, name):
  fa, ft, _, _ = UNARY[name]
  check(fa, ft, None, f32, device, vals=[ROUNDING_VALS])
  check(fa, ft, None, f64, device, vals=[ROUNDING_VALS + [2.0 ** 52 + 1, -(2.0 ** 53)]])

# math at the edges of its domain: 0, negatives, inf and nan
EDGE_VALS = [0.0, -0.0, -1.0, 1.0, math.inf, -math.inf, math.nan, 1e-30, 100.0, -100.0]
@pytest.mark.parametrize("name", ["neg", "exp", "log", "exp2", "log2", "sqrt", "rsqrt", "reciprocal", "sin", "abs", "sign",
                                  "relu", "sigmoid", "tanh", "isnan", "isinf", "floor", "ceil", "trunc", "round", "clip"])
def test_unary_edge_values(device, name):
  fa, ft, _, _ = UNARY[name]
  check(fa, ft, None, f32, device, atol=1e-6, rtol=1e-5, vals=[EDGE_VALS])

@pytest.mark.parametrize("name", ["neg", "abs", "sign", "square", "relu", "trunc", "floor", "ceil", "round", "clip", "isnan", "isinf",
                                  "exp", "log", "sqrt", "sin", "sigmoid", "reciprocal"])
@pytest.mark.parametrize("dtype", [i32])
def test_unary_int(device, name, dtype):
  """Ints: rounding is the identity, math promotes to float32 as torch does."""
  fa, ft, lo, hi = UNARY[name]
  check(fa, ft, [(4, 5)], dtype, device, atol=1e-5, rtol=1e-5, low=max(lo, 1) if name in ("log", "reciprocal") else min(lo, -4), high=max(hi, 5))

def test_unary_int64(device):
  check(lambda x: (-x, x.abs(), x.sign(), x.relu(), x.square(), x.exp()), None, [(4, 5)], i64, device, low=-6, high=6, atol=1e-5, rtol=1e-5)

@pytest.mark.parametrize("name", ["sign", "isnan", "isinf", "exp", "sqrt", "sigmoid", "square", "log"])
def test_unary_bool(device, name):
  fa, ft, _, _ = UNARY[name]
  check(fa, ft, [(3, 4)], bool_, device, atol=1e-6)

@pytest.mark.parametrize("dtype", [f16, bf16, f64])
@pytest.mark.parametrize("name", ["exp", "log", "sqrt", "sin", "sigmoid", "tanh", "round", "floor", "reciprocal"])
def test_unary_other_floats(device, name, dtype, request):
  expect_refusal(request, device, "f64_math", dtype == f64 and name in ("log", "sin"))
  fa, ft, lo, hi = UNARY[name]
  tol = NARROW.get(dtype, dict(atol=1e-12, rtol=1e-12))
  check(fa, ft, [(4, 6)], dtype, device, low=lo, high=hi, **tol)

@pytest.mark.parametrize("layout", ["T", "slice"])
@pytest.mark.parametrize("name", ["exp", "round", "sigmoid", "abs"])
def test_unary_noncontiguous(device, name, layout):
  fa, ft, lo, hi = UNARY[name]
  check(fa, ft, [(3, 4, 2)], f32, device, atol=1e-6, low=lo, high=hi, layout=layout)

def test_trig_large_arguments(device, request):
  expect_refusal(request, device, "f64_math")  # its second half is float64
  """Precision must not degrade with |x| (positions times frequencies in rotary embeddings are in the thousands)."""
  vals = [[100.0, 1000.0, 4097.5, 1e4, -3e4, 1e5, math.pi / 2, -math.pi, 1e-3]]
  check(lambda x: (x.sin(), x.cos()), lambda x: (x.sin(), x.cos()), None, f32, device, vals=vals, atol=1e-6, rtol=1e-5)
  check(lambda x: (x.sin(), x.cos()), lambda x: (x.sin(), x.cos()), None, f64, device, vals=vals, atol=1e-14, rtol=1e-12)

def test_unary_0d_and_empty(device):
  check(lambda x: x.exp(), None, [()], f32, device)
  check(lambda x: x.exp() + 1, None, [(0, 3)], f32, device)
  check(lambda x: -x, None, [(0,)], i32, device)

def test_neg_bool_is_logical_not(device):
  # torch refuses, tinygrad defines it: the rule says define it
  assert (-T([True, False], device)).tolist() == [False, True]

# ***** elementwise binary *****

BINARY = {  # name: (attograd fn, torch fn or None)
  "add": (lambda x, y: x + y, None), "sub": (lambda x, y: x - y, None), "mul": (lambda x, y: x * y, None),
  "div": (lambda x, y: x / y, None), "maximum": (lambda x, y: x.maximum(y), None), "minimum": (lambda x, y: x.minimum(y), None),
  "eq": (lambda x, y: x == y, None), "ne": (lambda x, y: x != y, None), "lt": (lambda x, y: x < y, None),
  "le": (lambda x, y: x <= y, None), "gt": (lambda x, y: x > y, None), "ge": (lambda x, y: x >= y, None),
  "add_method": (lambda x, y: x.add(y), None), "mul_method": (lambda x, y: x.mul(y), None), "sub_method": (lambda x, y: x.sub(y), None),
  "div_method": (lambda x, y: x.div(y), None),
}
BROADCAST_SHAPES = [[(3, 4), (3, 4)], [(3, 4), (4,)], [(3, 1), (1, 4)], [(2, 1, 4), (3, 1)], [(), (3, 2)], [(4, 3), ()],
                    [(0, 3), (1, 3)], [(5, 1, 1), (1, 1)]]

@pytest.mark.parametrize("shapes", BROADCAST_SHAPES, ids=str)
@pytest.mark.parametrize("name", ["sub", "div", "maximum", "lt"])
def test_binary_broadcast(device, name, shapes):
  fa, ft = BINARY[name]
  check(fa, ft, shapes, f32, device, atol=1e-6)

@pytest.mark.parametrize("name", list(BINARY))
@pytest.mark.parametrize("dtype", [f32, i32, i64])
def test_binary_dtypes(device, name, dtype):
  fa, ft = BINARY[name]
  # small ints so comparisons see ties; no zero divisors
  check(fa, ft, [(4, 5), (4, 5)], dtype, device, atol=1e-6, low=1 if name.startswith("div") else -3, high=4)

@pytest.mark.parametrize("name", ["add", "mul", "maximum", "minimum", "eq", "lt", "ge"])
def test_binary_bool(device, name):
  fa, ft = BINARY[name]
  check(fa, ft, [(3, 4), (3, 4)], bool_, device)

@pytest.mark.parametrize("dtype", [f16, bf16, f64])
@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "maximum", "minimum", "lt"])
def test_binary_other_floats(device, name, dtype):
  fa, ft = BINARY[name]
  check(fa, ft, [(3, 5), (5,)], dtype, device, low=0.5, high=3, **NARROW.get(dtype, dict(atol=1e-12, rtol=1e-12)))

@pytest.mark.parametrize("dtypes_", [(i32, f32), (f16, f32), (bool_, i32), (u8, i8), (i8, f16), (bf16, f16), (i64, f64), (bool_, f32)], ids=str)
@pytest.mark.parametrize("name", ["add", "div", "lt"])
def test_binary_mixed_dtypes(device, name, dtypes_):
  fa, ft = BINARY[name]
  check(fa, ft, [(3, 4), (3, 4)], list(dtypes_), device, low=1, high=4, atol=1e-2, rtol=1e-2)

@pytest.mark.parametrize("layout", ["T", "slice"])
@pytest.mark.parametrize("name", ["add", "div", "maximum", "ge"])
def test_binary_noncontiguous(device, name, layout):
  fa, ft = BINARY[name]
  check(fa, ft, [(3, 4, 2), (3, 4, 2)], f32, device, atol=1e-6, layout=layout)

def test_binary_permuted_and_plain(device):
  check(lambda x, y: x.permute(1, 0) * y, None, [(4, 3), (3, 4)], f32, device)
  check(lambda x, y: x[::2, 1:] + y.T, None, [(7, 4), (3, 4)], f32, device)
  check(lambda x, y: x.expand(3, 4) - y, None, [(3, 1), (3, 4)], i32, device)

SCALAR_FNS = {  # Python scalars on either side; the scalar is weak: it doesn't widen the tensor's dtype within its kind
  "add_int": lambda x: x + 2, "radd_int": lambda x: 2 + x, "sub_float": lambda x: x - 1.5, "rsub_float": lambda x: 1.5 - x,
  "mul_float": lambda x: x * 0.5, "rmul_int": lambda x: 3 * x, "div_int": lambda x: x / 2, "rdiv_float": lambda x: 3.0 / x,
  "pow_2": lambda x: x ** 2, "pow_3": lambda x: x ** 3, "pow_0": lambda x: x ** 0, "pow_neg1": lambda x: x ** -1,
  "pow_half": lambda x: x ** 0.5, "rpow_int": lambda x: 2 ** x, "rpow_float": lambda x: 1.5 ** x, "max_int": (lambda x: x.maximum(1), lambda x: x.clamp(min=1)),
  "min_float": (lambda x: x.minimum(0.5), lambda x: x.clamp(max=0.5)), "lt_float": lambda x: x < 0.5, "gt_int": lambda x: x > 1, "rlt": lambda x: 2 < x,
  "eq_int": lambda x: x == 2, "ne_float": lambda x: x != 2.0, "le_int": lambda x: x <= 2, "ge_float": lambda x: x >= 1.5,
  "add_bool": lambda x: x + True, "mul_bool": lambda x: x * False,
}
@pytest.mark.parametrize("name", list(SCALAR_FNS))
@pytest.mark.parametrize("dtype", [f32, i32])
def test_binary_python_scalar(device, name, dtype):
  fa, ft = SCALAR_FNS[name] if isinstance(SCALAR_FNS[name], tuple) else (SCALAR_FNS[name], None)
  if name == "pow_neg1" and dtype == i32:  # torch refuses integers to negative integer powers
    with pytest.raises(ValueError, match="negative"): fa(T([1, 2], device, dtype))
    return
  check(fa, ft, [(3, 4)], dtype, device, low=1, high=4, atol=1e-5, rtol=1e-5 if dtype != f16 else 2e-3)

@pytest.mark.parametrize("name", ["add_int", "mul_float", "div_int", "lt_float", "eq_int", "max_int", "mul_bool", "add_bool", "rpow_float", "pow_2"])
def test_bool_tensor_python_scalar(device, name):
  fa, ft = SCALAR_FNS[name] if isinstance(SCALAR_FNS[name], tuple) else (SCALAR_FNS[name], None)
  check(fa, ft, [(3, 4)], bool_, device)

@pytest.mark.parametrize("name", ["add_int", "rsub_float", "mul_float", "div_int", "pow_2", "rpow_int", "lt_float", "eq_int", "max_int"])
def test_half_tensor_python_scalar(device, name):
  fa, ft = SCALAR_FNS[name] if isinstance(SCALAR_FNS[name], tuple) else (SCALAR_FNS[name], None)
  check(fa, ft, [(3, 4)], f16, device, low=1, high=4, **NARROW[f16])

# floor division and remainder follow Python (and torch): the quotient is floored, the remainder takes the divisor's sign
INT_DIV_VALS = [[-7, 7, -7, 7, 0, -1, 5, -5, 6, -6, 2 ** 31 - 1, -2 ** 31 + 1], [2, 2, -2, -2, 3, 3, -3, 3, -3, 1, 7, -7]]
@pytest.mark.parametrize("dtype", [i32, i64, i8])
def test_int_floordiv_mod(device, dtype):
  vals = INT_DIV_VALS if dtype != i8 else [v[:10] for v in INT_DIV_VALS]
  check(lambda x, y: x // y, None, None, dtype, device, vals=vals)
  check(lambda x, y: x % y, None, None, dtype, device, vals=vals)
  check(lambda x, y: x.div(y, rounding_mode="floor"), None, None, dtype, device, vals=vals)
  check(lambda x, y: x.div(y, rounding_mode="trunc"), None, None, dtype, device, vals=vals)
  check(lambda x, y: x.floor_divide(y), None, None, dtype, device, vals=vals)
  check(lambda x, y: x.mod(y), lambda x, y: x.remainder(y), None, dtype, device, vals=vals)

@pytest.mark.parametrize("dtype", [i32])
def test_int_floordiv_mod_scalar(device, dtype):
  vals = [[-7, -6, -1, 0, 1, 6, 7, -100, 100]]
  for d in (3, -3, -1, 16):
    check(lambda x: x // d, None, None, dtype, device, vals=vals)
    check(lambda x: x % d, None, None, dtype, device, vals=vals)
  check(lambda x: 7 // x, None, None, dtype, device, vals=[[-3, -2, 2, 3, 5, -7]])
  check(lambda x: -7 % x, None, None, dtype, device, vals=[[-3, -2, 2, 3, 5, -7]])
  check(lambda x: x.div(3, rounding_mode="trunc"), None, None, dtype, device, vals=vals)

def test_float_floordiv_mod(device):
  vals = [[-7.5, 7.5, -7.5, 7.5, 0.0, 5.25, -3.0, 1e-3], [2.0, 2.0, -2.0, -2.0, 3.0, -0.5, 1.5, 1.0]]
  check(lambda x, y: x // y, None, None, f32, device, vals=vals)
  check(lambda x, y: x % y, None, None, f32, device, vals=vals, atol=1e-6)
  check(lambda x, y: x.div(y, rounding_mode="trunc"), None, None, f32, device, vals=vals)
  check(lambda x, y: x.div(y, rounding_mode="floor"), None, None, f32, device, vals=vals)
  check(lambda x: x // 2, None, None, f32, device, vals=vals[:1])
  check(lambda x: x % -2.5, None, None, f32, device, vals=vals[:1], atol=1e-6)
  check(lambda x: 3 // x, None, None, f32, device, vals=vals[1:])

def test_div_int_is_true_division(device):
  check(lambda x, y: x / y, None, None, i32, device, vals=[[7, -7, 1, 0], [2, 2, 3, 5]])
  check(lambda x, y: x / y, None, None, f32, device, vals=[[1.0, -1.0, 0.0, 0.0], [0.0, 0.0, 0.0, -0.0]])  # inf, -inf, nan
  with pytest.raises(ValueError, match="rounding_mode"): T([1, 2], device).div(2, rounding_mode="round")

# C's pow (and torch's) at the edges: x**0 and 1**y are 1 even for nan, (-1)**inf is 1, 0**-1 is inf, negative bases need integer exponents
POW_VALS = [[-2.0, -2.0, -1.5, 0.0, 0.0, 0.0, 2.0, 3.0, 0.5, -3.0, 4.0, 1.0, math.nan, -1.0, -1.0, math.inf, -math.inf, 0.5, 2.0, math.nan],
            [2.0, 3.0, 2.0, 0.0, 2.5, -1.0, 0.5, -2.0, 3.3, 0.5, -0.5, math.nan, 0.0, math.inf, -math.inf, -1.0, 3.0, math.inf, -math.inf, 2.0]]
def test_pow(device):
  check(lambda x, y: x ** y, None, None, f32, device, vals=POW_VALS, atol=1e-5, rtol=1e-5)
  check(lambda x, y: x.pow(y), None, [(3, 4), (4,)], f32, device, low=0.1, high=3, atol=1e-5, rtol=1e-5)
  # integer powers are exact and wrap on overflow; a negative exponent gives 0 except for bases 1 and -1
  int_vals = [[2, -3, 5, 0, 1, 7, 3, -1, -1, 2, 1, -2], [3, 3, 0, 2, 9, 2, 40, -3, -4, -1, -5, 31]]
  check(lambda x, y: x ** y, None, None, i32, device, vals=int_vals)
  check(lambda x, y: x ** y, None, None, i64, device, vals=[int_vals[0] + [3], int_vals[1] + [39]])
  check(lambda x, y: x ** y, None, None, [i32, f32], device, vals=[[2, -3, 5, 4], [0.5, 2.0, -1.0, 1.5]], atol=1e-6)
  check(lambda x: x ** 2.5, None, None, f32, device, vals=[[0.0, 1.0, 2.0, 4.0, -1.0]], atol=1e-6)
  check(lambda x: x ** 9, None, None, f32, device, vals=[[1.0, -1.0, 1.1, -2.0]], rtol=1e-5)
  check(lambda x: x ** 3, None, None, i64, device, vals=[[2, -3, 0, 1000]])
  check(lambda x: 2 ** x, None, None, i32, device, vals=[[0, 1, 5, 10]])
  check(lambda x: (-2.0) ** x, None, None, f32, device, vals=[[0.0, 1.0, 2.0, 3.0, 0.5]], atol=1e-6)

@pytest.mark.parametrize("dtype", [f32, f64])
def test_maximum_minimum_nan(device, dtype):
  vals = [[math.nan, 1.0, math.nan, -0.0, math.inf, -math.inf], [1.0, math.nan, math.nan, 0.0, 2.0, 3.0]]
  check(lambda x, y: x.maximum(y), None, None, dtype, device, vals=vals)
  check(lambda x, y: x.minimum(y), None, None, dtype, device, vals=vals)
  check(lambda x, y: x < y, None, None, dtype, device, vals=vals)
  check(lambda x, y: x == y, None, None, dtype, device, vals=vals)
  check(lambda x, y: x != y, None, None, dtype, device, vals=vals)
  check(lambda x, y: x >= y, None, None, dtype, device, vals=vals)

BITWISE = {"and": (lambda x, y: x & y, None), "or": (lambda x, y: x | y, None), "xor": (lambda x, y: x ^ y, None),
           "and_method": (lambda x, y: x.bitwise_and(y), None), "or_method": (lambda x, y: x.bitwise_or(y), None),
           "xor_method": (lambda x, y: x.bitwise_xor(y), None), "not": (lambda x, y: ~x, None), "logical_and": (lambda x, y: x.logical_and(y), None),
           "logical_or": (lambda x, y: x.logical_or(y), None), "logical_not": (lambda x, y: x.logical_not(), None)}
@pytest.mark.parametrize("dtype", [i32, bool_, u8])
@pytest.mark.parametrize("name", list(BITWISE))
def test_bitwise(device, name, dtype):
  fa, ft = BITWISE[name]
  check(fa, ft, [(3, 5), (5,)], dtype, device, low=-100 if dtype != u8 else 0, high=100)

def test_bitwise_scalars(device):
  for fn in (lambda x: x & 6, lambda x: 6 & x, lambda x: x | 1, lambda x: 1 | x, lambda x: x ^ -1, lambda x: 5 ^ x, lambda x: ~x):
    check(fn, None, [(2, 6)], i32, device, low=-50, high=50)
  for fn in (lambda x: x & True, lambda x: x | False, lambda x: x ^ True):
    check(fn, None, [(2, 6)], bool_, device)
  for dt in (i64, i8):
    check(lambda x, y: (x & y) ^ (~x | 3), None, [(2, 6), (6,)], dt, device, low=-100, high=100)
  with pytest.raises(TypeError, match="float32"): T([1.0], device) & T([1.0], device)
  with pytest.raises(TypeError, match="float32"): ~T([1.0], device)

@pytest.mark.parametrize("dtype", [i32, i64, u8])
def test_shifts(device, dtype):
  bits = 8 * dtype.itemsize
  x = [1, 3, 100, -5, -1024, 7, 0] if dtype != u8 else [1, 3, 100, 250, 128, 7, 0]
  s = [0, 1, 2, 3, 4, bits - 2, 5]
  check(lambda x, y: x << y, None, None, dtype, device, vals=[x, s])
  check(lambda x, y: x >> y, None, None, dtype, device, vals=[x, s])
  check(lambda x: x << 3, None, None, dtype, device, vals=[x])
  check(lambda x: x >> 1, None, None, dtype, device, vals=[x])
  check(lambda x, y: x.lshift(y), lambda x, y: x << y, None, dtype, device, vals=[x, s])
  check(lambda x, y: x.rshift(y), lambda x, y: x >> y, None, dtype, device, vals=[x, s])
  # amounts C leaves undefined: negative, or the bit width and more (torch: 0 for <<, the sign fill for >>)
  wild = [-1, bits, bits + 1, 100, -40, bits - 1, 0]
  check(lambda x, y: (x << y, x >> y), lambda x, y: (x << y, x >> y), None, dtype, device, vals=[x, wild])
  check(lambda x: (x << bits, x >> bits, x << -1, x >> (bits + 3)), lambda x: (x << bits, x >> bits, x << -1, x >> (bits + 3)), None, dtype, device, vals=[x])

WHERE_CASES = {
  "tensors": (lambda c, x, y: c.where(x, y), lambda c, x, y: torch.where(c, x, y)),
  "scalar_x": (lambda c, x, y: c.where(1.5, y), lambda c, x, y: torch.where(c, 1.5, y)),
  "scalar_y": (lambda c, x, y: c.where(x, 0), lambda c, x, y: torch.where(c, x, 0)),
  "both_int": (lambda c, x, y: c.where(1, -2), lambda c, x, y: torch.where(c, 1, -2)),
  "both_float": (lambda c, x, y: c.where(1.0, -2), lambda c, x, y: torch.where(c, 1.0, -2)),
  "int_cond": (lambda c, x, y: (x > 0).where(x, y * 2), lambda c, x, y: torch.where(x > 0, x, y * 2)),
}
@pytest.mark.parametrize("name", list(WHERE_CASES))
@pytest.mark.parametrize("dtypes_", [(bool_, f32, f32), (bool_, i32, i32), (bool_, i32, f16), (bool_, i64, f32)], ids=str)
def test_where(device, name, dtypes_):
  fa, ft = WHERE_CASES[name]
  check(fa, ft, [(3, 1, 4), (2, 4), (1,)], list(dtypes_), device, low=-3, high=3, atol=1e-6)

def test_where_noncontiguous_and_nonbool_cond(device):
  check(lambda c, x, y: c.where(x, y), lambda c, x, y: torch.where(c.bool(), x, y), [(4, 3), (4, 3), (4, 3)], [i32, f32, f32], device, layout="T")
  check(lambda c, x, y: c.where(x, y), lambda c, x, y: torch.where(c != 0, x, y), [(4, 3), (4, 3), (4, 3)], [f32, i32, i32], device, low=-1, high=1)

def test_lerp(device):
  check(lambda a, b: a.lerp(b, 0.25), lambda a, b: torch.lerp(a, b, 0.25), [(3, 4), (3, 4)], f32, device, atol=1e-6)
  check(lambda a, b, w: a.lerp(b, w), lambda a, b, w: torch.lerp(a, b, w), [(3, 4), (4,), (3, 1)], f32, device, low=0, high=1, atol=1e-6)
  check(lambda a, b: a.lerp(b, 0.5), lambda a, b: torch.lerp(a, b, 0.5), [(2, 3), (2, 3)], f16, device, **NARROW[f16])

def test_mul_add(device):
  """a * b + c rounded once (C's fma), against torch.addcmul; broadcast operands."""
  check(lambda a, b, c: a.mul_add(b, c), lambda a, b, c: torch.addcmul(c, a, b), [(3, 4), (4,), (3, 1)], f32, device, atol=1e-6)
  a, b, c = 1 + 2 ** -23, 1 - 2 ** -23, -1.0  # a * b + c = -2**-46 exactly: rounding the product first gives 0
  got = Tensor([a], device=device).mul_add(Tensor([b], device=device), Tensor([c], device=device)).numpy()[0]
  assert got == (0 if device == "WEBGPU" else -2.0 ** -46), got  # WGSL renders a * b + c: no fused form promised
  with pytest.raises(ArgumentError, match="floats"): Tensor([1, 2], device=device).mul_add(2, 3)

def test_binary_chain_fused(device):
  """A deeper elementwise graph (one kernel) mixing broadcast, scalars and comparisons."""
  check(lambda x, y, z: ((x * y + z).maximum(0) - (x > z).float() * 2) / (y.abs() + 1),
        lambda x, y, z: ((x * y + z).maximum(torch.tensor(0.0)) - (x > z).float() * 2) / (y.abs() + 1), [(4, 5), (5,), (4, 1)], f32, device, atol=1e-6)

# ***** movement *****

MOVEMENT = {  # name: (shape, attograd fn, torch fn or None)
  "reshape": ((2, 3, 4), lambda x: x.reshape(4, 6), None),
  "reshape_tuple": ((2, 3, 4), lambda x: x.reshape((6, 4)), None),
  "reshape_minus1": ((2, 3, 4), lambda x: x.reshape(-1, 2), None),
  "reshape_minus1_mid": ((2, 3, 4), lambda x: x.reshape(3, -1, 2), None),
  "reshape_flat": ((2, 3, 4), lambda x: x.reshape(-1), None),
  "reshape_0d": ((1, 1), lambda x: x.reshape(()), None),
  "reshape_from_0d": ((), lambda x: x.reshape(1, 1, 1), None),
  "reshape_empty": ((0, 4), lambda x: x.reshape(2, 0, 3), None),
  "view": ((4, 6), lambda x: x.view(2, 12), None),
  "view_minus1": ((4, 6), lambda x: x.view(-1, 3), None),
  "permute": ((2, 3, 4), lambda x: x.permute(2, 0, 1), None),
  "permute_tuple": ((2, 3, 4), lambda x: x.permute((1, 2, 0)), None),
  "permute_neg": ((2, 3, 4), lambda x: x.permute(-1, -3, -2), None),
  "expand": ((3, 1), lambda x: x.expand(3, 4), None),
  "expand_new_dims": ((3, 1), lambda x: x.expand(2, 3, 5), None),
  "expand_minus1": ((1, 4), lambda x: x.expand(3, -1), None),
  "expand_0d": ((), lambda x: x.expand(2, 3), None),
  "pad": ((3, 4), lambda x: x.pad((1, 2)), lambda x: F.pad(x, (1, 2))),
  "pad_2d": ((3, 4), lambda x: x.pad((1, 2, 0, 3)), lambda x: F.pad(x, (1, 2, 0, 3))),
  "pad_pairs": ((3, 4), lambda x: x.pad(((2, 0), (1, 1))), lambda x: F.pad(x, (1, 1, 2, 0))),
  "pad_none": ((3, 4), lambda x: x.pad((None, (0, 2))), lambda x: F.pad(x, (0, 2))),
  "pad_value": ((3, 4), lambda x: x.pad((1, 1, 2, 0), value=-7.5), lambda x: F.pad(x, (1, 1, 2, 0), value=-7.5)),
  "pad_negative": ((5, 6), lambda x: x.pad((-1, 2, -2, -1)), lambda x: F.pad(x, (-1, 2, -2, -1))),
  "pad_negative_value": ((5, 6), lambda x: x.pad((2, -3, 0, 1), value=9.0), lambda x: F.pad(x, (2, -3, 0, 1), value=9.0)),
  "pad_all_negative": ((5, 6), lambda x: x.pad((-1, -1, -2, -2)), lambda x: F.pad(x, (-1, -1, -2, -2))),
  "pad_3d_last": ((2, 3, 4), lambda x: x.pad((1, 1)), lambda x: F.pad(x, (1, 1))),
  "shrink": ((5, 6), lambda x: x.shrink(((1, 4), (0, 6))), lambda x: x[1:4, 0:6]),
  "shrink_none": ((5, 6), lambda x: x.shrink((None, (2, 5))), lambda x: x[:, 2:5]),
  "shrink_empty": ((5, 6), lambda x: x.shrink(((2, 2), None)), lambda x: x[2:2]),
  "flip": ((3, 4), lambda x: x.flip(0), None),
  "flip_multi": ((2, 3, 4), lambda x: x.flip(0, 2), None),
  "flip_tuple_neg": ((2, 3, 4), lambda x: x.flip((-1, -2)), None),
  "transpose": ((2, 3, 4), lambda x: x.transpose(0, 2), None),
  "transpose_neg": ((2, 3, 4), lambda x: x.transpose(-1, -2), None),
  "transpose_default": ((3, 4), lambda x: x.transpose(), lambda x: x.transpose(1, 0)),
  "T": ((3, 4), lambda x: x.T, None),
  "T_3d": ((2, 3, 4), lambda x: x.T, lambda x: x.permute(2, 1, 0)),
  "flatten": ((2, 3, 4), lambda x: x.flatten(), None),
  "flatten_range": ((2, 3, 4, 5), lambda x: x.flatten(1, 2), None),
  "flatten_neg": ((2, 3, 4, 5), lambda x: x.flatten(-3, -2), None),
  "flatten_start": ((2, 3, 4), lambda x: x.flatten(1), None),
  "flatten_0d": ((), lambda x: x.flatten(), None),
  "unflatten": ((2, 12), lambda x: x.unflatten(1, (3, 4)), None),
  "unflatten_neg": ((12, 2), lambda x: x.unflatten(-2, (2, 3, 2)), None),
  "squeeze": ((1, 3, 1, 4), lambda x: x.squeeze(), None),
  "squeeze_dim": ((1, 3, 1, 4), lambda x: x.squeeze(2), None),
  "squeeze_neg": ((1, 3, 1, 4), lambda x: x.squeeze(-4), None),
  "squeeze_noop": ((1, 3, 1, 4), lambda x: x.squeeze(1), None),
  "squeeze_0d": ((), lambda x: x.squeeze(), None),
  "unsqueeze": ((3, 4), lambda x: x.unsqueeze(0), None),
  "unsqueeze_mid": ((3, 4), lambda x: x.unsqueeze(1), None),
  "unsqueeze_end": ((3, 4), lambda x: x.unsqueeze(2), None),
  "unsqueeze_neg": ((3, 4), lambda x: x.unsqueeze(-1), None),
  "unsqueeze_neg3": ((3, 4), lambda x: x.unsqueeze(-3), None),
  "unsqueeze_0d": ((), lambda x: x.unsqueeze(0), None),
  "repeat": ((2, 3), lambda x: x.repeat(2, 3), None),
  "repeat_tuple": ((2, 3), lambda x: x.repeat((1, 2)), None),
  "repeat_more_dims": ((2, 3), lambda x: x.repeat(2, 1, 2), None),
  "repeat_zero": ((2, 3), lambda x: x.repeat(0, 2), None),
  "chain": ((4, 6), lambda x: x.T.reshape(3, 8)[1:, ::3].flip(0).pad((1, 0)), lambda x: F.pad(x.T.reshape(3, 8)[1:, ::3].flip(0), (1, 0))),
  "chain2": ((2, 3, 4), lambda x: x.permute(1, 0, 2).reshape(3, 8).expand(2, 3, 8).transpose(0, 1).flatten(1), None),
}
@pytest.mark.parametrize("name", list(MOVEMENT))
def test_movement(device, name):
  shape, fa, ft = MOVEMENT[name]
  check(fa, ft, [shape], f32, device)

@pytest.mark.parametrize("dtype", [i32, bool_, f16])
@pytest.mark.parametrize("name", ["permute", "pad_value", "flip_multi", "repeat", "chain"])
def test_movement_dtypes(device, name, dtype):
  shape, fa, ft = MOVEMENT[name]
  if name == "pad_value" and dtype != f16:  # an int/bool pad value of the tensor's kind
    fa, ft = lambda x: x.pad((1, 1, 2, 0), value=1), lambda x: F.pad(x, (1, 1, 2, 0), value=1)
  check(fa, ft, [shape], dtype, device, low=-50, high=50)

@pytest.mark.parametrize("layout", ["T", "slice"])
@pytest.mark.parametrize("name", ["reshape", "reshape_minus1", "permute", "pad_2d", "flip_multi", "flatten", "repeat", "chain2"])
def test_movement_noncontiguous(device, name, layout):
  shape, fa, ft = MOVEMENT[name]
  check(fa, ft, [shape], f32, device, layout=layout)

def test_movement_then_compute(device):
  """Movement ops pushed into the index math of a consumer kernel (no copies in between)."""
  check(lambda x: (x.permute(1, 0).reshape(-1)[::3] + 1) * 2, None, [(4, 6)], f32, device)
  check(lambda x: x.pad((1, 1, 1, 1)).exp()[1:, :-1].sum(0), lambda x: F.pad(x, (1, 1, 1, 1)).exp()[1:, :-1].sum(0), [(3, 4)], f32, device, atol=1e-5)
  check(lambda x, y: x.expand(4, 3, 5) * y.reshape(4, 1, 5), None, [(3, 5), (20,)], f32, device)
  check(lambda x: x.flip(1).contiguous().T.reshape(2, -1), None, [(3, 4)], i32, device)

def test_view_of_realized_and_reuse(device):
  x, tx = make_pair(np.arange(24.0).reshape(4, 6), f32, device)
  y = (x + 1).realize()
  compare(y[1:3].T, (tx + 1)[1:3].T)
  compare(y.reshape(2, 12)[:, ::5], (tx + 1).reshape(2, 12)[:, ::5])
  compare(y.sum(0), (tx + 1).sum(0))
  compare(y, tx + 1)

# ***** indexing *****

GETITEM = [1, -1, (1, 2), (-2, -1, 0), slice(None), slice(1, 3), slice(None, None, 2), slice(1, None, 3), slice(-3, None), slice(10, 20),
           slice(2, 2), slice(3, 1), slice(-100, 100), (slice(None), 1), (Ellipsis, 1), (1, Ellipsis), (Ellipsis,), (None,), (None, 1),
           (1, None, slice(None, None, 2)), (Ellipsis, None), (slice(None), None, 2, None), (0, slice(1, 3), slice(None, None, 4)),
           (slice(1, None, 2), Ellipsis, slice(0, 3, 2)), (None, Ellipsis, None), (2, 1, 3), (slice(0, 0), 1), ()]
@pytest.mark.parametrize("index", GETITEM, ids=repr)
def test_getitem(device, index):
  check(lambda x: x[index], None, [(4, 3, 5)], f32, device)

def np_index(index):
  """numpy as the reference where torch refuses (negative steps); np.array copies to positive strides, and keeps 0-d results arrays."""
  return lambda x: torch.from_numpy(np.array(x.numpy()[index]))

# torch refuses negative steps: numpy is the reference
NEG_STEP = [slice(None, None, -1), slice(None, None, -2), slice(-1, 0, -2), slice(3, 0, -1), slice(5, 1, -3), slice(None, 2, -1), slice(1, 3, -1),
            (slice(None, None, -1), 1, slice(1, None, -1)), (Ellipsis, slice(None, None, -3)), (slice(None, None, -3), None, 1, slice(None, None, 2))]
@pytest.mark.parametrize("index", NEG_STEP, ids=repr)
def test_getitem_negative_step(device, index):
  check(lambda x: x[index], np_index(index), [(4, 3, 5)], f32, device)

@pytest.mark.parametrize("index", [(1, slice(None, None, 2)), (slice(None, None, -1), 0), (Ellipsis, slice(1, None, 3)), -1], ids=repr)
def test_getitem_noncontiguous_and_dtypes(device, index):
  ref = np_index(index)
  check(lambda x: x[index], ref, [(4, 3, 5)], f32, device, layout="T")
  check(lambda x: x[index], ref, [(4, 3, 5)], i32, device, layout="slice")
  check(lambda x: x[index], ref, [(4, 3, 5)], bool_, device)

def test_getitem_0d_and_chained(device):
  check(lambda x: x[2][1], None, [(4, 3)], f32, device)
  check(lambda x: x[None][..., None], None, [()], f32, device)
  check(lambda x: x[1:][::2][:, 1], None, [(7, 3)], i32, device)
  check(lambda x: x[:, ::2] * 2 + x[:, 1::2], None, [(3, 8)], f32, device)

# ***** reductions *****

REDUCE_AXES = [None, -1, (0, 2)]
def _torch_reduce(name, x, axis, keepdim):
  """torch spellings: tuple axes go through amax/amin, and prod reduces one axis at a time."""
  if name == "prod":
    if axis is None: return x.prod() if not keepdim else x.prod().reshape([1] * x.ndim)
    for a in sorted((axis,) if isinstance(axis, int) else axis, key=lambda a: a % x.ndim, reverse=True): x = x.prod(a, keepdim=keepdim)
    return x
  dim = tuple(range(x.ndim)) if axis is None else axis
  if name in ("max", "min"): return (torch.amax if name == "max" else torch.amin)(x, dim=dim, keepdim=keepdim)
  if name in ("any", "all"):  # always bool in attograd; torch keeps uint8 for uint8 input (documented difference)
    return getattr(torch, name)(x, dim=dim, keepdim=keepdim).bool()
  if axis is None and keepdim: return getattr(x, name)(dim=tuple(range(x.ndim)), keepdim=True)
  return getattr(x, name)() if axis is None else getattr(x, name)(axis, keepdim=keepdim)

@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("axis", REDUCE_AXES, ids=str)
@pytest.mark.parametrize("name", ["sum", "prod", "max", "min", "mean", "var", "std", "any", "all"])
def test_reduce_float(device, name, axis, keepdim):
  check(lambda x: getattr(x, name)(axis=axis, keepdim=keepdim), lambda x: _torch_reduce(name, x, axis, keepdim), [(3, 4, 5)], f32, device,
        atol=1e-5, rtol=1e-5, low=0.5 if name == "prod" else -2, high=1.5 if name == "prod" else 2)

@pytest.mark.parametrize("dtype", [i32, bool_, u8])
@pytest.mark.parametrize("axis", [None, (0, 2)], ids=str)
@pytest.mark.parametrize("name", ["sum", "prod", "max", "min", "any", "all"])
def test_reduce_int_bool(device, name, axis, dtype):
  """Integer and bool sums and products accumulate in int64, as in torch."""
  lo, hi = (-3, 4) if name != "prod" else (1, 3)
  if dtype == u8: lo = max(lo, 0)
  check(lambda x: getattr(x, name)(axis=axis), lambda x: _torch_reduce(name, x, axis, False), [(3, 4, 5)], dtype, device, low=lo, high=hi)

@pytest.mark.parametrize("dtype", [i64, i8, dtypes.int16, dtypes.uint32])
def test_reduce_other_ints(device, dtype):
  ft = lambda x: (x.sum(1), x.amax(1), x.amin(0))
  if dtype == dtypes.uint32:  # torch has no uint32 reductions: numpy's, with the sum in uint64 as attograd (and torch's uint8 rule) does
    ft = lambda x: tuple(torch.from_numpy(r) for r in (x.numpy().sum(1, dtype=np.uint64), x.numpy().max(1), x.numpy().min(0)))
  check(lambda x: (x.sum(1), x.max(axis=1), x.min(axis=0)), ft, [(4, 5)], dtype, device, low=0 if dtype == dtypes.uint32 else -100, high=100)

@pytest.mark.parametrize("dtype", [f16, bf16, f64])
@pytest.mark.parametrize("name", ["sum", "max", "min", "mean", "var", "prod"])
def test_reduce_other_floats(device, name, dtype):
  tol = dict(atol=5e-3, rtol=5e-3) if dtype == f16 else dict(atol=5e-2, rtol=2e-2) if dtype == bf16 else dict(atol=1e-12, rtol=1e-12)
  check(lambda x: getattr(x, name)(axis=1), lambda x: _torch_reduce(name, x, 1, False), [(4, 40)], dtype, device,
        low=0.9 if name == "prod" else -2, high=1.1 if name == "prod" else 2, **tol)

@pytest.mark.filterwarnings("ignore:var.*degrees of freedom")  # torch warns where the answer is nan; so be it
@pytest.mark.parametrize("name", ["sum", "prod", "max", "min", "mean", "all", "var"])
def test_reduce_size1_dims(device, name):
  for shape, axis in [((1, 4), 0), ((4, 1), 1), ((), None), ((3, 1, 2), (1, 2))]:
    if name == "var" and shape == (): continue  # torch warns on 0-d var; covered by size-1 cases
    check(lambda x: getattr(x, name)(axis=axis), lambda x: _torch_reduce(name, x, axis, False), [shape], f32, device, atol=1e-6)
    check(lambda x: getattr(x, name)(axis=axis, keepdim=True), lambda x: _torch_reduce(name, x, axis, True), [shape], f32, device, atol=1e-6)

@pytest.mark.parametrize("name", ["sum", "prod", "mean", "any", "all"])
def test_reduce_empty(device, name):
  """Reducing over a 0-size axis gives the identity (nan for mean); other axes of size 0 stay empty."""
  for shape, axis in [((0, 3), 0), ((0, 3), 1), ((2, 0, 3), (0, 1))]:
    check(lambda x: getattr(x, name)(axis=axis), lambda x: _torch_reduce(name, x, axis, False), [shape], f32, device)
    check(lambda x: getattr(x, name)(axis=axis, keepdim=True), lambda x: _torch_reduce(name, x, axis, True), [shape], f32, device)
  if name in ("sum", "prod", "any", "all"):
    check(lambda x: getattr(x, name)(axis=0), lambda x: _torch_reduce(name, x, 0, False), [(0, 3)], i32, device)

def test_max_min_empty_refuses(device):
  x = Tensor.zeros(0, 3, device=device)
  with pytest.raises(ValueError, match=r"\(0, 3\)"): x.max(0)
  with pytest.raises(ValueError, match=r"\(0, 3\)"): x.min()
  compare(x.max(axis=1), torch.zeros(0, 3).amax(1))

@pytest.mark.filterwarnings("ignore:var.*degrees of freedom")
@pytest.mark.parametrize("correction", [0, 1, 2])
def test_var_std_correction(device, correction):
  for axis in (None, 0, (0, 1)):
    check(lambda x: x.var(axis, correction=correction), lambda x: torch.var(x, axis, correction=correction), [(4, 3)], f32, device, atol=1e-5, rtol=1e-5)
    check(lambda x: x.std(axis, keepdim=True, correction=correction), lambda x: torch.std(x, axis, correction=correction, keepdim=True),
          [(4, 3)], f32, device, atol=1e-5, rtol=1e-5)
  check(lambda x: x.var(1), lambda x: torch.var(x, 1), [(4, 1)], f32, device)  # one sample, correction 1: nan

def test_mean_int_is_float(device):
  # torch refuses, tinygrad defines it (a float32): the rule says define it; the integer sum is exact
  m = T([1, 2, 2**24 + 1], device, i32).mean()
  assert m.dtype.name == "float32" and m.item() == np.float32((2**24 + 4) / 3)

@pytest.mark.parametrize("layout", ["T", "slice"])
@pytest.mark.parametrize("name", ["sum", "max", "argmax"])
def test_reduce_noncontiguous(device, name, layout):
  for axis in (0, None):
    ft = (lambda x: getattr(x, name)(axis)) if name == "argmax" else (lambda x: _torch_reduce(name, x, axis, False))
    check(lambda x: getattr(x, name)(axis=axis), ft, [(3, 4, 5)], f32, device, atol=1e-5, rtol=1e-5, layout=layout)

@pytest.mark.parametrize("axis,keepdim", [(None, True), (0, False), (-1, True)], ids=str)
@pytest.mark.parametrize("dtype", [f32, i32, bool_])
@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_argmin(device, name, axis, keepdim, dtype):
  """Ties (many, with small ints and bools) resolve to the first index, as torch documents."""
  fa = lambda x: getattr(x, name)(axis, keepdim=keepdim)
  ft = (lambda x: fa(x.to(torch.uint8))) if dtype == bool_ else None  # torch has no argmax for bool: the uint8 result
  check(fa, ft, [(4, 6)], dtype, device, low=-2, high=3)

def test_argmax_special(device):
  check(lambda x: x.argmax(1), None, None, f32, device, vals=[[[1.0, math.inf, 3.0], [-math.inf, -math.inf, -math.inf], [2.0, 2.0, 1.0]]])
  check(lambda x: x.argmin(0), None, None, f32, device, vals=[[[1.0, -math.inf], [0.0, -math.inf]]])
  nans = [[[1.0, math.nan, 3.0, math.nan], [math.inf, 2.0, 2.0, -1.0], [-math.inf, -math.inf, math.nan, 0.0]]]  # the first NaN wins, as in torch
  check(lambda x: (x.argmax(1), x.argmin(1), x.argmax(), x.argmin(0)), lambda x: (x.argmax(1), x.argmin(1), x.argmax(), x.argmin(0)), None, f32, device, vals=nans)
  check(lambda x: x.argmax(), None, None, i64, device, vals=[[5, 9, -3, 9]])
  check(lambda x: x.argmax(0), None, None, i32, device, vals=[[-2 ** 31, -2 ** 31 + 1, 7]])
  check(lambda x: x.argmin(0), None, None, i32, device, vals=[[2 ** 31 - 1, -2 ** 31, 7]])
  check(lambda x: (x.argmin(0), x.argmax(0)), None, None, u8, device, vals=[[200, 0, 255, 0, 255]])  # ~ reverses unsigned order too
  check(lambda x: x.argmax(0), None, [(1, 3)], f32, device)
  check(lambda x: x.argmax(), None, [()], f32, device)

def test_reduce_big_cpu(device):
  """Long reductions (the PYTHON case is smaller): accumulation order must stay close to torch's."""
  n = 50000 if device == "CPU" else 150
  check(lambda x: x.sum(), None, [(n,)], f32, device, atol=1e-2, rtol=1e-4)
  check(lambda x: x.max(), lambda x: x.amax(), [(n,)], f32, device)
  check(lambda x: x.sum(0), None, [(n // 50, 50)], i32, device, low=-1000, high=1000)
  check(lambda x: x.mean(1), None, [(5, n // 5)], f16, device, atol=2e-3, rtol=2e-3)

def test_reduce_then_elementwise(device):
  """A reduce read back at a different index (x - x.max()): kernel split or recompute."""
  check(lambda x: x - x.max(axis=1, keepdim=True), lambda x: x - x.amax(1, keepdim=True), [(4, 5)], f32, device)
  check(lambda x: (x - x.mean(0)) / (x.std(0) + 1), None, [(6, 3)], f32, device, atol=1e-5)
  check(lambda x: x.sum(1).sum(0) + x.max(), lambda x: x.sum(1).sum(0) + x.max(), [(3, 4)], f32, device, atol=1e-5)
  check(lambda x: x.sum(1, keepdim=True).expand(3, 4) * x, None, [(3, 4)], i32, device)
  check(lambda x: (x.exp().sum(0) + x.max(axis=0)), lambda x: x.exp().sum(0) + x.amax(0), [(3, 4, 2)], f32, device, atol=1e-5)

# ***** matmul and the composites *****

MATMUL_SHAPES = [((3, 4), (4, 5)), ((1, 4), (4, 1)), ((2, 3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((3, 4), (2, 4, 5)),
                 ((4,), (4, 3)), ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (4,)), ((4,), (2, 4, 3)), ((3, 0), (0, 2)), ((0, 3), (3, 2))]
@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul(device, shapes):
  check(lambda a, b: a @ b, None, shapes, f32, device, atol=1e-5, rtol=1e-5)

@pytest.mark.parametrize("dtype", [i32, i64, f16, bf16, f64])
def test_matmul_dtypes(device, dtype):
  tol = NARROW.get(dtype, dict(atol=1e-12, rtol=1e-12))
  check(lambda a, b: a.matmul(b), None, [(3, 5), (5, 4)], dtype, device, low=-4, high=4, **tol)
  check(lambda a, b: a.dot(b), lambda a, b: a.matmul(b), [(2, 3, 5), (5,)], dtype, device, low=-4, high=4, **tol)

def test_matmul_mixed_dtypes(device):
  """torch refuses mixed dtypes in matmul; attograd promotes like every binary op (documented difference)."""
  promoted = lambda a, b: a.to(torch.promote_types(a.dtype, b.dtype)) @ b.to(torch.promote_types(a.dtype, b.dtype))
  check(lambda a, b: a @ b, promoted, [(3, 4), (4, 2)], [i32, f32], device, atol=1e-5)
  check(lambda a, b: a @ b, promoted, [(3, 4), (4, 2)], [f16, f32], device, atol=1e-3)

@pytest.mark.parametrize("layout", ["T", "slice"])
def test_matmul_noncontiguous(device, layout):
  check(lambda a, b: a @ b, None, [(3, 4), (4, 5)], f32, device, atol=1e-5, layout=layout)
  check(lambda a, b: a @ b, None, [(2, 3, 4), (2, 4, 5)], f32, device, atol=1e-5, layout=layout)
  check(lambda a, b: a.T @ b.T, None, [(4, 3), (5, 4)], f32, device, atol=1e-5)

def test_matmul_big_cpu(device):
  if device == "PYTHON": check(lambda a, b: a @ b, None, [(5, 7), (7, 6)], f32, device, atol=1e-5); return
  check(lambda a, b: a @ b, None, [(33, 65), (65, 17)], f32, device, atol=1e-4, rtol=1e-4)
  check(lambda a, b: (a @ b).relu(), None, [(4, 64, 32), (32, 48)], f32, device, atol=1e-4, rtol=1e-4)

def test_matmul_scalar_operands_refuse(device):
  with pytest.raises(ValueError, match="dimension"): T(2.0, device) @ T([1.0], device)
  with pytest.raises(TypeError): T([1.0], device) @ 2.0

def test_linear(device):
  check(lambda x, w, b: x.linear(w, b), lambda x, w, b: F.linear(x, w, b), [(2, 3, 4), (5, 4), (5,)], f32, device, atol=1e-5)
  check(lambda x, w: x.linear(w), lambda x, w: F.linear(x, w), [(3, 4), (2, 4)], f32, device, atol=1e-5)
  check(lambda x, w, b: x.linear(w, b), lambda x, w, b: x @ w + b, [(3, 4), (4,), ()], f32, device, atol=1e-5)
  check(lambda x, w: x.linear(w), lambda x, w: F.linear(x, w), [(3, 4), (4,)], f32, device, atol=1e-5)
  check(lambda x, w, b: x.linear(w, b), lambda x, w, b: F.linear(x, w, b), [(6,), (2, 6), (2,)], f32, device, atol=1e-5)

@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax(device, name, axis):
  fa = lambda x: getattr(x, name)(axis)
  ft = lambda x: getattr(torch, name)(x, axis)
  check(fa, ft, [(3, 4, 5)], f32, device, atol=1e-6, rtol=1e-5)
  check(fa, ft, [(3, 4, 5)], f32, device, atol=1e-6, rtol=1e-5, layout="T")
  if axis == -1:  # large logits must not overflow; a -inf logit gets probability 0
    check(fa, ft, None, f32, device, atol=1e-6, rtol=1e-5, vals=[[[1000.0, 1001.0, 1002.0], [-1000.0, 0.0, 1000.0], [-math.inf, 0.0, 1.0]]])

@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_dtypes(device, name, request):
  expect_refusal(request, device, "f64_math", name == "log_softmax")  # float64 is one of its cases
  check(lambda x: getattr(x, name)(), lambda x: getattr(torch, name)(x, -1), [(3, 8)], f16, device, **NARROW[f16])
  check(lambda x: getattr(x, name)(), lambda x: getattr(torch, name)(x, -1), [(3, 8)], f64, device, atol=1e-12, rtol=1e-12)
  check(lambda x: getattr(x, name)(0), lambda x: getattr(torch, name)(x, 0), [(1, 4)], f32, device)
  check(lambda x: getattr(x, name)(), lambda x: getattr(torch, name)(x, -1), [(5,)], f32, device, atol=1e-6)

# the composites built on the ops above, small, on both devices (test_nn.py covers them in depth)
def test_nn_composites(device):
  check(lambda x, w, b: x.conv2d(w, b, padding=1, stride=2), lambda x, w, b: F.conv2d(x, w, b, padding=1, stride=2),
        [(1, 2, 5, 5), (3, 2, 3, 3), (3,)], f32, device, atol=1e-5, rtol=1e-5)
  check(lambda x: x.max_pool2d(2), lambda x: F.max_pool2d(x, 2), [(1, 2, 4, 6)], f32, device)
  check(lambda x: x.avg_pool2d(3, stride=2, padding=1), lambda x: F.avg_pool2d(x, 3, stride=2, padding=1), [(1, 2, 5, 5)], f32, device, atol=1e-6)
  check(lambda x: x.layernorm(), lambda x: F.layer_norm(x, (6,)), [(4, 6)], f32, device, atol=1e-5, rtol=1e-5)
  check(lambda x: x.one_hot(5), lambda x: F.one_hot(x, 5), None, i64, device, vals=[[0, 4, 2, 2]])
  check(lambda x, y: x.cross_entropy(y), lambda x, y: F.cross_entropy(x, y), None, [f32, i64], device, atol=1e-6,
        vals=[[[1.0, 2.0, 0.5], [0.1, -1.0, 3.0]], [2, 0]])

# ***** randomized: shapes and indices drawn by hypothesis (derandomized: the same cases every run) *****

@st.composite
def broadcast_pair(draw):
  full = draw(st.lists(st.integers(1, 4), min_size=0, max_size=3))
  def operand():
    shape = [1 if draw(st.booleans()) else s for s in full]
    return tuple(shape[draw(st.integers(0, len(shape))):])  # drop some leading dims
  return operand(), operand()

@settings(max_examples=20, deadline=None, derandomize=True)
@given(shapes=broadcast_pair(), op=st.sampled_from(["add", "sub", "mul", "div", "maximum", "lt", "ne"]), dtype=st.sampled_from([f32, i32]))
def test_hypothesis_broadcast(device, shapes, op, dtype):
  fa, ft = BINARY[op]
  check(fa, ft, list(shapes), dtype, device, atol=1e-6, low=1 if op == "div" else -3, high=4)

@st.composite
def shape_and_index(draw):
  shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
  index = []
  for s in shape:
    kind = draw(st.sampled_from(["int", "slice", "slice", "none"]))
    if kind == "int": index.append(draw(st.integers(-s, s - 1)))
    elif kind == "slice":
      bound = st.one_of(st.none(), st.integers(-s - 2, s + 2))
      index.append(slice(draw(bound), draw(bound), draw(st.sampled_from([None, 1, 2, 3, -1, -2, -4]))))
    else: index.append(None); index.append(slice(None))
  if draw(st.booleans()): index.insert(draw(st.integers(0, len(index))), Ellipsis)
  return shape, tuple(index)

@settings(max_examples=25, deadline=None, derandomize=True)
@given(case=shape_and_index(), layout=st.sampled_from(["contig", "T"]))
def test_hypothesis_getitem(device, case, layout):
  shape, index = case
  try: np.empty(shape)[index]
  except IndexError: return  # too many indices after None/Ellipsis expansion: the error tests cover that
  check(lambda x: x[index], np_index(index), [shape], f32, device, layout=layout)

# ***** dtype conversion, data out, devices, assign *****

CAST_VALS = [-3.7, -2.5, -1.0, -0.2, 0.0, 0.2, 0.5, 1.0, 2.5, 3.7, 100.9, 127.0, 1000.5]
@pytest.mark.parametrize("to", [i32, i64, dtypes.int16, i8, bool_, f16, bf16, f64, f32], ids=str)
def test_cast_from_float(device, to):
  vals = CAST_VALS if to not in (i8,) else [v for v in CAST_VALS if abs(v) < 128]  # float->int8 out of range is UB in C and torch
  check(lambda x: x.cast(to), lambda x: x.to(to_torch_dtype(to)), None, f32, device, vals=[vals])

@pytest.mark.parametrize("to", [f32, f16, bf16, f64, i8, u8, i32, bool_, dtypes.int16, dtypes.uint32], ids=str)
def test_cast_from_int64(device, to):
  """Int to narrower int wraps (two's complement), as torch does."""
  vals = [-2 ** 31, -300, -129, -1, 0, 1, 127, 128, 255, 256, 70000, 2 ** 31 - 1]
  ft = (lambda x: x.to(to_torch_dtype(to))) if to != dtypes.uint32 else (lambda x: torch.from_numpy(x.numpy().astype(np.uint32)))
  check(lambda x: x.cast(to), ft, None, i64, device, vals=[vals])

def test_cast_from_int32(device):
  vals = [[-2 ** 31, -300, -129, -1, 0, 1, 127, 128, 255, 256, 70000, 2 ** 31 - 1]]
  check(lambda x: (x.cast(f32), x.cast(i8), x.cast(u8), x.cast(i64), x.cast(f16)), lambda x: (x.float(), x.to(torch.int8), x.to(torch.uint8), x.long(), x.half()),
        None, i32, device, vals=vals)

@pytest.mark.parametrize("to", [f32, i32, u8, f16, i64], ids=str)
def test_cast_from_bool(device, to):
  check(lambda x: x.cast(to), lambda x: x.to(to_torch_dtype(to)), None, bool_, device, vals=[[True, False, True]])

def test_cast_narrow_floats(device):
  vals = [[0.1, 1.0 / 3, 65504.0, 70000.0, -1e-8, 1e-5, 3.14159, math.inf, math.nan, -0.0, 1e38]]
  check(lambda x: x.cast(f16).cast(f32), lambda x: x.half().float(), None, f32, device, vals=vals)
  check(lambda x: x.cast(bf16).cast(f32), lambda x: x.bfloat16().float(), None, f32, device, vals=vals)
  check(lambda x: x.cast(bf16).cast(f16), lambda x: x.bfloat16().half(), None, f32, device, vals=vals)
  check(lambda x: x.half().float(), lambda x: x.half().float(), None, f64, device, vals=vals)
  check(lambda x: x.cast(i32), lambda x: x.int(), None, f16, device, vals=[[1.5, -2.5, 100.0, -0.9]])
  check(lambda x: x.cast(i32), lambda x: x.int(), None, bf16, device, vals=[[1.5, -2.5, 100.0, -0.9]])

def test_cast_methods_and_names(device):
  check(lambda x: (x.float(), x.half(), x.double(), x.int(), x.long(), x.bool()),
        lambda x: (x.float(), x.half(), x.double(), x.int(), x.long(), x.bool()), [(2, 3)], f32, device)
  check(lambda x: x.cast("int16"), lambda x: x.to(torch.int16), [(2, 3)], f32, device)
  with pytest.raises(TypeError, match="notatype"): T([1.0], device).cast("notatype")

def test_cast_noncontiguous(device):
  check(lambda x: x.cast(i32), lambda x: x.int(), [(3, 4)], f32, device, layout="T", low=-10, high=10)
  check(lambda x: x.cast(f16), lambda x: x.half(), [(3, 4)], i32, device, layout="slice", low=-10, high=10)

BITCAST = [(f32, i32, "int32"), (i32, f32, "float32"), (f32, dtypes.uint32, "uint32"), (f16, dtypes.int16, "int16"), (dtypes.int16, f16, "float16"),
           (bf16, dtypes.int16, "int16"), (dtypes.int16, bf16, "bfloat16"), (f64, i64, "int64"), (i64, f64, "float64"), (u8, i8, "int8"),
           (i8, u8, "uint8"), (bool_, u8, "uint8")]
@pytest.mark.parametrize("frm,to,tname", BITCAST, ids=str)
def test_bitcast(device, frm, to, tname):
  check(lambda x: x.bitcast(to), lambda x: x.view(getattr(torch, tname)), [(3, 4)], frm, device, low=-100 if frm != u8 else 0, high=100)

def test_bitcast_special_and_noncontiguous(device):
  check(lambda x: x.bitcast(i32), lambda x: x.view(torch.int32), None, f32, device, vals=[[-0.0, math.inf, -math.inf, 1e-45, 1.0]])
  check(lambda x: x.T.bitcast(i32), lambda x: x.T.contiguous().view(torch.int32), [(3, 4)], f32, device)
  check(lambda x: (x + 1).bitcast(i32) >> 23, lambda x: (x + 1).view(torch.int32) >> 23, [(3, 4)], f32, device)
  with pytest.raises(ValueError, match="float32.*int16"): T([1.0], device).bitcast(dtypes.int16)

def test_contiguous(device):
  check(lambda x: x.T.contiguous(), None, [(3, 4)], f32, device)
  check(lambda x: x[::2].contiguous() * 1, None, [(5, 4)], i32, device)
  x = T([[1.0, 2.0]], device)
  assert x.contiguous().tolist() == [[1.0, 2.0]]
  y = x.T.contiguous().realize()
  assert y.shape == (2, 1) and y.tolist() == [[1.0], [2.0]]
  assert x.clone().tolist() == x.tolist()

def test_assign(device):
  a = Tensor.zeros(3, 4, device=device).contiguous().realize()
  b, tb = make_pair(np.arange(12.0).reshape(3, 4), f32, device)
  a.assign(b * 2).realize()
  compare(a, tb * 2)
  a.assign(a + 1).realize()  # reads its own target
  compare(a, tb * 2 + 1)
  a.assign(5).realize()  # a scalar broadcasts and casts to the target
  compare(a, torch.full((3, 4), 5.0))
  a.assign(T([1, 2, 3, 4], device, i32)).realize()
  compare(a, torch.tensor([1.0, 2, 3, 4]).expand(3, 4))
  a.assign(b.T.T[:, ::-1]).realize()  # a non-contiguous source
  compare(a, tb.flip(1))

def test_assign_inplace_ops(device):
  a, ta = make_pair(np.arange(6).reshape(2, 3), i32, device)
  a = a.contiguous().realize()
  a += 3; a.realize()
  compare(a, ta + 3)
  a *= T([1, -1, 2], device, i32); a.realize()
  compare(a, (ta + 3) * torch.tensor([1, -1, 2], dtype=torch.int32))
  a -= 1
  compare(a, (ta + 3) * torch.tensor([1, -1, 2], dtype=torch.int32) - 1)
  f = Tensor.ones(2, 2, device=device).contiguous().realize()
  f /= 4; f.realize()
  compare(f, torch.full((2, 2), 0.25))

def test_assign_errors(device):
  a = Tensor.zeros(3, 4, device=device).contiguous().realize()
  with pytest.raises(ValueError, match=r"\(2, 4\).*\(3, 4\)"): a.assign(Tensor.ones(2, 4, device=device))
  other = "PYTHON" if device == "CPU" else "CPU"
  with pytest.raises(ValueError, match=f"{other}.*{device}"): a.assign(Tensor.ones(3, 4, device=other))

def test_assign_keeps_older_results(device):
  """A tensor computed from the old value before an assign still sees the old value (lazy, but not stale)."""
  a = Tensor([1.0, 2.0, 3.0], device=device).realize()
  old = a * 10
  a.assign(a + 1).realize()
  assert a.tolist() == [2.0, 3.0, 4.0]
  assert old.tolist() == [10.0, 20.0, 30.0]

def test_to_device(device):
  other = "PYTHON" if device == "CPU" else "CPU"
  x, tx = make_pair(np.arange(12.0).reshape(3, 4), f32, device)
  y = (x * 2).to(other)
  assert y.device == other and x.device == device
  compare(y, tx * 2)
  compare((y + 1).to(device), tx * 2 + 1)
  compare(x.T.to(other), tx.T)  # a non-contiguous view copies its values, not its memory
  compare(x[1:, ::2].to(other) + 1, tx[1:, ::2] + 1)
  assert x.to(device) is x
  compare(T([1, 2], device, bf16).to(other), torch.tensor([1, 2], dtype=torch.bfloat16))
  compare(Tensor(x, device=other), tx)
  with pytest.raises(ValueError, match="different devices"): x + x.to(other)
  with pytest.raises(ValueError, match="NOPE"): x.to("NOPE")

def test_tolist_item_numpy(device):
  assert T([[1, 2], [3, 4]], device).tolist() == [[1, 2], [3, 4]]
  assert T([[1.5], [2.5]], device).tolist() == [[1.5], [2.5]]
  assert T([True, False], device).tolist() == [True, False]
  assert T(3.5, device).tolist() == 3.5 and T(7, device).tolist() == 7
  assert T([], device).tolist() == [] and Tensor.zeros(2, 0, device=device).tolist() == [[], []]
  for t, v, typ in [(T(3.5, device), 3.5, float), (T([7], device, i32), 7, int), (T([[True]], device), True, bool), (T(2, device, bf16), 2.0, float)]:
    got = t.item()
    assert got == v and type(got) is typ
  assert T([2.5], device, f16).item() == 2.5 and float(T([2.5], device)) == 2.5 and int(T([3], device)) == 3
  with pytest.raises(ValueError, match=r"\(2,\)"): T([1, 2], device).item()
  n = T([[1, 2, 3]], device, i32).T.numpy()
  assert n.dtype == np.int32 and n.shape == (3, 1) and n.tolist() == [[1], [2], [3]]
  for dt in (f32, f16, f64, i8, u8, dtypes.int16, dtypes.uint16, i64, dtypes.uint32, dtypes.uint64, bool_):
    np_dt = torch.empty(0, dtype=to_torch_dtype(dt)).numpy().dtype
    assert Tensor.ones(2, 3, dtype=dt, device=device).contiguous().numpy().dtype == np_dt
  assert T(5.0, device).numpy().shape == ()
  with pytest.raises(TypeError, match="bfloat16"): T([1.0], device, bf16).numpy()
  assert (T([1, 2], device) + 1).tolist() == [2, 3]
  x = T([[1.0, 2.0], [3.0, 4.0]], device)[:, 1]
  assert x.tolist() == [2.0, 4.0] and x.numpy().tolist() == [2.0, 4.0]
  assert bool(T([1], device)) and not bool(T(0.0, device))
  with pytest.raises(RuntimeError, match="ambiguous"): bool(T([1, 2], device))

def test_reading_a_whole_buffer_runs_no_kernel(device):
  from attograd.helpers import GlobalCounters
  x = (T([[1.0, 2.0, 3.0]], device) * 2).reshape(1, 3, 1).realize().reshape(1, 3).reshape(3)  # reshapes stacked on a buffer
  before = GlobalCounters.kernel_count
  a = x.numpy()
  assert GlobalCounters.kernel_count == before and a.tolist() == [2.0, 4.0, 6.0]  # no copy kernel: the buffer is read
  a[0] = 7.0  # the array owns its values: writable, and writing it leaves the tensor alone
  assert x.tolist() == [2.0, 4.0, 6.0] and x.numpy()[0] == 2.0

def test_properties(device):
  x = Tensor.zeros(2, 3, 4, device=device, dtype=f16)
  assert x.shape == (2, 3, 4) and x.ndim == 3 and x.numel() == 24 and x.element_size() == 2 and x.nbytes() == 48
  assert x.size() == (2, 3, 4) and x.size(-1) == 4 and len(x) == 2 and x.device == device
  with pytest.raises(TypeError, match="0-d"): len(T(1.0, device))
  with pytest.raises(IndexError, match="axis 3"): x.size(3)

# ***** bad input raises, and says what was wrong *****

def test_error_broadcast(device):
  with pytest.raises(ValueError, match=r"\(3, 4\).*\(5,\)"): Tensor.ones(3, 4, device=device) + Tensor.ones(5, device=device)
  with pytest.raises(ValueError, match=r"\(2, 3\).*\(3, 2\)"): Tensor.ones(2, 3, device=device) * Tensor.ones(3, 2, device=device)
  with pytest.raises(ValueError, match=r"\(2, 3\).*\(4,\)"): Tensor.ones(2, 3, device=device) < Tensor.ones(4, device=device)
  with pytest.raises(ValueError, match=r"\(3,\).*\(2,\)"):
    (Tensor.ones(3, device=device) > 0).where(Tensor.ones(2, device=device), 0)

def test_error_reshape(device):
  x = Tensor.ones(2, 3, device=device)
  with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 2\)"): x.reshape(4, 2)
  with pytest.raises(ValueError, match=r"\(2, 3\).*\(-1, 4\)"): x.reshape(-1, 4)
  with pytest.raises(ValueError, match=r"only one.*-1"): x.reshape(-1, -1)
  with pytest.raises(ValueError, match=r"\(2, 3\).*\(7,\)"): x.view(7)
  with pytest.raises(ValueError, match=r"\(-2, -3\)"): x.reshape(-2, -3)
  with pytest.raises(ValueError, match=r"\(2, 3\).*\(2, 4, 5\)"): x.unflatten(1, (4, 5))

def test_error_axes(device):
  x = Tensor.ones(2, 3, device=device)
  with pytest.raises(IndexError, match="axis 2.*2 dimension"): x.sum(2)
  with pytest.raises(IndexError, match="axis -3"): x.max(-3)
  with pytest.raises(IndexError, match="axis 5"): x.argmax(5)
  with pytest.raises(IndexError, match="axis 2"): x.softmax(2)
  with pytest.raises(IndexError, match="axis 3"): x.unsqueeze(3)
  with pytest.raises(IndexError, match="axis -4"): x.unsqueeze(-4)
  with pytest.raises(IndexError, match="axis 2"): x.squeeze(2)
  with pytest.raises(IndexError, match="axis 2"): x.transpose(0, 2)
  with pytest.raises(IndexError, match="axis 2"): x.flip(2)
  with pytest.raises(IndexError, match="axis 3"): x.flatten(0, 3)
  with pytest.raises(ValueError, match=r"\(0, 0\).*repeated"): x.sum((0, 0))
  with pytest.raises(ValueError, match=r"\(0, 0\).*permutation"): x.permute(0, 0)
  with pytest.raises(ValueError, match=r"\(0,\).*permutation"): x.permute(0)
  with pytest.raises(IndexError, match="axis 2"): x.permute(0, 1, 2)

def test_error_movement(device):
  x = Tensor.ones(2, 3, device=device)
  with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 3\)"): x.expand(4, 3)
  with pytest.raises(ValueError, match=r"\(2, 3\).*\(3,\)"): x.expand(3)
  with pytest.raises(ValueError, match=r"\(2, 3\)"): x.shrink(((0, 3), None))
  with pytest.raises(ValueError, match=r"shrink \(\(0, 1\),\).*\(2\)"): x.shrink(((0, 1),))
  with pytest.raises(ValueError, match=r"padding \(1, 1, 1, 1, 1, 1\).*2 dims"): x.pad((1, 1, 1, 1, 1, 1))
  with pytest.raises(ValueError, match=r"padding \(1, 1, 1\)"): x.pad((1, 1, 1))
  with pytest.raises(ValueError, match=r"repeat \(2,\).*2 counts"): x.repeat(2)
  with pytest.raises(ValueError, match=r"\(3, 2\).*\(4, 2\)"): Tensor.ones(3, 2, device=device) @ Tensor.ones(4, 2, device=device)
  with pytest.raises(ValueError, match=r"\(2,\).*\(3,\)"): Tensor.ones(2, device=device) @ Tensor.ones(3, device=device)
  with pytest.raises(ValueError, match=r"\(2, 3, 4\).*\(5, 4, 2\)"):
    Tensor.ones(2, 3, 4, device=device) @ Tensor.ones(5, 4, 2, device=device)

def test_error_getitem(device):
  x = Tensor.ones(3, 4, device=device)
  with pytest.raises(IndexError, match="index 3.*axis 0.*size 3"): x[3]
  with pytest.raises(IndexError, match="index -5.*axis 1.*size 4"): x[0, -5]
  with pytest.raises(IndexError, match="too many indices.*3.*2"): x[0, 0, 0]
  with pytest.raises(IndexError, match="ellipsis"): x[..., 0, ...]
  with pytest.raises(ValueError, match="step"): x[::0]
  with pytest.raises(TypeError, match="str"): x["a"]
  with pytest.raises(TypeError, match="float"): x[1.5]
  with pytest.raises(IndexError, match="too many indices.*0 dim"): T(1.0, device)[0]

def test_error_creation(device):
  with pytest.raises(ValueError, match=r"\(2, -1\)"): Tensor.zeros(2, -1, device=device)
  with pytest.raises(ValueError, match=r"rectangular.*\(2,\).*\(3,\)"): T([[1, 2], [1, 2, 3]], device)
  with pytest.raises(TypeError, match="str"): T(["a", "b"], device)
  with pytest.raises(TypeError, match="dict"): T({1: 2}, device)
  with pytest.raises(ValueError, match="step"): Tensor.arange(0, 5, 0, device=device)
  with pytest.raises(ValueError, match=r"7, 2, 1"): Tensor.arange(7, 2, device=device)
  with pytest.raises(ValueError, match=r"0, 5, -1"): Tensor.arange(0, 5, -1, device=device)
  with pytest.raises(TypeError, match="float17"): Tensor.zeros(2, dtype="float17", device=device)
  with pytest.raises(ValueError, match="low < high"): Tensor.randint(3, low=5, high=5, device=device)

def test_error_dtypes(device):
  with pytest.raises(TypeError, match="bool"): T([True], device) - T([False], device)
  with pytest.raises(TypeError, match="bool"): 1.5 - T([True], device)  # torch refuses a bool on either side of -
  with pytest.raises(TypeError, match="bool"): T([1.0], device) - T([True], device)
  with pytest.raises(TypeError, match="bool"): T([1.0], device) - True
  with pytest.raises(TypeError, match="float32"): T([1.0], device) << 1
  with pytest.raises(TypeError, match="float32"): T([1.0], device) ^ T([1], device)
  with pytest.raises(TypeError, match="str"): T([1.0], device) + "a"
  with pytest.raises(TypeError, match="uint64.*int64|int64.*uint64"): T([1], device, dtypes.uint64) + T([1], device, i64)
