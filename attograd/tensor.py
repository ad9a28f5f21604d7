"""The front end: a lazy Tensor that builds UOps. Shapes, broadcasting, dtype promotion and error
messages live here; composite ops are written in terms of a few primitive UOps (DESIGN §3.1)."""
from __future__ import annotations
import functools, math, os, struct, sys, weakref
from typing import Any, Callable, Sequence
from attograd.errors import ArgumentError, IndexOutOfRange, UnsupportedDtype
from attograd.dtype import DType, dtypes, ConstType, least_upper_dtype, to_dtype, truncate, kind, DTYPES_BY_NAME
from attograd.helpers import Switch, gc_paused, argsort, prod, all_same, broadcast_shape, flatten, float_to_bf16_bits, bf16_bits_to_float
from attograd.uop.ops import UOp, Ops, GroupOp, device_leaf, sint, smax, smin, sym_prod, sym_sum, sym_neg, sym_eq, sym_le, sym_value, arg_key
from attograd.runtime.device import Device
from attograd.schedule.schedule import create_schedule, new_buffer, is_view_of_buffer, is_contiguous_buffer, buffer_view
from attograd.engine.realize import buffer_of, capturing, JitError, realize_graphs, realized_view, is_realized
from attograd.schedule.multi import shard_uop
from attograd.engine import registry
from attograd.engine.registry import sources
from attograd.gradient import compute_gradient, GradMode
from attograd.frontend.indexing import IndexingOps, full_index, index_checks
from attograd.frontend.reorder import ReorderOps
from attograd.frontend.pairs import ValuesIndices, _VI_HINT
from attograd.frontend.elementwise import ElementwiseOps
from attograd.frontend import replay
from attograd.frontend.replay import replayed

# tensors that require grad, by id: a WeakSet would compare two entries with ==, which is elementwise for tensors
_grad_tensors: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()

# tensors the next realize of anything realizes too: those with an assign not yet realized, so writes land in order and
# a chain of assigns (a running mean updated each step) never grows into an ever longer graph; and a loss that
# backward() ran from, as PyTorch computes it in the forward pass: `opt.step()` then `loss.item()` would otherwise run
# the forward pass twice, once for the gradients and again for the loss
# (keyed by id: a WeakSet would compare two references to one tensor with Tensor.__eq__, elementwise)
_pending_realize: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()

def _graph_for_gradient(root: UOp, targets: set[UOp]) -> UOp:
  """The graph gradients flow through: a realized tensor that depends on a target is seen through to the graph it
  came from, and a node that was realized into a target's memory is that target. A realized tensor that depends on no
  target stays its buffer: the gradient reads its values (seen through, a random tensor's graph would be rebuilt
  around newer random state, and the gradient would recompute it)."""
  reaches: dict[UOp, bool] = {}
  def leads_to_target(n: UOp) -> bool:
    # depth first over sources and the graphs realized nodes came from (iterative: a chain of realizes can be long)
    stack = [(n, False)]
    while stack:
      u, ready = stack.pop()
      if u in reaches: continue
      below = (*u.src, *((src,) if (src := sources.get(u)) is not None else ()))
      if ready: reaches[u] = u in targets or realized_view(u) in targets or any(reaches[s] for s in below)
      else: stack += [(u, True), *((s, False) for s in below if s not in reaches)]
    return reaches[n]
  expanded: set[UOp] = set()  # each node is seen through once: no cycle can keep this going
  # (realized_view and sources.get inlined: two Python calls fewer per node of a training step's graph, each backward)
  view_of, source_of = registry.realized.by_id.get, sources.by_id.get
  while True:
    swap = {}
    for n in root.toposort:
      if n in targets or n in expanded: continue
      if (e := view_of(id(n))) is not None and (v := e.value()) in targets: swap[n] = v
      elif (e := source_of(id(n))) is not None and leads_to_target(src := e.value): swap[n] = src
    if not swap: return root
    expanded |= swap.keys()
    root = root.substitute(swap)

def _check_size(s: Any, what: str) -> sint:
  """A size in a shape: a non-negative int, or an integer expression of bound Variables, never negative."""
  if isinstance(s, UOp):
    if not dtypes.is_int(s.dtype) or s.shape != (): raise ArgumentError(f"invalid size {s!r} in {what}: a size must be an int or an integer Variable")
    topo = s.toposort
    if (free := [u.arg[0] for u in topo if u.op is Ops.DEFINE_VAR and not any(b.op is Ops.BIND and b.src[0] is u for b in topo)]):
      raise ArgumentError(f"Variable {free[0]!r} in {what} is not bound: use Variable(...).bind(value)")
    if (s := s if s.op is Ops.BIND else s.simplify()).vmin < 0: raise ArgumentError(f"size {s!r} in {what} can be negative (down to {s.vmin})")
    return s
  if not isinstance(s, int) or s < 0: raise ArgumentError(f"invalid {what}: sizes must be non-negative ints or bound Variables")
  return s

_UNSET: Any = object()  # an argument not given (None means the default device)

def _device_node(device: str) -> UOp: return UOp(Ops.DEVICE, dtypes.void, (), device)
def _const(value: ConstType, dtype: DType, device: str) -> UOp: return device_leaf(Ops.CONST, dtype, device, truncate(dtype, value))

# a Python scalar broadcast to a shape, by (type, value's key, dtype, device, shape): the node is the same every time (UOps
# are unique), and building its four nodes again was half the Python cost of `x * 0.5`. Bounded: cleared when full
_broadcast_consts: dict[tuple, UOp] = {}
def _broadcast_const(value: ConstType, dtype: DType, device: str, shape: tuple[sint, ...]) -> UOp:
  key = (type(value), arg_key(value), dtype, device, shape)
  if (u := _broadcast_consts.get(key)) is None:
    if len(_broadcast_consts) >= 4096: _broadcast_consts.clear()
    u = _broadcast_consts[key] = Tensor(_const(value, dtype, device))._broadcast_to(shape).uop
  return u

def _expand_scalar(u: UOp, shape: tuple[sint, ...]) -> UOp:
  """A 0-d node broadcast to shape, as Tensor._broadcast_to builds it: reshaped to all 1s, then expanded."""
  u = UOp(Ops.RESHAPE, u.dtype, (u,), (1,) * len(shape))
  return u if u.arg == shape else UOp(Ops.EXPAND, u.dtype, (u,), shape)

def _flatten_nested(data: Any) -> tuple[list[Any], tuple[int, ...]]:
  if not isinstance(data, (list, tuple)): return [data], ()
  if len(data) == 0: return [], (0,)
  if not any(isinstance(d, (list, tuple)) for d in data): return list(data), (len(data),)  # a row of scalars
  parts = [_flatten_nested(d) for d in data]
  shapes = [s for _, s in parts]
  if not all_same(shapes): raise ArgumentError(f"nested list is not rectangular: rows have shapes {sorted(set(shapes))}")
  return [x for p, _ in parts for x in p], (len(data), *shapes[0])

def _pack(values: list[Any], dtype: DType) -> bytes:
  if dtype == dtypes.bfloat16: return struct.pack(f"<{len(values)}H", *(float_to_bf16_bits(float(v)) for v in values))
  # values the format takes as they are pack to what truncate gives them (struct rounds floats the same way); an int out
  # of range, a float for an int type or a float past the type's largest raise, and go one by one through truncate
  try: return struct.pack(f"<{len(values)}{dtype.fmt}", *values)
  except (struct.error, OverflowError): return struct.pack(f"<{len(values)}{dtype.fmt}", *(truncate(dtype, v) for v in values))

def _unpack(raw: memoryview, dtype: DType) -> list[Any]:
  if dtype == dtypes.bfloat16: return [bf16_bits_to_float(b) for b in raw.cast("H")]
  if dtype == dtypes.float16: return list(struct.unpack(f"<{raw.nbytes // 2}e", raw))  # memoryview.cast has no "e"
  return raw.cast(dtype.fmt).tolist()

def _nest(flat: list[Any], shape: tuple[int, ...]) -> Any:
  if not shape: return flat[0]
  if len(shape) == 1: return flat
  step = prod(shape[1:])
  return [_nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]

def _normalize_axis(axis: int, ndim: int, extra: int = 0) -> int:
  n = ndim + extra
  if not -max(n, 1) <= axis < max(n, 1): raise IndexError(f"axis {axis} is out of range for a tensor of {ndim} dimension(s)")
  return axis % max(n, 1)

# each base's live views, weakly both ways (by id: Tensor's == is elementwise, so no WeakSet/WeakKeyDictionary): a write
# to the base refreshes them, so they show it as torch's views do
_views_of: dict[int, tuple[weakref.ref, dict[int, weakref.ref], list[int]]] = {}
def _add_view(base: Tensor, view: Tensor) -> None:
  if (entry := _views_of.get(id(base))) is None or entry[0]() is not base:
    entry = _views_of[id(base)] = (weakref.ref(base, lambda _, k=id(base): _views_of.pop(k, None)), {}, [64])
  views = entry[1]
  views[id(view)] = weakref.ref(view)  # no callback (it costs a closure per view): dead entries are pruned in bulk
  if len(views) > entry[2][0]:
    for k in [k for k, r in views.items() if r() is None]: del views[k]
    entry[2][0] = max(64, 2 * len(views))
def _live_views(base: Tensor) -> list[Tensor]:
  if (entry := _views_of.get(id(base))) is None or entry[0]() is not base: return []
  return [v for r in list(entry[1].values()) if (v := r()) is not None]

def _view_chain(u: UOp, root: UOp) -> list[UOp] | None:
  """The movement ops from root up to u, innermost first, seeing through a realized view to the graph it came from;
  None when u doesn't come from root that way."""
  chain = []
  while u is not root:
    if (src := sources.get(u)) is not None: u = src
    elif u.op in GroupOp.Movement or u.op is Ops.DETACH: chain.append(u); u = u.src[0]  # detach() is a view too (torch)
    else: return None
  return chain[::-1]

def _redo_views(chain: list[UOp], u: UOp) -> UOp:
  for m in chain: u = m.replace(src=(u,))
  return u

def _undo_view(m: UOp, t: Tensor) -> Tensor:
  """t, shaped like the movement op m's output, laid back out in m's source's shape (elements m drops are 0/False)."""
  shape = m.src[0].shape
  if m.op is Ops.DETACH: return t
  if m.op is Ops.RESHAPE or m.op is Ops.EXPAND: return t.reshape(shape)  # an EXPAND here adds no elements (checked)
  if m.op is Ops.PERMUTE: return t.permute(argsort(m.arg))
  if m.op is Ops.FLIP: return t.flip(*(i for i, f in enumerate(m.arg) if f))
  if m.op is Ops.SHRINK: return t.pad(tuple((b, s - e) for (b, e), s in zip(m.arg, shape)))
  return t.shrink(tuple((b, b + s) for (b, _), s in zip(m.arg, shape)))  # PAD

# index checks realized inside a TinyJit capture: the JIT takes them and reads them after every replay
captured_checks: list[tuple[Any, str, int]] = []
def raise_index_errors(checks: list[tuple[Any, str, int]]) -> None:
  """Read the reports of index checks (buffers of [count out of range, one such value]) and raise for the first bad one."""
  for buf, what, size in checks:
    count, value = buf.as_bytes().cast("q")[:2]
    if count: raise IndexOutOfRange(f"index {value} is out of bounds for {what} with size {size} ({count} such entries)")

def _split_for_cores(n: sint) -> int:
  """How many partial reductions a full reduction of n elements is split into (1: none)."""
  if not isinstance(n, int) or n < 1 << 20: return 1
  return next((p for p in (64, 32, 16, 8, 4, 2) if n % p == 0), 1)

class Tensor(IndexingOps, ReorderOps, ElementwiseOps):
  """A lazy n-dimensional array: operations build a graph; realize() (or reading data) runs it."""
  __slots__ = ("uop", "_requires_grad", "grad", "_view_of", "__weakref__")
  training: bool = False
  @staticmethod
  def train(mode: bool = True) -> Switch: return Switch(Tensor, "training", mode)
  @staticmethod
  def test() -> Switch: return Switch(Tensor, "training", False)
  _seed: int = 0
  _rng_state: dict[str, Tensor] = {}  # per device: [key, counter] as uint32s in device memory

  def __init__(self, data: Any, device: str | None = None, dtype: DType | str | None = None, requires_grad: bool | None = None):
    if type(data) is UOp and device is None and dtype is None and data.op is not Ops.BIND: self.uop: UOp = data  # the front end's own nodes
    else: self.uop = _uop_from(data, Device.canonicalize(device), to_dtype(dtype) if dtype is not None else None)
    self._requires_grad, self.grad, self._view_of = None, None, None
    if requires_grad is not None: self.requires_grad = requires_grad

  # ***** properties *****
  @property
  def shape(self) -> tuple[int, ...]: return self.uop.shape
  @property
  def dtype(self) -> DType: return self.uop.dtype
  @property
  def device(self) -> str: return self.uop.device
  @property
  def ndim(self) -> int: return len(self.shape)
  def numel(self) -> sint: return sym_prod(self.shape)
  def dim(self) -> int: return self.ndim
  ndimension = dim
  def element_size(self) -> int: return self.dtype.itemsize
  def nbytes(self) -> int: return self.numel() * self.element_size()
  def size(self, dim: int | None = None) -> tuple[int, ...] | int:
    return self.shape if dim is None else self.shape[_normalize_axis(dim, self.ndim)]
  def __len__(self) -> int:
    if not self.shape: raise TypeError("len() of a 0-d tensor")
    return self.shape[0]
  def __repr__(self) -> str: return f"<Tensor shape={self.shape} dtype={self.dtype} device={self.device}>"
  __hash__ = object.__hash__

  # ***** autograd *****
  @property
  def requires_grad(self) -> bool | None:
    """A leaf's flag as set (None: never set, tinygrad's "undecided", which an optimizer turns into True). A computed
    tensor's is True, as torch's, when a gradient can flow into it from a tensor that requires grad (its graph is walked
    only when asked); else None."""
    if self._requires_grad is not None: return self._requires_grad
    if not _grad_tensors: return None
    targets = {t.uop for t in _grad_tensors.values()}
    seen, stack = set(), [_graph_for_gradient(self.uop, targets)]
    while stack:  # a target reached other than through a DETACH (detach(), .data)
      u = stack.pop()
      if u in targets: return True
      if u not in seen and u.op is not Ops.DETACH: seen.add(u); stack.extend(u.src)
    return None
  @requires_grad.setter
  def requires_grad(self, value: bool | None) -> None:
    if value and not (dtypes.is_float(self.dtype)): raise TypeError(f"only floating point tensors can require gradients, not {self.dtype}")
    self._requires_grad = value
    if value: _grad_tensors[id(self)] = self
    else: _grad_tensors.pop(id(self), None)
  def gradient(self, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor]:
    """Gradients of this tensor with respect to targets, as lazy tensors (nothing is stored)."""
    return self._gradient_in(None, targets, gradient)
  def _gradient_in(self, graph: UOp | None, targets: Sequence[Tensor], gradient: Tensor | None) -> list[Tensor]:
    """gradient(), through `graph` when the caller has already built it: _graph_for_gradient(self.uop, the targets' uops)."""
    if gradient is None:
      if self.numel() != 1: raise RuntimeError(f"gradient can be implied only for a one-element output, this one has shape {self.shape}")
      gradient = Tensor(1.0, device=self.device, dtype=self.dtype if dtypes.is_float(self.dtype) else dtypes.default_float)
    elif gradient.shape != self.shape: raise ArgumentError(f"gradient of shape {gradient.shape} for an output of shape {self.shape}")
    root_grad = gradient.cast(self.dtype)._broadcast_to(self.shape).uop
    wanted = {t.uop for t in targets}
    grads = compute_gradient(_graph_for_gradient(self.uop, wanted) if graph is None else graph, root_grad, wanted,
                             {t.uop for t in _grad_tensors.values()})
    return [Tensor(grads[t.uop]) if t.uop in grads else t.zeros_like() for t in targets]
  def _may_need_grad(self) -> bool:
    """Whether a gradient may flow into this tensor: a tensor that requires grad is in its graph (seen through realized
    nodes, as backward sees it). Lets an op pick a forward that also makes its backward cheap only when it will run."""
    if not _grad_tensors: return False
    targets = {t.uop for t in _grad_tensors.values()}
    return not targets.isdisjoint(_graph_for_gradient(self.uop, targets).toposort)
  def backward(self, gradient: Tensor | None = None) -> Tensor:
    """Accumulate d(self)/d(t) into t.grad for every tensor t that requires grad and this one depends on."""
    candidates = list(_grad_tensors.values())
    root = _graph_for_gradient(self.uop, every := {t.uop for t in candidates})
    graph = root.toposort
    targets = [t for t in candidates if t.uop in graph]
    if not targets: raise RuntimeError("backward() of a tensor that depends on no tensor requiring grad")
    # when every candidate is a target (a training step), root is the graph gradient() would build again for them:
    # a second walk of the model's graph, ~2 ms a step
    same = {t.uop for t in targets} == every
    with gc_paused(): grads = self._gradient_in(root if same else None, targets, gradient)  # a burst of acyclic nodes (realize_all)
    for t, g in zip(targets, grads):
      t.grad = g if t.grad is None else (t.grad + g)
    if not is_realized(self.uop): _pending_realize[id(self)] = self
    return self

  # ***** running *****
  def realize(self, *lst: Tensor) -> Tensor:
    """Run everything these tensors need; afterwards each is a view of device memory."""
    Tensor.realize_all([self, *lst])
    return self
  @staticmethod
  def realize_all(tensors: Sequence[Tensor]) -> None:
    # nothing pending and every tensor a whole buffer already (a result read again, a decode step's logits): nothing to run,
    # and realize_graphs' walk of the graphs (~40 us) is skipped
    if not _pending_realize and not index_checks and all(is_contiguous_buffer(u := t.uop) and not u.symbolic_shape for t in tensors): return
    if _pending_realize:
      # (first: the schedule runs their kernels as early as their sources allow, and a deferred run's read of a loss, which
      # backward() left pending, waits for the forward pass alone, not the update after it: engine/realize.py DEFER)
      tensors = [*_pending_realize.values(), *tensors]
      _pending_realize.clear()
    checks = None
    if index_checks:
      checks = index_checks[:]
      index_checks.clear()
      tensors = [*tensors, *(c[0] for c in checks)]
    tensors = list({id(t): t for t in tensors}.values())
    # a computed tensor keeps the graph it came from, so backward() still works after item(); a leaf of the gradient doesn't
    keep = [not t._requires_grad and GradMode.enabled for t in tensors]  # under no_grad a result forgets its graph
    with gc_paused():  # graphs hold no cycles: a collection here walks a training step's graphs for nothing (helpers.gc_paused)
      for t, u in zip(tensors, realize_graphs([t.uop for t in tensors], keep)): t.uop = u
    if checks:
      # (a sharded index's report is reduced over every part, an all-reduce: each device's copy holds all of it)
      reports = [(buffer_of((c.uop.src[0] if c.uop.op is Ops.MULTI else c.uop).base), what, size) for c, what, size in checks]
      if capturing() is not None: captured_checks.extend(reports)  # the JIT reads them after every replay
      else: raise_index_errors(reports)
  def schedule(self, *lst: Tensor):
    return create_schedule([t.uop for t in (self, *lst)])[0]
  def contiguous(self) -> Tensor:
    u = self.uop
    if is_contiguous_buffer(u): return self
    return self._new(UOp(Ops.CONTIGUOUS, self.dtype, (u,)))
  def _raw(self) -> memoryview:
    if capturing() is not None:
      raise JitError("reading a tensor's values into Python inside a TinyJit function: the replay would reuse this call's "
                     "value. Return the tensor from the function and read it outside")
    if isinstance(self.device, tuple): return self.realize().to(self.device[0])._raw()  # a sharded tensor, gathered
    t = self.realize()  # realize self first: later reads reuse its buffer
    if not is_contiguous_buffer(t.uop): t = t.contiguous().realize()  # (a whole buffer already: no second realize, ~40 us)
    raw = buffer_of(t.uop.base).as_bytes()
    # a symbolic shape lives in a buffer made for the variable's maximum: the tensor is its prefix
    return raw if isinstance(n := self.numel(), int) else raw[:sym_value(n) * self.dtype.itemsize]
  def _host_bytes(self) -> memoryview:
    """The values' bytes, read-only, for a reader that doesn't keep them: in place when the tensor is a whole buffer of
    static shape in host memory (CPU), else a fresh copy (_raw). An index check reads a batch of indices every training
    step, the LLM a token's logits, where a copy of the memory was the cost."""
    u = (t := self.realize()).uop
    if type(u.device) is str and not u.symbolic_shape and is_contiguous_buffer(u) and (mv := buffer_of(u.base).host_view()) is not None:
      return mv.toreadonly()
    return t._raw().toreadonly()
  def _value_shape(self) -> tuple[int, ...]: return tuple(sym_value(s) for s in self.shape) if self.uop.symbolic_shape else self.shape
  @property
  def data(self) -> Tensor:
    """torch's x.data: x detached, sharing its values (m.weight.data.normal_(0, 0.02) writes the weight, outside autograd).
    Called, x.data() is tinygrad's memoryview of the values."""
    return self._mark_view(_Data(UOp(Ops.DETACH, self.dtype, (self.uop,))))
  @data.setter
  def data(self, value: Tensor) -> None:  # torch's x.data = t: x takes t's values (and shape), its grad settings stay
    value = value.detach()
    if value.shape == self.shape and value.device == self.device: self.assign(value)
    else: self.uop = value.cast(self.dtype).uop
  def tolist(self) -> Any:
    if self.dtype == dtypes.bool: flat = [bool(b) for b in self._raw().cast("B")]
    else: flat = _unpack(self._raw(), self.dtype)
    return _nest(flat, self._value_shape()) if self.shape else flat[0]
  def item(self) -> ConstType:
    if self.numel() != 1: raise ArgumentError(f"item() needs a tensor with one element, this one has shape {self.shape}")
    return _unpack(self._raw(), self.dtype)[0] if self.dtype != dtypes.bool else bool(self._raw().cast("B")[0])
  def numpy(self):
    import numpy as np
    if self.dtype == dtypes.bfloat16: raise TypeError("numpy has no bfloat16: call .float() first")
    # _raw's bytes are a fresh copy of the memory: the array owns them, writable, with no second copy (a decode step's
    # 49152 logits were copied three times)
    a = np.frombuffer(raw := self._raw(), dtype=np.dtype(_NUMPY_NAMES[self.dtype])).reshape(self._value_shape())
    return a if raw.nbytes == len(raw.obj) else a.copy()  # (a symbolic shape's prefix: the rest isn't kept alive)
  def __bool__(self) -> bool:
    if self.numel() != 1: raise RuntimeError(f"the truth value of a tensor of shape {self.shape} is ambiguous")
    return bool(self.item())
  def __float__(self) -> float: return float(self.item())
  def __int__(self) -> int: return int(self.item())
  def to(self, *args: Any, device: str | None | Any = _UNSET, dtype: DType | None = None, non_blocking: bool = False, copy: bool = False) -> Tensor:
    """to(device), to(dtype), to(device, dtype), to(other_tensor) (its device and dtype), or keywords, as in torch."""
    for a in args:
      if isinstance(a, DType): dtype = a
      elif isinstance(a, Tensor): device, dtype = a.device, a.dtype
      elif a is None or isinstance(a, str) or (isinstance(a, (tuple, list)) and all(isinstance(d, str) for d in a)): device = a
      else: raise TypeError(f"to() takes a device (str), a dtype or a tensor, not {type(a).__name__}")
    t = self if device is _UNSET else self._to_device(device)
    t = t if dtype is None else t.cast(dtype)
    return t.clone() if copy and t is self else t
  def _to_device(self, device: str | None | tuple[str, ...]) -> Tensor:
    device = Device.canonicalize(device)
    if device == self.device: return self
    # to several devices: a copy on each (replicated); a sharded tensor to one device: its parts gathered there
    if isinstance(device, tuple) and not isinstance(self.device, tuple): return self._new(shard_uop(self.uop, device, None))
    if isinstance(device, tuple) or isinstance(self.device, tuple): return self._new(UOp(Ops.COPY, self.dtype, (self.uop, _device_node(device))))
    if (is_view_of_buffer(self.uop) and not self._may_need_grad()) or Device[self.device].renderer is None:
      # move the memory and replay the ops on the other side: a view runs no kernel here, and a
      # storage-only device (DISK) can't run one at all. Not for a tensor a gradient may flow into: the copy of
      # its memory would cut it out of the graph (its node would no longer be in it)
      here = self.device
      return self._new(self.uop.substitute({u: UOp(Ops.COPY, u.dtype, (u, _device_node(device))) if u.op is Ops.BUFFER else _device_node(device)
                                            for u in self.uop.toposort if u.op in {Ops.BUFFER, Ops.DEVICE} and u.device == here}))
    return self._new(UOp(Ops.COPY, self.dtype, (self.contiguous().uop, _device_node(device))))
  def shard(self, devices: Sequence[str], axis: int | None = None) -> Tensor:
    """This tensor split along axis over devices (the first size % n parts one row longer: 5 rows over 2 devices are
    3 and 2), or with axis None a copy on each (replicated). The result is one tensor: every op, autograd and the
    optimizers work on it as on any other; ops run on each device's part, and a reduce or matmul over the split axis
    combines the parts (an all-reduce). .to(device) gathers it on one device."""
    devices = Device.canonicalize(tuple(devices))
    if axis is not None: axis = _normalize_axis(axis, self.ndim)
    return self._new(shard_uop(self.uop, devices, axis))
  def shard_(self, devices: Sequence[str], axis: int | None = None) -> Tensor:
    """shard in place: this tensor (a model's parameter) becomes the sharded one, its requires_grad kept."""
    self.uop = self.shard(devices, axis).uop
    return self
  def assign(self, x: Tensor | ConstType) -> Tensor:
    """Give this tensor x's values (broadcast and cast to its shape and dtype), like torch's copy_.
    The write lands at the next realize of anything, in new memory: tensors computed from the old
    values keep them, even if they are still lazy; views of this tensor made before the write see the new ones (torch's aliasing)."""
    x = x if isinstance(x, Tensor) else Tensor(x, device=self.device, dtype=self.dtype)
    if x.device != self.device: raise ArgumentError(f"assign from device {x.device} to a tensor on {self.device}")
    x = x.cast(self.dtype)._broadcast_to(self.shape)
    if (vo := self._view_of) is not None and (base := vo[0]()) is not None and base is not self: return self._assign_through(base, vo[1], x)
    target = self.uop.src[0] if self.uop.op is Ops.ASSIGN else self.uop
    if not is_realized(target): self.uop = x.uop  # nothing realized to write over
    else:
      if (capture := capturing()) is not None: capture.assigned.setdefault(self, target)
      self.uop = UOp(Ops.ASSIGN, self.dtype, (target, x.uop))
      _pending_realize[id(self)] = self
    # views made before the write show it from now on, as torch's share memory (a tensor computed from them keeps
    # the old values: in torch it was computed before the write too)
    for v in _live_views(self): v._fresh()
    return self
  def _assign_through(self, base: Tensor, root: UOp, x: Tensor) -> Tensor:
    """The write to a view: the movement ops from the base's node (when the view was made) up to this view, undone on
    the value and on an all-True mask, say which elements of the base the write reaches; the base is assigned."""
    if (chain := _view_chain(self.uop, root)) is None:
      raise RuntimeError(f"write to a view of shape {self.shape} whose base tensor {base.shape} it can no longer be traced to "
                         "(the view was realized on its own): write to the base tensor instead, e.g. base[index] = value")
    if any(u.op is Ops.EXPAND and u.src[0].shape != u.shape for u in chain):
      raise RuntimeError("unsupported operation: a write to an expanded view, where more than one element of the view refers "
                         "to a single element of its base; call .clone() before writing to it")
    value, mask = x, Tensor.full(x.shape, True, dtype=dtypes.bool, device=self.device)
    for u in reversed(chain):
      value, mask = _undo_view(u, value), _undo_view(u, mask)
    base.assign(mask.where(value, base))
    self.uop, self._view_of = _redo_views(chain, base.uop), (self._view_of[0], base.uop)
    return self
  def detach(self) -> Tensor:
    """The values without the graph; as torch's, it shares them: an in-place write to it reaches this tensor."""
    return self._view(UOp(Ops.DETACH, self.dtype, (self.uop,)))
  def clone(self) -> Tensor: return self._new(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))
  def _new(self, u: UOp) -> Tensor: return Tensor(u)
  def _view(self, u: UOp) -> Tensor: return self._mark_view(Tensor(u))
  def _mark_view(self, t: Tensor) -> Tensor:
    """t is a view of self (as a PyTorch view shares memory): a write to t becomes an assign to the region of self's
    base it shows. The base is held weakly: once nothing else holds it, no one can see a write to it, and t is on its own."""
    vo = self._view_of
    if vo is not None and (base := vo[0]()) is not None: t._view_of = vo
    else: t._view_of, base = (weakref.ref(self), self.uop), self
    _add_view(base, t)  # so a later write to the base reaches t (assign)
    return t
  def _fresh(self) -> Tensor:
    """A view whose base was written since it was made shows the base's new values (before an in-place op reads it)."""
    vo = self._view_of
    if vo is None or (base := vo[0]()) is None or base.uop is vo[1] or (chain := _view_chain(self.uop, vo[1])) is None: return self
    self.uop, self._view_of = _redo_views(chain, base.uop), (vo[0], base.uop)
    return self

  # ***** creation *****
  @staticmethod
  def _shape_arg(shape: tuple[Any, ...]) -> tuple[sint, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)): shape = tuple(shape[0])
    return tuple(s if type(s) is int and s >= 0 else _check_size(s, f"shape {shape}") for s in shape)
  @staticmethod
  def full(shape: tuple[int, ...] | int, fill_value: ConstType, dtype: DType | str | None = None, device: str | None = None, **kw) -> Tensor:
    shape = Tensor._shape_arg(shape if isinstance(shape, tuple) else (shape,))
    dtype = to_dtype(dtype) if dtype is not None else dtypes.from_py(fill_value)
    t = Tensor(_const(fill_value, dtype, Device.canonicalize(device)))
    t = t.reshape((1,) * len(shape)).expand(shape) if shape else t
    # a tensor that requires grad is a leaf with memory of its own: a constant node is shared by every equal constant
    return Tensor(t.contiguous().realize().uop, **kw) if kw.get("requires_grad") else Tensor(t.uop, **kw) if kw else t
  @staticmethod
  def zeros(*shape, dtype=None, device=None, **kw) -> Tensor: return Tensor.full(Tensor._shape_arg(shape), 0, dtype or dtypes.default_float, device, **kw)
  @staticmethod
  def ones(*shape, dtype=None, device=None, **kw) -> Tensor: return Tensor.full(Tensor._shape_arg(shape), 1, dtype or dtypes.default_float, device, **kw)
  @staticmethod
  def empty(*shape, dtype=None, device=None, **kw) -> Tensor:
    shape, dtype, device = Tensor._shape_arg(shape), to_dtype(dtype or dtypes.default_float), Device.canonicalize(device)
    return Tensor(buffer_view(new_buffer(device, sym_prod(shape), dtype), shape), **kw)
  @staticmethod
  def arange(start: int | float, stop: int | float | None = None, step: int | float = 1, dtype=None, device=None, **kw) -> Tensor:
    if stop is None: start, stop = 0, start
    if any(isinstance(v, UOp) for v in (start, stop, step)):
      if not (isinstance(start, int) and start == 0 and step == 1):
        raise ArgumentError(f"arange with a Variable takes only a stop: arange(n), not arange({start}, {stop}, {step})")
      dtype = to_dtype(dtype) if dtype is not None else dtypes.default_int
      idx = Tensor(device_leaf(Ops.IOTA, dtypes.default_int if dtypes.is_int(dtype) else dtypes.float32, Device.canonicalize(device),
                               _check_size(stop, "arange")), **kw)
      return idx.cast(dtype)
    if step == 0: raise ArgumentError("arange step must be nonzero")
    if (stop - start) * step < 0: raise ArgumentError(f"arange({start}, {stop}, {step}): the step's sign points away from stop (PyTorch refuses this too)")
    n = max(0, math.ceil((stop - start) / step))
    dtype = to_dtype(dtype) if dtype is not None else dtypes.default_float if any(isinstance(v, float) for v in (start, stop, step)) else dtypes.default_int
    device = Device.canonicalize(device)
    idx = Tensor(device_leaf(Ops.IOTA, dtypes.default_int if dtypes.is_int(dtype) else dtypes.float32 if dtype != dtypes.float64 else dtype, device, n), **kw)
    return (idx * step + start).cast(dtype) if (start, step) != (0, 1) else idx.cast(dtype)
  @staticmethod
  def eye(n: int, m: int | None = None, dtype=None, device=None, **kw) -> Tensor:
    m = n if m is None else m
    rows, cols = Tensor.arange(n, device=device).reshape(n, 1), Tensor.arange(m, device=device).reshape(1, m)
    t = (rows == cols).cast(dtype or dtypes.default_float)
    # requires_grad=True makes a leaf with memory of its own, as full() does
    return Tensor(t.contiguous().realize().uop, **kw) if kw.get("requires_grad") else Tensor(t.uop, **kw) if kw else t
  def new_full(self, size, fill_value: ConstType, dtype=None, device=None, **kw) -> Tensor:
    return Tensor.full(tuple(size) if isinstance(size, (tuple, list)) else (size,), fill_value, dtype or self.dtype, device or self.device, **kw)
  def new_zeros(self, *size, dtype=None, device=None, **kw) -> Tensor: return self.new_full(Tensor._shape_arg(size), 0, dtype, device, **kw)
  def new_ones(self, *size, dtype=None, device=None, **kw) -> Tensor: return self.new_full(Tensor._shape_arg(size), 1, dtype, device, **kw)
  def new_empty(self, *size, dtype=None, device=None, **kw) -> Tensor: return Tensor.empty(*size, dtype=dtype or self.dtype, device=device or self.device, **kw)
  def new_tensor(self, data: Any, dtype=None, device=None, **kw) -> Tensor:
    return Tensor(data.detach() if isinstance(data, Tensor) else data, dtype=dtype or self.dtype, device=device or self.device, **kw)
  @staticmethod
  def from_numpy(a: Any) -> Tensor: return Tensor(a)
  def cpu(self) -> Tensor: return self.to("CPU")
  def full_like(self, fill_value: ConstType, dtype=None, device=None, **kw) -> Tensor:
    return Tensor.full(self.shape, fill_value, dtype or self.dtype, device or self.device, **kw)
  def zeros_like(self, **kw) -> Tensor: return self.full_like(0, **kw)
  def ones_like(self, **kw) -> Tensor: return self.full_like(1, **kw)
  def empty_like(self, dtype=None, device=None, **kw) -> Tensor: return Tensor.empty(self.shape, dtype=dtype or self.dtype, device=device or self.device, **kw)

  # ***** random: a counter-based generator, the same numbers on every device *****
  @staticmethod
  def manual_seed(seed: int = 0) -> None:
    Tensor._seed = seed
    for state in Tensor._rng_state.values(): state.assign(Tensor._rng_start(seed, state.device))
  @staticmethod
  def _rng_start(seed: int, device: str) -> Tensor:
    return Tensor([_lowbias32((seed * 0x9E3779B9 + 0x632BE5AB) & 0xFFFFFFFF), 0], device=device, dtype=dtypes.uint32)
  @staticmethod
  def _random_bits(n: int, device: str | None) -> Tensor:
    """n uint32s: a hash of (seed, counter); the counter advances so calls differ. Seed and counter live
    in device memory, so one kernel serves every call and a TinyJit replay draws new numbers."""
    device = Device.canonicalize(device)
    if (state := Tensor._rng_state.get(device)) is None:
      state = Tensor._rng_state[device] = Tensor._rng_start(Tensor._seed, device).contiguous().realize()
    key, counter = state[0], state[1]
    x = (Tensor.arange(n, device=device, dtype=dtypes.uint32) + counter) ^ key
    state.assign(state + Tensor([0, n & 0xFFFFFFFF], device=device, dtype=dtypes.uint32))
    for mul in (0x7FEB352D, 0x846CA68B):
      x = x ^ (x >> 16)
      x = x * mul
    return x ^ (x >> 16)
  @staticmethod
  def rand(*shape, dtype=None, device=None, **kw) -> Tensor:
    shape = Tensor._shape_arg(shape)
    if isinstance(n := sym_prod(shape), UOp):
      # numbers for the variable's largest value: the same kernels (and RNG advance) for every value bound
      return Tensor(Tensor.rand(smax(n), dtype=dtype, device=device).shrink(((0, n),)).reshape(shape).uop, **kw)
    bits = Tensor._random_bits(n, device)
    out = (bits >> 8).cast(dtypes.float32) * (1.0 / (1 << 24))
    return Tensor(out.reshape(shape).cast(dtype or dtypes.default_float).uop, **kw)
  @staticmethod
  def randn(*shape, dtype=None, device=None, **kw) -> Tensor:
    shape = Tensor._shape_arg(shape)
    u = Tensor.rand(2, sym_prod(shape), dtype=dtypes.float32, device=device)
    z = ((1 - u[0]).log() * -2).sqrt() * (u[1] * (2 * math.pi)).cos()
    return Tensor(z.reshape(shape).cast(dtype or dtypes.default_float).uop, **kw)
  @staticmethod
  def randint(*shape, low: int = 0, high: int = 10, dtype=None, device=None, size=None, **kw) -> Tensor:
    """tinygrad's randint(*shape, low=, high=) and torch's randint(high, size) / randint(low, high, size)."""
    if size is not None or (shape and isinstance(shape[-1], (tuple, list))):
      bounds, size = (shape, size) if size is not None else (shape[:-1], shape[-1])
      if len(bounds) == 1: low, high = 0, bounds[0]
      elif len(bounds) == 2: low, high = bounds
      elif bounds: raise TypeError(f"randint takes (high, size) or (low, high, size), got {shape}")
      shape = tuple(size)
    if high <= low: raise ArgumentError(f"randint needs low < high, got [{low}, {high})")
    r = Tensor.rand(*shape, dtype=dtypes.float64, device=device)
    return Tensor(((r * (high - low)).floor() + low).cast(dtype or dtypes.default_int).uop, **kw)
  def rand_like(self, **kw) -> Tensor: return Tensor.rand(*self.shape, dtype=kw.pop("dtype", self.dtype), device=kw.pop("device", self.device), **kw)
  def randn_like(self, **kw) -> Tensor: return Tensor.randn(*self.shape, dtype=kw.pop("dtype", self.dtype), device=kw.pop("device", self.device), **kw)

  # ***** movement *****
  def reshape(self, *shape) -> Tensor:
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    if None in shape:  # tinygrad's: None keeps the size of that dimension (torch refuses None)
      if len(shape) != self.ndim: raise ArgumentError(f"reshape to {shape}: None keeps a dimension's size, so it needs {self.ndim} entries")
      shape = tuple(o if s is None else s for s, o in zip(shape, self.shape))
    if type(numel := math.prod(cur := (u := self.uop).shape)) is int:  # concrete sizes: one check (a plain loop, C products)
      for s in shape:
        if type(s) is not int or s < 0: break
      else:
        if math.prod(shape) != numel: raise ArgumentError(f"cannot reshape tensor of shape {cur} ({numel} elements) to {shape}")
        return self if shape == cur else self._view(UOp(Ops.RESHAPE, u.dtype, (u,), shape))
    if shape.count(-1) > 1: raise ArgumentError(f"reshape to {shape}: only one dimension can be -1")
    numel = self.numel()
    if -1 in shape:
      known = sym_prod(s for s in shape if s != -1)
      if isinstance(known, int) and isinstance(numel, int):
        if known == 0 or numel % known: raise ArgumentError(f"cannot reshape tensor of shape {self.shape} to {shape}")
        shape = tuple(numel // known if s == -1 else s for s in shape)
      else: shape = tuple((numel // known).simplify() if s == -1 else s for s in shape)  # checked with the rest below
    if any(type(s) is not int or s < 0 for s in shape): shape = tuple(_check_size(s, f"shape {shape}") for s in shape)
    if not sym_eq(sym_prod(shape), numel): raise ArgumentError(f"cannot reshape tensor of shape {self.shape} ({numel} elements) to {shape}")
    if shape == self.shape: return self
    return self._view(UOp(Ops.RESHAPE, self.dtype, (self.uop,), shape))
  def view(self, *shape) -> Tensor: return self.reshape(*shape)
  def permute(self, *order) -> Tensor:
    order = tuple(order[0]) if len(order) == 1 and isinstance(order[0], (tuple, list)) else order
    n = len(self.uop.shape)
    axes = tuple([o % n if type(o) is int and -n <= o < n else _normalize_axis(o, n) for o in order])
    if sorted(axes) != list(range(n)): raise ArgumentError(f"permute order {order} is not a permutation of {n} axes")
    if axes == tuple(range(n)): return self
    return self._view(UOp(Ops.PERMUTE, self.dtype, (self.uop,), axes))
  def expand(self, *shape) -> Tensor:
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    if len(shape) < self.ndim: raise ArgumentError(f"can't expand shape {self.shape} to {shape}: fewer dimensions")
    base = (1,) * (len(shape) - self.ndim) + self.shape
    new = tuple(b if s == -1 else s for s, b in zip(shape, base))
    for b, s in zip(base, new):
      if b != s and b != 1: raise ArgumentError(f"can't expand shape {self.shape} to {shape}: size {b} is not 1")
    t = self.reshape(base)
    return t if new == base else self._view(UOp(Ops.EXPAND, self.dtype, (t.uop,), new))
  def _broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
    if self.shape == shape: return self
    if (n := len(shape) - len(self.shape)) >= 0 and all(a == 1 or a == b for a, b in zip(self.shape, shape[n:])):  # the common case, directly
      if n == 0: return self._new(UOp(Ops.EXPAND, self.dtype, (self.uop,), shape))  # (4, 1) -> (4, 4)
      u = UOp(Ops.RESHAPE, self.dtype, (self.uop,), (1,) * n + self.shape)  # (4,) -> (1, 4), then -> (3, 4)
      return self._new(u if u.arg == shape else UOp(Ops.EXPAND, self.dtype, (u,), shape))
    if len(self.shape) > len(shape) or broadcast_shape(self.shape, shape) != shape:
      raise ArgumentError(f"can't broadcast shape {self.shape} to {shape}")
    return self.expand(shape)
  def pad(self, padding: Sequence[int] | Sequence[tuple[int, int] | None], value: ConstType = 0, mode: str = "constant") -> Tensor:
    """padding per axis as ((before, after), ...), or flat PyTorch style (last axis first).
    mode 'reflect', 'replicate' or 'circular' is done by ReorderOps._pad_mode."""
    if all(isinstance(p, int) for p in padding):
      if len(padding) % 2 or len(padding) // 2 > self.ndim: raise ArgumentError(f"padding {padding} doesn't fit a tensor of {self.ndim} dims")
      pairs = [(0, 0)] * (self.ndim - len(padding) // 2) + [(padding[i], padding[i + 1]) for i in range(len(padding) - 2, -1, -2)]
    else:
      if len(padding) != self.ndim: raise ArgumentError(f"padding {padding} needs one entry per axis ({self.ndim})")
      pairs = [(0, 0) if p is None else tuple(p) for p in padding]
    if any(isinstance(x, UOp) for p in pairs for x in p):  # a symbolic amount must be a size: never negative
      pairs = [tuple(x if isinstance(x, int) else _check_size(x, f"padding {pairs}") for x in p) for p in pairs]
    if mode != "constant":
      if value != 0: raise ArgumentError(f"padding mode {mode!r} doesn't take a fill value (got {value})")
      return self._pad_mode(pairs, mode)
    # negative padding cuts
    neg = lambda x: isinstance(x, int) and x < 0
    t = self.shrink(tuple((-b if neg(b) else 0, s + a if neg(a) else s) for (b, a), s in zip(pairs, self.shape)))
    pos = tuple((0 if neg(b) else b, 0 if neg(a) else a) for b, a in pairs)
    if all(p == (0, 0) for p in pos): return t
    out = self._new(UOp(Ops.PAD, t.dtype, (t.uop,), pos))
    if value == 0: return out
    inside = Tensor.full(t.shape, True, dtype=dtypes.bool, device=self.device).pad(pos)
    return inside.where(out, Tensor(_const(value, self.dtype, self.device)))  # the value takes the tensor's dtype, as in torch
  def shrink(self, arg: Sequence[tuple[int, int] | None]) -> Tensor:
    if len(arg) != self.ndim: raise ArgumentError(f"shrink {arg} needs one entry per axis ({self.ndim})")
    # static sizes and bounds (the common case, chunk's and a slice's): each bound checked as ints, in one loop
    out, whole = [], True
    for a, n in zip(arg, self.uop.shape):
      if type(n) is not int: break
      if a is None: out.append((0, n))
      elif type(a) is tuple and len(a) == 2 and type(b := a[0]) is int and type(e := a[1]) is int and 0 <= b <= e <= n:
        out.append(a)
        whole = whole and b == 0 and e == n
      else: break
    else: return self if whole else self._view(UOp(Ops.SHRINK, self.uop.dtype, (self.uop,), tuple(out)))
    arg = tuple((0, s) if a is None else tuple(x if type(x) is int else _check_size(x, f"shrink {arg}") for x in a) for a, s in zip(arg, self.shape))
    for (b, e), s in zip(arg, self.shape):
      # with Variables it must hold for every value they can take: a TinyJit replay may bind any of them
      if not (sym_le(0, b) and sym_le(b, e) and sym_le(e, s)):
        raise ArgumentError(f"shrink {arg} is out of bounds for shape {self.shape}" + ("" if all(isinstance(x, int) for x in (b, e, s)) else
                         f" for some values of its Variables (the range [{smin(b)}, {smax(e)}] must fit in {smin(s)})"))
    if all(a == (0, s) for a, s in zip(arg, self.shape)): return self
    return self._view(UOp(Ops.SHRINK, self.dtype, (self.uop,), arg))
  def flip(self, *axis) -> Tensor:
    axis = tuple(axis[0]) if len(axis) == 1 and isinstance(axis[0], (tuple, list)) else axis
    ax = {_normalize_axis(a, self.ndim) for a in axis}
    if not ax: return self
    return self._new(UOp(Ops.FLIP, self.dtype, (self.uop,), tuple(i in ax for i in range(self.ndim))))
  def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
    order = list(range(self.ndim))
    a, b = _normalize_axis(dim0, self.ndim), _normalize_axis(dim1, self.ndim)
    order[a], order[b] = order[b], order[a]
    return self.permute(order)
  @property
  def T(self) -> Tensor: return self.permute(tuple(reversed(range(self.ndim))))
  @property
  def mT(self) -> Tensor: return self.transpose(-2, -1)
  def t(self) -> Tensor:
    if self.ndim > 2: raise ArgumentError(f"t() expects a tensor of at most 2 dimensions, got {self.ndim}")
    return self.T
  def is_contiguous(self) -> bool:
    """Whether the elements lie in memory in row-major order (a lazy result will: realize writes it so)."""
    u = self.uop
    while u.op is Ops.RESHAPE: u = u.src[0]
    return u.op not in GroupOp.Movement or is_contiguous_buffer(self.uop)
  def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if self.ndim == 0: return self.reshape(1)
    s, e = _normalize_axis(start_dim, self.ndim), _normalize_axis(end_dim, self.ndim)
    return self.reshape(self.shape[:s] + (prod(self.shape[s:e + 1]),) + self.shape[e + 1:])
  def unflatten(self, dim: int, sizes: tuple[int, ...]) -> Tensor:
    d = _normalize_axis(dim, self.ndim)
    return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1:])
  def squeeze(self, dim: int | None = None) -> Tensor:
    if dim is None: return self.reshape(tuple(s for s in self.shape if s != 1))
    d = _normalize_axis(dim, self.ndim)
    return self if self.ndim == 0 or self.shape[d] != 1 else self.reshape(self.shape[:d] + self.shape[d + 1:])
  def unsqueeze(self, dim: int) -> Tensor:
    shape = self.uop.shape
    d = _normalize_axis(dim, len(shape), extra=1)
    if type(math.prod(shape)) is not int: return self.reshape(shape[:d] + (1,) + shape[d:])  # (symbolic sizes: checked)
    return self._view(UOp(Ops.RESHAPE, self.uop.dtype, (self.uop,), shape[:d] + (1,) + shape[d:]))
  def repeat(self, *repeats) -> Tensor:
    repeats = tuple(repeats[0]) if len(repeats) == 1 and isinstance(repeats[0], (tuple, list)) else repeats
    if len(repeats) < self.ndim: raise ArgumentError(f"repeat {repeats} needs at least {self.ndim} counts")
    base = (1,) * (len(repeats) - self.ndim) + self.shape
    t = self.reshape(flatten((1, s) for s in base)).expand(flatten(zip(repeats, base)))
    return t.reshape(tuple(r * s for r, s in zip(repeats, base)))

  def __getitem__(self, index: Any) -> Tensor:
    """Basic indexing: ints, slices (any step), None and Ellipsis. Tensors (and lists) as indices go to
    IndexingOps._tensor_getitem (advanced indexing, bool masks)."""
    idx = list(index) if isinstance(index, tuple) else [index]
    if (t := self._static_index(idx)) is not None: return t
    if any(isinstance(i, (Tensor, list)) or type(i).__module__ == "numpy" or (isinstance(i, tuple) and isinstance(index, tuple)) for i in idx):
      return self._tensor_getitem(index)
    idx = full_index(idx, self.ndim)
    t, dim, out_shape = self, 0, []
    shrink, flips, steps = [], [], []
    for i in idx:
      if i is None: out_shape.append(1); continue
      size = self.shape[dim]
      if isinstance(i, int):
        if not -size <= i < size: raise IndexError(f"index {i} is out of bounds for axis {dim} with size {size}")
        i %= size
        shrink.append((i, i + 1)); flips.append(False); steps.append(1)
      elif any(isinstance(x, UOp) for x in (i.start, i.stop, i.step, size)):
        # a symbolic slice or axis: no clamping or negative positions, which would depend on the value
        start, stop = 0 if i.start is None else i.start, size if i.stop is None else i.stop
        if i.step not in (None, 1) or any(isinstance(x, int) and x < 0 for x in (start, stop)):
          raise IndexError(f"slice {i} of a symbolic axis (size {size}): only non-negative start:stop with step 1 is supported")
        shrink.append((start, stop)); flips.append(False); steps.append(1); out_shape.append(sym_sum(stop, sym_neg(start)))
      else:
        start, stop, step = i.indices(size)
        if step == 0: raise ArgumentError("slice step cannot be zero")
        n = len(range(start, stop, step))
        if step > 0: shrink.append((start, start + max(n - 1, 0) * step + (1 if n else 0))); flips.append(False)
        else: shrink.append((start + (n - 1) * step if n else 0, start + 1 if n else 0)); flips.append(True)
        steps.append(abs(step)); out_shape.append(n)
      dim += 1
    t = t.shrink(tuple(shrink)).flip(*[d for d, f in enumerate(flips) if f])
    if any(s != 1 for s in steps):
      # take every k-th element: pad each axis to a multiple of k, split it as (n, k), keep column 0
      t = t.pad(tuple((0, (-s) % k) for s, k in zip(t.shape, steps)))
      padded = t.shape
      t = t.reshape(flatten((s // k, k) for s, k in zip(padded, steps)))
      t = t.shrink(tuple(flatten(((0, s // k), (0, 1)) for s, k in zip(padded, steps))))
    t = t.reshape(tuple(out_shape))
    return t if t is self else self._mark_view(t)  # a basic index is a view, as in PyTorch

  def _static_index(self, idx: list[Any]) -> Tensor | None:
    """The common basic index (ints, slices of step 1, None, one Ellipsis, into static sizes) as __getitem__ builds it
    (a SHRINK, then a RESHAPE, the result a view of self), without its general path's per-axis lists and the views
    of its steps; None for any other index (the general path checks it and builds it, or raises)."""
    shape = self.uop.shape
    if type(math.prod(shape)) is not int: return None
    n_ell = 0
    for i in idx:
      if type(i) is int or i is None: continue
      if i is Ellipsis: n_ell += 1; continue
      if type(i) is slice and (i.step is None or type(i.step) is int and i.step == 1) and (i.start is None or type(i.start) is int) \
         and (i.stop is None or type(i.stop) is int): continue
      return None
    consumed = len(idx) - n_ell - idx.count(None)
    if n_ell > 1 or consumed > len(shape): return None
    if len(shape) > consumed:  # the axes the index doesn't name: whole, at its Ellipsis or its end
      e = idx.index(Ellipsis) if n_ell else len(idx)
      idx = idx[:e] + [slice(None)] * (len(shape) - consumed) + idx[e + 1:]
    elif n_ell: idx = [i for i in idx if i is not Ellipsis]
    arg, cut, out, dim, whole = [], [], [], 0, True
    for i in idx:
      if i is None: out.append(1); continue
      size = shape[dim]
      if type(i) is int:
        if not -size <= i < size: raise IndexError(f"index {i} is out of bounds for axis {dim} with size {size}")
        i %= size
        arg.append((i, i + 1)); cut.append(1)
        whole = whole and size == 1
      else:
        start, stop, _ = i.indices(size)
        k = max(stop - start, 0)
        arg.append((start, start + k)); cut.append(k); out.append(k)
        whole = whole and start == 0 and k == size
      dim += 1
    u = self.uop if whole else UOp(Ops.SHRINK, self.uop.dtype, (self.uop,), tuple(arg))
    if (out_shape := tuple(out)) != tuple(cut): u = UOp(Ops.RESHAPE, u.dtype, (u,), out_shape)
    return self if u is self.uop else self._mark_view(Tensor(u))

  # ***** elementwise *****
  def _operands(self, x: Tensor | ConstType, reverse: bool = False, out_dtype: DType | None = None) -> tuple[Tensor, Tensor]:
    if isinstance(x, Tensor):
      su, xu = self.uop, x.uop
      # the common cases, two tensors of one dtype on one device: nothing to promote, and the same shape or a 0-d one
      # beside the other (an optimizer's hyperparameter): the nodes the general path below builds, without its checks
      if out_dtype is None and su.dtype == xu.dtype and su.device == xu.device:
        if (ss := su.shape) == (xs := xu.shape): return (x, self) if reverse else (self, x)
        if not xs: x = Tensor(_expand_scalar(xu, ss))
        elif not ss: self = Tensor(_expand_scalar(su, xs))
        if not xs or not ss: return (x, self) if reverse else (self, x)
        # both with dims (a bias, a row's statistic beside the row): one dtype needs no promotion nor cast, only the
        # broadcast the general path below makes (the same nodes, without its dtype checks)
        try: shape = broadcast_shape(ss, xs)
        except ValueError as e: raise ArgumentError(str(e)) from None  # (as below)
        a, b = self._broadcast_to(shape), x._broadcast_to(shape)
        return (b, a) if reverse else (a, b)
      if x.device != self.device: raise ArgumentError(f"tensors on different devices: {self.device} and {x.device}")
      # as in PyTorch, a 0-d tensor beside one with dimensions is weak, like a Python scalar
      dt = least_upper_dtype(self.dtype, x.dtype) if (self.ndim == 0) == (x.ndim == 0) else \
        _weak_promote(self.dtype, x.dtype) if x.ndim == 0 else _weak_promote(x.dtype, self.dtype)
    elif ((tx := type(x)) is float or tx is int) and out_dtype is None and (su := self.uop).dtype in _FLOATS:
      # an int or float beside a float tensor: the tensor's dtype, as _weak_promote finds, and no cast (most scalar ops
      # of a training step, a GELU's polynomial, an optimizer's: 9 -> 7.5 us an op)
      c = Tensor(_broadcast_const(x, su.dtype, su.device, su.shape))
      return (c, self) if reverse else (self, c)
    elif isinstance(x, (bool, int, float)):  # Python scalars are weak; a constant, broadcast to self (the common case)
      dt = out_dtype or _weak_promote(self.dtype, dtypes.from_py(x))
      a, c = self.cast(dt), Tensor(_broadcast_const(x, dt, self.device, self.shape))
      return (c, a) if reverse else (a, c)
    elif isinstance(x, UOp) and dtypes.is_int(x.dtype) and x.shape == ():  # a bound Variable (or a size made of them): an int whose value can change
      dt, x = _weak_promote(self.dtype, dtypes.default_int), Tensor(x.substitute({b: Tensor(b, device=self.device).uop for b in x.toposort if b.op is Ops.BIND}))
    elif isinstance(x, ValuesIndices): raise TypeError(_VI_HINT.format(what="used as an operand"))
    else: raise TypeError(f"unsupported operand type {type(x).__name__}")
    dt = out_dtype or dt
    a, b = self.cast(dt), x.cast(dt)
    try: shape = broadcast_shape(a.shape, b.shape)
    except ValueError as e: raise ArgumentError(str(e)) from None  # torch raises RuntimeError here: ours is both
    a, b = a._broadcast_to(shape), b._broadcast_to(shape)
    return (b, a) if reverse else (a, b)
  def _alu(self, op: Ops, *src: Tensor) -> Tensor:
    dt = dtypes.bool if op in GroupOp.Comparison else src[-1].dtype if src else self.dtype
    return Tensor(UOp(op, dt, (self.uop, *(s.uop for s in src))))
  def cast(self, dtype: DType | str) -> Tensor:
    dtype = to_dtype(dtype)
    return self if self.dtype == dtype else Tensor(UOp(Ops.CAST, dtype, (self.uop,)))
  def bitcast(self, dtype: DType | str) -> Tensor:
    dtype = to_dtype(dtype)
    if dtype.itemsize != self.dtype.itemsize: raise ArgumentError(f"bitcast from {self.dtype} to {dtype} needs equal item sizes")
    return self if self.dtype == dtype else Tensor(UOp(Ops.BITCAST, dtype, (self.uop,)))
  def float(self) -> Tensor: return self.cast(dtypes.float32)
  def bfloat16(self) -> Tensor: return self.cast(dtypes.bfloat16)
  def short(self) -> Tensor: return self.cast(dtypes.int16)
  def byte(self) -> Tensor: return self.cast(dtypes.uint8)
  def char(self) -> Tensor: return self.cast(dtypes.int8)
  def type_as(self, other: Tensor) -> Tensor: return self.cast(other.dtype)
  def type(self, dtype: DType | str | None = None) -> Tensor | str:
    """With a dtype, a cast; without, torch's type name ('torch.FloatTensor'), so code comparing it runs unchanged."""
    if dtype is None: return f"torch.{_TORCH_TYPE_NAMES.get(self.dtype, self.dtype.name)}Tensor"
    return self.cast(dtype)
  def half(self) -> Tensor: return self.cast(dtypes.float16)
  def double(self) -> Tensor: return self.cast(dtypes.float64)
  def int(self) -> Tensor: return self.cast(dtypes.int32)
  def long(self) -> Tensor: return self.cast(dtypes.int64)
  def bool(self) -> Tensor: return self.cast(dtypes.bool)

  def add(self, x, reverse=False, *, alpha=None) -> Tensor: return _binop(Ops.ADD, self, x if alpha is None else x * alpha, reverse)
  def sub(self, x, reverse=False, *, alpha=None) -> Tensor:
    if alpha is not None: x = x * alpha
    # PyTorch refuses a bool on either side of -, even with a float or int on the other
    if self.dtype == dtypes.bool or isinstance(x, bool) or (isinstance(x, Tensor) and x.dtype == dtypes.bool):
      raise TypeError("subtraction with a bool tensor or bool scalar is not supported; use logical_xor, ~ or cast first")
    return _binop(Ops.SUB, self, x, reverse)
  def mul(self, x, reverse=False) -> Tensor: return _binop(Ops.MUL, self, x, reverse)
  def div(self, x, reverse=False, rounding_mode: str | None = None) -> Tensor:
    if rounding_mode is None:
      a, b = self._operands(x, reverse)
      if not dtypes.is_float(a.dtype): a, b = a.cast(dtypes.default_float), b.cast(dtypes.default_float)
      return a._alu(Ops.FDIV, b)
    if rounding_mode == "trunc":
      a, b = self._operands(x, reverse)
      return a._alu(Ops.IDIV, b) if dtypes.is_int(a.dtype) else (a._alu(Ops.FDIV, b)).trunc()
    if rounding_mode == "floor": return self.floor_divide(x, reverse)
    raise ArgumentError(f"div rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
  def floor_divide(self, x, reverse=False) -> Tensor:
    a, b = self._operands(x, reverse)
    if a.dtype == dtypes.bool: raise TypeError("floor division of bools is not supported (as in PyTorch); cast to an integer type first")
    if not dtypes.is_int(a.dtype): return a._alu(Ops.FDIV, b).floor()
    q = a._alu(Ops.IDIV, b)
    # C truncates; Python and PyTorch floor: step down where the signs differ and it wasn't exact
    fix = a._alu(Ops.MOD, b).ne(0) & ((a < 0) ^ (b < 0))
    return q - fix.cast(q.dtype)
  def mod(self, x, reverse=False) -> Tensor:
    a, b = self._operands(x, reverse)
    if not dtypes.is_int(a.dtype):
      q = (a / b).floor()
      return (a - q * b)._with_derivative(a, 1.0, b, -q)  # torch's: 1 and -floor(a/b) (the chain rule gave nan at b = 0)
    r = a._alu(Ops.MOD, b)
    return (r.ne(0) & ((r < 0) ^ (b < 0))).where(r + b, r)
  def maximum(self, x) -> Tensor: return _binop(Ops.MAX, self, x)
  def minimum(self, x) -> Tensor:
    a, b = self._operands(x)
    return (a < b).where(a, b) if not dtypes.is_float(a.dtype) else -((-a).maximum(-b))
  def pow(self, x, reverse=False) -> Tensor:
    """torch.pow. Gradients as torch's: d/dself = e * self**(e-1) (0 where e == 0), d/de = self**e * log(self) (0 where
    self == 0 and e >= 0), written out rather than taken through the branches for the special cases (a chain rule
    through `where(b == 0, 1, ...)` gave 0 for 2**x at x = 0, and through 1/(x*x) nan at 0)."""
    if not reverse and isinstance(x, (int, float)) and float(x).is_integer() and abs(x) <= 8 and not isinstance(x, bool):
      if isinstance(x, int) and x < 0 and not dtypes.is_float(self.dtype):
        raise ArgumentError(f"integer tensor ({self.dtype}) to a negative integer power ({x}) is not allowed, as in PyTorch; use a float")
      base = self.cast(_weak_promote(self.dtype, dtypes.from_py(x)))  # torch's dtype: a float exponent makes ints float, an int makes bools int
      out = base._small_int_pow(int(x))
      if not dtypes.is_float(out.dtype): return out
      return out._with_derivative(base, base.zeros_like() if x == 0 else base._scalar_pow_value(x - 1) * x)
    if not reverse and isinstance(x, float) and x in (0.5, -0.5):
      base = self._float_unary()
      return base._scalar_pow_value(x)._with_derivative(base, base._scalar_pow_value(x - 1) * x)
    a, b = self._operands(x, reverse)
    if dtypes.is_int(a.dtype): return a._int_pow(b)
    if not dtypes.is_float(a.dtype): a, b = a.cast(dtypes.default_float), b.cast(dtypes.default_float)
    out = a._pow_value(b)
    scalar_e = not reverse and isinstance(x, (int, float)) and not isinstance(x, bool)  # torch's special cases apply to e - 1
    da = (b == 0).where(0.0, b * (a._scalar_pow_value(x - 1) if scalar_e else a._pow_value(b - 1)))
    db = ((a == 0) & (b >= 0)).where(0.0, out * a.log())
    return out._with_derivative(a, da, b, db)
  def _small_int_pow(self, n: int) -> Tensor:
    """self**n by multiplications (and a reciprocal for n < 0), exact as torch's for small integer n"""
    acc = self.ones_like() if n == 0 else self
    for _ in range(abs(n) - 1): acc = acc * self
    return acc.reciprocal() if n < 0 else acc
  def _scalar_pow_value(self, e: float) -> Tensor:
    """self**e for a Python exponent with torch's special cases (its derivative x**(e-1) takes them too: sqrt(-0) is -0,
    rsqrt(-0) is -inf, sqrt(-inf) is nan where C's pow gives inf)"""
    if float(e).is_integer() and abs(e) <= 8: return self._small_int_pow(int(e))
    if e == 0.5: return self.sqrt()
    if e == -0.5: return self.rsqrt()
    return self._pow_value(Tensor(_broadcast_const(float(e), self.dtype, self.device, self.shape)))
  def _pow_value(self, b: Tensor) -> Tensor:
    """self**b for floats, with C's (and torch's) special cases; no derivative of its own (pow gives it)."""
    a = self
    mag = (b * a.abs().log2()).exp2()
    odd = (b - 2 * (b / 2).floor()).eq(1)
    neg_ok = (b.trunc() == b) | (a == -math.inf)  # a negative base needs an integer exponent, except -inf (C's pow)
    out = (a < 0).where(neg_ok.where(odd.where(-mag, mag), math.nan), mag)
    at_zero = (b < 0).where(math.inf, 0.0)
    at_zero = (odd & (a.reciprocal() < 0)).where(-at_zero, at_zero)  # -0 to an odd power keeps its sign: (-0)**-1 is -inf
    out = ((a == 0) & b.isnan().logical_not()).where((b == 0).where(1.0, at_zero), out)
    # as C's pow (and torch): x**0 and 1**y are 1 even for nan, and (-1)**(+-inf) is 1; log2/exp2 would give nan
    return ((b == 0) | (a == 1) | ((a == -1) & b.isinf())).where(1.0, out).cast(a.dtype)
  def _int_pow(self, e: Tensor) -> Tensor:
    """Exact integer power by repeated squaring, wrapping on overflow as torch's integer pow does.
    A negative exponent gives 0, except for the bases 1 and -1 (torch's integer semantics too)."""
    neg = e < 0
    e, acc, base = neg.where(-e, e), self.ones_like(), self
    for _ in range(8 * self.dtype.itemsize):
      acc = (e & 1).ne(0).where(acc * base, acc)
      base, e = base * base, e >> 1
    return neg.where((self.abs() == 1).where(acc, 0), acc)
  def _logic(self, op: Ops, x, reverse=False) -> Tensor:
    a, b = self._operands(x, reverse)
    if dtypes.is_float(a.dtype):
      raise UnsupportedDtype(f"{_LOGIC_NAMES[op]} is not implemented for {a.dtype} tensors (as in torch, and tinygrad's shifts take "
                             "integers only): it needs bool or integer tensors" + (", e.g. x * 2**n for a shift" if op in (Ops.SHL, Ops.SHR) else ""))
    return a._alu(op, b)
  def bitwise_and(self, x) -> Tensor: return self._logic(Ops.AND, x)
  def bitwise_or(self, x) -> Tensor: return self._logic(Ops.OR, x)
  def bitwise_xor(self, x) -> Tensor: return self._logic(Ops.XOR, x)
  def logical_not(self) -> Tensor: return self.cast(dtypes.bool)._alu(Ops.CMPNE, Tensor(_const(True, dtypes.bool, self.device))._broadcast_to(self.shape))
  def bitwise_not(self) -> Tensor:
    if self.dtype == dtypes.bool: return self.logical_not()
    if dtypes.is_float(self.dtype): raise TypeError(f"~ needs bool or integer tensors, got {self.dtype}")
    return self ^ -1 if not dtypes.is_unsigned(self.dtype) else self ^ dtypes.max(self.dtype)
  def lshift(self, x, reverse: bool = False) -> Tensor: return self._shift(Ops.SHL, x, reverse)
  def rshift(self, x, reverse: bool = False) -> Tensor: return self._shift(Ops.SHR, x, reverse)
  bitwise_left_shift, bitwise_right_shift = lshift, rshift  # torch's names
  def _shift(self, op: Ops, x, reverse: bool = False) -> Tensor:
    # C leaves a shift by a negative amount, or by the bit width or more, undefined (CPU and PYTHON disagree);
    # torch gives 0 for << and the sign fill for >>, so only in-range amounts reach the ALU
    a, s = self._operands(x, reverse)
    ok = (s >= 0) & (s < 8 * a.dtype.itemsize)
    out = a._logic(op, ok.where(s, 0))
    return ok.where(out, 0 if op is Ops.SHL else (a < 0).where(-1, 0).cast(a.dtype))
  def eq(self, x) -> Tensor: a, b = self._operands(x); return a._alu(Ops.CMPEQ, b)
  def ne(self, x) -> Tensor: a, b = self._operands(x); return a._alu(Ops.CMPNE, b)
  def lt(self, x, reverse=False) -> Tensor: a, b = self._operands(x, reverse); return a._alu(Ops.CMPLT, b)
  def le(self, x) -> Tensor: a, b = self._operands(x); return (b._alu(Ops.CMPLT, a)).logical_not() if not dtypes.is_float(a.dtype) else (a._alu(Ops.CMPLT, b) | a._alu(Ops.CMPEQ, b))
  def gt(self, x) -> Tensor: return self.lt(x, reverse=True)
  def ge(self, x) -> Tensor: a, b = self._operands(x); return (a._alu(Ops.CMPLT, b)).logical_not() if not dtypes.is_float(a.dtype) else (b._alu(Ops.CMPLT, a) | a._alu(Ops.CMPEQ, b))
  def where(self, x: Tensor | ConstType, y: Tensor | ConstType) -> Tensor:
    cond = self.cast(dtypes.bool)
    if isinstance(x, Tensor): x, y = x._operands(y)
    elif isinstance(y, Tensor): y, x = y._operands(x)
    else:
      dt = least_upper_dtype(dtypes.from_py(x), dtypes.from_py(y))
      x, y = Tensor(_const(x, dt, self.device)), Tensor(_const(y, dt, self.device))
    try: shape = broadcast_shape(cond.shape, x.shape, y.shape)
    except ValueError as e: raise ArgumentError(str(e)) from None
    return Tensor(UOp(Ops.WHERE, x.dtype, (cond._broadcast_to(shape).uop, x._broadcast_to(shape).uop, y._broadcast_to(shape).uop)))

  __add__ = lambda self, x: self.add(x); __radd__ = lambda self, x: self.add(x, True)
  __sub__ = lambda self, x: self.sub(x); __rsub__ = lambda self, x: self.sub(x, True)
  __mul__ = lambda self, x: self.mul(x); __rmul__ = lambda self, x: self.mul(x, True)
  __truediv__ = lambda self, x: self.div(x); __rtruediv__ = lambda self, x: self.div(x, True)
  __floordiv__ = lambda self, x: self.floor_divide(x); __rfloordiv__ = lambda self, x: self.floor_divide(x, True)
  __mod__ = lambda self, x: self.mod(x); __rmod__ = lambda self, x: self.mod(x, True)
  __pow__ = lambda self, x: self.pow(x); __rpow__ = lambda self, x: self.pow(x, True)
  __and__ = lambda self, x: self.bitwise_and(x); __rand__ = lambda self, x: self.bitwise_and(x)
  __or__ = lambda self, x: self.bitwise_or(x); __ror__ = lambda self, x: self.bitwise_or(x)
  __xor__ = lambda self, x: self.bitwise_xor(x); __rxor__ = lambda self, x: self.bitwise_xor(x)
  __lshift__ = lambda self, x: self.lshift(x); __rshift__ = lambda self, x: self.rshift(x)
  __rlshift__ = lambda self, x: self.lshift(x, True); __rrshift__ = lambda self, x: self.rshift(x, True)
  __invert__ = lambda self: self.bitwise_not()
  __neg__ = lambda self: self.neg()
  __lt__ = lambda self, x: self.lt(x); __gt__ = lambda self, x: self.gt(x)
  __le__ = lambda self, x: self.le(x); __ge__ = lambda self, x: self.ge(x)
  __eq__ = lambda self, x: self.eq(x); __ne__ = lambda self, x: self.ne(x)  # type: ignore[assignment]
  __matmul__ = lambda self, x: self.matmul(x); __rmatmul__ = lambda self, x: x.matmul(self) if isinstance(x, Tensor) else Tensor(x).matmul(self)
  def __iadd__(self, x): return self._write(self._fresh() + x)
  def __isub__(self, x): return self._write(self._fresh() - x)
  def __imul__(self, x): return self._write(self._fresh() * x)
  def __itruediv__(self, x): return self._write(self._fresh() / x)
  def __ilshift__(self, x): return self._write(self._fresh() << x)
  def __irshift__(self, x): return self._write(self._fresh() >> x)

  # ***** in place (torch's x.add_(y)...): lazy like assign; the family is generated below the class *****
  def _write(self, value: Tensor | ConstType) -> Tensor:
    """An in-place op's result written into self, with torch's rules: no write into a leaf that requires grad while
    autograd records, and no result of a higher kind (float into an int tensor) cast down silently."""
    if self._requires_grad and GradMode.enabled:
      raise RuntimeError("a leaf tensor that requires grad is used in an in-place operation: wrap the update in "
                         "`with attograd.no_grad():`, or use assign")
    if isinstance(value, Tensor) and kind(value.dtype) > kind(self.dtype):
      raise RuntimeError(f"result type {value.dtype} can't be cast to the desired output type {self.dtype} in an in-place operation")
    return self.assign(value)
  def zero_(self) -> Tensor: return self._write(Tensor.zeros(self.shape, dtype=self.dtype, device=self.device))
  def fill_(self, value: Tensor | ConstType) -> Tensor:
    v = value.cast(self.dtype) if isinstance(value, Tensor) else Tensor(_const(value, self.dtype, self.device))
    return self._write(v._broadcast_to(self.shape))
  def copy_(self, src: Tensor | Any, non_blocking: bool = False) -> Tensor:
    src = src if isinstance(src, Tensor) else Tensor(src, device=self.device)
    return self.assign(src.to(self.device))  # copy_ casts freely, as torch's
  def requires_grad_(self, value: bool = True) -> Tensor:
    self.requires_grad = value
    return self
  def detach_(self) -> Tensor:
    """Cut this tensor from the graph it came from, in place."""
    self.uop = UOp(Ops.DETACH, self.dtype, (self.uop,))
    return self

  # unary math
  def _float_unary(self) -> Tensor: return self if dtypes.is_float(self.dtype) else self.cast(dtypes.default_float)
  def neg(self) -> Tensor:
    if self.dtype == dtypes.bool: return self.logical_not()  # torch refuses, tinygrad defines it: the other truth value
    return self._alu(Ops.NEG)
  def exp2(self) -> Tensor: return self._float_unary()._alu(Ops.EXP2)
  def log2(self) -> Tensor: return self._float_unary()._alu(Ops.LOG2)
  def log(self) -> Tensor: return self._float_unary()._alu(Ops.LOG2) * math.log(2)
  def sqrt(self) -> Tensor: return self._float_unary()._alu(Ops.SQRT)
  def rsqrt(self) -> Tensor: return self.sqrt().reciprocal()
  def reciprocal(self) -> Tensor: return self._float_unary()._alu(Ops.RECIP)
  def sin(self) -> Tensor: return self._float_unary()._alu(Ops.SIN)
  def cos(self) -> Tensor:
    # 1 - 2*sin(x/2)^2: x/2 is exact, while pi/2 - x rounds away the digits of a large x (cos(3e4) was off by 4e-4)
    s = (self._float_unary() * 0.5)._alu(Ops.SIN)
    return 1 - 2 * s * s
  def tan(self) -> Tensor:
    x = self._float_unary()
    if x.dtype.itemsize < 4: return x.cast(dtypes.float32).tan().cast(x.dtype)  # rounding sin and cos to 16 bits first costs 2e-2 near pi/2
    return x.sin() / x.cos()
  def trunc(self) -> Tensor: return self if not dtypes.is_float(self.dtype) else self._alu(Ops.TRUNC)
  def floor(self) -> Tensor:
    if not dtypes.is_float(self.dtype): return self
    t = self.trunc()
    return (self < t).where(t - 1, t)
  def ceil(self) -> Tensor:
    if not dtypes.is_float(self.dtype): return self
    t = self.trunc()
    return (self > t).where(t + 1, t)
  def round(self) -> Tensor:
    """Round half to even, as PyTorch does."""
    if not dtypes.is_float(self.dtype): return self
    f = self.floor()
    diff = self - f
    even = (f - 2 * (f * 0.5).floor()).eq(0)
    return (diff > 0.5).where(f + 1, (diff < 0.5).where(f, even.where(f, f + 1)))
  def abs(self) -> Tensor:
    if dtypes.is_unsigned(self.dtype) or self.dtype == dtypes.bool: return self
    if not dtypes.is_float(self.dtype): return (self < 0).where(-self, self)
    # floats: the sign bit cleared, so abs(+-0.0) is +0.0 and NaN stays NaN (max(x, -x) gave -0.0 for +0.0, and its
    # NaN test in a select made gcc leave every math function built on abs scalar: a tanh-GELU ran at 26 ns a value).
    # The derivative is torch's sign(x), 0 at 0
    bits = _UINT_OF_SIZE[self.dtype.itemsize]
    return (self.bitcast(bits) & (1 << (8 * self.dtype.itemsize - 1)) - 1).bitcast(self.dtype)._with_derivative(self, self.sign())
  def sign(self) -> Tensor:
    if self.dtype == dtypes.bool: return self
    return (self > 0).where(1, (self < 0).where(-1, 0)).cast(self.dtype)  # as torch: sign(nan) and sign(-0.0) are 0
  def square(self) -> Tensor:
    # a float squares to x * x with the derivative 2x: the nodes pow(2) builds, without its dispatch (optimizers and
    # gradient clipping square every parameter's gradient each step). Not self * self in general: a bool squares to int64
    if (dt := (u := self.uop).dtype) in _FLOATS:  # (the nodes (self * self)._with_derivative(self, self * 2) builds)
      return Tensor(UOp(Ops.WITH_DERIVATIVE, dt, (UOp(Ops.MUL, dt, (u, u)), u, UOp(Ops.MUL, dt, (u, _broadcast_const(2, dt, u.device, u.shape))))))
    return self.pow(2)
  def relu(self) -> Tensor: return (self <= 0).where(0, self)  # NaN stays NaN; the gradient at 0 is 0, as in torch
  @replayed
  def sigmoid(self) -> Tensor:
    # the derivative s*(1-s), as torch: through 1/(1 + exp(-x)) it is 0 * inf = nan for x below -88
    x = self._float_unary()
    s = (1 + (-x).exp()).reciprocal()
    return s._with_derivative(x, s * (1 - s))
  @replayed
  def tanh(self) -> Tensor:
    """expm1(2x) / (expm1(2x) + 2): 2*sigmoid(2x) - 1 cancels near 0 (tanh(1e-8) was 0). Past |x| = 20 it is +-1.
    The derivative is 1 - tanh^2, as torch (not the chain rule through the clip at +-20)."""
    x = self._float_unary()
    e = (2.0 * x.clip(-20.0, 20.0)).expm1()
    t = e / (e + 2.0)
    return t._with_derivative(x, 1 - t * t)
  def clip(self, min_=None, max_=None, *, min=None, max=None) -> Tensor:
    """torch.clamp: the gradient reaches self where min <= self <= max (1 at the bounds), min where self < min and max
    where self > max; NaN stays NaN and passes no gradient. With min > max every element is max."""
    if min is not None: min_ = min
    if max is not None: max_ = max
    if min_ is None and max_ is None: raise ArgumentError("clip needs min or max")
    t = self if min_ is None else (self < min_).where(min_, self)
    t = t if max_ is None else (t > max_).where(max_, t)
    if not dtypes.is_float(t.dtype): return t
    for bound in (min_, max_):  # a NaN bound gives NaN (torch's max/min propagate it)
      if isinstance(bound, Tensor): t = bound.isnan().where(bound, t)
    # torch's gradients: self where min <= self <= max; min where self < min < max; max where self > max or min > max
    # (with min == max and self below it, nobody gets one); NaN anywhere passes none
    x = self.cast(t.dtype)
    ok_lo, ok_hi = (x >= min_) if min_ is not None else None, (x <= max_) if max_ is not None else None
    d_self = ok_lo & ok_hi if ok_lo is not None and ok_hi is not None else ok_lo if ok_lo is not None else ok_hi
    pairs = [x, d_self.where(1.0, 0.0)]
    if isinstance(min_, Tensor): pairs += [min_, ((x < min_) & (min_ < max_ if max_ is not None else True)).where(1.0, 0.0)]
    if isinstance(max_, Tensor): pairs += [max_, ((x > max_) | (min_ > max_ if min_ is not None else False)).where(1.0, 0.0)]
    return t.detach()._with_derivative(*pairs)
  clamp = clip
  def isnan(self) -> Tensor: return self.ne(self)
  def isinf(self, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
    if not dtypes.is_float(self.dtype) or not (detect_positive or detect_negative): return self.zeros_like(dtype=dtypes.bool)
    if detect_positive and detect_negative: return self.abs().eq(math.inf)
    return self.eq(math.inf if detect_positive else -math.inf)
  def isfinite(self) -> Tensor: return (self.isinf() | self.isnan()).logical_not()
  def lerp(self, end: Tensor, weight) -> Tensor: return self + (end - self) * weight
  def mul_add(self, y: Tensor | ConstType, z: Tensor | ConstType) -> Tensor:
    """self * y + z rounded once (a fused multiply-add, C's fma; WebGPU's renderer computes it as written), for floats:
    one instruction where the product and the sum were two (a quantized weight's decode, scale * q + min, in a matmul)."""
    a, b = self._operands(y)
    a, c = a._operands(z)
    b, c = b._operands(c)
    if not dtypes.is_float(a.dtype): raise ArgumentError(f"mul_add needs floats, got {a.dtype}")
    try: shape = broadcast_shape(a.shape, b.shape, c.shape)
    except ValueError as e: raise ArgumentError(str(e)) from None
    return Tensor(UOp(Ops.MULACC, a.dtype, (a._broadcast_to(shape).uop, b._broadcast_to(shape).uop, c._broadcast_to(shape).uop)))
  def logical_and(self, x) -> Tensor: return self.cast(dtypes.bool) & (x.cast(dtypes.bool) if isinstance(x, Tensor) else bool(x))
  def logical_or(self, x) -> Tensor: return self.cast(dtypes.bool) | (x.cast(dtypes.bool) if isinstance(x, Tensor) else bool(x))

  # ***** reductions *****
  def _axes(self, axis) -> tuple[int, ...]:
    if axis is None: return tuple(range(self.ndim))
    axis = (axis,) if isinstance(axis, int) else tuple(axis)
    out = tuple(sorted({_normalize_axis(a, self.ndim) for a in axis}))
    if len(out) != len(axis): raise ArgumentError(f"axis {axis} has repeated entries")
    return out if self.ndim else ()  # a 0-d tensor takes axis 0 or -1 (as torch) and has nothing to reduce
  def _reduce(self, op: Ops, axis=None, keepdim: bool = False) -> Tensor:
    u = self.uop
    shape = u.shape
    if type(numel := math.prod(shape)) is int and numel:  # static sizes, none 0 (the common case, its nodes directly)
      n = len(shape)
      axes = (axis % n,) if type(axis) is int and -n <= axis < n else self._axes(axis)
      if len(axes) == n and (parts := _split_for_cores(numel)) > 1:
        ret = self.reshape(parts, numel // parts)._reduce(op, 1).contiguous()._reduce(op, 0)
        return ret.reshape((1,) * n) if keepdim else ret
      if not axes: return self
      r = UOp(Ops.REDUCE_AXIS, u.dtype, (u,), (op, axes))
      # (the sum's own node reshaped: the REDUCE tensor a reshape would be a view of is held by no one)
      return Tensor(r if keepdim else UOp(Ops.RESHAPE, u.dtype, (r,), tuple([s for i, s in enumerate(shape) if i not in axes])))
    axes = self._axes(axis)
    if len(axes) == self.ndim and (parts := _split_for_cores(self.numel())) > 1:
      # a big full reduction is one loop no core can share: reduce `parts` rows apart (a kernel whose
      # rows the cores split), then the partials (adding fewer numbers in a row is also more accurate)
      ret = self.reshape(parts, self.numel() // parts)._reduce(op, 1).contiguous()._reduce(op, 0)
      return ret.reshape((1,) * self.ndim) if keepdim else ret
    out_shape = tuple(1 if i in axes else s for i, s in enumerate(self.shape))
    ret = self if not axes else Tensor(UOp(Ops.REDUCE_AXIS, self.dtype, (self.uop,), (op, axes)))
    if 0 in self.shape:  # nothing to reduce: the identity (or an empty result); max has one only for bools (any() is False)
      if op is Ops.MAX and self.dtype != dtypes.bool and any(self.shape[a] == 0 for a in axes):
        raise ArgumentError(f"max/min over an empty axis of shape {self.shape} has no identity")
      ret = Tensor.full(out_shape, 0 if op is Ops.ADD else 1 if op is Ops.MUL else dtypes.min(self.dtype), dtype=self.dtype, device=self.device)
    return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))
  # PyTorch's names beside tinygrad's: dim= is axis= (the reductions, softmax, scans); a keyword-only parameter rather
  # than a wrapper, which would cost every call a Python frame
  def sum(self, axis=None, keepdim: bool = False, dtype: DType | None = None, *, dim=None) -> Tensor:
    if dim is not None: axis = dim
    # as in PyTorch, integer and bool sums accumulate in int64 (unsigned in uint64)
    acc = to_dtype(dtype) if dtype is not None else (dtypes.uint64 if dtypes.is_unsigned(self.dtype) and self.dtype.itemsize >= 4 else dtypes.int64) \
      if not dtypes.is_float(self.dtype) else self.dtype
    return self.cast(acc)._reduce(Ops.ADD, axis, keepdim)
  def prod(self, axis=None, keepdim: bool = False, dtype: DType | None = None, *, dim=None) -> Tensor:
    if dim is not None: axis = dim
    acc = to_dtype(dtype) if dtype is not None else dtypes.int64 if not dtypes.is_float(self.dtype) else self.dtype
    return self.cast(acc)._reduce(Ops.MUL, axis, keepdim)
  # max/min have two meanings: torch's positional or dim= form x.max(1) returns (values, indices); tinygrad's
  # x.max(axis=1) returns the tensor. Project rule: where both define a result and differ PyTorch wins and tinygrad's
  # spelling keeps working, so the keyword decides. A tuple of dims (torch refuses it) reduces, as in tinygrad.
  def max(self, dim=None, keepdim: bool = False, *, axis=None) -> Tensor | ValuesIndices:
    """x.max() / x.max(axis=1): the max (a tensor); x.max(1) / x.max(dim=1): torch's (values, indices); x.max(t): torch.maximum."""
    if isinstance(dim, Tensor): return self.maximum(dim)
    if axis is not None:
      if dim is not None: raise TypeError("max() takes dim= (torch's values and indices) or axis= (tinygrad's tensor), not both")
      return self._reduce(Ops.MAX, axis, keepdim)
    if _one_dim(dim):
      idx = self.argmax(d := dim.__index__(), keepdim)
      return ValuesIndices(self._picked(d, idx, keepdim) if self._may_need_grad() else self._reduce(Ops.MAX, d, keepdim), idx)
    return self._reduce(Ops.MAX, dim, keepdim)
  def min(self, dim=None, keepdim: bool = False, *, axis=None) -> Tensor | ValuesIndices:
    """As max: x.min(axis=1) the tensor, x.min(1) / x.min(dim=1) torch's (values, indices), x.min(t) torch.minimum."""
    if isinstance(dim, Tensor): return self.minimum(dim)
    if axis is not None:
      if dim is not None: raise TypeError("min() takes dim= (torch's values and indices) or axis= (tinygrad's tensor), not both")
      return self.amin(axis, keepdim)
    if _one_dim(dim):
      idx = self.argmin(d := dim.__index__(), keepdim)
      return ValuesIndices(self._picked(d, idx, keepdim) if self._may_need_grad() else self.amin(d, keepdim), idx)
    return self.amin(dim, keepdim)
  def _picked(self, dim: int, idx: Tensor, keepdim: bool) -> Tensor:
    """The element at idx along dim: torch's max(dim)/min(dim) send the whole gradient to the index they return, where
    amax shares it among ties (taken only when a gradient may flow: the reduce is cheaper)"""
    if self.ndim == 0: return self
    d = _normalize_axis(dim, self.ndim)
    n = self.shape[d]
    ar = Tensor.arange(n, device=self.device).reshape((n,) + (1,) * (self.ndim - d - 1))
    hit = ar == (idx if keepdim else idx.unsqueeze(d))
    return hit.where(self, 0).sum(d, keepdim)
  def amax(self, dim=None, keepdim: bool = False, *, axis=None) -> Tensor: return self._reduce(Ops.MAX, dim if axis is None else axis, keepdim)
  def amin(self, dim=None, keepdim: bool = False, *, axis=None) -> Tensor:
    if axis is not None: dim = axis
    if dtypes.is_float(self.dtype): return -((-self).amax(dim, keepdim))
    if self.dtype == dtypes.bool: return self.logical_not().amax(dim, keepdim).logical_not()
    return ~((~self).amax(dim, keepdim))  # ~ reverses the order of signed and unsigned ints alike
  def mean(self, axis=None, keepdim: bool = False, *, dim=None, dtype: DType | None = None) -> Tensor:
    if dim is not None: axis = dim
    if dtype is not None: return self.cast(dtype).mean(axis, keepdim)
    # torch refuses the mean of ints and bools, tinygrad defines it (its (pred == y).mean()): the exact integer sum over
    # the count, a float (integer / gives the default float)
    axes = self._axes(axis)
    n = sym_prod(self.shape[a] for a in axes)
    if type(n) is int and n and (dt := self.uop.dtype) in _FLOATS:  # a float's sum over its count: the nodes sum and / build
      u = self._reduce(Ops.ADD, axes, keepdim).uop
      return Tensor(UOp(Ops.FDIV, dt, (u, _broadcast_const(n, dt, u.device, u.shape))))
    s = self.sum(axis, keepdim)
    return s / n if not isinstance(n, int) or n else s * math.nan  # a symbolic count of 0 divides 0 by 0: nan, as torch
  def var(self, axis=None, keepdim: bool = False, correction: int = 1, *, dim=None, unbiased: bool | None = None) -> Tensor:
    if dim is not None: axis = dim
    if unbiased is not None: correction = int(unbiased)
    if not dtypes.is_float(self.dtype): return self._float_unary().var(axis, keepdim, correction)  # as mean: torch refuses, tinygrad defines
    n = sym_prod(self.shape[a] for a in self._axes(axis))
    # the mean is detached, as torch's derivative 2(x - mean)/n leaves it: its own term is 0 in exact arithmetic, and with
    # an infinite element it is nan (inf - inf) spread over the whole row
    sq = (self - self.mean(axis, keepdim=True).detach()).square().sum(axis, keepdim)
    return sq / (max(n - correction, 0) if isinstance(n, int) else (n - correction).maximum(0))  # as torch: no degrees of freedom left divides by 0 (inf, or nan for 0/0)
  def std(self, axis=None, keepdim: bool = False, correction: int = 1, *, dim=None, unbiased: bool | None = None) -> Tensor:
    return self.var(axis, keepdim, correction, dim=dim, unbiased=unbiased)._masked_sqrt()
  def _masked_sqrt(self) -> Tensor:
    """sqrt whose derivative is 0 where the value is 0, as torch's std and norm backward (not 1/(2*0) times 0 = nan)"""
    r = self.sqrt()
    return r._with_derivative(self, (r == 0).where(0.0, 0.5 / r))
  def any(self, axis=None, keepdim: bool = False, *, dim=None) -> Tensor:
    """Always bool: PyTorch returns uint8 for uint8 input (a legacy quirk), attograd doesn't copy it. So does all()."""
    return self.cast(dtypes.bool).amax(axis if dim is None else dim, keepdim)
  def all(self, axis=None, keepdim: bool = False, *, dim=None) -> Tensor: return self.logical_not().any(axis, keepdim, dim=dim).logical_not()
  def argmax(self, axis=None, keepdim: bool = False, *, dim=None) -> Tensor:
    if dim is not None: axis = dim
    if axis is None:
      ret = self.flatten().argmax(0)
      return ret.reshape((1,) * self.ndim) if keepdim else ret
    a = _normalize_axis(axis, self.ndim)
    if self.ndim == 0: return Tensor.zeros((), dtype=dtypes.int64, device=self.device)
    n = self.shape[a]
    idx = Tensor.arange(n, 0, -1, device=self.device, dtype=dtypes.int64).reshape((n,) + (1,) * (self.ndim - a - 1))
    is_max = self == self.amax(a, keepdim=True)
    if dtypes.is_float(self.dtype): is_max = is_max | self.isnan()  # as in torch a NaN is the max, but NaN == NaN is False
    hit = is_max.cast(dtypes.int64) * idx
    return (n - hit.amax(a, keepdim=keepdim)).cast(dtypes.int64)
  def argmin(self, axis=None, keepdim: bool = False, *, dim=None) -> Tensor:
    return (-self if dtypes.is_float(self.dtype) else self.logical_not() if self.dtype == dtypes.bool else ~self).argmax(axis, keepdim, dim=dim)

  # ***** composites *****
  @replayed
  def matmul(self, x: Tensor) -> Tensor:
    """PyTorch's matmul: 1-D operands are vectors, leading dims broadcast."""
    if not isinstance(x, Tensor): raise TypeError(f"matmul with {type(x).__name__}")
    if self.ndim == 0 or x.ndim == 0: raise ArgumentError("matmul needs tensors of at least one dimension; use * for scalars")
    a = self.reshape(1, -1) if self.ndim == 1 else self
    b = x.reshape(-1, 1) if x.ndim == 1 else x
    if not sym_eq(a.shape[-1], b.shape[-2]):
      raise ArgumentError(f"matmul shapes {self.shape} and {x.shape} don't match: {a.shape[-1]} != {b.shape[-2]}")
    dt = least_upper_dtype(a.dtype, b.dtype)
    a, b = a.cast(dt), b.cast(dt)
    k, m = a.shape[-1], b.shape[-1]
    try: broadcast_shape(a.shape[:-2], b.shape[:-2])
    except ValueError: raise ArgumentError(f"matmul shapes {self.shape} and {x.shape}: batch dims {a.shape[:-2]} and {b.shape[:-2]} don't broadcast") from None
    prod_ = a.reshape(*a.shape[:-1], 1, k) * b.transpose(-1, -2).reshape(*b.shape[:-2], 1, m, k)
    out = prod_._reduce(Ops.ADD, -1)
    if self.ndim == 1: out = out.squeeze(-2)
    if x.ndim == 1: out = out.squeeze(-1)
    return out
  dot = matmul
  def bmm(self, x: Tensor) -> Tensor:
    if self.ndim != 3 or not isinstance(x, Tensor) or x.ndim != 3 or self.shape[0] != x.shape[0]:
      raise ArgumentError(f"bmm needs two 3-D tensors with the same batch size, got {self.shape} and {getattr(x, 'shape', x)}")
    return self.matmul(x)
  def outer(self, x: Tensor) -> Tensor:
    if self.ndim != 1 or x.ndim != 1: raise ArgumentError(f"outer needs two 1-D tensors, got {self.shape} and {x.shape}")
    return self.reshape(-1, 1) * x.reshape(1, -1)
  ger = outer
  # ***** more of torch's spellings, each over ops above (issue 16 audit: what a PyTorch program reaches for next) *****
  def mm(self, x: Tensor) -> Tensor:
    if self.ndim != 2 or not isinstance(x, Tensor) or x.ndim != 2: raise ArgumentError(f"mm needs two 2-D tensors, got {self.shape} and {getattr(x, 'shape', x)}")
    return self.matmul(x)
  def mv(self, x: Tensor) -> Tensor:
    if self.ndim != 2 or not isinstance(x, Tensor) or x.ndim != 1: raise ArgumentError(f"mv needs a 2-D and a 1-D tensor, got {self.shape} and {getattr(x, 'shape', x)}")
    return self.matmul(x)
  def addcmul(self, tensor1: Tensor, tensor2: Tensor, value: ConstType = 1) -> Tensor: return self + value * (tensor1 * tensor2)
  def addcdiv(self, tensor1: Tensor, tensor2: Tensor, value: ConstType = 1) -> Tensor: return self + value * (tensor1 / tensor2)
  def clamp_min(self, min: Any) -> Tensor: return self.clamp(min=min)
  def clamp_max(self, max: Any) -> Tensor: return self.clamp(max=max)
  def remainder(self, x: Any) -> Tensor: return self.mod(x)  # torch.remainder is Python's %: the divisor's sign
  def view_as(self, other: Tensor) -> Tensor: return self.view(other.shape)
  def reshape_as(self, other: Tensor) -> Tensor: return self.reshape(other.shape)
  def expand_as(self, other: Tensor) -> Tensor: return self.expand(other.shape)
  def ravel(self) -> Tensor: return self.flatten()
  def swapaxes(self, axis0: int, axis1: int) -> Tensor: return self.transpose(axis0, axis1)
  swapdims = swapaxes
  def movedim(self, source: int | Sequence[int], destination: int | Sequence[int]) -> Tensor:
    src, dst = ([source], [destination]) if isinstance(source, int) else (list(source), list(destination))
    if len(src) != len(dst): raise ArgumentError(f"movedim: {len(src)} source dims and {len(dst)} destination dims")
    src, dst = [_normalize_axis(d, self.ndim) for d in src], [_normalize_axis(d, self.ndim) for d in dst]
    if len(set(src)) != len(src) or len(set(dst)) != len(dst): raise ArgumentError(f"movedim: repeated dims in {source} or {destination}")
    rest = iter(d for d in range(self.ndim) if d not in src)
    where = dict(zip(dst, src))
    return self.permute(*(where[i] if i in where else next(rest) for i in range(self.ndim)))
  moveaxis = movedim
  def narrow(self, dim: int, start: int, length: int) -> Tensor:
    d = _normalize_axis(dim, self.ndim)
    start = start + self.shape[d] if start < 0 else start
    if not 0 <= start <= start + length <= self.shape[d]:
      raise IndexOutOfRange(f"narrow: start {start} and length {length} don't fit dim {dim} of size {self.shape[d]}")
    return self.shrink(tuple((start, start + length) if i == d else None for i in range(self.ndim)))
  def unbind(self, dim: int = 0) -> tuple[Tensor, ...]:
    d = _normalize_axis(dim, self.ndim)
    return tuple(self.narrow(d, i, 1).squeeze(d) for i in range(self.shape[d]))
  def tile(self, *dims) -> Tensor:
    dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
    return self.reshape((1,) * (len(dims) - self.ndim) + self.shape).repeat(*((1,) * (self.ndim - len(dims)) + dims))
  def count_nonzero(self, dim=None) -> Tensor: return (self != 0).sum(dim)
  def nan_to_num(self, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
    if not dtypes.is_float(self.dtype): return self
    big = _FLOAT_MAX[self.dtype.scalar()]  # the largest finite value (dtypes.max of a float is inf)
    x = self.isnan().where(nan, self)
    return (x == math.inf).where(big if posinf is None else posinf, (x == -math.inf).where(-big if neginf is None else neginf, x))
  # torch's in-place random fills (model init code: m.weight.data.normal_(0, 0.02)); generator= is accepted, the numbers
  # come from Tensor.manual_seed's stream
  def uniform_(self, a: float = 0.0, b: float = 1.0, *, generator: Any = None) -> Tensor:
    return self._write(Tensor.uniform(*self.shape, low=a, high=b, dtype=self.dtype, device=self.device))
  def normal_(self, mean: float = 0.0, std: float = 1.0, *, generator: Any = None) -> Tensor:
    return self._write(Tensor.normal(*self.shape, mean=mean, std=std, dtype=self.dtype, device=self.device))
  def bernoulli_(self, p: float = 0.5, *, generator: Any = None) -> Tensor:
    return self._write((Tensor.rand(*self.shape, device=self.device) < p).cast(self.dtype))
  def is_floating_point(self) -> bool: return dtypes.is_float(self.dtype)
  def equal(self, other: Tensor) -> bool: return self.shape == other.shape and bool((self == other).all().item())
  @property
  def is_leaf(self) -> bool:
    """torch's: a tensor no gradient flows through to another (made by the user, or computed from nothing that requires grad)."""
    return self._requires_grad is not None or not self.requires_grad
  def norm(self, p: Any = "fro", dim=None, keepdim: bool = False, dtype: DType | None = None) -> Tensor:
    """torch.norm: the vector p-norm over dim (all elements by default); 'fro' is 2, inf/-inf the largest/smallest |x|."""
    x = (self if dtype is None else self.cast(dtype))._float_unary().abs()
    # the norm of a zero vector has gradient 0, as torch's (the chain rule gave 0 * inf = nan)
    if p in ("fro", 2): return x.square().sum(dim, keepdim)._masked_sqrt()
    if p == math.inf: return x.amax(dim, keepdim)
    if p == -math.inf: return x.amin(dim, keepdim)
    if p == 0: return x.ne(0).cast(x.dtype).sum(dim, keepdim)
    if p == 1: return x.sum(dim, keepdim)
    if isinstance(p, (int, float)):
      s = x.pow(p).sum(dim, keepdim)
      return s._scalar_pow_value(1 / p)._with_derivative(s, (s == 0).where(0.0, s._scalar_pow_value(1 / p - 1) * (1 / p)))
    raise ArgumentError(f"norm: unsupported p={p!r}")
  def isclose(self, other: Tensor | ConstType, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
    """|self - other| <= atol + rtol * |other|, as torch.isclose (infinities are close only to themselves)."""
    a, b = self._operands(other)
    if not dtypes.is_float(a.dtype): a, b = a.cast(dtypes.default_float), b.cast(dtypes.default_float)
    close = a.eq(b) | ((a - b).abs() <= atol + rtol * b.abs())
    if equal_nan: close = close | (a.isnan() & b.isnan())
    return close
  def allclose(self, other: Tensor | ConstType, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
    return bool(self.isclose(other, rtol, atol, equal_nan).all().item())
  @replayed
  def linear(self, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    out = self @ weight.T  # a 1-D weight is one output feature: x @ w, as in torch
    return out + bias if bias is not None else out
  @replayed
  def softmax(self, axis: int = -1, dtype: DType | None = None, *, dim=None) -> Tensor:
    if dim is not None: axis = dim
    x = self._float_unary() if dtype is None else self.cast(dtype)  # ints first: x - max would wrap for unsigned ones
    # the shift by the row's max changes nothing mathematically, so no gradient flows into it (as in torch): through
    # the max it would be a sum of terms that cancel, at the cost of two more reductions in the backward pass
    e = (x - x.amax(axis, keepdim=True).detach()).exp()
    p = e * e.sum(axis, keepdim=True).reciprocal()  # one division per row, not per element (torch's CPU kernel does the same)
    # the backward reads p itself, P * (g - sum(g * P)): the chain rule through e and its sum made a backward pass recompute
    # the row max, the sum and the exps in kernels of their own (attention's backward: 10 kernels)
    return p._with_vjp((x,), functools.partial(_softmax_vjps, axis), p)
  @replayed
  def log_softmax(self, axis: int = -1, dtype: DType | None = None, *, dim=None) -> Tensor:
    if dim is not None: axis = dim
    x = self._float_unary() if dtype is None else self.cast(dtype)
    m = x - x.amax(axis, keepdim=True).detach()  # as in softmax: the shift cancels out
    return m - m.exp().sum(axis, keepdim=True).log()

  # ***** nn functional *****
  def _window_last(self, k: int, stride: int, dilation: int) -> Tensor:
    """(..., i) -> (..., o, k) sliding windows over the last axis, with movement ops only: repeat the
    axis k times, lay the copies in rows of length i+dilation so row j starts j*dilation later,
    then keep every stride-th column."""
    *lead, i = self.shape
    o = (i - dilation * (k - 1) - 1) // stride + 1
    if o <= 0: raise ArgumentError(f"kernel size {k} (dilation {dilation}) is larger than the padded input size {i}")
    keep, nopad = tuple((0, s) for s in lead), ((0, 0),) * len(lead)
    if dilation * (k - 1) < stride:
      # windows that don't overlap (pooling): rows of `stride` elements, a window at the start of each row.
      # No repeat of the input, so the gradient is a pad and a reshape, without a sum over the window
      x = self.shrink(keep + ((0, o * stride),)) if i >= o * stride else self.pad(nopad + ((0, o * stride - i),))
      row = -(-stride // dilation) * dilation
      x = x.reshape(*lead, o, stride).pad(nopad + ((0, 0), (0, row - stride)))
      return x.reshape(*lead, o, row // dilation, dilation).shrink(keep + ((0, o), (0, k), (0, 1))).reshape(*lead, o, k)
    x = self.pad(nopad + ((0, max(0, o * stride - i - dilation)),))
    i = x.shape[-1]
    x = x.reshape(*lead, 1, i).expand(*lead, k, i).reshape(*lead, k * i).pad(nopad + ((0, k * dilation),))
    x = x.reshape(*lead, k, i + dilation).shrink(keep + ((0, k), (0, o * stride)))
    x = x.reshape(*lead, k, o, stride).shrink(keep + ((0, k), (0, o), (0, 1))).reshape(*lead, k, o)
    return x.transpose(-1, -2)
  def _pool(self, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]) -> Tensor:
    """(..., *spatial) -> (..., *out, *kernel): the windows a conv or pool reduces over."""
    n, x = len(kernel), self
    lead = self.ndim - n
    # the last spatial axis first (no permute needed), then each earlier one moved to the end: a gradient
    # through the windows then comes out in the input's own axis order (row-major, not transposed)
    for a in reversed(range(n)):
      x = x.permute(*range(lead + a), *range(lead + a + 1, x.ndim), lead + a)._window_last(kernel[a], stride[a], dilation[a])
    # now (..., o_{n-1}, k_{n-1}, ..., o0, k0) -> (..., o0, o1, ..., k0, k1, ...)
    return x.permute(*range(lead), *(lead + 2 * (n - 1 - a) for a in range(n)), *(lead + 2 * (n - 1 - a) + 1 for a in range(n)))
  @staticmethod
  def _tuple(v: int | Sequence[int], n: int, name: str) -> tuple[int, ...]:
    t = (v,) * n if isinstance(v, int) else tuple(v)
    if len(t) != n or any(not isinstance(x, int) for x in t): raise ArgumentError(f"{name} {v} must be an int or {n} ints")
    return t
  def _conv_padding(self, padding, kernel: tuple[int, ...], dilation: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    n = len(kernel)
    if padding == "valid": return ((0, 0),) * n
    if padding == "same":
      total = [d * (k - 1) for k, d in zip(kernel, dilation)]
      return tuple((t // 2, t - t // 2) for t in total)
    if isinstance(padding, int): return ((padding, padding),) * n
    if len(padding) == n: return tuple((p, p) for p in padding)
    if len(padding) == 2 * n: return tuple((padding[2 * i], padding[2 * i + 1]) for i in range(n))
    raise ArgumentError(f"padding {padding} must be 'same', 'valid', an int, {n} ints or {2 * n} ints")
  @replayed
  def conv2d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1, stride=1, dilation=1, padding=0) -> Tensor:
    """Convolution over the trailing spatial axes (1-, 2- or 3-D), PyTorch's layout: x (N, Cin, *S),
    weight (Cout, Cin/groups, *K)."""
    n = weight.ndim - 2
    if self.ndim != n + 2: raise ArgumentError(f"conv input of shape {self.shape} doesn't match weight of shape {weight.shape}")
    bs, cin_total, cout, cin = self.shape[0], self.shape[1], weight.shape[0], weight.shape[1]
    if cin * groups != cin_total or cout % groups:
      raise ArgumentError(f"conv of input {self.shape} with weight {weight.shape} and groups={groups}: channels don't match")
    kernel = weight.shape[2:]
    stride, dilation = Tensor._tuple(stride, n, "stride"), Tensor._tuple(dilation, n, "dilation")
    pads = self._conv_padding(padding, kernel, dilation)
    x = self.pad(((0, 0), (0, 0)) + pads)._pool(kernel, stride, dilation)   # (N, Cin_total, *O, *K)
    out_sp = x.shape[2:2 + n]
    x = x.reshape(bs, groups, 1, cin, *out_sp, *kernel)
    w = weight.reshape(1, groups, cout // groups, cin, *(1,) * n, *kernel)
    red = (3, *range(4 + n, 4 + 2 * n))
    out = (x * w)._reduce(Ops.ADD, red).reshape(bs, cout, *out_sp)
    out = out if bias is None else out + bias.reshape(1, cout, *(1,) * n)
    # the output's gradient is read by the weight's, the input's and the bias's gradient kernels, the first
    # two once per window element: computed once into a buffer rather than in each of their inner loops
    return out.contiguous_backward()
  conv1d = conv3d = conv2d
  def conv_transpose2d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1, stride=1, dilation=1, padding=0,
                       output_padding=0) -> Tensor:
    """The gradient of conv2d as a layer: weight is (Cin, Cout/groups, *K), as in PyTorch."""
    n = weight.ndim - 2
    kernel = weight.shape[2:]
    stride, dilation = Tensor._tuple(stride, n, "stride"), Tensor._tuple(dilation, n, "dilation")
    padding, output_padding = Tensor._tuple(padding, n, "padding"), Tensor._tuple(output_padding, n, "output_padding")
    if any(s > 1 for s in stride) and all(d == 1 for d in dilation) and all(isinstance(v, int) for v in (*self.shape[2:], *kernel)):
      return self._conv_transpose_phases(weight, bias, groups, stride, padding, output_padding)
    x = self
    for a, s in enumerate(stride):  # put s-1 zeros between input elements
      if s == 1: continue
      ax = 2 + a
      i = x.shape[ax]
      x = x.unsqueeze(ax + 1).pad(tuple((0, s - 1) if d == ax + 1 else (0, 0) for d in range(x.ndim + 1)))
      x = x.reshape(*x.shape[:ax], i * s, *x.shape[ax + 2:])
      x = x.shrink(tuple((0, (i - 1) * s + 1) if d == ax else None for d in range(x.ndim)))
    cin, cout_g = weight.shape[:2]
    w = weight.reshape(groups, cin // groups, cout_g, *kernel).transpose(1, 2).flip(*range(3, 3 + n))
    w = w.reshape(groups * cout_g, cin // groups, *kernel)
    pads = tuple(v for k, d, p, op in zip(kernel, dilation, padding, output_padding) for v in (d * (k - 1) - p, d * (k - 1) - p + op))
    return x.conv2d(w, bias, groups=groups, dilation=dilation, padding=pads)
  def _conv_transpose_phases(self, weight: Tensor, bias: Tensor | None, groups: int, stride: tuple, padding: tuple,
                             output_padding: tuple) -> Tensor:
    """A strided transposed conv as stride**n plain convs, one per output phase, interleaved (sub-pixel). Counted from
    before the padding, output t = s*T + r takes the input at T - q times the kernel's tap s*q + r: for each phase r, a
    conv of the input (padded by q-1) with the taps r, r+s, ... flipped. Putting s-1 zeros between the inputs instead
    multiplies zeros s**n times over and reads through a division per index (PP-OCR det's 2x2 stride 2 upsampling, one
    core: 204 ms at 0.6 GFLOPS for its last layer)."""
    n, kernel = len(stride), weight.shape[2:]
    cin, cout_g = weight.shape[:2]
    taps = [-(-k // s) for k, s in zip(kernel, stride)]  # per phase; the kernel padded with zero taps to taps*s
    w = weight.pad(((0, 0), (0, 0), *((0, q * s - k) for q, s, k in zip(taps, stride, kernel))))
    w = w.reshape(groups, cin // groups, cout_g, *(d for q, s in zip(taps, stride) for d in (q, s)))
    # (group, cin, cout, q0, r0, q1, r1, ...) -> (group, cout, r0, r1, ..., cin, q0, q1, ...), taps flipped
    w = w.permute(0, 2, *(4 + 2 * i for i in range(n)), 1, *(3 + 2 * i for i in range(n))).flip(*range(3 + n, 3 + 2 * n))
    w = w.reshape(groups * cout_g * prod(stride), cin // groups, *taps)
    # the phases' conv is a kernel of its own: fused into the interleaving, each output read its weight through a
    # remainder and no register tile applied (PP-OCR det's 24 -> 4x24 channels at 160x160: 44 ms, 3 GFLOPS a core)
    y = self.conv2d(w, groups=groups, padding=tuple(v for q in taps for v in (q - 1, q - 1))).contiguous()
    spans = y.shape[2:]
    # (batch, channel * phases, T...) -> (batch, channel, T0, r0, T1, r1, ...) -> (batch, channel, T0*s0, ...)
    y = y.reshape(y.shape[0], groups * cout_g, *stride, *spans)
    y = y.permute(0, 1, *(a for i in range(n) for a in (2 + n + i, 2 + i))).reshape(y.shape[0], groups * cout_g, *(t * s for t, s in zip(spans, stride)))
    outs = [(i - 1) * s - 2 * p + k + op for i, s, p, k, op in zip(self.shape[2:], stride, padding, kernel, output_padding)]
    y = y.pad(((0, 0), (0, 0), *((-p, p + o - t * s) for p, o, t, s in zip(padding, outs, spans, stride))))
    return y if bias is None else y + bias.reshape(1, -1, *([1] * n))
  def _pool_pads(self, n: int, kernel_size, stride, dilation, padding, ceil_mode: bool):
    """Pooling geometry over the last n axes: kernel, stride, dilation, padding and the extra right
    padding that ceil_mode adds (which PyTorch never counts as part of a window's average)."""
    kernel = Tensor._tuple(kernel_size, n, "kernel_size")
    stride = kernel if stride is None else Tensor._tuple(stride, n, "stride")
    dilation, padding = Tensor._tuple(dilation, n, "dilation"), Tensor._tuple(padding, n, "padding")
    extras = []
    for i, k, s, d, p in zip(self.shape[-n:], kernel, stride, dilation, padding):
      if 2 * p > k: raise ArgumentError(f"pool padding {p} must be at most half the kernel size {k}")
      span = i + 2 * p - d * (k - 1) - 1
      o = (-(-span // s) if ceil_mode else span // s) + 1
      if ceil_mode and (o - 1) * s >= i + p: o -= 1  # the last window must start inside the input or left padding
      extras.append(max(0, (o - 1) * s + d * (k - 1) + 1 - (i + 2 * p)))
    return kernel, stride, dilation, padding, extras
  def _pool_padded(self, geometry, fill: ConstType, extra_fill: ConstType) -> Tensor:
    kernel, stride, dilation, padding, extras = geometry
    lead = ((0, 0),) * (self.ndim - len(kernel))
    x = self.pad(lead + tuple((p, p) for p in padding), value=fill).pad(lead + tuple((0, e) for e in extras), value=extra_fill)
    return x._pool(kernel, stride, dilation)
  def _max_pool(self, n: int, kernel_size, stride=None, dilation=1, padding=0, ceil_mode: bool = False,
                return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    geometry = self._pool_pads(n, kernel_size, stride, dilation, padding, ceil_mode)
    lowest = float("-inf") if dtypes.is_float(self.dtype) else dtypes.min(self.dtype)
    if not return_indices:
      win = self._pool_padded(geometry, lowest, lowest)
      if not (dtypes.is_float(self.dtype) and self._may_need_grad()): return win.amax(tuple(range(-n, 0)))
      # torch sends a window's gradient to one element, the first of tied maxima (a NaN is the max), where amax shares it
      flat = win.reshape(*win.shape[:-n], prod(geometry[0]))
      hit = (flat == flat.amax(-1, keepdim=True)) | flat.isnan()
      return flat._picked(-1, hit.argmax(-1), False)
    # torch's indices: each window's max as a flat index into the input's last n dims, the first in window order on
    # ties. The spatial positions are pooled with the same geometry (-1 where padding), so a window's max and its
    # position line up; a padded cell never wins (it is excluded even where the input itself is the lowest value)
    if self.ndim < n: raise ArgumentError(f"max_pool{n}d of a {self.ndim}-D tensor")
    spatial = self.shape[-n:]
    pos = Tensor.arange(prod(spatial), device=self.device, dtype=dtypes.int64).reshape(spatial)._pool_padded(geometry, -1, -1)
    win = self._pool_padded(geometry, lowest, lowest)
    k = prod(geometry[0])
    win, pos = win.reshape(*win.shape[:-n], k), pos.reshape(*pos.shape[:-n], k)
    values = win.amax(-1, keepdim=True)
    hit = (win == values) & (pos >= 0)
    if dtypes.is_float(self.dtype): hit = hit | (win.isnan() & (pos >= 0))  # as torch: a NaN is the max (value and place)
    first = hit.argmax(-1, keepdim=True)
    indices = pos.expand(win.shape).gather(-1, first)
    return values.squeeze(-1), indices.squeeze(-1)
  def max_unpool2d(self, indices: Tensor, kernel_size=(2, 2), stride=None, dilation=1, padding=0, output_size=None) -> Tensor:
    """The inverse of max_pool2d(return_indices=True): each value put back at its index, zeros elsewhere (torch's)."""
    return self._max_unpool(2, indices, kernel_size, stride, dilation, padding, output_size)
  def _max_unpool(self, n: int, indices: Tensor, kernel_size, stride=None, dilation=1, padding=0, output_size=None) -> Tensor:
    kernel = Tensor._tuple(kernel_size, n, "kernel_size")
    stride = kernel if stride is None else Tensor._tuple(stride, n, "stride")
    dilation, padding = Tensor._tuple(dilation, n, "dilation"), Tensor._tuple(padding, n, "padding")
    if indices.shape != self.shape: raise ArgumentError(f"max_unpool: indices of shape {indices.shape} don't match input {self.shape}")
    if output_size is None: out = tuple((i - 1) * s - 2 * p + d * (k - 1) + 1 for i, s, p, d, k in zip(self.shape[-n:], stride, padding, dilation, kernel))
    else: out = tuple(output_size)[-n:]
    lead = self.shape[:-n]
    flat = Tensor.zeros(*lead, prod(out), dtype=self.dtype, device=self.device)
    return flat.scatter(-1, indices.reshape(*lead, -1), self.reshape(*lead, -1)).reshape(*lead, *out)
  def _avg_pool(self, n: int, kernel_size, stride=None, dilation=1, padding=0, ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
    geometry = self._pool_pads(n, kernel_size, stride, dilation, padding, ceil_mode)
    window = tuple(range(-n, 0))
    total = self._float_unary()._pool_padded(geometry, 0.0, 0.0).sum(window)
    ones = Tensor.ones(*self.shape[-n:], device=self.device)
    return total / ones._pool_padded(geometry, 1.0 if count_include_pad else 0.0, 0.0).sum(window)
  def max_pool1d(self, kernel_size=2, *args, **kw) -> Tensor: return self._max_pool(1, kernel_size, *args, **kw)
  def max_pool2d(self, kernel_size=(2, 2), *args, **kw) -> Tensor: return self._max_pool(2, kernel_size, *args, **kw)
  def max_pool3d(self, kernel_size=(2, 2, 2), *args, **kw) -> Tensor: return self._max_pool(3, kernel_size, *args, **kw)
  def avg_pool1d(self, kernel_size=2, *args, **kw) -> Tensor: return self._avg_pool(1, kernel_size, *args, **kw)
  def avg_pool2d(self, kernel_size=(2, 2), *args, **kw) -> Tensor: return self._avg_pool(2, kernel_size, *args, **kw)
  def avg_pool3d(self, kernel_size=(2, 2, 2), *args, **kw) -> Tensor: return self._avg_pool(3, kernel_size, *args, **kw)

  @replayed
  def layernorm(self, axis=-1, eps: float = 1e-5) -> Tensor:
    y = self - self.mean(axis, keepdim=True)
    return y * (y.square().mean(axis, keepdim=True) + eps).rsqrt()
  def batchnorm(self, weight: Tensor | None, bias: Tensor | None, mean: Tensor, invstd: Tensor, axis=1) -> Tensor:
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    shape = tuple(s if i in [a % self.ndim for a in axes] else 1 for i, s in enumerate(self.shape))
    x = (self - mean.reshape(shape)) * (invstd.reshape(shape) if weight is None else (weight.reshape(shape) * invstd.reshape(shape)))
    return x + bias.reshape(shape) if bias is not None else x
  def dropout(self, p: float = 0.5) -> Tensor:
    if not 0 <= p <= 1: raise ArgumentError(f"dropout probability {p} must be in [0, 1]")
    if not Tensor.training or p == 0: return self
    if p == 1: return self * 0
    keep = Tensor.rand(*self.shape, device=self.device, dtype=dtypes.float32) >= p
    return keep.where(self * (1 / (1 - p)), 0)
  def one_hot(self, num_classes: int = -1) -> Tensor:
    if dtypes.is_float(self.dtype): raise TypeError(f"one_hot needs an integer tensor, got {self.dtype}")
    if num_classes == -1: num_classes = int(self.max().item()) + 1
    return (self.unsqueeze(-1) == Tensor.arange(num_classes, device=self.device)).cast(dtypes.int64)
  def sparse_categorical_crossentropy(self, Y: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0, reduction: str = "mean") -> Tensor:
    """Cross entropy of logits (N, C) against class indices Y (N,), as tinygrad names it."""
    return self.cross_entropy(Y, reduction=reduction, label_smoothing=label_smoothing, ignore_index=ignore_index)
  def cross_entropy(self, Y: Tensor, reduction: str = "mean", label_smoothing: float = 0.0, ignore_index: int = -100) -> Tensor:
    """torch.nn.functional.cross_entropy for logits (N, C, ...) and class indices or probabilities."""
    if reduction not in ("mean", "sum", "none"): raise ArgumentError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    n = self.shape[1 if self.ndim > 1 else 0]
    if dtypes.is_float(Y.dtype):  # class probabilities
      logp = self.log_softmax(1 if self.ndim > 1 else 0)
      target = Y * (1 - label_smoothing) + label_smoothing / n
      loss = -(logp * target).sum(1 if self.ndim > 1 else 0)
      return loss if reduction == "none" else loss.sum() if reduction == "sum" else loss.mean()
    if Y.dtype == dtypes.bool: raise TypeError(f"cross_entropy targets must be class indices (integers) or probabilities (floats), got {Y.dtype}")
    self._check_index_values(Y, 0, n, "cross_entropy's classes", ignore_index)  # torch raises for a target outside [0, n)
    return self._cross_entropy_indices(Y, reduction, label_smoothing, ignore_index)
  @replayed
  def _cross_entropy_indices(self, Y: Tensor, reduction: str, label_smoothing: float, ignore_index: int) -> Tensor:
    """cross_entropy against class indices Y, checked: built once per signature (frontend/replay.py)"""
    logp = self.log_softmax(1 if self.ndim > 1 else 0)
    n = self.shape[1 if self.ndim > 1 else 0]
    classes = Tensor.arange(n, device=self.device).reshape(*((1, n) + (1,) * (self.ndim - 2) if self.ndim > 1 else (n,)))
    y = Y.unsqueeze(1) if self.ndim > 1 else Y
    picked = (classes == y).where(logp, 0).sum(1 if self.ndim > 1 else 0)
    loss = -(picked * (1 - label_smoothing) + logp.mean(1 if self.ndim > 1 else 0) * label_smoothing)
    valid = Y.ne(ignore_index)
    loss = valid.where(loss, 0)
    if reduction == "none": return loss
    return loss.sum() if reduction == "sum" else loss.sum() / valid.sum().cast(loss.dtype)
  def binary_crossentropy(self, Y: Tensor, reduction: str = "mean") -> Tensor:
    def clamped_log(p: Tensor) -> Tensor:  # torch clamps each log at -100; log(0) must not poison the gradient
      return (p > 0).where((p > 0).where(p, 1.0).log(), -100.0).maximum(-100.0)
    loss = -(Y * clamped_log(self) + (1 - Y) * clamped_log(1 - self))
    return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss
  def binary_crossentropy_logits(self, Y: Tensor, reduction: str = "mean", pos_weight: Tensor | None = None) -> Tensor:
    # (1 - y) x + (1 + (pw - 1) y) softplus(-x); softplus(-x) written to stay finite for large |x|
    sp = (-self).maximum(0) + (1 + (-self.abs()).exp()).log()
    loss = (1 - Y) * self + (sp if pos_weight is None else (1 + (pos_weight - 1) * Y) * sp)
    return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss
  def sequential(self, layers: Sequence[Callable[[Tensor], Tensor]]) -> Tensor:
    x = self
    for f in layers: x = f(x)
    return x
  def contiguous_backward(self) -> Tensor: return Tensor(UOp(Ops.CONTIGUOUS_BACKWARD, self.dtype, (self.uop,)))

def _inplace(name: str) -> Callable[..., Tensor]:
  def op(self: Tensor, *args: Any, **kwargs: Any) -> Tensor: return self._write(getattr(self._fresh(), name)(*args, **kwargs))
  op.__name__ = op.__qualname__ = f"{name}_"
  op.__doc__ = f"In place: x.{name}_(...) is x.assign(x.{name}(...)), lazy like assign (torch's {name}_)."
  return op
# torch's in-place spellings: each is its out-of-place op written back (one rule, not a method each)
_FLOAT_MAX = {dtypes.float16: 65504.0, dtypes.bfloat16: 3.3895313892515355e38, dtypes.float32: 3.4028234663852886e38,
              dtypes.float64: 1.7976931348623157e308}
class _Data(Tensor):
  """What x.data gives: a detached view of x (torch), callable for tinygrad's x.data() memoryview."""
  __slots__ = ()
  def __call__(self) -> memoryview: return self._raw()

INPLACE_OPS = ("add", "sub", "mul", "div", "pow", "floor_divide", "remainder", "clamp", "clip", "masked_fill", "scatter",
               "scatter_reduce", "index_add", "neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "square", "sin", "cos",
               "relu", "sigmoid", "tanh", "floor", "ceil", "round", "trunc", "sign", "lerp", "maximum", "minimum", "bitwise_and",
               "addcmul", "addcdiv", "clamp_min", "clamp_max", "nan_to_num",
               "bitwise_or", "bitwise_xor", "logical_not", "bitwise_left_shift", "bitwise_right_shift")
for _name in INPLACE_OPS:
  if hasattr(Tensor, _name): setattr(Tensor, f"{_name}_", _inplace(_name))

def _one_dim(dim: Any) -> bool:
  """One dimension (an int, numpy's ints too) rather than None or a tuple of dims: torch's max/min with a dim."""
  return dim is not None and not isinstance(dim, (tuple, list, bool)) and hasattr(dim, "__index__")

_LOGIC_NAMES = {Ops.AND: "bitwise_and (&)", Ops.OR: "bitwise_or (|)", Ops.XOR: "bitwise_xor (^)", Ops.SHL: "lshift (<<)",
                Ops.SHR: "rshift (>>)"}

replay.tensor_class = Tensor

_FLOATS = frozenset(dt for dt in vars(dtypes).values() if isinstance(dt, DType) and dtypes.is_float(dt))

def _softmax_vjps(axis: int, p: Tensor) -> tuple[Callable[[Tensor], Tensor]]:
  """softmax's backward, P * (g - sum(g * P)), reading P = softmax(x) itself"""
  return (lambda g: p * (g - (g * p).sum(axis, keepdim=True)),)

def _weak_promote(strong: DType, weak: DType) -> DType:
  """PyTorch's rule for a weak operand (a Python scalar, or a 0-d tensor beside a tensor with dimensions):
  it doesn't widen the other dtype within its kind (bool < int < float), only lifts it to a higher kind."""
  return strong if kind(weak) <= kind(strong) else least_upper_dtype(strong, weak)

def _binop(op: Ops, a: Tensor, x: Any, reverse: bool = False) -> Tensor:
  l, r = a._operands(x, reverse)
  return Tensor(UOp(op, dtypes.bool if op in GroupOp.Comparison else r.uop.dtype, (l.uop, r.uop)))  # (l._alu(op, r))

def _lowbias32(x: int) -> int:
  x ^= x >> 16; x = (x * 0x7FEB352D) & 0xFFFFFFFF
  x ^= x >> 15; x = (x * 0x846CA68B) & 0xFFFFFFFF
  return x ^ (x >> 16)

_NUMPY_NAMES = {dtypes.bool: "bool", dtypes.int8: "int8", dtypes.uint8: "uint8", dtypes.int16: "int16", dtypes.uint16: "uint16",
                dtypes.int32: "int32", dtypes.uint32: "uint32", dtypes.int64: "int64", dtypes.uint64: "uint64",
                dtypes.float16: "float16", dtypes.float32: "float32", dtypes.float64: "float64"}
_UINT_OF_SIZE = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}  # a float's bits, for abs
_TORCH_TYPE_NAMES = {dtypes.float32: "Float", dtypes.float64: "Double", dtypes.float16: "Half", dtypes.bfloat16: "BFloat16",
                     dtypes.uint8: "Byte", dtypes.int8: "Char", dtypes.int16: "Short", dtypes.int32: "Int", dtypes.int64: "Long",
                     dtypes.bool: "Bool"}
def _from_numpy_dtype(npdt) -> DType:
  for dt, name in _NUMPY_NAMES.items():
    if npdt.name == name: return dt
  raise TypeError(f"numpy dtype {npdt} has no attograd equivalent")

_PY_SCALARS = {bool, int, float}

def _uop_from(data: Any, device: str | tuple[str, ...], dtype: DType | None) -> UOp:
  """The graph node for Tensor(data): a constant, or a buffer filled from Python/numpy data."""
  if isinstance(device, tuple) and not isinstance(data, (bool, int, float, Tensor, UOp)):  # data for several devices: a copy on each
    return shard_uop(_uop_from(data, device[0], dtype), device, None)
  if isinstance(data, UOp):
    # a bound Variable is a 0-d tensor of its value, on the device it is used on
    if data.op is Ops.BIND and data.src[1].device is None: return data.replace(src=(data.src[0], _const(data.src[1].arg, data.dtype, device)))
    return data
  if isinstance(data, Tensor):
    t = data.to(device)
    return (t.cast(dtype) if dtype is not None else t).uop
  if isinstance(data, (bool, int, float)): return _const(data, dtype or dtypes.from_py(data), device)
  if type(data).__module__ == "numpy":
    import numpy as np
    arr = np.ascontiguousarray(data)
    src_dtype = _from_numpy_dtype(arr.dtype)
    u = _buffer_from_bytes(arr.tobytes(), src_dtype, data.shape, device)  # data's shape: 0-d stays 0-d
    return u if dtype is None or dtype == src_dtype else UOp(Ops.CAST, dtype, (u,))
  if isinstance(data, memoryview):  # typed values in host memory (memoryview(...).cast("f", shape)): its format and shape
    fmt = data.format.lstrip("@=<")
    if (src_dtype := next((d for d in DTYPES_BY_NAME.values() if d.fmt == fmt), None)) is None:
      raise UnsupportedDtype(f"can't make a Tensor from a memoryview of format {data.format!r}")
    u = _buffer_from_bytes(data.tobytes(), src_dtype, data.shape, device)
    return u if dtype is None or dtype == src_dtype else UOp(Ops.CAST, dtype, (u,))
  if isinstance(data, (bytes, bytearray)):
    u = _buffer_from_bytes(bytes(data), dtypes.uint8, (len(data),), device)
    return u if dtype is None or dtype == dtypes.uint8 else UOp(Ops.CAST, dtype, (u,))
  if isinstance(data, (list, tuple)):
    flat, shape = _flatten_nested(data)
    # the types present, once: a batch of tokens as a list of lists was a 1.3 ms Tensor element by element
    if not (kinds := set(map(type, flat))) <= _PY_SCALARS:
      for v in flat:
        if not isinstance(v, (bool, int, float)): raise UnsupportedDtype(f"can't make a Tensor from a list holding {type(v).__name__}")
    dtype = dtype or (dtypes.from_py(flat) if not kinds <= _PY_SCALARS else dtypes.default_float if float in kinds or not flat
                      else dtypes.default_int if int in kinds else dtypes.bool)
    return _buffer_from_bytes(_pack(flat, dtype), dtype, shape, device)
  if data is None: return _buffer_from_bytes(b"", dtype or dtypes.default_float, (0,), device)
  raise UnsupportedDtype(f"can't make a Tensor from {type(data).__name__}")

# while TinyJit runs a function's first two calls: the data each Tensor made from Python/numpy data got, with the line
# of user code that made it; jit.py compares the two calls (data that changed would be frozen by the replay)
host_data_log: list[tuple[tuple[str, int], bytes]] | None = None
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

def _user_site() -> tuple[str, int] | None:
  """The user's line that called Tensor(data), or None when the package made it (its own constant tables)."""
  f = sys._getframe(2)
  while f.f_code.co_name in ("_uop_from", "__init__") and f.f_code.co_filename == __file__: f = f.f_back
  return None if f.f_code.co_filename.startswith(_PACKAGE_DIR) else (f.f_code.co_filename, f.f_lineno)

def _buffer_from_bytes(raw: bytes, dtype: DType, shape: tuple[int, ...], device: str) -> UOp:
  if host_data_log is not None and (site := _user_site()) is not None: host_data_log.append((site, raw))
  size = prod(shape)
  buf = new_buffer(device, size, dtype)
  buffer_of(buf).copyin(memoryview(raw))
  return buf if shape == (size,) else UOp(Ops.RESHAPE, dtype, (buf,), shape)
