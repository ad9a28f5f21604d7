"""attograd.utils.data against torch.utils.data: the same batches in the same order (sequential), every sample once
per epoch (shuffled, reproducible from a seed), drop_last, collate_fn, errors raised where they happen; helpers."""
import numpy as np
import pytest
import torch
import torch.utils.data as tud
from attograd import Tensor
from attograd.utils import data

X = np.arange(46 * 3, dtype=np.float32).reshape(46, 3)
Y = np.arange(46) % 5

@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("prefetch", [None, 0])
@pytest.mark.parametrize("as_tensor", [False, True])
def test_sequential_batches_match_torch(drop_last, prefetch, as_tensor):
  ds = data.TensorDataset(Tensor(X), Tensor(Y)) if as_tensor else data.TensorDataset(X, Y)
  dl = data.DataLoader(ds, batch_size=8, drop_last=drop_last, prefetch_factor=prefetch)
  tdl = tud.DataLoader(tud.TensorDataset(torch.tensor(X), torch.tensor(Y)), batch_size=8, drop_last=drop_last)
  assert len(dl) == len(tdl) == (5 if drop_last else 6)
  got, want = list(dl), list(tdl)
  assert len(got) == len(want)
  for (x, y), (tx, ty) in zip(got, want):
    assert isinstance(x, Tensor) and x.shape == tuple(tx.shape)
    np.testing.assert_array_equal(x.numpy(), tx.numpy()); np.testing.assert_array_equal(y.numpy(), ty.numpy())

def test_shuffle_is_a_permutation_reproducible_from_a_seed():
  ds = data.TensorDataset(X, Y)
  epochs = lambda seed: [[x.numpy()[:, 0].tolist() for x, _ in data.DataLoader(ds, batch_size=10, shuffle=True, generator=seed)] for _ in range(1)]
  a, b, c = epochs(1), epochs(1), epochs(2)
  assert a == b and a != c
  flat = sorted(v for batch in a[0] for v in batch)
  assert flat == X[:, 0].tolist()  # every sample exactly once
  dl = data.DataLoader(ds, batch_size=46, shuffle=True, generator=3)
  e1, e2 = next(iter(dl))[0].numpy(), next(iter(dl))[0].numpy()
  assert not np.array_equal(e1, e2), "each epoch draws a new order"

def test_custom_dataset_collate_fn_and_dict_samples():
  class Squares(data.Dataset):
    def __len__(self): return 7
    def __getitem__(self, i): return {"x": np.array([i, i * i], np.float32), "label": i % 2}
  b = list(data.DataLoader(Squares(), batch_size=3))
  assert [x["x"].shape for x in b] == [(3, 2), (3, 2), (1, 2)] and b[1]["label"].tolist() == [1, 0, 1]
  tb = list(tud.DataLoader(Squares(), batch_size=3))
  np.testing.assert_array_equal(b[2]["x"].numpy(), tb[2]["x"].numpy())
  c = list(data.DataLoader(Squares(), batch_size=4, collate_fn=lambda samples: len(samples)))
  assert c == [4, 3]
  assert len(list(data.DataLoader(Squares(), batch_size=None))) == 7

def test_errors_surface_and_early_stop_does_not_hang():
  class Bad(data.Dataset):
    def __len__(self): return 10
    def __getitem__(self, i):
      if i == 6: raise KeyError("sample 6 is broken")
      return np.float32(i)
  it = iter(data.DataLoader(Bad(), batch_size=2))
  assert next(it).tolist() == [0.0, 1.0]
  with pytest.raises(KeyError, match="broken"): list(it)
  for i, _ in enumerate(data.DataLoader(data.TensorDataset(X), batch_size=1, prefetch_factor=1)):
    if i == 2: break  # the background thread must end, not block on a full queue
  with pytest.raises(ValueError): data.TensorDataset(X, Y[:3])
  with pytest.raises(ValueError): data.DataLoader(data.TensorDataset(X), batch_size=0)

def test_subset_concat_random_split():
  ds = data.TensorDataset(X, Y)
  parts = data.random_split(ds, [0.5, 0.3, 0.2], generator=0)
  assert [len(p) for p in parts] == [len(p) for p in tud.random_split(range(46), [0.5, 0.3, 0.2])] == [24, 13, 9]
  seen = sorted(int(p[i][0][0]) for p in parts for i in range(len(p)))
  assert seen == X[:, 0].astype(int).tolist()
  cat = parts[0] + parts[1]
  assert len(cat) == 37 and cat[24][0].tolist() == parts[1][0][0].tolist() and cat[-1][0].tolist() == parts[1][12][0].tolist()
  with pytest.raises(ValueError): data.random_split(ds, [10, 10])

def test_helpers_surface(capsys):
  from attograd.helpers import trange, tqdm, colored, getenv, Timing, GlobalCounters, Context, _Bar
  assert sum(trange(5)) == 10 and list(tqdm([1, 2])) == [1, 2]
  bar = _Bar(range(3), desc="x")  # the fallback without tqdm
  assert list(bar) == [0, 1, 2] and bar.n == 3
  bar.set_description("loss 1.0"); bar.set_postfix(acc=0.5)
  with Timing("took "): pass
  assert capsys.readouterr().out.startswith("took ")
  assert colored("a", None) == "a" and getenv("ATTOGRAD_SURELY_UNSET", 3) == 3 and GlobalCounters.kernel_count >= 0
  with Context(DEBUG=0): pass

def test_train_decorator_and_mean_of_bool():
  @Tensor.train()
  def f(): return Tensor.training
  assert Tensor.training is False and f() is True and Tensor.training is False
  @Tensor.test()
  def g(): return Tensor.training
  with Tensor.train():
    assert g() is False and Tensor.training is True
    with Tensor.test(): assert Tensor.training is False
    assert Tensor.training is True
  mode = Tensor.train()
  assert Tensor.training is False  # made but not entered: nothing changes (as in tinygrad)
  with mode:
    with mode: assert Tensor.training is True  # re-entrant
  assert Tensor.training is False
  pred, y = Tensor([1, 2, 3, 4]), Tensor([1, 0, 3, 0])
  acc = (pred == y).mean()
  assert acc.dtype.name.startswith("float") and acc.item() == 0.5
  assert (pred == y).mean(0).item() == 0.5
  # the same rule for the rest torch refuses and tinygrad defines: ints' mean and var are floats, -bool is logical_not
  m = Tensor([1, 2, 4]).mean()
  assert m.dtype.name == "float32" and abs(m.item() - 7 / 3) < 1e-6 and abs(Tensor([1, 2, 4]).var().item() - 7 / 3) < 1e-6
  assert (-Tensor([True, False])).tolist() == [False, True]

def test_torch_generator_seeds_the_order():
  ds = data.TensorDataset(X, Y)
  order = lambda g: next(iter(data.DataLoader(ds, batch_size=46, shuffle=True, generator=g)))[1].tolist()
  assert order(torch.Generator().manual_seed(5)) == order(torch.Generator().manual_seed(5)) != order(torch.Generator().manual_seed(6))

@pytest.mark.parametrize("batch_size,drop_last,prefetch", [(4, False, None), (4, True, 0), (None, False, None)])
def test_iterable_dataset_matches_torch(batch_size, drop_last, prefetch):
  """An IterableDataset (a stream, no indices) is batched in its order, as torch's DataLoader does, len() from its own."""
  def stream(base):
    class Stream(base):
      def __iter__(self):
        for i in range(10): yield np.full(2, i, np.float32), i
      def __len__(self): return 10
    return Stream()
  ours = data.DataLoader(stream(data.IterableDataset), batch_size=batch_size, drop_last=drop_last, prefetch_factor=prefetch)
  theirs = tud.DataLoader(stream(tud.IterableDataset), batch_size=batch_size, drop_last=drop_last)
  assert len(ours) == len(theirs)
  got, want = list(ours), list(theirs)
  assert len(got) == len(want)
  for (ox, oy), (tx, ty) in zip(got, want): np.testing.assert_array_equal(np.asarray(ox.numpy() if hasattr(ox, "numpy") else ox), tx.numpy()); assert np.asarray(oy.tolist() if hasattr(oy, "tolist") else oy).tolist() == np.asarray(ty).tolist()
  with pytest.raises(ValueError): data.DataLoader(stream(data.IterableDataset), shuffle=True)
