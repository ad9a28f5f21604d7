"""Result dtypes against PyTorch: torch.promote_types for every pair, the dtype of binary ops on
tensors, and weak typing (a Python scalar, or a 0-d tensor beside one with dimensions, only counts
when it is of a higher kind: bool < int < float). Checking dtypes builds graphs only; a few cases
also run to see the values come out in that dtype."""
import itertools
import numpy as np
import pytest
import torch
from attograd import Tensor, dtypes
from attograd.dtype import least_upper_dtype
from helpers import ALL_DTYPES, DEVICES, FROM_TORCH, TORCH_DTYPES, compare

UNSIGNED_WIDE = (dtypes.uint16, dtypes.uint32, dtypes.uint64)
PAIRS = list(itertools.product(ALL_DTYPES, ALL_DTYPES))

def torch_promote(a, b):
  """torch's answer, or None where torch refuses (uint16/32/64 with other integer types)."""
  try: return FROM_TORCH[torch.promote_types(TORCH_DTYPES[a], TORCH_DTYPES[b])]
  except RuntimeError: return None

def ids(p): return f"{p[0].name}-{p[1].name}"

@pytest.mark.parametrize("a,b", PAIRS, ids=[ids(p) for p in PAIRS])
def test_promote_types(a, b):
  want = torch_promote(a, b)
  if want is not None:
    assert least_upper_dtype(a, b) == want
    return
  # torch refuses; attograd extends like numpy (the smallest type holding both), and refuses where no integer holds both
  if {a, b} & {dtypes.uint64} and any(dtypes.is_int(t) and not dtypes.is_unsigned(t) for t in (a, b)):
    with pytest.raises(TypeError, match="uint64.*int|int.*uint64"): least_upper_dtype(a, b)
  else:
    np_name = np.promote_types(np.dtype(a.name), np.dtype(b.name)).name
    assert least_upper_dtype(a, b).name == np_name

def test_promote_types_properties():
  for a, b in PAIRS:
    try: ab = least_upper_dtype(a, b)
    except TypeError: continue
    assert ab == least_upper_dtype(b, a), "symmetric"
    assert least_upper_dtype(ab, a) == ab and least_upper_dtype(ab, b) == ab, "an upper bound of both"
  for a in ALL_DTYPES: assert least_upper_dtype(a, a) == a

# ***** binary ops on two tensors with dimensions *****

TORCH_OPS = {
  "add": (lambda x, y: x + y, lambda x, y: torch.result_type(x, y)),
  "mul": (lambda x, y: x * y, lambda x, y: torch.result_type(x, y)),
  "maximum": (lambda x, y: x.maximum(y), lambda x, y: torch.result_type(x, y)),
  "where": (lambda x, y: (x > 0).where(x, y), lambda x, y: torch.result_type(x, y)),
  # true division of integers gives the default float
  "div": (lambda x, y: x / y, lambda x, y: r if (r := torch.result_type(x, y)).is_floating_point else torch.float32),
  "lt": (lambda x, y: x < y, lambda x, y: torch.bool),
  "eq": (lambda x, y: x == y, lambda x, y: torch.bool),
}
DEFINED_PAIRS = [p for p in PAIRS if torch_promote(*p) is not None]

@pytest.mark.parametrize("op", list(TORCH_OPS))
def test_tensor_tensor_dtype(op):
  fa, ft = TORCH_OPS[op]
  for a, b in DEFINED_PAIRS:
    if op == "maximum" and dtypes.bool in (a, b) and a != b: continue  # torch has no mixed bool maximum
    x, y = Tensor.zeros(2, 3, dtype=a), Tensor.zeros(3, dtype=b)
    want = FROM_TORCH[ft(torch.zeros(2, 3, dtype=TORCH_DTYPES[a]), torch.zeros(3, dtype=TORCH_DTYPES[b]))]
    assert fa(x, y).dtype == want, f"{op}({a}, {b})"

# ***** Python scalars are weak *****

SCALARS = [True, 2, -3, 2.5, 1e10]
SCALAR_OPS = {  # name: attograd fn, or (attograd fn, torch fn) where torch spells it differently
  "add": lambda x, s: x + s, "radd": lambda x, s: s + x, "mul": lambda x, s: x * s, "rmul": lambda x, s: s * x,
  "div": lambda x, s: x / s, "rdiv": lambda x, s: s / x, "floordiv": lambda x, s: x // s, "mod": lambda x, s: x % s,
  "pow": lambda x, s: x ** s, "rpow": lambda x, s: s ** x, "lt": lambda x, s: x < s, "eq": lambda x, s: x == s,
  "sub": lambda x, s: x - s, "rsub": lambda x, s: s - x,
  "where_x": (lambda x, s: (x != 0).where(s, x), lambda x, s: torch.where(x != 0, s, x)),
  "where_y": (lambda x, s: (x != 0).where(x, s), lambda x, s: torch.where(x != 0, x, s)),
}
def torch_dtype_or_error(fn, *args):
  try: return FROM_TORCH[fn(*args).dtype]
  except (RuntimeError, TypeError, ZeroDivisionError): return None

@pytest.mark.parametrize("op", list(SCALAR_OPS))
@pytest.mark.parametrize("s", SCALARS, ids=repr)
def test_python_scalar_dtype(op, s):
  fa, ft = SCALAR_OPS[op] if isinstance(SCALAR_OPS[op], tuple) else (SCALAR_OPS[op], SCALAR_OPS[op])
  for dt in ALL_DTYPES:
    t = torch.ones(3, dtype=TORCH_DTYPES[dt])
    if dt in UNSIGNED_WIDE:  # torch has few kernels for these: ask its promotion rule where it applies
      if op not in ("add", "radd", "mul", "rmul", "where_x", "where_y"): continue
      want = FROM_TORCH[torch.result_type(t, s)]
    else: want = torch_dtype_or_error(ft, t, s)
    # where torch refuses, attograd refuses too or extends (test_ops checks the refusals it copies);
    # bool ** bool stays bool in torch, attograd computes it in float32 like other non-float powers
    if want is None or (op == "pow" and dt == dtypes.bool and isinstance(s, bool)): continue
    assert fa(Tensor.ones(3, dtype=dt), s).dtype == want, f"{op}({dt}, {s!r})"

def test_python_scalar_pairs_in_where():
  c, tc = Tensor([True, False]), torch.tensor([True, False])
  for x, y in itertools.product([True, 1, 2.5], repeat=2):
    assert c.where(x, y).dtype == FROM_TORCH[torch.where(tc, x, y).dtype], (x, y)

# ***** 0-d tensors are weak beside tensors with dimensions *****

@pytest.mark.parametrize("op", ["add", "mul", "where", "div", "lt"])
def test_zero_dim_tensor_dtype(op):
  fa, ft = TORCH_OPS[op]
  for a, b in DEFINED_PAIRS:
    for sa, sb in [((3,), ()), ((), (3,)), ((), ())]:
      x, y = Tensor.zeros(*sa, dtype=a), Tensor.zeros(*sb, dtype=b)
      want = FROM_TORCH[ft(torch.zeros(sa, dtype=TORCH_DTYPES[a]), torch.zeros(sb, dtype=TORCH_DTYPES[b]))]
      assert fa(x, y).dtype == want, f"{op}({a}{list(sa)}, {b}{list(sb)})"

def test_zero_dim_from_reduction_and_constant():
  x = Tensor.ones(4, dtype=dtypes.int32)
  assert (x + x.sum()).dtype == dtypes.int32, "sum() is a 0-d int64: weak beside int32"
  assert (x * Tensor(2.5)).dtype == dtypes.float32
  assert (Tensor.ones(2, dtype=dtypes.float16) + Tensor(1.0, dtype=dtypes.float64)).dtype == dtypes.float16
  assert (Tensor.ones(2, dtype=dtypes.int8) + Tensor(1.0, dtype=dtypes.float64)).dtype == dtypes.float64

# ***** result dtypes of the other ops *****

def test_op_result_dtypes():
  cases = [  # (attograd fn, torch fn) on tensors of the given dtype
    (lambda x: x.sum(), lambda x: x.sum()), (lambda x: x.prod(), lambda x: x.prod()), (lambda x: x.max(), lambda x: x.max()),
    (lambda x: x.argmax(), lambda x: x.argmax()), (lambda x: x.exp(), lambda x: x.exp()), (lambda x: x.sqrt(), lambda x: x.sqrt()),
    (lambda x: x.abs(), lambda x: x.abs()), (lambda x: -x, lambda x: -x), (lambda x: x.floor(), lambda x: x.floor()),
    (lambda x: x.sigmoid(), lambda x: x.sigmoid()), (lambda x: x.isnan(), lambda x: x.isnan()), (lambda x: x.sign(), lambda x: x.sign()),
    (lambda x: x.square(), lambda x: x.square()), (lambda x: x.relu(), lambda x: x.relu()), (lambda x: x.softmax(0), lambda x: x.softmax(0)),
    (lambda x: x.mean(), lambda x: x.mean()), (lambda x: x.var(), lambda x: x.var()), (lambda x: x.reciprocal(), lambda x: x.reciprocal()),
    (lambda x: x.round(), lambda x: x.round()), (lambda x: x.clip(0, 1), lambda x: x.clip(0, 1)), (lambda x: x.clip(0.5), lambda x: x.clip(0.5)),
    (lambda x: x.sum(dtype=dtypes.float64), lambda x: x.sum(dtype=torch.float64)),
  ]
  for dt in (dtypes.bool, dtypes.uint8, dtypes.int8, dtypes.int32, dtypes.int64, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64):
    for fa, ft in cases:
      want = torch_dtype_or_error(ft, torch.ones(3, dtype=TORCH_DTYPES[dt]))
      if want is None: continue  # torch refuses (mean of ints, neg of bool, ...); the error tests cover ours
      assert fa(Tensor.ones(3, dtype=dt)).dtype == want, f"{dt}: {fa.__code__.co_positions}"

def test_creation_dtypes():
  assert Tensor([1, 2]).dtype == FROM_TORCH[torch.tensor([1, 2]).dtype]
  assert Tensor([1, 2.0]).dtype == FROM_TORCH[torch.tensor([1, 2.0]).dtype]
  assert Tensor([True, 1]).dtype == FROM_TORCH[torch.tensor([True, 1]).dtype]
  assert Tensor([[True], [False]]).dtype == dtypes.bool
  assert Tensor(3).dtype == dtypes.int64 and Tensor(3.0).dtype == dtypes.float32 and Tensor(False).dtype == dtypes.bool
  assert Tensor.arange(3).dtype == dtypes.int64 and Tensor.arange(3.0).dtype == dtypes.float32 and Tensor.arange(0, 1, 0.5).dtype == dtypes.float32
  assert Tensor.full((2,), 1).dtype == dtypes.int64 and Tensor.full((2,), 1.0).dtype == dtypes.float32 and Tensor.full((2,), True).dtype == dtypes.bool
  assert Tensor(np.zeros(2, dtype=np.uint16)).dtype == dtypes.uint16 and Tensor(np.zeros(2)).dtype == dtypes.float64
  assert Tensor.eye(2).dtype == dtypes.float32 and Tensor.rand(2).dtype == dtypes.float32 and Tensor.randint(2).dtype == dtypes.int64

def test_creation_from_a_typed_memoryview():
  # a memoryview's format is its dtype and its shape the tensor's (as numpy.asarray reads it): values in host memory
  # without numpy (an LLM's embedding rows); a cast dtype converts the values; an unknown format refuses
  import array
  a = np.arange(6, dtype=np.float32).reshape(2, 3)
  t = Tensor(memoryview(a.tobytes()).cast("f", (2, 3)))
  assert t.dtype == dtypes.float32 and t.shape == (2, 3) and (t.numpy() == a).all()
  assert Tensor(memoryview(array.array("h", [1, -2, 3]))).dtype == dtypes.int16
  assert Tensor(memoryview(array.array("b", [1, -2, 3])), dtype=dtypes.float32).tolist() == [1.0, -2.0, 3.0]
  with pytest.raises(Exception, match="format"): Tensor(memoryview(b"ab").cast("c"))

# ***** the values come out in the promoted dtype *****

@pytest.mark.parametrize("device", DEVICES)
def test_promoted_values(device):
  x8, t8 = Tensor([100, -100, 7], dtype=dtypes.int8, device=device), torch.tensor([100, -100, 7], dtype=torch.int8)
  compare(x8 + 100, t8 + 100)  # stays int8 and wraps, as torch does
  compare(x8 * Tensor([3, 3, 3], dtype=dtypes.int16, device=device), t8 * torch.tensor([3, 3, 3], dtype=torch.int16))
  compare(x8 + 0.5, t8 + 0.5)
  compare(x8 + Tensor(1000, device=device), t8 + torch.tensor(1000))  # the 0-d int64 is weak: int8 wraps
  compare(x8 / 8, t8 / 8)
  b, tb = Tensor([True, False], device=device), torch.tensor([True, False])
  compare(b + 5, tb + 5)
  compare(b * 1.5, tb * 1.5)
  compare(b + True, tb + True)
  u, tu = Tensor([200, 100], dtype=dtypes.uint8, device=device), torch.tensor([200, 100], dtype=torch.uint8)
  compare(u + Tensor([-1, 1], dtype=dtypes.int8, device=device), tu + torch.tensor([-1, 1], dtype=torch.int8))
  compare(u * 2, tu * 2)
  h, th = Tensor([1000.0, 0.1], dtype=dtypes.float16, device=device), torch.tensor([1000.0, 0.1], dtype=torch.float16)
  compare(h * 100, th * 100)  # float16 overflows to inf, as in torch
  compare(h + Tensor([1.0, 1.0], dtype=dtypes.bfloat16, device=device), th + torch.tensor([1.0, 1.0], dtype=torch.bfloat16), atol=1e-3)
