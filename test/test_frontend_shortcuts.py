"""The front end's shortcuts build the very nodes their general paths build (tensor.py: basic indexing of static sizes,
a float's square and mean, stack's pieces, cat's sum): the same graph, so scheduling and autograd can't tell."""
import numpy as np
import pytest
from attograd import Tensor, dtypes
from attograd.uop.ops import Ops

x = Tensor(np.arange(4 * 6 * 8, dtype=np.float32).reshape(4, 6, 8))

INDICES = [(slice(None), -1), (3, 0, 0), (Ellipsis, slice(2, 5)), (None, slice(1, 3), Ellipsis, None), Ellipsis, slice(None),
           slice(5, 2), (1, None, slice(None), slice(-8, None)), -4, (slice(1, None), 2), (0, Ellipsis, 0)]

@pytest.mark.parametrize("index", INDICES, ids=[str(i) for i in INDICES])
def test_static_index_is_the_general_path(monkeypatch, index):
  fast = x[index]
  monkeypatch.setattr(Tensor, "_static_index", lambda self, idx: None)
  general = x[index]
  assert fast.uop is general.uop
  assert (fast is x) == (general is x)
  np.testing.assert_array_equal(fast.numpy(), x.numpy()[index])

def test_static_index_is_a_view():
  base = Tensor.zeros(3, 4).contiguous().realize()
  v = base[1, 1:3]
  base.assign(Tensor.ones(3, 4))
  assert v.tolist() == [1.0, 1.0]

@pytest.mark.parametrize("bad", [(4,), (0, 0, 0, 0), (Ellipsis, Ellipsis), (0, 6)])
def test_static_index_errors(bad):
  with pytest.raises(IndexError): x[bad]

def test_square_mean_stack_cat_nodes():
  y = x * 2
  assert y.square().uop is (y * y)._with_derivative(y, y * 2).uop
  assert y.mean(-1).uop is (y.sum(-1) / 8).uop
  assert y.mean((0, 2), keepdim=True).uop is (y.sum((0, 2), keepdim=True) / 32).uop
  parts = [y.sum(), y.amax(), y.mean()]
  pieces = [p.unsqueeze(0) for p in parts]
  want = pieces[0].pad(((0, 2),)) + pieces[1].pad(((1, 1),)) + pieces[2].pad(((2, 0),))
  s = Tensor.stack(*parts).uop  # (replayed: a CALL whose graph is the cat's nodes)
  assert s.op is Ops.CALL and s.arg.expand(s.src) is want.uop
  b = x > 3
  assert b.cat(b).uop is (b.pad(((0, 4), (0, 0), (0, 0))) | b.pad(((4, 0), (0, 0), (0, 0)))).uop
  assert b.cat(b).dtype == dtypes.bool
