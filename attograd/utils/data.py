"""torch.utils.data's Dataset, IterableDataset, TensorDataset, Subset, random_split, samplers and DataLoader.

A DataLoader's background thread fetches and collates the next batches as numpy arrays (prefetch_factor of them ahead);
the Tensors are made in the calling thread, the one that runs kernels, so nothing in the graph is touched by two threads.
Shuffling draws each epoch's order from a seeded generator: the same seed gives the same batches."""
from __future__ import annotations
import bisect, queue, random, threading
from typing import Any, Callable, Generic, Iterable, Iterator, Sequence, TypeVar
from attograd.errors import ArgumentError
from attograd.tensor import Tensor

T = TypeVar("T")

class Dataset(Generic[T]):
  def __getitem__(self, index: int) -> T: raise NotImplementedError(f"{type(self).__name__} has no __getitem__")
  def __add__(self, other: Dataset) -> ConcatDataset: return ConcatDataset([self, other])

class IterableDataset(Dataset):
  """torch's: a stream of samples, read by iterating it rather than by index; a DataLoader batches them in order."""
  def __iter__(self) -> Iterator[Any]: raise NotImplementedError

class TensorDataset(Dataset):
  """Samples are the i-th rows of each tensor (attograd Tensors or numpy arrays, all of the same length)."""
  def __init__(self, *tensors: Any):
    if not tensors: raise ValueError("TensorDataset needs at least one tensor")
    if any(len(t) != len(tensors[0]) for t in tensors): raise ValueError(f"TensorDataset's tensors differ in length: {[len(t) for t in tensors]}")
    self.tensors = tensors
    self._arrays: list[Any] | None = None
  def __len__(self) -> int: return len(self.tensors[0])
  def _np(self) -> list[Any]:
    """numpy views of the tensors, read once: rows are then gathered by numpy, not by a kernel per batch."""
    if self._arrays is None: self._arrays = [t.numpy() if isinstance(t, Tensor) else t for t in self.tensors]
    return self._arrays
  def __getitem__(self, index: int) -> tuple:
    if not -len(self) <= index < len(self): raise IndexError(f"index {index} is out of range for {len(self)} samples")
    return tuple(a[index] for a in self._np())
  def __getitems__(self, indices: Sequence[int]) -> _Batch:
    """A whole batch at once (torch's protocol): each tensor's rows, stacked."""
    import numpy as np
    idx = np.asarray(indices, dtype=np.int64)
    if len(idx) and (idx.min() < -len(self) or idx.max() >= len(self)): raise IndexError(f"indices out of range for {len(self)} samples")
    return _Batch(tuple(a[idx] for a in self._np()))

class _Batch(tuple):
  """Rows already stacked by __getitems__: collate has nothing left to do but wrap them."""

class Subset(Dataset):
  def __init__(self, dataset: Dataset, indices: Sequence[int]): self.dataset, self.indices = dataset, list(indices)
  def __len__(self) -> int: return len(self.indices)
  def __getitem__(self, i: int) -> Any: return self.dataset[self.indices[i]]

class ConcatDataset(Dataset):
  def __init__(self, datasets: Iterable[Dataset]):
    self.datasets = list(datasets)
    self.cumulative_sizes, n = [], 0
    for d in self.datasets: n += len(d); self.cumulative_sizes.append(n)  # type: ignore[arg-type]
  def __len__(self) -> int: return self.cumulative_sizes[-1] if self.cumulative_sizes else 0
  def __getitem__(self, i: int) -> Any:
    if i < 0: i += len(self)
    if not 0 <= i < len(self): raise IndexError(f"index {i} is out of range for {len(self)} samples")
    d = bisect.bisect_right(self.cumulative_sizes, i)
    return self.datasets[d][i - (self.cumulative_sizes[d - 1] if d else 0)]

class Generator:
  """torch.Generator's seeding face, for DataLoader(generator=Generator().manual_seed(0)) and random_split: it holds
  a seed (the loader draws each epoch's order from it); it is not a source of tensor randomness (Tensor.manual_seed)."""
  def __init__(self, device: str = "cpu"): self._seed = random.getrandbits(63)
  def manual_seed(self, seed: int) -> Generator: self._seed = int(seed); return self
  def initial_seed(self) -> int: return self._seed
  def seed(self) -> int: self._seed = random.getrandbits(63); return self._seed

def _rng(generator: Any) -> random.Random:
  """A random.Random from an int seed, a random.Random, a numpy Generator, or None (seeded from Python's global random)."""
  if generator is None: return random.Random(random.getrandbits(64))
  if isinstance(generator, random.Random): return generator
  if isinstance(generator, int): return random.Random(generator)
  if hasattr(generator, "integers"): return random.Random(int(generator.integers(2 ** 63)))
  if hasattr(generator, "initial_seed"): return random.Random(int(generator.initial_seed()))  # a torch.Generator: its seed
  raise TypeError(f"generator must be an int seed, a random.Random, a numpy or torch Generator, not {type(generator).__name__}")

def random_split(dataset: Dataset, lengths: Sequence[int | float], generator: Any = None) -> list[Subset]:
  n = len(dataset)  # type: ignore[arg-type]
  if all(isinstance(x, float) for x in lengths) and abs(sum(lengths) - 1) < 1e-9:
    counts = [int(n * f) for f in lengths]
    for i in range(n - sum(counts)): counts[i % len(counts)] += 1  # torch gives the remainder round-robin
  else: counts = [int(x) for x in lengths]
  if sum(counts) != n: raise ValueError(f"lengths {list(lengths)} don't add up to the dataset's {n} samples")
  perm = list(range(n))
  _rng(generator).shuffle(perm)
  out, i = [], 0
  for c in counts: out.append(Subset(dataset, perm[i:i + c])); i += c
  return out

class Sampler:
  def __iter__(self) -> Iterator[int]: raise NotImplementedError
class SequentialSampler(Sampler):
  def __init__(self, data_source: Any): self.n = len(data_source)
  def __iter__(self) -> Iterator[int]: return iter(range(self.n))
  def __len__(self) -> int: return self.n
class RandomSampler(Sampler):
  """A new permutation each epoch, drawn from the generator (so a seed fixes every epoch's order)."""
  def __init__(self, data_source: Any, replacement: bool = False, num_samples: int | None = None, generator: Any = None):
    self.n, self.replacement, self.rng = len(data_source), replacement, _rng(generator)
    self.num_samples = self.n if num_samples is None else num_samples
  def __iter__(self) -> Iterator[int]:
    if self.replacement: return iter([self.rng.randrange(self.n) for _ in range(self.num_samples)])
    perm = list(range(self.n))
    self.rng.shuffle(perm)
    return iter(perm[:self.num_samples])
  def __len__(self) -> int: return self.num_samples
class BatchSampler(Sampler):
  def __init__(self, sampler: Iterable[int], batch_size: int, drop_last: bool):
    if not isinstance(batch_size, int) or batch_size <= 0: raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last
  def __iter__(self) -> Iterator[list[int]]:
    batch: list[int] = []
    for i in self.sampler:
      batch.append(i)
      if len(batch) == self.batch_size: yield batch; batch = []
    if batch and not self.drop_last: yield batch
  def __len__(self) -> int:
    n = len(self.sampler)  # type: ignore[arg-type]
    return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

def _stack(samples: list[Any]) -> Any:
  """The samples of a batch as numpy arrays and containers of them (what default_collate makes Tensors of)."""
  import numpy as np
  first = samples[0]
  if isinstance(first, _Batch): return tuple(first)
  if isinstance(first, Tensor): return Tensor.stack(*samples)
  if isinstance(first, dict): return {k: _stack([s[k] for s in samples]) for k in first}
  if isinstance(first, (tuple, list)):
    if any(len(s) != len(first) for s in samples): raise RuntimeError("each sample of a batch must have the same number of fields")
    return type(first)(_stack(list(f)) for f in zip(*samples)) if isinstance(first, tuple) else [_stack(list(f)) for f in zip(*samples)]
  if isinstance(first, (str, bytes)): return samples
  return np.stack([np.asarray(s) for s in samples])

def _to_tensors(x: Any) -> Any:
  if type(x).__module__ == "numpy" and hasattr(x, "dtype"): return Tensor(x)
  if isinstance(x, dict): return {k: _to_tensors(v) for k, v in x.items()}
  if isinstance(x, (tuple, list)) and not (x and isinstance(x[0], (str, bytes))): return type(x)(_to_tensors(v) for v in x)
  return x

def default_collate(batch: list[Any]) -> Any:
  """Samples -> a batch: arrays and numbers stacked into Tensors along a new first axis, tuples/dicts field by field."""
  return _to_tensors(_stack(batch))

_DONE = object()

class DataLoader:
  def __init__(self, dataset: Any, batch_size: int | None = 1, shuffle: bool = False, sampler: Iterable[int] | None = None,
               batch_sampler: Iterable[list[int]] | None = None, num_workers: int = 0, collate_fn: Callable[[list[Any]], Any] | None = None,
               pin_memory: bool = False, drop_last: bool = False, timeout: float = 0, worker_init_fn: Any = None, generator: Any = None,
               prefetch_factor: int | None = None, persistent_workers: bool = False):
    self.iterable = isinstance(dataset, IterableDataset)
    if self.iterable and (shuffle or sampler is not None or batch_sampler is not None):
      raise ArgumentError("DataLoader over an IterableDataset takes no shuffle, sampler or batch_sampler (the stream sets the order)")
    if sampler is not None and shuffle: raise ValueError("sampler and shuffle=True are exclusive")
    if batch_sampler is not None and (batch_size != 1 or shuffle or sampler is not None or drop_last):
      raise ValueError("batch_sampler is exclusive with batch_size, shuffle, sampler and drop_last")
    self.dataset, self.batch_size, self.drop_last, self.collate_fn = dataset, batch_size, drop_last, collate_fn
    if self.iterable: self.sampler, self.batch_sampler = None, None
    else:
      self.sampler = sampler if sampler is not None else RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
      self.batch_sampler = batch_sampler if batch_sampler is not None else \
        BatchSampler(self.sampler, batch_size, drop_last) if batch_size is not None else None
    self.prefetch = 2 if prefetch_factor is None else prefetch_factor  # batches made ahead by the background thread (0: none)
  def __len__(self) -> int:
    if self.iterable:  # as torch: from the dataset's own __len__, if it has one
      n = len(self.dataset)
      return n if self.batch_size is None else n // self.batch_size if self.drop_last else -(-n // self.batch_size)
    return len(self.batch_sampler if self.batch_sampler is not None else self.sampler)  # type: ignore[arg-type]
  def _stream(self) -> Iterator[Any]:
    """An IterableDataset's samples in batches of batch_size (each a list), or one by one with batch_size=None."""
    if self.batch_size is None: yield from iter(self.dataset); return
    batch: list[Any] = []
    for sample in self.dataset:
      batch.append(sample)
      if len(batch) == self.batch_size: yield batch; batch = []
    if batch and not self.drop_last: yield batch
  def _fetch(self, indices: Any) -> Any:
    """One batch, before it becomes Tensors: numpy arrays when collated here (or the samples, for a collate_fn)."""
    if self.iterable:  # the samples themselves, from _stream
      if self.collate_fn is not None: return indices
      return _stack(indices) if self.batch_size is not None else indices
    if self.batch_sampler is None: samples = self.dataset[indices]  # batch_size=None: single samples
    elif hasattr(self.dataset, "__getitems__") and self.collate_fn is None: samples = [self.dataset.__getitems__(indices)]
    else: samples = [self.dataset[i] for i in indices]
    if self.collate_fn is not None: return samples
    return _stack(samples) if self.batch_sampler is not None else samples
  def _finish(self, fetched: Any) -> Any:
    return self.collate_fn(fetched) if self.collate_fn is not None else _to_tensors(fetched)
  def __iter__(self) -> Iterator[Any]:
    order = self._stream() if self.iterable else iter(self.batch_sampler if self.batch_sampler is not None else self.sampler)
    if self.prefetch <= 0:
      for idx in order: yield self._finish(self._fetch(idx))
      return
    q: queue.Queue = queue.Queue(maxsize=self.prefetch)
    stop = threading.Event()
    def put(x: Any) -> bool:
      while not stop.is_set():  # (a timeout, so that a consumer that stopped early never leaves this thread blocked)
        try: q.put(x, timeout=0.1); return True
        except queue.Full: continue
      return False
    def produce() -> None:
      try:
        for idx in order:
          if not put((True, self._fetch(idx))): return
        put((True, _DONE))
      except BaseException as e: put((False, e))  # re-raised in the consumer, at the batch that failed
    worker = threading.Thread(target=produce, daemon=True, name="attograd-DataLoader")
    worker.start()
    try:
      while True:
        ok, item = q.get()
        if not ok: raise item
        if item is _DONE: return
        yield self._finish(item)
    finally:  # (also when the loop over the loader stops early)
      stop.set()
      worker.join()
