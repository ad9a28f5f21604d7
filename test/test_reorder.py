"""The ReorderOps mixin against PyTorch on both devices: cat/stack/split/chunk, repeat_interleave, roll,
tril/triu, meshgrid, pad modes, logsumexp, var_mean/std_mean, scans, sort/argsort/topk; values, dtypes,
gradients and errors. PYTHON cases stay tiny: the interpreter is slow."""
import math
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from attograd import Tensor, dtypes, GlobalCounters
from helpers import DEVICES, check, compare

pytestmark = pytest.mark.parametrize("device", DEVICES)
f32, i32, i64, bool_ = dtypes.float32, dtypes.int32, dtypes.int64, dtypes.bool
LAYOUTS = ["contig", "T", "slice"]

def T(data, device, dtype=None) -> Tensor: return Tensor(data, device=device, dtype=dtype)

def check_grad(fa, ft, shapes, device, seed=0, low=-2, high=2):
  """Gradients of sum(out * w) for fixed random weights w, attograd vs torch (float32 inputs)."""
  rng = np.random.default_rng(seed)
  arrs = [rng.uniform(low, high, size=s).astype(np.float32) for s in shapes]
  ins_a = [Tensor(a, device=device, requires_grad=True) for a in arrs]
  ins_t = [torch.tensor(a, requires_grad=True) for a in arrs]
  outs_a, outs_t = fa(*ins_a), ft(*ins_t)
  if not isinstance(outs_t, (tuple, list)): outs_a, outs_t = [outs_a], [outs_t]
  loss_a, loss_t = None, 0
  for oa, ot in zip(outs_a, outs_t):
    w = rng.uniform(-1, 1, size=tuple(ot.shape)).astype(np.float32)
    la = (oa * Tensor(w, device=device)).sum()
    loss_a = la if loss_a is None else loss_a + la
    loss_t = loss_t + (ot * torch.tensor(w)).sum()
  loss_a.backward(); loss_t.backward()
  for a, t in zip(ins_a, ins_t): compare(a.grad, t.grad, atol=1e-5, rtol=1e-4)

# ***** cat / stack *****

@pytest.mark.parametrize("dtype", [f32, i32, i64, bool_])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat(device, dtype, dim):
  check(lambda a, b, c: Tensor.cat(a, b, c, dim=dim), lambda a, b, c: torch.cat([a, b, c], dim=dim),
        [(2, 3), (2, 3), (2, 3)], dtype, device)
  shp = [(2, 3), (1, 3), (3, 3)] if dim == 0 else [(2, 3), (2, 1), (2, 2)]
  check(lambda a, b, c: a.cat(b, c, dim=dim), lambda a, b, c: torch.cat([a, b, c], dim=dim), shp, dtype, device)

@pytest.mark.parametrize("layout", LAYOUTS)
def test_cat_noncontig_and_list(device, layout):
  check(lambda a, b: Tensor.cat([a, b], dim=1), lambda a, b: torch.cat([a, b], dim=1), [(2, 3), (2, 3)], f32, device, layout=layout)

def test_cat_edge(device):
  check(lambda a, b: a.cat(b, dim=0), lambda a, b: torch.cat([a, b]), [(0, 3), (2, 3)], f32, device)
  check(lambda a, b: a.cat(b, dim=1), lambda a, b: torch.cat([a, b], 1), [(2, 0), (2, 1)], f32, device)
  check(lambda a, b: a.cat(b), lambda a, b: torch.cat([a, b]), [(0,), (2, 3)], f32, device)  # legacy skip of 1-D empties
  check(lambda a: a.cat(), lambda a: torch.cat([a]), [(2, 3)], f32, device)
  check(lambda a, b: a.cat(b, dim=1), lambda a, b: torch.cat([a, b], 1), [(2, 2), (2, 3)], [i32, f32], device)  # promotion

def test_cat_errors(device):
  a, b = T([[1.0, 2.0]], device), T([[1.0, 2.0, 3.0]], device)
  with pytest.raises(ValueError, match=r"\(1, 2\).*\(1, 3\)"): a.cat(b, dim=0)
  with pytest.raises(IndexError, match="2"): a.cat(a, dim=2)
  with pytest.raises(ValueError, match="zero-dim"): T(1.0, device).cat(T(2.0, device))
  with pytest.raises(ValueError, match="equal shape"): Tensor.stack(a, b)
  with pytest.raises(IndexError, match="-4"): a.stack(a, dim=-4)

@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_stack(device, dim):
  check(lambda a, b: Tensor.stack(a, b, dim=dim), lambda a, b: torch.stack([a, b], dim=dim), [(2, 3), (2, 3)], f32, device)
  check(lambda a, b, c: a.stack(b, c, dim=dim), lambda a, b, c: torch.stack([a, b, c], dim=dim), [(2, 3)] * 3, i32, device, layout="T")

def test_stack_edge(device):
  check(lambda a, b: Tensor.stack(a, b), lambda a, b: torch.stack([a, b]), [(), ()], f32, device)
  check(lambda a, b: Tensor.stack([a, b], dim=1), lambda a, b: torch.stack([a, b], 1), [(0, 2), (0, 2)], i64, device)

def test_cat_stack_grad(device):
  check_grad(lambda a, b: a.cat(b, dim=1), lambda a, b: torch.cat([a, b], 1), [(2, 3), (2, 2)], device)
  check_grad(lambda a, b: a.stack(b, dim=-1), lambda a, b: torch.stack([a, b], -1), [(2, 3), (2, 3)], device)

# ***** split / chunk *****

@pytest.mark.parametrize("dtype", [f32, i64])
@pytest.mark.parametrize("args", [(2, 0), (3, 1), (1, -1), (4, -2), ([1, 2], -1), ([0, 3, 0], 1), ([2, 2], 0), (10, 0)])
def test_split(device, dtype, args):
  check(lambda a: a.split(*args), lambda a: a.split(*args), [(4, 3)], dtype, device, layout="T")

@pytest.mark.parametrize("args", [(1, 0), (2, 1), (3, -1), (4, 1), (5, 1), (3, 0)])
def test_chunk(device, args):
  check(lambda a: a.chunk(*args), lambda a: a.chunk(*args), [(3, 5)], f32, device)

def test_split_chunk_edge_and_errors(device):
  check(lambda a: a.split(2), lambda a: a.split(2), [(0, 3)], f32, device)
  check(lambda a: a.chunk(3), lambda a: a.chunk(3), [(0, 3)], f32, device)
  a = T([[1, 2, 3]], device)
  with pytest.raises(ValueError, match=r"\[1, 1\].*sum to 2.*size 3"): a.split([1, 1], dim=1)
  with pytest.raises(ValueError, match="-1"): a.split(-1)
  with pytest.raises(ValueError, match="0"): a.chunk(0)
  with pytest.raises(IndexError, match="5"): a.split(1, dim=5)

def test_split_grad(device):
  check_grad(lambda a: a.split([1, 2], dim=-1), lambda a: a.split([1, 2], dim=-1), [(2, 3)], device)

def test_repeat_interleave_counts(device):
  check(lambda a: a.repeat_interleave([1, 0, 2], 1), lambda a: a.repeat_interleave(torch.tensor([1, 0, 2]), 1), [(2, 3)], f32, device)
  check(lambda a: a.repeat_interleave(Tensor([2, 1], device=device), dim=-2), lambda a: a.repeat_interleave(torch.tensor([2, 1]), dim=-2),
        [(2, 3)], i64, device, layout="T")
  check(lambda a: a.repeat_interleave([3]), lambda a: a.repeat_interleave(torch.tensor([3])), [(2, 2)], f32, device)
  check_grad(lambda a: a.repeat_interleave([2, 1, 0], 0), lambda a: a.repeat_interleave(torch.tensor([2, 1, 0]), 0), [(3, 2)], device)
  with pytest.raises(ValueError, match="2 entries.*size 3"): T([1, 2, 3], device).repeat_interleave([1, 2])
  with pytest.raises(ValueError, match="-1"): T([1, 2], device).repeat_interleave([1, -1])
  with pytest.raises(ValueError, match="-2"): T([1, 2], device).repeat_interleave(-2)

# ***** repeat_interleave / roll / tril / triu / meshgrid *****

@pytest.mark.parametrize("args", [(2,), (3, 0), (2, 1), (1, -1), (0, 1), (2, None)])
def test_repeat_interleave(device, args):
  check(lambda a: a.repeat_interleave(*args), lambda a: a.repeat_interleave(*args), [(2, 3)], i32, device, layout="T")
  check(lambda a: a.repeat_interleave(*args[:1]), lambda a: a.repeat_interleave(*args[:1]), [()], f32, device)

@pytest.mark.parametrize("args", [(1, 0), (-1, 1), (5, -1), (7, None), (-3, None), ((1, 2), (0, 1)), ((2, -1), (-1, 0)), (0, 0), ((1, 1), (1, 1))])
def test_roll(device, args):
  check(lambda a: a.roll(*args), lambda a: a.roll(*args), [(3, 4)], f32, device, layout="slice")
  check(lambda a: a.roll(*args), lambda a: a.roll(*args), [(3, 4)], i64, device)

def test_roll_edge_grad_errors(device):
  check(lambda a: a.roll(2, 0), lambda a: a.roll(2, 0), [(0, 3)], f32, device)
  check(lambda a: a.roll(3, 1), lambda a: a.roll(3, 1), [(2, 1)], f32, device)
  check_grad(lambda a: a.roll((1, -2), (0, 1)), lambda a: a.roll((1, -2), (0, 1)), [(3, 4)], device)
  with pytest.raises(ValueError, match=r"\(1, 2\).*\(0,\)"): T([[1, 2]], device).roll((1, 2), (0,))
  with pytest.raises(IndexError, match="3"): T([[1, 2]], device).roll(1, 3)

@pytest.mark.parametrize("diagonal", [0, 1, -5])
@pytest.mark.parametrize("dtype", [f32, i32, bool_])
def test_tril_triu(device, diagonal, dtype):
  check(lambda a: a.tril(diagonal), lambda a: a.tril(diagonal), [(3, 4)], dtype, device)
  check(lambda a: a.triu(diagonal), lambda a: a.triu(diagonal), [(2, 4, 3)], dtype, device, layout="T")

def test_tril_triu_edge(device):
  check(lambda a: a.triu(), lambda a: a.triu(), [(0, 3)], f32, device)
  check(lambda a: a.tril(), lambda a: a.tril(), [(1, 1)], f32, device)
  with pytest.raises(ValueError, match=r"\(3,\)"): T([1, 2, 3], device).tril()

@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_meshgrid(device, indexing):
  check(lambda a, b: Tensor.meshgrid(a, b, indexing=indexing), lambda a, b: torch.meshgrid(a, b, indexing=indexing), [(3,), (4,)], f32, device)
  check(lambda a, b, c: a.meshgrid(b, c, indexing=indexing), lambda a, b, c: torch.meshgrid(a, b, c, indexing=indexing),
        [(2,), (3,), (1,)], i32, device)
  check(lambda a: a.meshgrid(indexing=indexing), lambda a: torch.meshgrid(a, indexing=indexing), [(3,)], f32, device)
  check(lambda a, b: a.meshgrid(b, indexing=indexing), lambda a, b: torch.meshgrid(a, b, indexing=indexing), [(0,), (2,)], f32, device)

def test_meshgrid_errors(device):
  with pytest.raises(ValueError, match="'ji'"): T([1], device).meshgrid(T([2], device), indexing="ji")
  with pytest.raises(ValueError, match=r"\(1, 1\)"): T([[1]], device).meshgrid()

# ***** pad modes *****

@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("pad", [(1, 2), (0, 1, 2, 0), (2, 0, 1, 1), (2, 2, 2, 2)])
def test_pad_modes(device, mode, pad):
  check(lambda a: a.pad(pad, mode=mode), lambda a: F.pad(a, pad, mode=mode), [(2, 3, 4)], f32, device, layout="T")

def test_pad_modes_grad_and_tuple_form(device):
  check_grad(lambda a: a.pad((2, 1, 1, 0), mode="reflect"), lambda a: F.pad(a, (2, 1, 1, 0), mode="reflect"), [(1, 3, 4)], device)
  check_grad(lambda a: a.pad((1, 2), mode="replicate"), lambda a: F.pad(a, (1, 2), mode="replicate"), [(2, 3)], device)
  check(lambda a: a.pad(((0, 0), (1, 1), None), mode="circular"), lambda a: F.pad(a, (0, 0, 1, 1), mode="circular"), [(1, 3, 2)], i32, device)

def test_pad_mode_errors(device):
  a = T([[[1.0, 2.0, 3.0]]], device)
  with pytest.raises(ValueError, match=r"\(3, 0\).*size 3"): a.pad((3, 0), mode="reflect")
  with pytest.raises(ValueError, match=r"\(4, 0\).*size 3"): a.pad((4, 0), mode="circular")
  with pytest.raises(ValueError, match="'wrap'"): a.pad((1, 1), mode="wrap")
  with pytest.raises(ValueError, match="fill value"): a.pad((1, 1), value=2.0, mode="replicate")
  with pytest.raises(ValueError, match="negative"): a.pad((-1, 1), mode="replicate")

# ***** logsumexp / var_mean / std_mean *****

@pytest.mark.parametrize("axis,keepdim", [(0, False), (-1, True), ((0, 1), False), (None, False)])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_logsumexp(device, axis, keepdim, layout):
  ta = (lambda a: torch.logsumexp(a, tuple(range(a.ndim)), keepdim)) if axis is None else (lambda a: torch.logsumexp(a, axis, keepdim))
  check(lambda a: a.logsumexp(axis, keepdim), ta, [(2, 3, 4)], f32, device, layout=layout, low=-50, high=50, atol=1e-5)

def test_logsumexp_edge_grad(device):
  check(lambda a: a.logsumexp(1), lambda a: torch.logsumexp(a, 1), None, f32, device,
        vals=[[[-math.inf, -math.inf], [math.inf, 1.0], [1000.0, 1000.0], [-1000.0, 0.0]]])
  check(lambda a: a.logsumexp(1), lambda a: torch.logsumexp(a, 1), [(3, 0)], f32, device)
  check(lambda a: a.logsumexp(0), lambda a: torch.logsumexp(a, 0), [(0, 2)], f32, device)
  check(lambda a: a.logsumexp(0), lambda a: torch.logsumexp(a, 0), [(4,)], i32, device, atol=1e-5)
  check(lambda a: a.logsumexp(0), lambda a: torch.logsumexp(a, 0), [()], f32, device)
  check_grad(lambda a: a.logsumexp(-1), lambda a: torch.logsumexp(a, -1), [(3, 4)], device)

@pytest.mark.parametrize("fn", ["var_mean", "std_mean"])
@pytest.mark.parametrize("axis,correction,keepdim", [(None, 1, False), (0, 0, True), (1, 2, False), ((0, 2), 1, True)])
def test_var_std_mean(device, fn, axis, correction, keepdim):
  tdim = axis if axis is not None else None
  check(lambda a: getattr(a, fn)(axis, keepdim=keepdim, correction=correction),
        lambda a: getattr(torch, fn)(a, tdim, correction=correction, keepdim=keepdim), [(3, 4, 2)], f32, device, layout="T", atol=1e-5)

# ***** scans *****

SCANS = {"cumsum": (lambda a, d: a.cumsum(d), lambda a, d: torch.cumsum(a, d)),
         "cumprod": (lambda a, d: a.cumprod(d), lambda a, d: torch.cumprod(a, d)),
         "cummax": (lambda a, d: a.cummax(d), lambda a, d: tuple(torch.cummax(a, d))),
         "cummin": (lambda a, d: a.cummin(d), lambda a, d: tuple(torch.cummin(a, d))),
         "logcumsumexp": (lambda a, d: a.logcumsumexp(d), lambda a, d: torch.logcumsumexp(a, d))}

@pytest.mark.parametrize("name", SCANS)
@pytest.mark.parametrize("dtype", [f32, i64])
@pytest.mark.parametrize("dim", [1, -3])
def test_scans(device, name, dtype, dim):
  fa, ft = SCANS[name]
  if name == "logcumsumexp" and dtype != f32: pytest.skip("torch's logcumsumexp is float only")
  lo, hi = (-2, 3) if dtype == f32 else (-3, 4)
  check(lambda a: fa(a, dim), lambda a: ft(a, dim), [(2, 3, 4)], dtype, device, layout="T" if dim > 0 else "slice", low=lo, high=hi, atol=1e-5)

@pytest.mark.parametrize("name", SCANS)
def test_scans_edge(device, name):
  fa, ft = SCANS[name]
  check(lambda a: fa(a, 0), lambda a: ft(a, 0), [()], f32, device)
  check(lambda a: fa(a, 1), lambda a: ft(a, 1), [(2, 0)], f32, device)
  check(lambda a: fa(a, 0), lambda a: ft(a, 0), [(1, 3)], f32, device)
  if name != "logcumsumexp":
    check(lambda a: fa(a, 0), lambda a: ft(a, 0), [(5,)], bool_, device)
    check(lambda a: fa(a, -1), lambda a: ft(a, -1), [(2, 4)], i32, device, low=-3, high=4)
  vals = [[1.0, math.nan, 3.0, -math.inf, math.nan, 2.0], [2.0, 2.0, 1.0, 2.0, math.inf, 2.0]]  # NaN sticks; ties take the latest index
  check(lambda a: fa(a, 1), lambda a: ft(a, 1), None, f32, device, vals=[vals])

def test_cumsum_large_and_fused(device):
  if device == "PYTHON": pytest.skip("large")
  check(lambda a: a.cumsum(-1), lambda a: torch.cumsum(a, -1), [(3, 300)], f32, device, atol=1e-4, rtol=1e-4)
  x = Tensor(np.random.default_rng(0).random((4, 64), dtype=np.float32), device=device).realize()
  GlobalCounters.reset()
  x.cumsum(1).realize()
  assert GlobalCounters.kernel_count == 1

def test_scan_grad(device):
  check_grad(lambda a: a.cumsum(1), lambda a: torch.cumsum(a, 1), [(2, 4)], device)
  check_grad(lambda a: a.cumsum(-2), lambda a: torch.cumsum(a, -2), [(3, 2)], device)
  check_grad(lambda a: a.cumprod(0), lambda a: torch.cumprod(a, 0), [(4,)], device, low=0.5, high=2)
  check_grad(lambda a: a.logcumsumexp(0), lambda a: torch.logcumsumexp(a, 0), [(4, 2)], device)
  check_grad(lambda a: a.cummax(1)[0], lambda a: torch.cummax(a, 1)[0], [(2, 4)], device)

def test_scan_errors(device):
  with pytest.raises(IndexError, match="2"): T([[1.0]], device).cumsum(2)
  with pytest.raises(IndexError, match="-3"): T([[1.0]], device).cummax(-3)

# ***** sort / argsort / topk *****

@pytest.mark.parametrize("dtype", [f32, i32, i64])
@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("descending", [False, True])
def test_sort(device, dtype, dim, descending):
  # ints from a small range: many ties, so the stable index order is checked too
  check(lambda a: a.sort(dim, descending), lambda a: tuple(torch.sort(a, dim=dim, descending=descending, stable=True)),
        [(3, 5)], dtype, device, layout="T", low=-3, high=3)
  check(lambda a: a.argsort(dim, descending), lambda a: torch.argsort(a, dim=dim, descending=descending, stable=True),
        [(3, 5)], dtype, device, layout="slice", low=-3, high=3)

@pytest.mark.parametrize("desc", [False, True])
def test_sort_edge(device, desc):
  def ft(a): return tuple(torch.sort(a, dim=-1, descending=desc, stable=True))
  check(lambda a: a.sort(-1, desc), ft, None, f32, device, vals=[[math.nan, 1.0, -math.inf, math.nan, math.inf, -0.5, 1.0]])
  check(lambda a: a.sort(-1, desc), ft, [()], f32, device)
  check(lambda a: a.sort(-1, desc), ft, [(2, 0)], f32, device)
  check(lambda a: a.sort(-1, desc), ft, [(3, 1)], i32, device)
  check(lambda a: a.sort(-1, desc), ft, [(6,)], bool_, device)

def test_sort_larger(device):
  n = 200 if device == "CPU" else 12
  check(lambda a: a.sort(-1), lambda a: tuple(torch.sort(a, dim=-1, stable=True)), [(2, n)], f32, device)
  check(lambda a: a.topk(5, 1), lambda a: tuple(torch.topk(a, 5, 1)), [(2, n)], f32, device)

@pytest.mark.parametrize("dtype", [f32, i32])
@pytest.mark.parametrize("k,dim,largest", [(1, -1, True), (3, 1, False), (5, 1, True), (0, 1, True), (2, 0, True), (3, -2, False)])
def test_topk(device, dtype, k, dim, largest):
  # distinct values: torch's topk doesn't promise an order among ties
  rng = np.random.default_rng(k)
  vals = rng.permutation(15).reshape(3, 5) - 7
  check(lambda a: a.topk(k, dim, largest), lambda a: tuple(torch.topk(a, k, dim, largest)), None, dtype, device, vals=[vals])

def test_topk_errors(device):
  a = T([[1.0, 2.0, 3.0]], device)
  with pytest.raises(RuntimeError, match="k=4.*size 3"): a.topk(4)
  with pytest.raises(RuntimeError, match="k=-1"): a.topk(-1)
  with pytest.raises(IndexError, match="2"): a.sort(2)

def test_sort_topk_grad(device):
  check_grad(lambda a: a.sort(-1)[0], lambda a: torch.sort(a, -1)[0], [(2, 5)], device)
  check_grad(lambda a: a.sort(0, descending=True)[0], lambda a: torch.sort(a, 0, descending=True)[0], [(4, 2)], device)
  check_grad(lambda a: a.topk(2, -1)[0], lambda a: torch.topk(a, 2, -1)[0], [(3, 4)], device)

def test_sort_kernels(device):
  if device == "PYTHON": pytest.skip("counting on CPU is enough")
  x = Tensor(np.random.default_rng(1).random((4, 32), dtype=np.float32), device=device).realize()
  GlobalCounters.reset()
  v, i = x.sort(-1)
  Tensor.realize_all([v, i])
  assert GlobalCounters.kernel_count <= 3  # the ranks, then values and indices

# ***** long rows: the merge sort (fixture `bitonic`, its old name) and the blocked scans *****
import attograd.frontend.reorder as reorder

@pytest.fixture
def bitonic(monkeypatch):
  """Every sort goes through the long-row path (the merge sort), however short the row (so small shapes test it)."""
  monkeypatch.setattr(reorder, "_RANK_SORT_MAX", 0)

@pytest.mark.parametrize("dtype", [f32, i64, dtypes.float64, bool_, dtypes.float16])
@pytest.mark.parametrize("descending", [False, True])
def test_bitonic_sort(device, bitonic, dtype, descending):
  if device == "PYTHON" and dtype not in (f32, i64): pytest.skip("the interpreter is slow: two dtypes (both key layouts) are enough there")
  n = 13 if device == "CPU" else 6  # padded to 16 / 8: the padding must sort last
  check(lambda a: a.sort(-1, descending), lambda a: tuple(torch.sort(a, dim=-1, descending=descending, stable=True)),
        [(3, n)], dtype, device, low=-3, high=3)  # many ties: the stable order is checked
  if device == "CPU" and dtype == f32:
    check(lambda a: a.sort(0, descending), lambda a: tuple(torch.sort(a, dim=0, descending=descending, stable=True)),
          [(13, 3)], dtype, device, layout="T", low=-3, high=3)

@pytest.mark.parametrize("descending", [False, True])
def test_bitonic_sort_edge(device, bitonic, descending):
  vals = [math.nan, 1.0, -math.inf, -0.0, math.nan, math.inf, 0.0, -0.5, 1.0, -0.0]
  for dt in ((f32, dtypes.float64) if device == "CPU" else (f32,)):
    check(lambda a: a.sort(-1, descending), lambda a: tuple(torch.sort(a, dim=-1, descending=descending, stable=True)), None, dt, device, vals=[vals])
  out = Tensor([0.0, -0.0, -0.0], device=device).sort()[0].numpy()
  assert list(np.signbit(out)) == [False, True, True]  # values ride along exactly: -0.0 stays -0.0
  check(lambda a: a.sort(-1, descending), lambda a: tuple(torch.sort(a, dim=-1, descending=descending, stable=True)), None, dtypes.int32, device,
        vals=[[2**31 - 1, -2**31, 0, -1, 2**31 - 1, -2**31]])
  check(lambda a: a.sort(-1, descending), lambda a: tuple(torch.sort(a, dim=-1, descending=descending, stable=True)), None, i64, device,
        vals=[[2**63 - 1, -2**63, 0, -1, 2**63 - 1, -2**63]])
  check(lambda a: a.sort(-1), lambda a: tuple(torch.sort(a, dim=-1, stable=True)), [(2, 0)], f32, device)
  check(lambda a: a.sort(-1), lambda a: tuple(torch.sort(a, dim=-1, stable=True)), [(3, 1)], f32, device)

def test_bitonic_topk_argsort_grad(device, bitonic):
  n = 11 if device == "CPU" else 5
  vals = np.random.default_rng(5).permutation(3 * n).reshape(3, n) - n  # distinct: topk's tie order is unspecified
  check(lambda a: a.topk(4, -1), lambda a: tuple(torch.topk(a, 4, -1)), None, f32, device, vals=[vals])
  check(lambda a: a.topk(3, 0, largest=False), lambda a: tuple(torch.topk(a, 3, 0, largest=False)), None, i32, device, vals=[vals])
  check(lambda a: a.argsort(-1, True), lambda a: torch.argsort(a, dim=-1, descending=True, stable=True), [(2, n)], f32, device, layout="slice")
  check_grad(lambda a: a.sort(-1)[0], lambda a: torch.sort(a, -1)[0], [(2, n)], device)
  check_grad(lambda a: a.topk(2, -1)[0] * 3, lambda a: torch.topk(a, 2, -1)[0] * 3, [(3, n)], device)

def test_long_sort_and_scans(device):
  if device == "PYTHON": pytest.skip("long rows: the interpreter is slow")
  check(lambda a: a.sort(-1), lambda a: tuple(torch.sort(a, dim=-1, stable=True)), [(2, 100)], f32, device)
  check(lambda a: a.sort(-1, True), lambda a: tuple(torch.sort(a, dim=-1, descending=True, stable=True)), [(2, 100)], i32, device, low=-20, high=20)
  check(lambda a: a.topk(5, 1), lambda a: tuple(torch.topk(a, 5, 1)), [(2, 100)], f32, device)
  check(lambda a: a.cumsum(-1), lambda a: torch.cumsum(a, -1), [(2, 5000)], f32, device, atol=1e-3, rtol=1e-4)
  check(lambda a: a.cumsum(0), lambda a: torch.cumsum(a, 0), [(130, 3)], i32, device, layout="T", low=-9, high=9)
  check(lambda a: a.cumsum(0), lambda a: torch.cumsum(a, 0), [(1000,)], bool_, device)
  check(lambda a: a.cumprod(-1), lambda a: torch.cumprod(a, -1), [(2, 300)], f32, device, low=0.9, high=1.1, rtol=1e-4)
  check(lambda a: a.logcumsumexp(-1), lambda a: torch.logcumsumexp(a, -1), [(2, 700)], f32, device, low=-50, high=50, atol=1e-4)
  vals = [[-math.inf] * 70 + [1.0, math.inf, 2.0] + [math.nan] + [0.0] * 30]
  check(lambda a: a.logcumsumexp(-1), lambda a: torch.logcumsumexp(a, -1), None, f32, device, vals=vals)
  check(lambda a: a.cumsum(-1), lambda a: torch.cumsum(a, -1), None, f32, device, vals=vals)
  vals = np.random.default_rng(6).integers(-30, 30, (2, 300)).astype(np.float32)
  vals[0, 100], vals[1, 299], vals[1, 5] = math.nan, math.nan, math.inf  # NaN sticks across blocks; ties take the latest index
  check(lambda a: a.cummax(-1), lambda a: tuple(torch.cummax(a, -1)), None, f32, device, vals=[vals])
  check(lambda a: a.cummin(0), lambda a: tuple(torch.cummin(a, 0)), [(200, 2)], i32, device, low=-9, high=9)
  check_grad(lambda a: a.cummax(-1)[0], lambda a: torch.cummax(a, -1)[0], [(1, 100)], device)
  check_grad(lambda a: a.cumsum(-1), lambda a: torch.cumsum(a, -1), [(2, 150)], device)

def test_long_scan_kernels(device):
  if device == "PYTHON": pytest.skip("counting on CPU is enough")
  x = Tensor(np.random.default_rng(2).random((1 << 16,), dtype=np.float32), device=device).realize()
  GlobalCounters.reset()
  x.cumsum(0).realize()
  assert GlobalCounters.kernel_count <= 4  # blocks of 32, their totals (2048), those totals' (64), and the combined output

# ***** the merge sort, topk of small k, median, unique *****

def sort_pair(desc: bool):
  return (lambda a: a.sort(-1, desc)), (lambda a: tuple(torch.sort(a, dim=-1, descending=desc, stable=True)))

@pytest.mark.parametrize("dtype", [f32, i32, dtypes.float16, bool_])
@pytest.mark.parametrize("descending", [False, True])
def test_merge_sort(device, dtype, descending):
  # 70 elements: padded to 128, a block of 64 sorted by counting and one merge level; 3000: six merge levels
  n = 3000 if device == "CPU" else 70
  if device not in ("CPU", "PYTHON") and dtype not in (f32, i32): pytest.skip("two dtypes are enough off CPU")
  fa, ft = sort_pair(descending)
  check(fa, ft, [(2, n)], dtype, device, low=-20, high=20)  # ints: many ties, so the stable order is checked
  vals = np.random.default_rng(3).integers(-3, 3, n).astype(np.float32)
  vals[::7], vals[3::11], vals[5::13], vals[1::17] = math.nan, math.inf, -0.0, -math.inf
  check(fa, ft, None, f32, device, vals=[vals])
  if device == "CPU":
    check(lambda a: a.sort(0, descending), lambda a: tuple(torch.sort(a, dim=0, descending=descending, stable=True)),
          [(n, 3)], dtype, device, layout="T", low=-20, high=20)

def test_merge_sort_argsort_values_exact(device):
  n = 300 if device == "CPU" else 70
  out = Tensor([0.0, -0.0] * (n // 2), device=device).sort()[0].numpy()
  assert list(np.signbit(out)) == [False, True] * (n // 2)  # values are the input's, read at the indices: -0.0 stays
  check(lambda a: a.argsort(-1, True), lambda a: torch.argsort(a, dim=-1, descending=True, stable=True), [(3, n)], i32, device,
        layout="slice", low=-5, high=5)

def test_merge_sort_grad(device):
  # the values' gradient goes through a gather whose condition also holds the inverse permutation (one read per element)
  n = 2000 if device == "CPU" else 70
  check_grad(lambda a: a.sort(-1)[0], lambda a: torch.sort(a, -1)[0], [(2, n)], device)
  check_grad(lambda a: a.sort(0, descending=True)[0] * 2, lambda a: torch.sort(a, 0, descending=True)[0] * 2, [(n, 2)], device)

def test_merge_sort_kernels(device):
  if device != "CPU": pytest.skip("counting on CPU is enough")
  n = 1 << 14
  x = Tensor(np.random.default_rng(1).random(n, dtype=np.float32), device=device).realize()
  GlobalCounters.reset()
  Tensor.realize_all(list(x.sort()))
  # the keys, the block sort's 2 (its ranks, and their placement: a scatter of each key to its rank), two per merge level
  # (each key's place, then the scatter; 64 -> 16384: 8 levels), values and indices: O(log n), not O(log^2 n)
  assert GlobalCounters.kernel_count <= 22, GlobalCounters.kernel_count

@pytest.mark.parametrize("n", [2, 63, 64, 65, 127, 128, 129, 257, 1025])
def test_merge_sort_sizes(device, bitonic, n):
  # around the block (64) and each level's run length: padding to a power of two, a last run that is all padding
  if device != "CPU": pytest.skip("sizes on CPU; the other devices run the same graphs in the tests above")
  vals = np.random.default_rng(n).integers(-4, 4, (2, n)).astype(np.float32)  # ties: the stable order is checked
  vals[0, ::5], vals[1, 1::7], vals[0, 2::9] = math.nan, -0.0, -math.inf
  for desc in (False, True):
    fa, ft = sort_pair(desc)
    check(fa, ft, None, f32, device, vals=[vals])
    check(fa, ft, None, i32, device, vals=[np.nan_to_num(vals, nan=3, neginf=-9).astype(np.int32)])
  check(lambda a: a.sort(0, True), lambda a: tuple(torch.sort(a, dim=0, descending=True, stable=True)), None, f32, device,
        vals=[vals.T.copy()])

def test_sort_graph_reused(device):
  # a sort's key graph is built once per shape and its input swapped in: later sorts of the shape see their own data
  if device != "CPU": pytest.skip("CPU is enough")
  rng = np.random.default_rng(11)
  for desc in (False, True, False):
    a = rng.standard_normal((2, 300)).astype(np.float32)
    v, i = Tensor(a, device=device).sort(-1, descending=desc)
    tv, ti = torch.sort(torch.from_numpy(a), dim=-1, descending=desc, stable=True)
    np.testing.assert_array_equal(v.numpy(), tv.numpy())
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
  b = rng.integers(0, 5, (2, 300)).astype(np.int64)  # another dtype of the same shape: another graph (two passes)
  v, i = Tensor(b, device=device).sort(-1)
  np.testing.assert_array_equal(i.numpy(), np.argsort(b, axis=-1, kind="stable"))

def test_template_rebuilds_the_substituted_graph(device):
  # a template rebuilds only the nodes above its stand-in: nodes are hash-consed, so the graph it gives over another input
  # is the very node substitute() gives, for a sort's and a topk's key graphs (fixed nodes below and beside the input)
  if device != "CPU": pytest.skip("graph building only")
  from attograd.frontend.reorder import _build_sorted_keys, _topk_pair, _SORT_BLOCK, _SEARCH_WAYS
  from attograd.uop.ops import UOp, Ops, Template
  rng = np.random.default_rng(3)
  for a, build, args in [(rng.permutation(600).astype(np.uint64).reshape(2, 300), _build_sorted_keys, (_SORT_BLOCK, _SEARCH_WAYS)),
                         (rng.standard_normal((2, 5000)).astype(np.float32), _topk_pair, (7, True, Tensor))]:
    x = Tensor(a, device=device).realize().uop
    leaf = UOp(Ops.CONST, x.dtype, (UOp(Ops.DEVICE, dtypes.void, (), device),), "stand-in").reshape((1, 1)).expand(a.shape)
    root = build(leaf, *args)
    assert Template((leaf,), root)(x) is root.substitute({leaf: x})

def test_sort_topk_are_calls(device):
  # where no gradient flows, a sort's and a topk's graphs are CALL nodes over the input (uop/ops.py): the realize of a later
  # call of the shape walks a few nodes, finds the schedule by them and expands nothing; values still each input's own
  if device != "CPU": pytest.skip("graph building only")
  from attograd.uop.ops import Ops
  import attograd.schedule.schedule as sched
  rng = np.random.default_rng(5)
  for fa, ft in [(lambda t: t.sort(), lambda t: torch.sort(t, stable=True)), (lambda t: t.topk(7), lambda t: torch.topk(t, 7))]:
    for i in range(3):
      a = rng.standard_normal((2, 3000)).astype(np.float32)
      out = fa(Tensor(a, device=device).realize())
      nodes = {u for o in out for u in o.uop.toposort}
      assert sum(u.op is Ops.CALL for u in nodes) == 2 and len(nodes) < 12, len(nodes)
      seen = len(sched._schedule_cache)
      Tensor.realize_all(list(out))
      if i: assert len(sched._schedule_cache) == seen  # the second and third: the first's schedule
      for o, t in zip(out, ft(torch.from_numpy(a))): np.testing.assert_array_equal(o.numpy(), t.numpy())

def test_call_gradient(device):
  # a CALL in a graph a gradient flows through is differentiated as the graph it stands for
  if device != "CPU": pytest.skip("CPU is enough")
  from attograd.frontend.reorder import _templated, _topk_pair
  a = np.random.default_rng(6).standard_normal((2, 3000)).astype(np.float32)
  x, tx = Tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
  v, _ = (Tensor(u) for u in _templated(_topk_pair, x.uop, 5, True, Tensor))
  (v * v).sum().backward()
  (torch.topk(tx, 5)[0] ** 2).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-6)

def test_topk_stored_ranks(device):
  # k * m^2 past _RANK_INLINE_MAX: the chunk maxima's ranks are stored before the pick (256 of 512 maxima)
  if device != "CPU": pytest.skip("CPU is enough")
  vals = np.random.default_rng(12).permutation(16384).astype(np.float32).reshape(1, 16384)
  check(lambda a: a.topk(256, -1), lambda a: tuple(torch.topk(a, 256, -1)), None, f32, device, vals=[vals])

@pytest.mark.parametrize("k", [1, 5, 17])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_small_k(device, k, largest):
  n = 5000 if device == "CPU" else 600
  if device not in ("CPU", "PYTHON") and k != 5: pytest.skip("one k is enough off CPU")
  if device == "PYTHON" and k == 17: pytest.skip("the chunked pick's widest case runs on CPU: the interpreter took 50 s on it")
  rng = np.random.default_rng(k)
  vals = rng.permutation(2 * n).reshape(2, n).astype(np.float32) - n  # distinct: torch's order among ties is unspecified
  check(lambda a: a.topk(k, -1, largest), lambda a: tuple(torch.topk(a, k, -1, largest)), None, f32, device, vals=[vals])
  check(lambda a: a.topk(k, 0, largest), lambda a: tuple(torch.topk(a, k, 0, largest)), None, i32, device, vals=[vals.T.copy()])
  vals[0, ::5], vals[1, 7] = math.nan, math.inf  # NaN is the largest, as in torch
  check(lambda a: a.topk(k, -1, largest)[0], lambda a: torch.topk(a, k, -1, largest)[0], None, f32, device, vals=[vals])

def test_topk_ties_and_large_k(device):
  n = 4000 if device == "CPU" else 600
  a = np.random.default_rng(9).integers(-10, 10, (2, n)).astype(np.float32)
  # 1500 and 250: the chunks can't narrow it, a sort of candidates (the interpreter, 20 s on that, takes the chunked pick)
  for k in ((3, 60, 1500) if device == "CPU" else (3,) if device == "PYTHON" else (3, 250)):
    v, i = Tensor(a, device=device).topk(k)
    tv = torch.topk(torch.from_numpy(a), k)[0].numpy()
    np.testing.assert_array_equal(v.numpy(), tv)
    np.testing.assert_array_equal(np.take_along_axis(a, i.numpy(), 1), tv)  # indices point at the values
    first = np.argsort(-a, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(i.numpy(), first)  # ties ordered by index, like a stable sort

def test_topk_small_k_grad(device):
  n = 3000 if device == "CPU" else 600
  check_grad(lambda a: a.topk(4, -1)[0], lambda a: torch.topk(a, 4, -1)[0], [(2, n)], device)

def test_topk_kernels(device):
  if device != "CPU": pytest.skip("counting on CPU is enough")
  x = Tensor(np.random.default_rng(2).random(100_000, dtype=np.float32), device=device).realize()
  GlobalCounters.reset()
  Tensor.realize_all(list(x.topk(10)))
  # the chunk maxima, a chain of 10 max reduces over them (one kernel), the same over the 320 candidates, the values (a full
  # sort would take ~27 kernels of O(n log n))
  assert GlobalCounters.kernel_count <= 4, GlobalCounters.kernel_count

def test_topk_sort_errors(device):
  a = T([[1.0, 2.0, 3.0]], device)
  with pytest.raises(RuntimeError, match="k=4"): a.topk(4)
  with pytest.raises(RuntimeError, match="k=201"): T(np.zeros(200, np.float32), device).topk(201)
  with pytest.raises(IndexError): a.topk(1, dim=2)
  with pytest.raises(IndexError): a.sort(-3)
  with pytest.raises(IndexError): a.median(2)

@pytest.mark.parametrize("n", [7, 8, 201])
def test_median(device, n):
  if device != "CPU" and n == 201: pytest.skip("one long row on CPU is enough (PYTHON is slow, lavapipe caps loop length)")
  for dtype in (f32, i32):
    # ints from a small range: ties, and the index is the stable sort's, like torch's
    check(lambda a: a.median(-1), lambda a: tuple(torch.median(a, -1)), [(3, n)], dtype, device, low=-4, high=4)
    check(lambda a: a.median(0, keepdim=True), lambda a: tuple(torch.median(a, 0, keepdim=True)), [(n, 2)], dtype, device, low=-4, high=4)
    check(lambda a: a.median(), lambda a: torch.median(a), [(2, n)], dtype, device, low=-4, high=4)

def test_median_select(device):
  # rows of _SELECT_MIN and longer take the radix selection: the stable sort's element (its index with ties), NaN's first
  if device != "CPU": pytest.skip("CPU is enough: the graphs are the sort's primitives")
  rng = np.random.default_rng(13)
  n = reorder._SELECT_MIN + 37
  vals = rng.integers(-6, 6, (3, n)).astype(np.float32)
  vals[1, 100], vals[1, 5] = math.nan, math.nan
  vals[2, ::3], vals[0, 1::4] = -0.0, -math.inf
  check(lambda a: a.median(1), lambda a: tuple(torch.median(a, 1)), None, f32, device, vals=[vals])
  check(lambda a: a.median(0, keepdim=True), lambda a: tuple(torch.median(a, 0, keepdim=True)), None, f32, device, vals=[vals.T.copy()])
  v = Tensor(vals[2], device=device).median()
  assert np.signbit(v.numpy()) == np.signbit(torch.median(torch.from_numpy(vals[2])).numpy())  # the stable sort's zero
  check(lambda a: a.median(), lambda a: torch.median(a), None, f32, device, vals=[rng.standard_normal(5000).astype(np.float32)])
  for dt in (i32, dtypes.int16, dtypes.uint8):
    check(lambda a: a.median(-1), lambda a: tuple(torch.median(a, -1)), [(2, 3000)], dt, device, low=0, high=9)
  check_grad(lambda a: a.median(-1)[0], lambda a: torch.median(a, -1)[0], [(2, n)], device)
  x = Tensor(rng.standard_normal(100_000).astype(np.float32), device=device).realize()
  GlobalCounters.reset()
  x.median().realize()
  assert GlobalCounters.kernel_count <= 32, GlobalCounters.kernel_count  # 7 digits of 4 kernels, not a sort's 26 of O(n log n)

def test_median_edge(device):
  vals = [[3.0, 1.0, 2.0, 2.0, 5.0, 2.0], [1.0, math.nan, 0.0, 4.0, math.nan, 3.0]]  # lower median; NaN wins, first NaN
  check(lambda a: a.median(1), lambda a: tuple(torch.median(a, 1)), None, f32, device, vals=[vals])
  check(lambda a: a.median(), lambda a: torch.median(a), None, f32, device, vals=[vals])
  check(lambda a: a.median(), lambda a: torch.median(a), None, f32, device, vals=[[1.0, 2.0, 3.0, 4.0]])  # 2, not 2.5
  check(lambda a: a.median(0), lambda a: tuple(torch.median(a, 0)), [()], f32, device)
  assert math.isnan(Tensor([], device=device).median().item())
  with pytest.raises(IndexError, match="non-zero"): Tensor.zeros(2, 0, device=device).median(1)
  check_grad(lambda a: a.median(-1)[0], lambda a: torch.median(a, -1)[0], [(3, 9)], device)

@pytest.mark.parametrize("dtype", [i32, i64, f32])
def test_unique(device, dtype):
  rng = np.random.default_rng(4)
  shape = (30, 40) if device == "CPU" else (5, 14)
  arr = rng.integers(0, 25, shape)
  a, t = Tensor(arr.astype(np.float32) if dtype == f32 else arr, device=device, dtype=dtype), torch.tensor(arr, dtype=torch.float32 if dtype == f32 else None)
  if dtype == i32: t = t.to(torch.int32)
  compare(a.unique(), torch.unique(t))
  for got, want in zip(a.unique(return_inverse=True, return_counts=True), torch.unique(t, return_inverse=True, return_counts=True)):
    compare(got, want)
  u, inv = a.unique(sorted=False, return_inverse=True)
  assert inv.shape == a.shape
  np.testing.assert_array_equal(u.numpy()[inv.numpy()], a.numpy())  # the inverse rebuilds the input

def test_unique_edge(device):
  vals = [1.0, math.nan, -0.0, math.nan, 0.0, 1.0, -math.inf]
  for got, want in zip(T(vals, device).unique(return_counts=True), torch.unique(torch.tensor(vals), return_counts=True)):
    compare(got, want)  # each NaN its own, -0.0 equal to 0.0
  got = Tensor([], device=device).unique(return_inverse=True, return_counts=True)
  assert [g.shape for g in got] == [(0,), (0,), (0,)]
  compare(T([[True, False], [True, True]], device).unique(), torch.unique(torch.tensor([[True, False], [True, True]])))
  with pytest.raises(NotImplementedError, match="dim"): T([1, 2], device).unique(dim=0)
