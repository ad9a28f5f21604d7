"""Indexing with tensors: advanced __getitem__, __setitem__, gather, scatter, masked_fill.

Everything here is built from differentiable primitives (compare, where, sum/max, movement ops), so
gradients come for free. A lookup `x[idx]` compares the index against arange(size) of the indexed axis
and sums the pick in x's own dtype (`_pick`); the scheduler reads that sum as a gather, one load per output
element, with no loop over n and no one-hot buffer.

Out-of-range tensor indices: torch raises, and so does attograd. A realized index tensor (not huge) is read back
and checked at the call (a sync; not inside a TinyJit call, whose first call checks as its capture does); any other
one gets a check computed with the next realize (index_checks: a two-number report, how many entries are out of range
and one of them), read right after it runs, and the realize raises IndexError (TinyJit reads the reports after every
replay). No out-of-range lookup returns a value unreported.
Python-int indices are always checked at the call.

A bool mask needs the number of True elements to know the output shape (torch's dynamic shape), so
indexing with a bool mask realizes the mask and reads it back: it syncs."""
from __future__ import annotations
from typing import Any
from attograd.errors import ArgumentError, IndexOutOfRange, UnsupportedDtype
from attograd.dtype import dtypes
from attograd.uop.ops import UOp, Ops, GroupOp
from attograd.helpers import prod, broadcast_shape
from attograd.schedule.schedule import is_view_of_buffer
from attograd.engine.realize import in_jit_call

_CHECK_LIMIT = 1 << 16  # realized index tensors up to this many elements get their values checked at the call

# lazy index checks the next realize computes and reads: (report, what was indexed, its size); see the module doc
index_checks: list[tuple[Any, str, int]] = []

def _is_tensor(x: Any) -> bool: return hasattr(x, "uop") and hasattr(x, "realize")

def _axis(dim: int, ndim: int, name: str = "dim") -> int:
  if not -max(ndim, 1) <= dim < max(ndim, 1): raise IndexError(f"{name} {dim} is out of range for a tensor of {ndim} dimension(s)")
  return dim % max(ndim, 1)

def full_index(idx: list[Any], ndim: int) -> list[Any]:
  """An index (ints, slices, None, one Ellipsis, tensors) checked and filled with slice(None), at its Ellipsis or its
  end, to address all ndim axes (a bool mask of k dims addresses k). A Python bool is refused: it isn't an int index."""
  for i in idx:
    if not (i is None or i is Ellipsis or isinstance(i, (int, slice)) or _is_tensor(i)) or isinstance(i, bool):
      raise TypeError(f"invalid index {i!r} of type {type(i).__name__}")
    if _is_tensor(i) and i.dtype != dtypes.bool and not dtypes.is_int(i.dtype):
      raise IndexError(f"tensors used as indices must be integer or bool, got {i.dtype}")
  if sum(i is Ellipsis for i in idx) > 1: raise IndexError("an index can only have a single ellipsis")
  consumed = sum(i.ndim if _is_tensor(i) and i.dtype == dtypes.bool else 0 if i is None or i is Ellipsis else 1 for i in idx)
  if consumed > ndim: raise IndexError(f"too many indices ({consumed}) for a tensor of {ndim} dimension(s)")
  e = next((p for p, i in enumerate(idx) if i is Ellipsis), len(idx))
  return idx[:e] + [slice(None)] * (ndim - consumed) + idx[e + 1:]

def _known_range(u: UOp) -> tuple[int, int] | None:
  """(min, max) an index computed from arange and constants can take, from the symbolic rules' bounds of the same
  arithmetic on one element (an arange is a variable over its range; movement ops don't change values); None when
  it depends on data."""
  if (s := _as_scalar(u, {})) is None: return None
  s = s.simplify()
  return int(s.vmin), int(s.vmax)

def _as_scalar(n: UOp, memo: dict[UOp, UOp | None]) -> UOp | None:
  """_known_range's one element of n, or None. A module function with its memo passed, not a closure calling itself:
  that one held itself through its cell, a reference cycle only the cycle collector freed (every embedding's index
  check, each training step)."""
  if n in memo: return memo[n]
  if n.op is Ops.IOTA and isinstance(n.arg, int): r = UOp.variable(f"iota{n.arg}", 0, max(n.arg - 1, 0), n.dtype)
  elif n.op is Ops.CONST: r = n
  elif n.op in GroupOp.Movement and n.op is not Ops.PAD: r = _as_scalar(n.src[0], memo)
  elif n.op in GroupOp.ALU or n.op is Ops.CAST:
    srcs = [_as_scalar(x, memo) for x in n.src]
    r = None if any(x is None for x in srcs) else n.replace(src=tuple(srcs))  # type: ignore[arg-type]
  else: r = None
  memo[n] = r
  return r

def _host_values(t: Any) -> Any:
  """t's values as a numpy array, read-only; integers read in place when they are a whole buffer in host memory
  (Tensor._host_bytes): an index check reads a batch of indices every training step"""
  import numpy as np
  if not dtypes.is_int(t.dtype): return t.numpy()
  return np.frombuffer(t._host_bytes(), dtype=np.dtype(t.dtype.fmt)).reshape(t._value_shape())

_SCATTER_REDUCE = {"add": "sum", "multiply": "prod"}  # scatter(reduce=)'s names -> scatter_reduce's

class IndexingOps:
  __slots__ = ()  # Tensor defines the slots

  # ***** helpers *****
  def _check_index_values(self, idx: Any, lo: int, hi: int, what: str, ignore: int | None = None) -> None:
    """Values of idx outside [lo, hi) (other than ignore) raise IndexError: now if idx is realized (and not huge), else at
    the next realize."""
    if idx.numel() == 0: return
    size = hi if lo == 0 else -lo
    # (not inside a TinyJit call: a replay must check new values, and its first call computes the check as the capture
    # does, so the two build the same graph)
    if idx.numel() <= _CHECK_LIMIT and is_view_of_buffer(idx.uop) and not in_jit_call():
      vals = _host_values(idx)
      out = (vals < lo) | (vals >= hi)
      bad = vals[out if ignore is None else out & (vals != ignore)]
      if bad.size: raise IndexOutOfRange(f"index {int(bad.flat[0])} is out of bounds for {what} with size {size}")
      return
    # (a target's ignored entries count as lo: a batch of class indices read as it is, when it is in memory, above; a
    # lazy one checked by the kernels)
    if ignore is not None: idx = idx.ne(ignore).where(idx, lo)
    if (r := _known_range(idx.uop)) is not None and lo <= r[0] and r[1] < hi: return  # in range by construction
    i = idx.cast(dtypes.int64)
    bad = (i < lo) | (i >= hi)
    report = bad.sum().reshape(1).cat(bad.where(i, dtypes.min(dtypes.int64)).max().reshape(1)).contiguous()
    index_checks.append((report, what, size))

  def _pick(self, mask: Any, axis: int) -> Any:
    """The element of self where mask holds along axis (at most once; 0 where nowhere), in self's own dtype. A sum
    with no widening cast between it and its where is what the scheduler reads as a gather: a load of the one element
    each output needs, not a loop over the table (a uint8 image set indexed by a batch: 40 s -> a copy). Bools go
    through uint8, which a sum can hold."""
    if self.dtype == dtypes.bool: return self.cast(dtypes.uint8)._pick(mask, axis).cast(dtypes.bool)
    return mask.where(self, self.zeros_like()).sum(axis, dtype=self.dtype)

  def _as_index(self, i: Any) -> Any:
    """Python lists/tuples and numpy arrays used as indices become Tensors on self's device."""
    if _is_tensor(i): return i
    if isinstance(i, (list, tuple)) or type(i).__module__ == "numpy":  # a tuple inside an index is a sequence too, as in torch
      t = type(self)(i, device=self.device)
      if t.dtype != dtypes.bool and not dtypes.is_int(t.dtype): raise IndexError(f"tensors used as indices must be integer or bool, got {t.dtype}")
      return t
    return i

  # ***** __getitem__ with tensors *****
  def _tensor_getitem(self, index: Any) -> Any:
    """Advanced indexing (numpy/torch rules): integer tensors broadcast together, bool masks, mixed
    with ints, slices, None and Ellipsis."""
    idx = full_index([self._as_index(i) for i in (list(index) if isinstance(index, tuple) else [index])], self.ndim)
    # a bool mask of k dims stands for k integer index tensors (its nonzero positions)
    expanded, dim = [], 0
    for i in idx:
      if _is_tensor(i) and i.dtype == dtypes.bool:
        if i.ndim == 0: raise IndexError("a 0-d bool tensor as an index is not supported")
        if i.shape != self.shape[dim:dim + i.ndim]:
          raise IndexError(f"the shape of the mask {i.shape} at index {dim} does not match the shape of the indexed tensor {self.shape}")
        nz = i.numpy().nonzero()  # syncs: the output size depends on the mask's values
        expanded += [type(self)(n.astype("int64"), device=self.device) for n in nz]
        dim += i.ndim
      else:
        expanded.append(i)
        if i is not None: dim += 1
    idx = expanded
    # basic part first: tensor positions keep their axis (slice(None)); ints and slices apply now
    has_tensor = any(_is_tensor(i) for i in idx)
    if not has_tensor: return self[tuple(idx)]
    # as in torch (unlike numpy) ints apply first and don't count: tensors separated only by ints are adjacent
    no_ints = [i for i in idx if not isinstance(i, int)]
    adv_pos = [p for p, i in enumerate(no_ints) if _is_tensor(i)]
    adjacent = adv_pos == list(range(adv_pos[0], adv_pos[-1] + 1))
    t = self[tuple(slice(None) if _is_tensor(i) else i for i in idx)]
    # which axes of t the index tensors address, and where the result's broadcast dims go
    tdims, tensors, out_dim, first = [], [], 0, None
    src_dim = 0
    for p, i in enumerate(idx):
      if _is_tensor(i):
        if first is None: first = out_dim
        size = self.shape[src_dim]
        self._check_index_values(i, -size, size, f"dimension {src_dim}")
        tdims.append(out_dim); tensors.append((i, size))
      if i is None or isinstance(i, slice) or _is_tensor(i): out_dim += 1
      if i is not None: src_dim += 1
    return t._take_along(tdims, tensors, first if adjacent else 0)

  def _take_along(self, tdims: list[int], tensors: list[tuple[Any, int]], insert_at: int) -> Any:
    """self's axes tdims (sizes n_j) are looked up by the index tensors (broadcast together); the
    broadcast dims replace those axes, at position insert_at among the remaining axes."""
    sizes = [n for _, n in tensors]
    N = prod(sizes)
    B = _broadcast_shapes(*(i.shape for i, _ in tensors))
    flat = self._flat_index(tensors, B)
    others = [d for d in range(self.ndim) if d not in tdims]
    rest = tuple(self.shape[d] for d in others)
    x = self.permute(others + tdims).reshape(rest + (N,))
    x = x.reshape(rest[:insert_at] + (1,) * len(B) + rest[insert_at:] + (N,))
    mask = flat.unsqueeze(-1) == type(self).arange(N, device=self.device, dtype=flat.dtype)
    mask = mask.reshape((1,) * insert_at + B + (1,) * (len(rest) - insert_at) + (N,))
    return x._pick(mask, -1)

  def _flat_index(self, tensors: list[tuple[Any, int]], B: tuple[int, ...]) -> Any:
    """One flat (row-major) position per broadcast element; negative entries wrap, out-of-range -> -1."""
    N = prod(n for _, n in tensors)
    dt = dtypes.int32 if N < 2 ** 31 else dtypes.int64
    flat, valid = None, None
    for i, n in tensors:
      i = i.cast(dt) if i.dtype != dtypes.int64 or dt == dtypes.int64 else i
      w = (i < 0).where(i + n, i)
      ok = (w >= 0) & (w < n)
      w = w.cast(dt)._broadcast_to(B)
      flat = w if flat is None else flat * n + w
      valid = ok if valid is None else valid & ok
    return valid._broadcast_to(B).where(flat, -1).cast(dt)

  # ***** __setitem__ *****
  def __setitem__(self, index: Any, value: Any) -> None:
    """x[index] = value for basic and advanced indices: value is cast to x's dtype and broadcast to
    x[index]'s shape; the write goes through assign (lazy, lands at the next realize). With repeated
    advanced indices the last write wins. Basic indices (ints, slices, None, Ellipsis) undo their
    movement ops on the value (pads, no compares); advanced ones compare every element of x with every
    written position (numel(x) * numel(x[index]) work), so they suit small writes."""
    T = type(self)
    if any(isinstance(x, UOp) for i in (index if isinstance(index, tuple) else (index,)) for x in
           ((i.start, i.stop, i.step) if isinstance(i, slice) else (i,))):
      raise TypeError(f"setitem at a Variable position ({index}) is not supported: write with a mask, e.g. "
                      "x.assign((Tensor.arange(n) == v).reshape(n, 1).where(value, x))")
    v = value if _is_tensor(value) else T(value, device=self.device, dtype=self.dtype)
    if v.device != self.device: raise ArgumentError(f"setitem from device {v.device} into a tensor on {self.device}")
    target_shape = self[index].shape
    v = v.cast(self.dtype)
    if v.ndim > len(target_shape) and all(s == 1 for s in v.shape[:v.ndim - len(target_shape)]):  # torch drops leading 1s
      v = v.reshape(v.shape[v.ndim - len(target_shape):])
    try: v = v._broadcast_to(target_shape)
    except ValueError: raise ArgumentError(f"shape mismatch: value of shape {v.shape} cannot be broadcast to indexing result of shape {target_shape}") from None
    idx = list(index) if isinstance(index, tuple) else [index]
    if all(i is None or i is Ellipsis or (isinstance(i, (int, slice)) and not isinstance(i, bool)) for i in idx):
      new = self._basic_setitem(idx, v)
    else:
      # general path: every element finds the last index position that writes it
      pos = T.arange(self.numel(), device=self.device, dtype=dtypes.int32).reshape(self.shape)[index].flatten()
      M = pos.numel()
      hit = pos.unsqueeze(0) == T.arange(self.numel(), device=self.device, dtype=dtypes.int32).unsqueeze(1)  # (numel, M)
      last = hit.where(T.arange(1, M + 1, device=self.device, dtype=dtypes.int32).unsqueeze(0), 0).amax(1) if M else \
        T.zeros(self.numel(), dtype=dtypes.int32, device=self.device)
      vals = v.flatten()._take_along([0], [(last - 1, M)], 0) if M else self.flatten()
      new = (last > 0).where(vals, self.flatten()).reshape(self.shape)
    self.assign(new)

  def _basic_setitem(self, idx: list[Any], v: Any) -> Any:
    """Undo the basic index's movement ops on v (and on an all-True mask): pad back to self's shape."""
    T = type(self)
    n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
    if any(i is Ellipsis for i in idx):
      e = next(p for p, i in enumerate(idx) if i is Ellipsis)
      idx = idx[:e] + [slice(None)] * (self.ndim - n_real) + idx[e + 1:]
    else: idx = idx + [slice(None)] * (self.ndim - n_real)
    # v's shape without None dims, with size-1 dims for ints
    shape, vd = [], 0
    for i in idx:
      if i is None: vd += 1; continue
      if isinstance(i, int): shape.append(1)
      else: shape.append(v.shape[vd]); vd += 1
    v = v.reshape(tuple(shape))
    m = T.full(v.shape, True, dtype=dtypes.bool, device=self.device)
    real = [i for i in idx if i is not None]
    flips, steps, pads = [], [], []
    for d, (i, size) in enumerate(zip(real, self.shape)):
      if isinstance(i, int): i = slice(i % size, i % size + 1)
      start, stop, step = i.indices(size)
      n = len(range(start, stop, step))
      lo = start if step > 0 else (start + (n - 1) * step if n else 0)
      if step < 0: flips.append(d)
      steps.append(abs(step))
      span = (n - 1) * abs(step) + 1 if n else 0
      pads.append((lo if n else 0, size - (lo if n else 0) - span))
    def undo(t: Any) -> Any:
      t = t.flip(*flips)
      if any(s != 1 for s in steps):
        t = t.reshape(tuple(x for n, s in zip(t.shape, steps) for x in (n, 1)))
        t = t.pad(tuple(p for s in steps for p in ((0, 0), (0, s - 1))))
        t = t.reshape(tuple(n * s for n, s in zip(v.shape, steps)))
        t = t.shrink(tuple((0, (n - 1) * s + 1 if n else 0) for n, s in zip(v.shape, steps)))
      return t.pad(tuple(pads))
    return undo(m).where(undo(v), self)

  # ***** gather / scatter *****
  def _check_dim_index(self, dim: int, index: Any, name: str) -> int:
    if not _is_tensor(index) or not dtypes.is_int(index.dtype):
      raise UnsupportedDtype(f"{name}: index must be an integer tensor, got {getattr(index, 'dtype', type(index).__name__)}")
    d = _axis(dim, self.ndim)
    if index.ndim != max(self.ndim, 1) and not (index.ndim == 0 and self.ndim == 0) and not (index.ndim <= 1 and self.ndim <= 1):
      raise ArgumentError(f"{name}: index has {index.ndim} dimension(s) but the tensor has {self.ndim}; they must match")
    return d

  def gather(self, dim: int, index: Any) -> Any:
    """out[i][j] = self[index[i][j]][j] (dim=0), torch.gather. index has self's number of dims and is
    no bigger than self on the other axes; the output has index's shape."""
    d = self._check_dim_index(dim, index, "gather")
    x = self.reshape(self.shape or (1,))
    ix = index.reshape(index.shape or (1,))
    for a, (si, sx) in enumerate(zip(ix.shape, x.shape)):
      if a != d and si > sx: raise ArgumentError(f"gather: index {tuple(index.shape)} is bigger than the tensor {self.shape} at dimension {a}")
    self._check_index_values(index, 0, x.shape[d], f"dimension {d}")
    return self._gather(d, index)

  def _gather(self, d: int, index: Any) -> Any:
    """gather without the checks, for indices in range by construction (a sort's permutations)."""
    x = self.reshape(self.shape or (1,))
    ix = index.reshape(index.shape or (1,))
    n = x.shape[d]
    x = x.shrink(tuple((0, n) if a == d else (0, s) for a, s in enumerate(ix.shape)))  # (.., n at d, ..)
    # (.., 1 at d, .., n last): n moves to the end, the axes after it keep their order (a transpose swapped n with the
    # last axis, which reordered the axes between them when d had two or more axes after it)
    x = x.unsqueeze(d)
    x = x.permute(*(a for a in range(x.ndim) if a != d + 1), d + 1)
    mask = ix.unsqueeze(-1) == type(self).arange(n, device=self.device, dtype=ix.dtype)
    out = x._pick(mask, -1)
    return out.reshape(index.shape)

  def _scatter_mask(self, d: int, index: Any, src: Any, name: str) -> tuple[Any, Any, Any]:
    """The (.., n at d, J at d+1, ..) match of self positions vs. index entries, and src (unsqueezed
    likewise), both on index's extent of the other axes."""
    if src.ndim != index.ndim: raise ArgumentError(f"{name}: src has {src.ndim} dimension(s) but index has {index.ndim}")
    for a, (si, ss, sx) in enumerate(zip(index.shape, src.shape, self.shape)):
      if si > ss: raise ArgumentError(f"{name}: index {tuple(index.shape)} is bigger than src {tuple(src.shape)} at dimension {a}")
      if a != d and si > sx: raise ArgumentError(f"{name}: index {tuple(index.shape)} is bigger than the tensor {self.shape} at dimension {a}")
    n = self.shape[d]
    self._check_index_values(index, 0, n, f"dimension {d}")
    src = src.shrink(tuple((0, s) for s in index.shape))
    ar = type(self).arange(n, device=self.device, dtype=index.dtype).reshape((n,) + (1,) * (index.ndim - d))
    mask = index.unsqueeze(d) == ar
    return mask, src.unsqueeze(d), n

  def _pad_to_self(self, t: Any, d: int, fill: Any) -> Any:
    return t.pad(tuple((0, 0) if a == d else (0, sx - st) for a, (st, sx) in enumerate(zip(t.shape, self.shape))), value=fill)

  def scatter(self, dim: int, index: Any, src: Any = None, value: Any = None, *, reduce: str | None = None) -> Any:
    """torch.scatter (out of place): out[index[i][j]][j] = src[i][j] (dim=0); src may be a scalar
    (or pass value=). With repeated indices the last write along dim wins. reduce="add"/"multiply" (torch's older
    form) accumulates into self instead: scatter_reduce with "sum"/"prod", include_self."""
    if src is None: src = value
    if src is None: raise TypeError("scatter needs src or value")
    if reduce is not None:
      if reduce not in _SCATTER_REDUCE: raise ArgumentError(f"scatter reduce must be one of {tuple(_SCATTER_REDUCE)}, got {reduce!r}")
      if not _is_tensor(src): src = type(self).full(index.shape, src, dtype=self.dtype, device=self.device)
      return self.scatter_reduce(dim, index, src, _SCATTER_REDUCE[reduce], include_self=True)
    d = self._check_dim_index(dim, index, "scatter")
    if self.ndim == 0: return self.reshape(1).scatter(0, index.reshape(1), src if not _is_tensor(src) else src.reshape(1)).reshape(())
    if not _is_tensor(src): src = type(self).full(index.shape, src, dtype=self.dtype, device=self.device)
    mask, s, n = self._scatter_mask(d, index, src.cast(self.dtype), "scatter")
    J = index.shape[d]
    j = type(self).arange(1, J + 1, device=self.device, dtype=dtypes.int32).reshape((J,) + (1,) * (index.ndim - d - 1))
    last = mask.where(j, 0).amax(d + 1, keepdim=True) if J else mask.sum(d + 1, keepdim=True).cast(dtypes.int32)
    val = s._pick(j == last, d + 1)
    has = self._pad_to_self((last > 0).squeeze(d + 1), d, False)
    return has.where(self._pad_to_self(val, d, 0), self)

  def scatter_reduce(self, dim: int, index: Any, src: Any, reduce: str, include_self: bool = True) -> Any:
    """torch.scatter_reduce: reduce is one of sum, prod, mean, amax, amin. Positions no index writes
    keep self's value; include_self=False leaves self out of the reduction where something is written.
    mean of integers rounds down (as torch)."""
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
      raise ArgumentError(f"scatter_reduce: reduce must be one of sum, prod, mean, amax, amin, got {reduce!r}")
    d = self._check_dim_index(dim, index, "scatter_reduce")
    if self.ndim == 0: return self.reshape(1).scatter_reduce(0, index.reshape(1), src.reshape(1), reduce, include_self).reshape(())
    mask, s, n = self._scatter_mask(d, index, src.cast(self.dtype), "scatter_reduce")
    count = mask.sum(d + 1)
    if reduce in ("sum", "mean"): r = mask.where(s, s.zeros_like()).sum(d + 1).cast(self.dtype)
    elif reduce == "prod": r = mask.where(s, s.ones_like()).prod(d + 1).cast(self.dtype)
    else:
      big = s.full_like(-float("inf") if dtypes.is_float(self.dtype) else dtypes.min(self.dtype))
      if reduce == "amax": r = mask.where(s, big).amax(d + 1)
      else: r = mask.where(s, s.full_like(float("inf") if dtypes.is_float(self.dtype) else dtypes.max(self.dtype))).amin(d + 1)
    has = self._pad_to_self(count > 0, d, False)
    r, count = self._pad_to_self(r, d, 0), self._pad_to_self(count, d, 0)
    if include_self:
      if reduce == "sum": r = self + r
      elif reduce == "prod": r = self * r
      elif reduce == "amax": r = self.maximum(r)
      elif reduce == "amin": r = self.minimum(r)
      else: r, count = self + r, count + 1
    if reduce == "mean":
      c = has.where(count, 1).cast(self.dtype)
      r = r.floor_divide(c) if not dtypes.is_float(self.dtype) else r / c
    return has.where(r.cast(self.dtype), self)

  def unfold(self, dimension: int, size: int, step: int) -> Any:
    """torch.Tensor.unfold: the windows of `size` every `step` along a dim; that dim becomes the window count and
    the window is a new last dim. (Not nn.functional.unfold, the image patches.)"""
    d = dimension % self.ndim if self.ndim and -self.ndim <= dimension < self.ndim else None
    if d is None and not (self.ndim == 0 and dimension in (0, -1)): raise IndexError(f"unfold dimension {dimension} of a {self.ndim}-D tensor")
    x = self.reshape(1) if self.ndim == 0 else self
    d = d or 0
    n = x.shape[d]
    if size > n or step <= 0 or size < 0: raise ArgumentError(f"unfold: size {size} and step {step} don't fit a dim of {n}")
    T, nw = type(self), (n - size) // step + 1
    idx = (T.arange(nw, device=self.device).reshape(nw, 1) * step + T.arange(size, device=self.device).reshape(1, size)).flatten()
    out = x.index_select(d, idx).reshape(*x.shape[:d], nw, size, *x.shape[d + 1:])
    out = out.permute(*range(d + 1), *range(d + 2, out.ndim), d + 1)
    return out.reshape(size) if self.ndim == 0 else out
  def index_select(self, dim: int, index: Any) -> Any:
    """torch.index_select: the entries of a 1-D integer index along dim."""
    if not _is_tensor(index) or not dtypes.is_int(index.dtype) or index.ndim > 1:
      raise TypeError(f"index_select: index must be a 1-D integer tensor, got {getattr(index, 'shape', type(index).__name__)}")
    d = _axis(dim, self.ndim)
    return self[(slice(None),) * d + (index.reshape(-1),)] if self.ndim else self.reshape(1)[index.reshape(-1)].reshape(index.shape)

  def index_add(self, dim: int, index: Any, source: Any, alpha: Any = 1) -> Any:
    """torch.index_add (out of place): out[.., index[j], ..] += alpha * source[.., j, ..] along dim; repeated
    indices all add. Built as a compare of each output position with the index and a sum over j."""
    if not _is_tensor(index) or not dtypes.is_int(index.dtype) or index.ndim > 1:
      raise TypeError(f"index_add: index must be a 1-D integer tensor, got {getattr(index, 'shape', type(index).__name__)}")
    d = _axis(dim, self.ndim)
    x, src = (self, source) if self.ndim else (self.reshape(1), source.reshape(1))
    J, n = index.numel(), x.shape[d]
    want = x.shape[:d] + (J,) + x.shape[d + 1:]
    if src.shape != want: raise ArgumentError(f"index_add: source of shape {source.shape} must have shape {want}")
    self._check_index_values(index, 0, n, f"dimension {d}")
    hit = index.reshape(J, 1) == type(self).arange(n, device=self.device, dtype=index.dtype).reshape(1, n)  # (J, n)
    s = src.cast(self.dtype).transpose(d, -1).unsqueeze(-1) * alpha  # (.., J, n)
    out = x + hit.where(s, s.zeros_like()).sum(-2).transpose(d, -1).cast(self.dtype)
    return out.reshape(self.shape)

  def nonzero(self, as_tuple: bool = False) -> Any:
    """torch.nonzero: (N, ndim) int64 positions of nonzero entries, row-major. The count sets the shape: it syncs."""
    import numpy as np
    pos = np.argwhere(self.numpy().reshape(self.shape or (1,))).astype(np.int64)
    if not self.ndim: pos = pos[:, :0]
    if as_tuple: return tuple(type(self)(np.ascontiguousarray(pos[:, i]), device=self.device) for i in range(max(self.ndim, 1)))
    return type(self)(pos, device=self.device)

  def masked_fill(self, mask: Any, value: Any) -> Any:
    """self where mask is False, value (cast to self's dtype) where it is True; mask broadcasts to self."""
    if not _is_tensor(mask) or mask.dtype != dtypes.bool: raise TypeError(f"masked_fill: mask must be a bool tensor, got {getattr(mask, 'dtype', type(mask).__name__)}")
    try: ok = _broadcast_shapes(mask.shape, self.shape) == self.shape
    except IndexError: ok = False
    if not ok:
      raise ArgumentError(f"masked_fill: mask of shape {mask.shape} doesn't broadcast to the tensor's shape {self.shape}")
    if _is_tensor(value):
      if value.ndim != 0: raise ArgumentError(f"masked_fill: value must be a 0-dim tensor or a number, got shape {value.shape}")
      v = value.cast(self.dtype)
    else: v = type(self).full((), value, dtype=self.dtype, device=self.device)
    return mask.where(v, self)

def _broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
  try: return broadcast_shape(*shapes)
  except ValueError: raise IndexError(f"shape mismatch: indexing tensors could not be broadcast together with shapes {list(shapes)}") from None
