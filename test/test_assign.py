"""assign writes into a tensor's memory; results computed before stay as they were."""
import numpy as np
import pytest
from attograd import Tensor, GlobalCounters
from helpers import DEVICES

@pytest.mark.parametrize("device", DEVICES)
def test_assign_reading_itself_elsewhere_is_not_corrupted(device):
  a = Tensor([[1., 2., 3.], [4., 5., 6.]], device=device).realize()
  a.assign(a.flip(0)).realize()
  assert a.tolist() == [[4., 5., 6.], [1., 2., 3.]]
  a.assign(a.T.reshape(2, 3)).realize()
  assert a.tolist() == [[4., 1., 5.], [2., 6., 3.]]

def test_elementwise_assign_is_one_kernel():
  a = Tensor.rand(16, 16).realize()
  expected = a.numpy() * 2 + 1
  GlobalCounters.reset()
  a.assign(a * 2 + 1).realize()
  assert GlobalCounters.kernel_count == 1
  np.testing.assert_allclose(a.numpy(), expected, rtol=1e-6)

def test_results_from_before_an_assign_are_not_reused():
  a = Tensor([1., 2., 3.]).realize()
  before = (a + 1).tolist()
  a.assign(a * 10).realize()
  assert (a + 1).tolist() == [11., 21., 31.] and before == [2., 3., 4.]
  a += 1
  assert a.tolist() == [11., 21., 31.]

def test_assign_broadcasts_and_casts_like_copy_():
  a = Tensor.zeros(2, 3).realize()
  a.assign(Tensor([1, 2, 3]))
  assert a.tolist() == [[1., 2., 3.], [1., 2., 3.]]
  with pytest.raises(ValueError, match=r"\(4,\)"): a.assign(Tensor([1., 2., 3., 4.]))

def _loop_elements(ast) -> int:
  """How many elements a kernel's output loops visit (the product of its RANGEs' sizes)."""
  from attograd.uop.ops import Ops
  n = 1
  for u in ast.toposort:
    if u.op is Ops.RANGE: n *= u.src[0].arg
  return n

def test_write_to_a_slice_moves_only_the_slice():
  # a KV cache's write of one position: the kernel stores one row (after a copy of the old values into new memory,
  # which a TinyJit replay drops and writes in place), not a select over the whole buffer
  from attograd import TinyJit, Variable
  from attograd.uop.ops import Ops
  cache = Tensor.arange(16 * 2 * 4).float().reshape(16, 2, 4).contiguous().realize()
  lazy_old = cache[2:4] * 1  # computed from the old values: keeps them
  cache[Variable("p", 0, 15).bind(3):Variable("p", 0, 15).bind(3) + 1].assign(Tensor.ones(1, 2, 4).contiguous())
  want = np.arange(128, dtype=np.float32).reshape(16, 2, 4); old = want[2:4].copy(); want[3] = 1
  np.testing.assert_equal(cache.numpy(), want)
  np.testing.assert_equal(lazy_old.numpy(), old)
  cache = Tensor.zeros(16, 2, 4).contiguous().realize()
  @TinyJit
  def step(x: Tensor, p, c: Tensor) -> Tensor:
    c[p:p + 1].assign(x.contiguous())
    return c[:p + 1].sum(0).realize()
  for i in range(5):
    out = step(Tensor.full((1, 2, 4), float(i + 1)).contiguous().realize(), Variable("p", 0, 15).bind(i), cache)
    np.testing.assert_equal(out.numpy(), np.full((2, 4), sum(range(1, i + 2)), np.float32))
  np.testing.assert_equal(cache.numpy()[:, 0, 0], [1, 2, 3, 4, 5] + [0] * 11)
  items = step.replay.plan.items
  assert not any(ei.ast.op is Ops.COPY for ei in items)
  writer = next(ei for ei in items if ei.bufs[0].size == 128)  # the one that writes the cache
  assert _loop_elements(writer.ast) == 8  # one row of (2, 4), not the 128 of the cache
