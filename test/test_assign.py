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
