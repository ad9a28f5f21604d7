"""Sharded tensors: a MULTI node is one logical tensor held as parts on several devices (DESIGN §3.3). Every Tensor op,
autograd rule and optimizer builds ordinary UOps over MULTI nodes, as over any tensor; before scheduling, the `lower_multi`
pass rewrites them into one graph per device: an op whose sources are sharded alike runs on each part, a reduce over the
sharded axis reduces each part and then the parts together (an ALLREDUCE item), and sources sharded differently are
resharded with copies the scheduler sees (COPY nodes). A sharded op runs the same kernel on every device (DESIGN §4.2)
where the parts have one shape; uneven parts (5 rows over 2 devices: 3 and 2) get a kernel each."""
from __future__ import annotations
from typing import Callable
from attograd.dtype import dtypes
from attograd.helpers import prod
from attograd.uop.ops import UOp, Ops, GroupOp, sint
from attograd.uop.patterns import PatternMatcher, UPat, graph_rewrite
from attograd.schedule.schedule import is_contiguous_buffer, derivatives_dropped

Bounds = tuple[tuple[int, int], ...]
MULTI_OPS = (Ops.MULTI, Ops.SHARD)
MULTI_MASK = sum(1 << op.value for op in MULTI_OPS)

def split_bounds(size: int, n: int) -> Bounds:
  """(start, end) of each of n parts of an axis of `size`: the first size % n parts one longer (5 over 2: 3 and 2), as
  torch.tensor_split does. Every part holds at least one element."""
  if not isinstance(size, int): raise ValueError(f"can't shard an axis of symbolic size {size!r}")
  if size < n: raise ValueError(f"can't shard an axis of {size} over {n} devices: every device needs at least one element")
  q, r = divmod(size, n)
  starts = [i * q + min(i, r) for i in range(n + 1)]
  return tuple(zip(starts[:-1], starts[1:]))

def multi(parts: list[UOp] | tuple[UOp, ...], axis: int | None) -> UOp: return UOp(Ops.MULTI, parts[0].dtype, tuple(parts), axis)

def shard_uop(x: UOp, devices: tuple[str, ...], axis: int | None) -> UOp:
  """x split along axis over devices (None: a copy on each): a MULTI of SHARD nodes, lowered to shrinks and copies."""
  bounds = None if axis is None else split_bounds(x.shape[axis], len(devices))
  return multi([UOp(Ops.SHARD, x.dtype, (x,), (i, axis, bounds, devices)) for i in range(len(devices))], axis)

def bounds_of(m: UOp) -> Bounds | None:
  if m.arg is None: return None
  ends, at = [], 0
  for p in m.src:
    ends.append((at, at + p.shape[m.arg]))
    at += p.shape[m.arg]
  return tuple(ends)

def is_multi(u: UOp) -> bool: return u.op is Ops.MULTI

def _contiguous(u: UOp) -> UOp: return u if is_contiguous_buffer(u) else UOp(Ops.CONTIGUOUS, u.dtype, (u,))
def _device(d: str) -> UOp: return UOp(Ops.DEVICE, dtypes.void, (), d)
def _to(u: UOp, device: str) -> UOp:
  """u on device: itself when it is there, else a copy (of its values in memory, as Tensor.to makes one)."""
  return u if u.device == device else UOp(Ops.COPY, u.dtype, (_contiguous(u), _device(device)))

def _along(shape: tuple[sint, ...], axis: int, value) -> tuple: return tuple(value if i == axis else s for i, s in enumerate(shape))

def gather(m: UOp, device: str) -> UOp:
  """The whole of sharded m on one device: each part copied there and laid end to end (as Tensor.cat does it)."""
  if m.arg is None: return next((p for p in m.src if p.device == device), _to(m.src[0], device))
  total = m.shape[m.arg]
  return _lay([_to(p, device).pad(_along(((0, 0),) * len(m.shape), m.arg, (b, total - e))) for p, (b, e) in zip(m.src, bounds_of(m))])

UINT_OF_SIZE = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}
def _lay(pieces: list[UOp]) -> UOp:
  """Blocks padded with zeros to one shape, no two nonzero at one place, as one tensor: their bits or-ed together (an add
  of floats would turn a -0.0 next to the padding into 0.0)."""
  if len(pieces) == 1: return pieces[0]
  dt = pieces[0].dtype
  bits = UINT_OF_SIZE[dt.itemsize] if dtypes.is_float(dt) else dt
  out = pieces[0].bitcast(bits) if bits != dt else pieces[0]
  for p in pieces[1:]: out = UOp(Ops.OR, bits, (out, p.bitcast(bits) if bits != dt else p))
  return out.bitcast(dt) if bits != dt else out

def to_sharding(m: UOp, axis: int | None, bounds: Bounds | None, devices: tuple[str, ...]) -> list[UOp]:
  """The parts of m split as (axis, bounds) over devices. Replicated to split is a shrink of each copy (no data moves);
  split to replicated is an all-gather (each device gets every part by a copy); split another way moves only what each
  device lacks (_pieces)."""
  if m.device != devices:
    raise RuntimeError(f"sharded tensors on different devices: {m.device} and {devices}; move one with .to(devices)")
  if m.arg == axis and bounds_of(m) == bounds: return list(m.src)
  if m.arg is None:
    if axis is None: return list(m.src)
    return [p.shrink(_along(tuple((0, s) for s in p.shape), axis, bounds[i])) for i, p in enumerate(m.src)]
  if axis is None: return [gather(m, d) for d in devices]
  return [_pieces(m, axis, bounds[i], d) for i, d in enumerate(devices)]

def _pieces(m: UOp, axis: int, want: tuple[int, int], device: str) -> UOp:
  """The part of split m that spans `want` along axis (all of the other axes), on device: from each of m's parts only the
  block inside it, copied if it lives elsewhere, laid in place (as gather lays whole parts). Split by rows to split by
  columns over n devices moves (n-1)/n of the tensor once, where gathering everything moved it n-1 times."""
  a, nd = m.arg, len(m.shape)
  shape = _along(m.shape, axis, want[1] - want[0])
  pieces = []
  for p, (b, e) in zip(m.src, bounds_of(m)):
    lo, hi = (max(b, want[0]), min(e, want[1])) if a == axis else (b, e)  # the rows of p along m's split axis it gives
    if lo >= hi: continue
    box = _along(tuple((0, s) for s in p.shape), a, (lo - b, hi - b))
    if a != axis: box = _along(box, axis, want)
    at = lo - (want[0] if a == axis else 0)  # where the block starts along a, in the part being made
    pieces.append(_to(p.shrink(box), device).pad(_along(((0, 0),) * nd, a, (at, shape[a] - at - (hi - lo)))))
  assert pieces, f"no part of {bounds_of(m)} covers {want}"
  return _lay(pieces)

# ***** the rules: each op over MULTI sources becomes a MULTI of the op over parts *****

def _lead(srcs: tuple[UOp, ...]) -> UOp:
  """The source whose sharding an op's result takes: the first split one (replicated sources are cut to match it for
  free), else the first."""
  ms = [s for s in srcs if is_multi(s)]
  return next((s for s in ms if s.arg is not None), ms[0])

def elementwise(u: UOp, lead: UOp | None = None) -> UOp | None:
  """An elementwise op (and contiguous, detach, assign, ...) on each part, its sources sharded as the lead one."""
  if not any(is_multi(s) for s in u.src): return None
  lead = lead if lead is not None else _lead(u.src)
  axis, bounds, devices = lead.arg, bounds_of(lead), lead.device
  cols: list[list[UOp]] = []
  for s in u.src:
    if is_multi(s): cols.append(to_sharding(s, axis, bounds, devices))
    elif s.op is Ops.DEVICE or (s.shape == () and s.device is None): cols.append([s] * len(devices))  # a scalar with no device
    else: raise RuntimeError(f"{u.op} of a tensor sharded over {devices} and one on {s.device}: move it with .to(devices) or .shard(devices)")
  return multi([UOp(u.op, u.dtype, tuple(c[i] for c in cols), u.arg) for i in range(len(devices))], axis)

def replicate_leaf(u: UOp) -> UOp | None:
  """A constant or arange made for several devices: one on each."""
  if not isinstance(dev := u.src[0].arg, tuple): return None
  return multi([u.replace(src=(_device(d),)) for d in dev], None)

def lower_shard(u: UOp) -> UOp:
  """SHARD: part i of x. From one device, a slice copied to its device; from a sharded x, x resharded."""
  (i, axis, bounds, devices), x = u.arg, u.src[0]
  if is_multi(x): return to_sharding(x, axis, bounds, devices)[i]
  part = x if axis is None else x.shrink(_along(tuple((0, s) for s in x.shape), axis, bounds[i]))
  return _to(part, devices[i])

def lower_copy(u: UOp) -> UOp | None:
  """COPY to a tuple of devices replicates (Tensor.to(devices)); a sharded tensor's COPY to one device gathers it."""
  x, dev = u.src[0], u.src[1].arg
  if x.op is Ops.CONTIGUOUS and is_multi(x.src[0]): x = x.src[0]  # each part is made contiguous where it is copied
  if not is_multi(x): return None if not isinstance(dev, tuple) else multi([_to(x, d) for d in dev], None)
  if not isinstance(dev, tuple): return gather(x, dev)
  if dev == x.device: return multi(to_sharding(x, None, None, dev), None)
  return multi([gather(x, d) for d in dev], None)

def lower_reduce(u: UOp) -> UOp | None:
  """A reduce on each part; over the split axis, the parts' results are then reduced together (ALLREDUCE, in place) and
  every device holds the result."""
  if not is_multi(x := u.src[0]): return None
  parts = [UOp(Ops.REDUCE_AXIS, u.dtype, (p,), u.arg) if any(p.shape[a] != 1 for a in u.arg[1]) else p for p in x.src]
  if x.arg is None or x.arg not in u.arg[1]: return multi(parts, x.arg)
  ar = UOp(Ops.ALLREDUCE, u.dtype, tuple(UOp(Ops.CONTIGUOUS, u.dtype, (p,)) for p in parts), u.arg[0])
  return multi([UOp(Ops.MSELECT, u.dtype, (ar,), i) for i in range(len(parts))], None)

def _gathered(u: UOp, x: UOp) -> UOp:
  """A movement op across the split axis, done on every device's copy of the whole (replicated result)."""
  return multi([u.replace(src=(p,)) for p in to_sharding(x, None, None, x.device)], None)

def _reshape_axis(old: tuple[int, ...], new: tuple[int, ...], axis: int, sizes: list[int]) -> int | None:
  """The axis of `new` that the split axis of `old` becomes, when each part reshapes on its own (row-major: the axes
  before it hold as many elements in both shapes, and every part's rows are a whole number of the new axis' rows)."""
  before = prod(old[:axis])
  for j in range(len(new)):
    if prod(new[:j]) == before and new[j] > 1 and all(new[j] * s % old[axis] == 0 for s in sizes): return j
    if prod(new[:j]) > before: break
  return None

def lower_movement(u: UOp) -> UOp | None:
  if not is_multi(x := u.src[0]): return None
  if x.arg is None: return multi([u.replace(src=(p,)) for p in x.src], None)
  a, sizes = x.arg, [p.shape[x.arg] for p in x.src]
  return MOVEMENT[u.op](u, x, a, sizes)

def _reshape(u: UOp, x: UOp, a: int, sizes: list[int]) -> UOp:
  if not all(isinstance(s, int) for s in (*x.shape, *u.arg)) or (j := _reshape_axis(x.shape, u.arg, a, sizes)) is None: return _gathered(u, x)
  return multi([p.reshape(_along(u.arg, j, u.arg[j] * s // x.shape[a])) for p, s in zip(x.src, sizes)], j)

def _keeps_axis(u: UOp, a: int) -> bool:
  """Does the movement op leave the split axis alone?"""
  if u.op is Ops.PAD: return u.arg[a] == (0, 0)
  if u.op is Ops.SHRINK: return u.arg[a] == (0, u.src[0].shape[a])
  if u.op is Ops.FLIP: return not u.arg[a]
  return True

def _per_part(u: UOp, x: UOp, a: int, sizes: list[int]) -> UOp:
  if not _keeps_axis(u, a): return _gathered(u, x)
  if u.op is Ops.SHRINK: return multi([p.shrink(_along(u.arg, a, (0, s))) for p, s in zip(x.src, sizes)], a)
  if u.op is Ops.EXPAND: return multi([p.expand(_along(u.arg, a, s)) for p, s in zip(x.src, sizes)], a)
  return multi([u.replace(src=(p,)) for p in x.src], a)

MOVEMENT: dict[Ops, Callable[[UOp, UOp, int, list[int]], UOp]] = {
  Ops.RESHAPE: _reshape, Ops.PERMUTE: lambda u, x, a, sizes: multi([u.replace(src=(p,)) for p in x.src], u.arg.index(a)),
  Ops.EXPAND: _per_part, Ops.PAD: _per_part, Ops.SHRINK: _per_part, Ops.FLIP: _per_part}

ELEMENTWISE = GroupOp.Elementwise | {Ops.CONTIGUOUS, Ops.CONTIGUOUS_BACKWARD, Ops.DETACH}
lower_multi = PatternMatcher([
  (UPat(ELEMENTWISE, name="u"), elementwise),
  # an assign writes the target's parts where they are: the value takes the target's sharding
  (UPat(Ops.ASSIGN, name="u"), lambda u: elementwise(u, u.src[0]) if is_multi(u.src[0]) else None),
  (UPat({Ops.CONST, Ops.IOTA}, src=(UPat(Ops.DEVICE),), name="u"), replicate_leaf),
  (UPat(Ops.SHARD, name="u"), lower_shard),
  (UPat(Ops.COPY, name="u"), lower_copy),
  (UPat(Ops.REDUCE_AXIS, name="u"), lower_reduce),
  (UPat(GroupOp.Movement, name="u"), lower_movement),
])

def lower_graphs(graphs: list[UOp]) -> list[UOp]:
  """Each graph with its sharded ops written per device: a MULTI over per-device graphs, or a one-device graph."""
  # the derivatives a graph carries are autograd's (which reads the logical graph): a backward written over a placeholder
  # (softmax's) isn't a value on any device, so they go before the ops are split
  sink = graph_rewrite(UOp(Ops.SINK, dtypes.void, tuple(graphs)), derivatives_dropped, name="derivatives_dropped")
  sink = graph_rewrite(sink, lower_multi, name="lower_multi")
  for g in sink.src:
    if (bad := next((u for u in g.toposort if u.op is Ops.MULTI and u is not g), None)) is not None:
      raise RuntimeError(f"a sharded tensor reached {next(p.op for p in g.toposort if bad in p.src)}, which has no sharding rule")
  return list(sink.src)
