"""Indexing with tensors against PyTorch on both devices: advanced __getitem__ (integer tensors, bool
masks, mixed with basic indices), __setitem__, gather, scatter, scatter_reduce, masked_fill, their
gradients, errors, and that an index built from arange fuses into one kernel.
PYTHON cases stay tiny: the interpreter is slow."""
import numpy as np
import pytest
import torch
from attograd import Tensor, dtypes, GlobalCounters
from helpers import DEVICES, compare, make_pair

pytestmark = pytest.mark.parametrize("device", DEVICES)
f32, i32, i64, bool_ = dtypes.float32, dtypes.int32, dtypes.int64, dtypes.bool

def pair(arr, dtype, device):
  return make_pair(np.asarray(arr), dtype, device)

def rand(shape, dtype, device, seed=0):
  rng = np.random.default_rng(seed)
  arr = rng.integers(-9, 9, size=shape) if dtypes.is_int(dtype) else rng.standard_normal(shape)
  return pair(arr, dtype, device)

def idx_pair(vals, device, dtype=i64): return pair(np.array(vals), dtype, device)

def conv(index, device):
  """The same index for attograd and torch: numpy arrays become index tensors (int64, bool stays bool)."""
  if not isinstance(index, tuple): index = (index,)
  a, t = [], []
  for i in index:
    if isinstance(i, np.ndarray):
      ia, it = pair(i, bool_ if i.dtype == np.bool_ else i64, device)
      a.append(ia); t.append(it)
    else: a.append(i); t.append(i)
  return tuple(a), tuple(t)

# ***** advanced __getitem__ *****

A = np.array
GETITEM_CASES = [
  A([0, 2, -1]), A([[1, 0], [-3, 2]]), (slice(None), A([3, 0, -4])), (A([0, 1]), A([2, -1])),
  (A([[0], [2]]), slice(1, 3)),
  (A([[0], [2]]), A([1, 3])), (A([1, 2]), None, A([0, 3])), (None, A([2]), Ellipsis), (Ellipsis, A([0, -1])),
  (slice(None, None, 2), A([0, 0, 1])), A([], dtype=np.int64), (slice(None), A([], dtype=np.int64)),
  A([[True, False, True, True], [False, False, True, False], [True, True, True, True]]),
  (A([True, False, True]),), (slice(None), A([False, True, False, True])), (A([True, False, True]), A([0, 3])),
  A(np.zeros((3, 4), dtype=bool)),
]

@pytest.mark.parametrize("case", range(len(GETITEM_CASES)))
def test_getitem_advanced(device, case):
  index, dtype = GETITEM_CASES[case], [f32, i32][case % 2]
  x, xt = rand((3, 4), dtype, device)
  ia, it = conv(index, device)
  compare(x[ia], xt[it])

@pytest.mark.parametrize("dtype", [f32, i64, bool_])
def test_getitem_3d_mixed(device, dtype):
  x, xt = rand((2, 3, 4), dtype, device) if dtype != bool_ else pair(np.arange(24).reshape(2, 3, 4) % 3 == 0, bool_, device)
  for index in [(A([1, 0, 1]), slice(None), A([3, 2, -1])),  # separated by a slice: the broadcast dims go first
                (slice(None), A([[0, 2]]), A([[1], [3]])), (1, A([2, 0]), slice(None, None, 2)),
                (A([1, 0]), 1, A([2, 3])),  # torch applies ints first: the tensors count as adjacent
                (0, slice(None), A([1, 1])),
                (A([0, 1]), Ellipsis, A([1, 2])), (slice(None), A([0, 1]), None, A([1, 2]))]:
    ia, it = conv(index, device)
    compare(x[ia], xt[it])

def test_getitem_lists_and_int32_index(device):
  x, xt = rand((4, 3), f32, device)
  compare(x[[0, 3, -2]], xt[[0, 3, -2]])
  compare(x[[True, False, False, True]], xt[[True, False, False, True]])
  i, it = idx_pair([2, -1, 0], device, i32)
  compare(x[:, i], xt[:, it])

def test_getitem_zero_size(device):
  x, xt = rand((0, 3), f32, device)
  i, it = idx_pair([], device)
  compare(x[i], xt[it])
  compare(x[:, idx_pair([1, 2], device)[0]], xt[:, torch.tensor([1, 2])])
  y, yt = rand((2, 3), f32, device)
  compare(y[idx_pair(np.zeros((0, 2), dtype=np.int64), device)[0]], yt[torch.zeros((0, 2), dtype=torch.int64)])

def test_getitem_arange_index_fuses(device):
  if device == "PYTHON": pytest.skip("kernel counts are device independent")
  x, xt = rand((64, 32), f32, device)
  x.realize()
  GlobalCounters.reset()
  out = x[Tensor.arange(100, device=device) % 3].realize()
  assert GlobalCounters.kernel_count == 1
  compare(out, xt[torch.arange(100) % 3])
  g, gt = rand((64, 5), f32, device)
  GlobalCounters.reset()
  out = x.gather(1, Tensor.arange(64 * 5, device=device).reshape(64, 5) % 32).realize()
  assert GlobalCounters.kernel_count == 1
  compare(out, xt.gather(1, torch.arange(64 * 5).reshape(64, 5) % 32))

def test_getitem_errors(device):
  x = Tensor.zeros(3, 4, device=device)
  with pytest.raises(IndexError, match=r"index 3 is out of bounds for dimension 0 with size 3"): x[Tensor([0, 3], device=device)]
  with pytest.raises(IndexError, match=r"index -5 is out of bounds for dimension 1 with size 4"): x[:, Tensor([-5], device=device)]
  with pytest.raises(IndexError, match=r"index 5 is out of bounds for axis 1 with size 4"): x[Tensor([0], device=device), 5]
  with pytest.raises(IndexError, match=r"must be integer or bool, got dtypes.float32"): x[Tensor([0.0], device=device)]
  with pytest.raises(IndexError, match=r"could not be broadcast together"): x[Tensor([0, 1], device=device), Tensor([0, 1, 2], device=device)]
  with pytest.raises(IndexError, match=r"shape of the mask \(2,\) at index 0"): x[Tensor([True, False], device=device)]
  with pytest.raises(IndexError, match=r"too many indices \(3\)"): x[Tensor([0], device=device), 0, 0]
  with pytest.raises(IndexError, match="single ellipsis"): x[..., Tensor([0], device=device), ...]
  with pytest.raises(TypeError, match="invalid index 'a'"): x[Tensor([0], device=device), "a"]
  # basic and advanced indexing check an index the same way: a Python bool is no int (x[True] read row 1)
  for index in (True, (0, False), (..., "a")):
    with pytest.raises(TypeError, match="invalid index"): x[index]
  with pytest.raises(IndexError, match="single ellipsis"): x[..., 0, ...]

def test_getitem_lazy_out_of_range_raises(device):
  """A lazy index tensor is checked with the realize (as torch raises): nothing wrong is returned."""
  x = Tensor([1.0, 2.0, 3.0], device=device)
  with pytest.raises(IndexError, match="index 3 is out of bounds"): x[Tensor.arange(5, device=device) - 1].tolist()
  assert x[Tensor.arange(4, device=device) - 1].tolist() == [3.0, 1.0, 2.0, 3.0]

# ***** __setitem__ *****

SETITEM_CASES = [
  (1, 5), ((slice(None), 2), -1), ((slice(None, None, 2), slice(1, 4, 2)), A([[1, 2]])), ((Ellipsis, None, -1), 7),
  (A([0, 2]), A([1, 2, 3, 4])), ((slice(None), A([1, -1])), 9), ((A([0, 1]), A([3, 1])), A([1, 2])),
  (A([[True, False, True, False], [False] * 4, [True] * 4]), 0), ((A([2, 0]), slice(1, 3)), A([[5], [6]])),
]

@pytest.mark.parametrize("case", range(len(SETITEM_CASES)))
def test_setitem(device, case):
  (index, value), dtype = SETITEM_CASES[case], [f32, i32][case % 2]
  x, xt = rand((3, 4), dtype, device)
  x.realize()
  ia, it = conv(index, device)
  if isinstance(value, np.ndarray): va, vt = pair(value, i64, device); vt = vt.to(xt.dtype)  # cast to x's dtype on the way in
  else: va = vt = value
  x[ia] = va
  xt[it] = vt
  compare(x, xt)

def test_setitem_negative_step_and_float_value_cast(device):
  x, xt = rand((4, 5), i32, device)
  x.realize()
  x[::-2, 3:0:-2] = Tensor([[1.7, 2.2], [-3.9, 4.0]], device=device)  # torch has no negative steps: numpy reference
  ref = xt.numpy().copy()
  ref[::-2, 3:0:-2] = np.array([[1, 2], [-3, 4]])
  np.testing.assert_array_equal(x.numpy(), ref)

def test_setitem_lazy_until_realize(device):
  x = Tensor([1.0, 2.0, 3.0], device=device).realize()
  before = x * 1
  x[Tensor([2, 0], device=device)] = Tensor([7.0, 8.0], device=device)
  assert x.tolist() == [8.0, 2.0, 7.0] and before.tolist() == [1.0, 2.0, 3.0]

def test_setitem_errors(device):
  x = Tensor.zeros(3, 4, device=device).realize()
  with pytest.raises(ValueError, match=r"value of shape \(3,\) cannot be broadcast to indexing result of shape \(2, 4\)"):
    x[Tensor([0, 1], device=device)] = Tensor([1.0, 2.0, 3.0], device=device)
  with pytest.raises(IndexError, match=r"index 4 is out of bounds"): x[Tensor([4], device=device)] = 1.0

# ***** gather / scatter / scatter_reduce / masked_fill *****

@pytest.mark.parametrize("dtype", [f32, i32, i64])
def test_gather(device, dtype):
  x, xt = rand((3, 4), dtype, device)
  i, it = idx_pair([[0, 2, 1, 0], [2, 2, 0, 1]], device)
  compare(x.gather(0, i), xt.gather(0, it))
  compare(x.gather(-1, i[:, :3] + 1), xt.gather(-1, it[:, :3] + 1))
  j, jt = idx_pair([[3], [0], [1]], device, i32)
  compare(x.gather(1, j), xt.gather(1, jt.long()))
  e, et = idx_pair(np.zeros((0, 4), dtype=np.int64), device)
  compare(x.gather(0, e), xt.gather(0, et))
  y, yt = rand((2, 3, 2), f32, device)
  k, kt = idx_pair([[[1, 0]], [[2, 2]]], device)
  compare(y.gather(1, k), yt.gather(1, kt))

@pytest.mark.parametrize("dtype", [f32, i32])
def test_scatter(device, dtype):
  x, xt = rand((3, 4), dtype, device)
  s, st = rand((2, 4), dtype, device, seed=1)
  i, it = idx_pair([[0, 1, 2, 0], [1, 2, 0, 1]], device)
  compare(x.scatter(0, i, s), xt.scatter(0, it, st))
  compare(x.scatter(1, i[:, :2] + 1, s), xt.scatter(1, it[:, :2] + 1, st))  # index smaller than src and self
  compare(x.scatter(1, i % 3, 5), xt.scatter(1, it % 3, 5))
  compare(x.scatter(0, i, value=-2), xt.scatter(0, it, value=-2))
  e, et = idx_pair(np.zeros((0, 4), dtype=np.int64), device)
  compare(x.scatter(0, e, s), xt.scatter(0, et, st))

@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(device, reduce, include_self):
  dtype = f32 if include_self else i32
  x, xt = rand((3, 4), dtype, device)
  s, st = rand((2, 4), dtype, device, seed=1)
  i, it = idx_pair([[0, 0, 2, 0], [0, 2, 0, 0]], device)  # row 1 is never written
  compare(x.scatter_reduce(0, i, s, reduce, include_self=include_self), xt.scatter_reduce(0, it, st, reduce, include_self=include_self), atol=1e-5)
  j, jt = idx_pair([[3, 3, 0], [1, 1, 1]], device)
  compare(x.scatter_reduce(1, j, s, reduce, include_self=include_self), xt.scatter_reduce(1, jt, st, reduce, include_self=include_self), atol=1e-5)

@pytest.mark.parametrize("dtype", [f32, i32, bool_])
def test_masked_fill(device, dtype):
  x, xt = rand((3, 4), dtype, device) if dtype != bool_ else pair(np.eye(3, 4, dtype=bool), bool_, device)
  m, mt = pair(np.array([[True, False, True, False]] * 3), bool_, device)
  compare(x.masked_fill(m, 1), xt.masked_fill(mt, 1))
  compare(x.masked_fill(m[0], 0), xt.masked_fill(mt[0], 0))  # the mask broadcasts
  v, vt = Tensor(2.5, device=device), torch.tensor(2.5)
  compare(x.masked_fill(m, v), xt.masked_fill(mt, vt))  # the value takes x's dtype
  z, zt = rand((0, 4), dtype, device)
  compare(z.masked_fill(m[0], 3), zt.masked_fill(mt[0], 3))

def test_gather_scatter_errors(device):
  x = Tensor.zeros(3, 4, device=device)
  with pytest.raises(TypeError, match="index must be an integer tensor, got dtypes.float32"): x.gather(0, Tensor([[0.0]], device=device))
  with pytest.raises(ValueError, match=r"index has 1 dimension\(s\) but the tensor has 2"): x.gather(0, Tensor([0], device=device))
  with pytest.raises(ValueError, match=r"index \(2, 5\) is bigger than the tensor \(3, 4\) at dimension 1"): x.gather(0, Tensor.zeros(2, 5, dtype=i64, device=device))
  with pytest.raises(IndexError, match=r"index 3 is out of bounds for dimension 0 with size 3"): x.gather(0, Tensor([[3]], device=device))
  with pytest.raises(IndexError, match=r"dim 2 is out of range"): x.gather(2, Tensor([[0]], device=device))
  with pytest.raises(ValueError, match=r"reduce must be one of .* got 'max'"): x.scatter_reduce(0, Tensor([[0]], device=device), x, "max")
  with pytest.raises(ValueError, match=r"index \(1, 5\) is bigger than src \(3, 4\)"): x.scatter(0, Tensor.zeros(1, 5, dtype=i64, device=device), x)
  with pytest.raises(TypeError, match="mask must be a bool tensor, got dtypes.int"): x.masked_fill(Tensor([1], device=device), 0)
  with pytest.raises(ValueError, match=r"mask of shape \(2, 3, 4\) doesn't broadcast to the tensor's shape \(3, 4\)"):
    x.masked_fill(Tensor.zeros(2, 3, 4, dtype=bool_, device=device), 0)

# ***** gradients *****

def _grad_pair(shape, device, seed=0):
  arr = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
  return Tensor(arr, device=device, requires_grad=True), torch.tensor(arr, requires_grad=True)

def test_gradients(device):
  x, xt = _grad_pair((3, 4), device)
  i, it = idx_pair([[0, 2, 1, 0], [2, 2, 0, 1]], device)
  w, wt = _grad_pair((2, 4), device, seed=1)
  (x.gather(0, i) * w).sum().backward()
  (xt.gather(0, it) * wt).sum().backward()
  compare(x.grad, xt.grad, atol=1e-5)
  x, xt = _grad_pair((3, 4), device)
  j, jt = idx_pair([2, 0, 2, -1], device)
  ((x[j, 1:] * w.reshape(4, 2)[:, :1]).sum() + (x[:, j] ** 2).sum()).backward()  # repeated indices accumulate
  ((xt[jt, 1:] * wt.detach().reshape(4, 2)[:, :1]).sum() + (xt[:, jt] ** 2).sum()).backward()
  compare(x.grad, xt.grad, atol=1e-5)
  x, xt = _grad_pair((3, 4), device)
  m, mt = pair(np.array([[True, False, False, True]] * 3), bool_, device)
  (x.masked_fill(m, 0.5) * x).sum().backward()
  (xt.masked_fill(mt, 0.5) * xt).sum().backward()
  compare(x.grad, xt.grad, atol=1e-5)
  x, xt = _grad_pair((3, 4), device)
  s, st = _grad_pair((2, 4), device, seed=2)
  k, kt = idx_pair([[0, 1, 2, 0], [1, 2, 0, 1]], device)
  (x.scatter(0, k, s) * Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device=device)).sum().backward()
  (xt.scatter(0, kt, st) * torch.arange(12, dtype=torch.float32).reshape(3, 4)).sum().backward()
  compare(x.grad, xt.grad, atol=1e-5)
  compare(s.grad, st.grad, atol=1e-5)

@pytest.mark.parametrize("shape, dim", [((3, 5, 2, 7), 1), ((2, 3, 4, 5, 6), 2), ((4, 3, 3, 3), 0)])
def test_gather_two_or_more_axes_after_dim(shape, dim, device):
  # the axes after dim keep their order (they were once swapped: a broadcast error, or wrong values when sizes matched)
  rng = np.random.default_rng(0)
  x = rng.random(shape).astype(np.float32)
  ishape = list(shape)
  ishape[dim] = 2
  i = rng.integers(0, shape[dim], ishape)
  got = Tensor(x, device=device).gather(dim, Tensor(i, device=device)).numpy()
  np.testing.assert_array_equal(got, torch.tensor(x).gather(dim, torch.tensor(i)).numpy())
