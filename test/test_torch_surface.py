"""The Tensor surface a PyTorch user touches (issue 16): each test runs the same lines in torch and attograd."""
import numpy as np
import pytest
import torch
from attograd import Tensor, TinyJit, JitError, dtypes

def arange(*shape: int) -> np.ndarray: return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
def both(a: np.ndarray) -> tuple[Tensor, torch.Tensor]: return Tensor(a).realize(), torch.tensor(a)
def same(t: Tensor, r: torch.Tensor, **kw) -> None:
  assert t.shape == tuple(r.shape), (t.shape, tuple(r.shape))
  np.testing.assert_allclose(t.numpy(), r.numpy(), **kw)

# ***** writes through views reach the base *****
@pytest.mark.parametrize("write", [
  lambda x: x[0].__setitem__(1, 5),                          # x[0][1] = 5
  lambda x: x[1].__iadd__(100),                              # v = x[1]; v += 100
  lambda x: x.reshape(4, 3).__setitem__((1, 2), -1),         # setitem on x.reshape(...)
  lambda x: x.T.__setitem__(0, 9),                           # a permuted view
  lambda x: x[:, 1:3][1].__setitem__(slice(None), 7),        # a view of a view
  lambda x: x.view(12)[::5].__imul__(-2),                    # a strided view
  lambda x: x.unsqueeze(0).squeeze(0).flatten()[3:].__isub__(1)])
def test_write_through_view(write):
  (x, r) = both(arange(3, 4))
  write(x); write(r)
  same(x, r)

def test_write_through_view_of_lazy_and_realized_view():
  x, r = Tensor.zeros(3, 3), torch.zeros(3, 3)
  row, trow = x[0], r[0]
  assert row.tolist() == trow.tolist()  # the view is realized on its own first
  row[1] = 7; trow[1] = 7
  same(x, r); same(row, trow)

def test_view_sees_base_written_before_inplace_op():
  (x, r) = both(arange(2, 3))
  v, tv = x[0], r[0]
  x += 1; r += 1
  v += 10; tv += 10
  same(x, r); same(v, tv)

def test_write_to_expanded_view_raises():
  x = Tensor.ones(1, 3).contiguous().realize()
  with pytest.raises(RuntimeError, match="expanded"): x.expand(2, 3)[0] = 1.0

# ***** out-of-range indices raise *****
@pytest.mark.parametrize("bad", [10, -11])
def test_lookup_out_of_range_raises(bad):
  w = Tensor.randn(10, 4).realize()
  idx = Tensor([1, bad]) + 0  # lazy: checked with the realize
  with pytest.raises(IndexError, match="out of bounds"): w[idx].numpy()
  with pytest.raises(IndexError, match="out of bounds"): w.gather(0, Tensor([[1, bad]]) + 0).numpy()
  with pytest.raises(RuntimeError): w[idx].numpy()  # torch raises RuntimeError for gather/embedding
  assert w[Tensor([1, -1]) + 0].shape == (2, 4)  # negative in range still wraps

@pytest.mark.parametrize("target", [[0, 7, 1], [0, -1, 1]])
def test_cross_entropy_target_out_of_range_raises(target):
  logits = Tensor.randn(3, 3)
  with pytest.raises(IndexError): logits.cross_entropy(Tensor(target)).item()
  with pytest.raises(IndexError): torch.nn.functional.cross_entropy(torch.randn(3, 3), torch.tensor(target))

def test_cross_entropy_ignore_index_is_not_out_of_range():
  x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
  y = [0, -100, 4]
  same(Tensor(x).cross_entropy(Tensor(y)), torch.nn.functional.cross_entropy(torch.tensor(x), torch.tensor(y)), rtol=1e-5)

def test_jit_replay_reports_out_of_range_index():
  w = Tensor.randn(10, 4).realize()
  @TinyJit
  def f(i: Tensor) -> Tensor: return w[i].sum().realize()
  for _ in range(3): f(Tensor([1, 2]))
  with pytest.raises(IndexError): f(Tensor([1, 12]))
  f(Tensor([3, 4]))

# ***** TinyJit never replays stale values silently *****
def test_jit_raises_when_a_python_float_it_read_changes():
  w = Tensor.ones(3).contiguous().realize()
  class Opt: pass
  opt = Opt(); opt.lr = 0.1
  @TinyJit
  def step(x: Tensor) -> Tensor:
    w.assign(w - opt.lr * x)
    return w.sum().realize()
  for _ in range(3): step(Tensor.ones(3))
  opt.lr = 0.01
  with pytest.raises(JitError, match="opt.lr"): step(Tensor.ones(3))

def test_jit_raises_when_training_mode_changes():
  @TinyJit
  def f(x: Tensor) -> Tensor: return x.dropout(0.5).realize()
  for _ in range(3): f(Tensor.ones(4))
  with Tensor.train():
    with pytest.raises(JitError, match="training"): f(Tensor.ones(4))

def test_jit_raises_for_numpy_data_made_inside_that_changes():
  rng = np.random.default_rng(0)
  @TinyJit
  def f(x: Tensor) -> Tensor: return (x + Tensor(rng.random(3).astype(np.float32))).realize()
  f(Tensor.ones(3))
  with pytest.raises(JitError, match="numpy"): f(Tensor.ones(3))

def test_jit_allows_constant_data_made_inside():
  @TinyJit
  def f(x: Tensor) -> Tensor: return (x + Tensor([1., 2., 3.]) + Tensor.rand(3) * 0).realize()
  for _ in range(4): assert f(Tensor.ones(3)).tolist() == [2., 3., 4.]

@pytest.mark.parametrize("make", [Tensor.zeros, Tensor.ones, lambda *s, **kw: Tensor.full(s, 2.0, **kw)])
def test_creation_keeps_requires_grad(make):
  a, b = make(2, 3, requires_grad=True), make(2, 3, requires_grad=True)
  assert a.requires_grad and b.requires_grad
  (a * 2 + b * 3).sum().backward()
  assert a.grad.tolist() == [[2.] * 3] * 2 and b.grad.tolist() == [[3.] * 3] * 2
