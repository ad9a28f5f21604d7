"""TinyJit: run a function twice the usual way (the second time recording every kernel it launches),
then replay the recorded kernels on new inputs with no graph building, scheduling or compiling."""
from __future__ import annotations
import functools, operator, types
from typing import Any, Callable, Generic, TypeVar
from attograd.helpers import ContextVar, DEBUG
from attograd.uop.ops import UOp, Ops, substitute_sym
from attograd.runtime.device import Buffer
from attograd.engine.realize import BufferCopy, Capture, ExecItem, ExecPlan, JitError, _captures, buffer_of, bind_shapes, jit_calls, first_call_templates
from attograd.engine.memory import planned_buffers
from attograd.engine.registry import assigned_to, jit_replays, sources
import attograd.tensor as tensor_module
from attograd.tensor import Tensor
from attograd.schedule.schedule import is_contiguous_buffer, forget_schedules

JIT = ContextVar("JIT", 1)
ReturnType = TypeVar("ReturnType")

def _find(x: Any, want: Callable[[Any], bool]) -> list[Any]:
  """The values of an argument or a return value that `want` picks, looking into lists, tuples and dicts."""
  if want(x): return [x]
  if isinstance(x, (list, tuple)): return [v for y in x for v in _find(y, want)]
  if isinstance(x, dict): return [v for y in x.values() for v in _find(y, want)]
  return []
def _is_tensor(x: Any) -> bool: return isinstance(x, Tensor)
def _is_bound_variable(x: Any) -> bool: return isinstance(x, UOp) and x.op is Ops.BIND
def _tensors_in(x: Any) -> list[Tensor]: return _find(x, _is_tensor)
def _shape_binds(t: Tensor) -> list[UOp]: return [b for s in t.shape if isinstance(s, UOp) for b in s.toposort if b.op is Ops.BIND]
def _unbind(x: UOp) -> UOp: return x.substitute({b: b.src[0] for b in x.toposort if b.op is Ops.BIND})
def _shape_sig(t: Tensor) -> tuple:
  """A shape as the kernels see it: a symbolic size by its Variables, whatever values they are bound to."""
  return tuple(s if isinstance(s, int) else _unbind(s) for s in t.shape)

def _sig(x: Any) -> Any:
  """What a replay must match of an argument: a tensor's shape, dtype and device, and the value of everything that isn't
  a tensor (it was baked into the kernels)."""
  if isinstance(x, Tensor): return ("Tensor", _shape_sig(x) if x.uop.symbolic_shape else x.shape, x.dtype, x.device)
  if _is_bound_variable(x): return ("Variable", x.src[0].arg)  # its value may change
  if isinstance(x, (list, tuple)): return (type(x).__name__, tuple(_sig(v) for v in x))
  if isinstance(x, dict): return ("dict", tuple((k, _sig(v)) for k, v in x.items()))
  return ("value", x)

def _describe(args: tuple, kwargs: dict) -> tuple[list[Tensor], tuple]:
  """The input tensors and the call's signature (_sig of every argument)."""
  tensors = _tensors_in(list(args) + list(kwargs.values()))
  return tensors, (tuple(_sig(a) for a in args), tuple((k, _sig(v)) for k, v in kwargs.items()))

class _LastCall:
  """A replayed call's arguments as they were: the very Tensor objects with the node each held (after _as_plain_buffers),
  the _sig of every other argument, and the inputs' memory. A call whose tensors are those objects, none reassigned, and
  whose other arguments match is the same call (a decode loop passes the same KV cache tensors every token): it skips
  _describe, _as_plain_buffers and _buffers (~0.2 ms for 61 arguments). Only flat positional arguments: a list is
  compared by contents, which may change in place."""
  __slots__ = ("args", "tensors", "uops", "inputs", "var_at", "pick_tensors", "others")
  def __init__(self, args: tuple, tensors: list[Tensor], inputs: list[Buffer]):
    self.args, self.tensors, self.inputs = args, tuple(tensors), inputs
    self.uops = tuple(t.uop for t in tensors)
    self.var_at = [i for i, a in enumerate(args) if _is_bound_variable(a)]  # where the bound Variables are
    # the tensors' places, taken from a call's arguments in one C call (61 for a decode step), and the others' _sig
    at = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
    self.pick_tensors = (lambda a: ()) if not at else (lambda a, g=operator.itemgetter(*at): (g(a),)) if len(at) == 1 else operator.itemgetter(*at)
    self.others = [(i, _sig(a)) for i, a in enumerate(args) if not isinstance(a, Tensor)]
  @staticmethod
  def usable(args: tuple, kwargs: dict) -> bool: return not kwargs and not any(isinstance(a, (list, tuple, dict)) for a in args)
  def same(self, args: tuple) -> bool:
    if len(args) != len(self.args) or tensor_module._pending_realize or tensor_module.index_checks: return False
    if not all(map(operator.is_, ts := self.pick_tensors(args), self.tensors)) or not all(map(operator.is_, map(_uop_of, ts), self.uops)): return False
    return all(not isinstance(a := args[i], Tensor) and _sig(a) == sig for i, sig in self.others)
_uop_of = operator.attrgetter("uop")

def _parts(u: UOp) -> tuple[UOp, ...]:
  """A tensor's per-device views: a sharded tensor's parts, or the tensor itself."""
  return u.src if u.op is Ops.MULTI else (u,)
def _buffers(tensors: list[Tensor]) -> list[Buffer]:
  """The memory of each tensor's every part, in order: what a replay swaps in."""
  return [buffer_of(p.base) for t in tensors for p in _parts(t.uop)]

def _as_plain_buffers(tensors: list[Tensor]) -> None:
  """Realize the inputs, each into a whole buffer of its own (a view is copied): a replay swaps
  memory in by buffer, so an input must be exactly one buffer."""
  # inputs that are whole buffers already and nothing pending to realize (a decode step's KV cache, every call): the
  # realize would find nothing to do, after ~2 us a tensor of bookkeeping
  if not tensor_module._pending_realize and not tensor_module.index_checks and \
     all((u.op is Ops.BUFFER or is_contiguous_buffer(u)) and not u.base.arg.offset for t in tensors for u in _parts(t.uop)): return
  Tensor.realize_all(tensors)
  for t in tensors:
    if any(not (u.op is Ops.BUFFER or is_contiguous_buffer(u)) or u.base.arg.offset for u in _parts(t.uop)):
      t.uop = Tensor(UOp(Ops.CONTIGUOUS, t.dtype, (t.uop,))).realize().uop

def _forget_graph(t: Tensor) -> None:
  """A captured output keeps no graph: a replay refills its memory, so a backward() through the graph the capture built
  would read the capture's buffers. Held (its view note for backward, and the graph of a base tensor that died, which
  a view keeps to redo writes through it) it kept every node of the traced function alive, and the memory they name:
  SmolLM2's 30-layer prompt pass held 17k nodes and its KV cache's copy from before the cache moved (10 MiB)."""
  for u in (t.uop, *(_parts(t.uop) if t.uop.op is Ops.MULTI else ())): sources.pop(u)
  if (vo := t._view_of) is not None and vo[0]() is None: t._view_of = None

def _mismatch(old: tuple, new: tuple) -> str:
  (oa, ok), (na, nk) = old, new
  for i, (o, n) in enumerate(zip(oa, na)):
    if o != n: return f"argument {i} was {o}, now {n}"
  for (k, o), (_, n) in zip(ok, nk):
    if o != n: return f"argument {k!r} was {o}, now {n}"
  return f"{len(oa)} positional and {len(ok)} keyword arguments before, now {len(na)} and {len(nk)}"

def _reads_only_where_it_writes(ast: UOp, param: int) -> bool:
  """Does the kernel read PARAM `param` only at the index it stores to (p = p - lr*g)? Then writing
  the result over that memory is safe: each element is read before it is written, by the same thread."""
  store = next(u for u in ast.toposort if u.op is Ops.STORE)
  loads = [u.src[0] for u in ast.toposort if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.PARAM and u.src[0].src[0].arg == param]
  return all(idx.src[1] is store.src[0].src[1] for idx in loads)

def _latest(node: UOp) -> UOp:
  """The BUFFER a tensor's memory moved to through assigns made since (registry.assigned_to: realize leaves the notes)."""
  while (moved := assigned_to.get(node)) is not None: node = moved
  return node

def _changed_data(first: list, second: list) -> tuple[str, int] | None:
  """The user line whose Tensor data differs between two calls' logs (the n-th made at a line against the n-th), if any."""
  by_site: dict[tuple[str, int], list[bytes]] = {}
  for site, raw in first: by_site.setdefault(site, []).append(raw)
  seen: dict[tuple[str, int], int] = {}
  for site, raw in second:
    n = seen[site] = seen.get(site, -1) + 1
    if n < len(olds := by_site.get(site, [])) and olds[n] != raw: return site
  return None

def _current(owner: Any, key: Any) -> Any:
  """A watched float's value now: an entry of a dict or list (gone: None, which differs), else an attribute."""
  if isinstance(owner, (dict, list)):
    try: return owner[key]
    except (KeyError, IndexError): return None
  return getattr(owner, key)

_WATCH_ITEMS = 64  # entries of a container compared per replay: bounded, a replay costs a few microseconds

def _watch_list(fxn: Callable, args: tuple, kwargs: dict) -> list[tuple[Any, Any, Any, str]]:
  """The Python floats a function's kernels may have baked in, to compare on every replay: (owner, key, value, name) for
  Tensor.training, floats among the globals and closure variables it names and its arguments, and the float attributes
  of those objects (with floats in their list/dict attributes: an optimizer's param_groups). A float read only by a
  function it calls, or deeper in an object, isn't seen. An object whose `tensor_backed` names some of its floats keeps
  those in Tensors the kernels read (an optimizer's param group: lr): they may change, and aren't watched."""
  roots: list[tuple[str, Any, Any, Any]] = []  # (name, owner, key, value)
  if (code := getattr(fxn, "__code__", None)) is not None:
    g = fxn.__globals__
    roots += [(n, g, n, g[n]) for n in code.co_names if n in g]
    for n, cell in zip(code.co_freevars, fxn.__closure__ or ()):
      try: roots.append((n, None, None, cell.cell_contents))
      except ValueError: pass  # an empty cell
  roots += [(f"argument {i}", None, None, a) for i, a in enumerate(args)] + [(k, None, None, v) for k, v in kwargs.items()]
  watch: list[tuple[Any, Any, Any, str]] = [(Tensor, "training", Tensor.training, "Tensor.training")]
  def is_float(v: Any) -> bool: return type(v) is float
  def items(c: Any) -> list[tuple[Any, Any]]:
    """A list's or dict's entries (the first _WATCH_ITEMS): a float kept in a mutable container (scale[0], cfg["lr"])
    changes without rebinding any name."""
    if isinstance(c, list): return list(enumerate(c[:_WATCH_ITEMS]))
    live = getattr(c, "tensor_backed", ())  # an optimizer's param group keeps lr in a Tensor: it may change
    if isinstance(c, dict): return [(k, v) for _, (k, v) in zip(range(_WATCH_ITEMS), c.items()) if k not in live]
    return []
  for name, owner, key, obj in roots:
    if is_float(obj):
      if owner is not None: watch.append((owner, key, obj, name))
      continue
    watch += [(obj, k, v, f"{name}[{k!r}]") for k, v in items(obj) if is_float(v)]
    if isinstance(obj, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)) or not hasattr(obj, "__dict__"): continue
    backed = getattr(obj, "tensor_backed", ())
    for k, v in vars(obj).items():
      if is_float(v) and k not in backed: watch.append((obj, k, v, f"{name}.{k}"))
      if k not in backed: watch += [(v, i, f, f"{name}.{k}[{i!r}]") for i, f in items(v) if is_float(f)]
      for i, d in enumerate(v if isinstance(v, (list, tuple)) else [v] if isinstance(v, dict) else []):
        if isinstance(d, dict):
          live = getattr(d, "tensor_backed", ())
          watch += [(d, dk, dv, f"{name}.{k}[{i}][{dk!r}]") for dk, dv in d.items() if is_float(dv) and dk not in live]
  return watch

class _Replay:
  """The recorded kernels as a plan run by the one run loop (engine/realize.py ExecPlan), where each input's memory
  goes, and the memory from outside the function (weights, optimizer state) with the node that names it: an assign
  outside moves a tensor to new memory, and the replay follows it."""
  def __init__(self, items: list[ExecItem], inputs: list[Buffer], outside: dict[int, UOp], scratch: list[Buffer]):
    where = {id(b): i for i, b in enumerate(inputs)}
    self.plan = ExecPlan(items, print_at=2)
    self.scratch = scratch  # the memory of the buffers made and dropped inside (the memory plan's slots)
    # each input's slots in the items, and the memory they hold now: a decode step's KV caches come back in the same
    # memory every call, and their ~120 slots are left as they are
    self.slots: list[list[tuple[ExecItem, int]]] = [[] for _ in inputs]
    for ei in items:
      for j, b in enumerate(ei.bufs):
        if id(b) in where: self.slots[where[id(b)]].append((ei, j))
    self.bound: list[Any] = [None] * len(inputs)
    self.outside = [[node, [(ei, j) for ei in items for j, b in enumerate(ei.bufs) if id(b) == key]] for key, node in outside.items()]
    self.seen_writes = -1  # assigned_to.writes at the last scan of the outside memory's notes (none yet)
    jit_replays.add(self)  # (realize writes the notes while one lives)
  def __call__(self, inputs: list[Buffer], var_vals: dict[UOp, int]) -> None:
    for i, b in enumerate(inputs):
      if (mem := b.ensure_allocated()._buf) is not self.bound[i]:
        self.bound[i] = mem
        # the Buffer too, not only its memory: a slot left naming the capture's input kept that memory alive after the
        # tensor moved to new memory (an LLM prompt pass's captured KV cache: a 10 MiB copy)
        for ei, j in self.slots[i]: ei.rebind(j, b)
    # no forwarding note written since the last replay's scan (a decode loop's steps: no realized assign moved a tensor
    # between them): no weight moved, and the scan of every one (~700 for a 30-layer model, ~1 ms) is skipped
    if assigned_to.writes != self.seen_writes:
      for entry in self.outside:
        if (node := _latest(entry[0])) is not entry[0]:
          entry[0], buf = node, buffer_of(node)
          for ei, j in entry[1]: ei.rebind(j, buf)
      self.seen_writes = assigned_to.writes
    self.plan(var_vals)

class TinyJit(Generic[ReturnType]):
  """Decorate a function of Tensors. Call 1 runs it; call 2 runs it and records its kernels; later
  calls replay them on the new inputs and return the same output tensors, refilled (so keep what you
  need from an earlier call by copying it). Inputs must keep their shapes, dtypes and devices, and
  other arguments their values: anything else raises. Reading values into Python inside (.item(),
  .numpy(), .tolist()) raises while recording, since a replay couldn't repeat it. JIT=0 turns it off."""
  def __init__(self, fxn: Callable[..., ReturnType]):
    self.fxn = fxn
    self.cnt = 0
    self.signature: tuple | None = None
    self.replay: _Replay | None = None
    self.ret: Any = None
    self.var_vals: dict[UOp, int] = {}
    self.sym_outputs: list[tuple[Tensor, UOp]] = []  # returned tensors of symbolic shape, with their view unbound
    self.symbolic = False  # inputs or outputs of symbolic shape
    self.checks: list[tuple[Buffer, str, int]] = []  # index checks' reports the replay reads (frontend/indexing.py)
    self.watch: list[tuple[Any, Any, Any, str]] = []  # Python floats the capture saw, compared on each replay
    self.host_data: list = []  # the data of Tensors made from Python/numpy data in the first call, by user line
    self.last: _LastCall | None = None  # the last replay's arguments: the same again skip the checks
    self.first_templates: list = []  # the schedules the first call used, forgotten once captured
    functools.update_wrapper(self, fxn)
  def __get__(self, obj: Any, objtype: Any = None) -> Any: return self if obj is None else functools.partial(self.__call__, obj)
  def discard_scratch(self) -> None:
    """Give the pages of the replay's internal buffers (nothing outside reads them after a call) back to the system until
    the next replay, which faults them in again: for a function called now and then, such as an LLM's prompt pass (8 MiB
    of SmolLM2's 128-token pass stayed resident through every decoded token). The outputs and inputs are kept."""
    if self.replay is not None:
      for b in self.replay.scratch: b.discard()
  def reset(self) -> None:
    self.cnt, self.signature, self.replay, self.ret, self.sym_outputs, self.symbolic = 0, None, None, None, [], False
    self.checks, self.watch, self.host_data, self.last, self.first_templates = [], [], [], None, []

  def _run_logged(self, run: Callable[[], Any]) -> tuple[Any, list]:
    """run() (a plain call or the capture) with the data of Tensors made from Python/numpy data logged by user line."""
    tensor_module.host_data_log = log = []
    jit_calls[0] += 1
    try: return run(), log
    finally: tensor_module.host_data_log, jit_calls[0] = None, jit_calls[0] - 1

  def __call__(self, *args: Any, **kwargs: Any) -> ReturnType:
    # inside another TinyJit's capture, run plainly: the outer one records these kernels with its own
    if not JIT.value or _captures: return self.fxn(*args, **kwargs)
    if (last := self.last) is not None and not kwargs and last.same(args):
      return self._replay(last.tensors, last.inputs, [args[i] for i in last.var_at])
    tensors, signature = _describe(args, kwargs)
    if self.signature is not None and signature != self.signature:
      raise JitError(f"{self.fxn.__name__} was captured for other inputs: {_mismatch(self.signature, signature)}. "
                     "Call .reset() on the TinyJit to capture again, or use a new TinyJit for each input shape")
    self.signature = signature
    _as_plain_buffers(tensors)
    if self.cnt == 0:
      self.cnt = 1
      first_call_templates.append(templates := [])
      try: ret, self.host_data = self._run_logged(lambda: self.fxn(*args, **kwargs))
      finally: first_call_templates.pop()
      self.first_templates = templates
      return ret
    if self.cnt == 1:
      ret, host_data = self._run_logged(lambda: self._capture(tensors, args, kwargs))
      if (changed := _changed_data(self.host_data, host_data)) is not None:
        self.reset()
        raise JitError(f"{self.fxn.__name__} makes a Tensor from Python/numpy data at {changed[0]}:{changed[1]} whose values changed "
                       "between its first two calls: a replay would reuse this call's values. Pass that data as a Tensor argument")
      self.watch, self.host_data = _watch_list(self.fxn, args, kwargs), []
      return ret
    inputs = _buffers(tensors)
    self.last = _LastCall(args, tensors, inputs) if _LastCall.usable(args, kwargs) else None
    return self._replay(tensors, inputs, _find(list(args) + list(kwargs.values()), _is_bound_variable))

  def _replay(self, tensors: list[Tensor], inputs: list[Buffer], variables: list[UOp]) -> ReturnType:
    """Run the captured kernels on the inputs' memory, with the values of the bound Variables among the arguments."""
    assert self.replay is not None
    for owner, key, value, name in self.watch:
      if [now := _current(owner, key)] != [value]:  # (a list: a NaN equals itself)
        raise JitError(f"{name} was {value} when {self.fxn.__name__} was captured and is now {now}: a replay would use the old "
                       "value, baked into its kernels. Hold a value that changes in a Tensor (and assign to it), or call .reset() "
                       "to capture again")
    bound = {b.src[0]: b.src[1].arg for b in variables}
    if self.symbolic:  # Variables can come in the shapes of the inputs too, and outputs' shapes show this call's values
      bound.update((b.src[0], b.src[1].arg) for t in tensors for b in _shape_binds(t))
    var_vals = {**self.var_vals, **bound}
    self.replay(inputs, var_vals)
    if self.checks: tensor_module.raise_index_errors(self.checks)
    if self.symbolic:
      for t, view in self.sym_outputs: t.uop = bind_shapes(view, var_vals)
    return self.ret

  def _capture(self, tensors: list[Tensor], args: tuple, kwargs: dict) -> ReturnType:
    # the inputs' memory as the call starts: an input assigned inside moves to new memory during the call, and
    # _write_in_place puts its values back in this memory, which is what a replay must swap the next call's input into
    inputs = _buffers(tensors)
    capture = Capture()
    _captures.append(capture)
    tensor_module.captured_checks.clear()
    try:
      ret = self.fxn(*args, **kwargs)
      outputs = _tensors_in(ret)
      Tensor.realize_all(outputs)  # outputs are computed inside the capture, pending assigns too
    finally: _captures.pop()
    for t in outputs: _forget_graph(t)
    forget_schedules(capture.templates + self.first_templates)
    self.first_templates = []
    kept_inputs = {id(b) for b in inputs}
    items = capture.items
    kept = kept_inputs | {id(buffer_of(p.base)) for t in outputs for p in _parts(t.uop) if p.base.op is Ops.BUFFER}
    # index checks computed inside: the replay reads their reports after running, so their memory is kept
    self.checks = tensor_module.captured_checks[:]
    tensor_module.captured_checks.clear()
    kept |= {id(buf) for buf, _, _ in self.checks}
    tensor_module.raise_index_errors(self.checks)
    for t, before in capture.assigned.items():
      for b, a in zip(_parts(before), _parts(t.uop)): items = self._write_in_place(items, b, a, kept, capture.nodes)
      t.uop = before
    # buffers first seen as a kernel's output were made inside: the ones nothing outside keeps share memory
    seen: set[int] = set()
    internal: dict[int, Buffer] = {}
    made_inside: set[int] = set()
    for ei in items:
      if id(ei.bufs[0]) not in seen:
        made_inside.add(id(ei.bufs[0]))
        if id(ei.bufs[0]) not in kept: internal[id(ei.bufs[0])] = ei.bufs[0]
      seen.update(id(b) for b in ei.bufs)
    planned = planned_buffers([[id(b) for b in ei.bufs] for ei in items], internal)
    items = [ExecItem(ei.ast, ei.runner, [planned.get(id(b), b) for b in ei.bufs]) for ei in items]
    outside = {id(b): capture.nodes[id(b)] for ei in items for b in ei.bufs
               if id(b) not in made_inside and id(b) in capture.nodes and id(b) not in kept_inputs}
    scratch = list({id(b.base): b.base for b in planned.values() if b.base is not None}.values())
    self.replay, self.ret, self.cnt, self.var_vals = _Replay(items, inputs, outside, scratch), ret, 2, capture.var_vals
    self.sym_outputs = [(t, substitute_sym(t.uop, {}, _unbind)) for t in outputs if any(u.sym_args for u in t.uop.toposort)]
    self.symbolic = bool(self.sym_outputs) or any(t.uop.symbolic_shape for t in tensors)
    if DEBUG >= 1: print(f"TinyJit {self.fxn.__name__}: captured {len(items)} kernels")
    return ret

  @staticmethod
  def _write_in_place(items: list[ExecItem], before: UOp, after: UOp, kept: set[int], nodes: dict[int, UOp]) -> list[ExecItem]:
    """A tensor (one device's part of it) was assigned inside, from view `before` to view `after`: make the replay leave
    the new values in the old memory, so the next replay reads them (the caller points the tensor back at `before`). In
    place when no kernel reads the old values after the one writing the new ones (and that one reads them only where it
    writes); else by a copy at the end."""
    old, new = buffer_of(before.base), buffer_of(after.base)
    if old is new: return items
    if before.base.arg.offset or before.size != old.size:
      raise JitError(f"assign to a view of a tensor (shape {before.shape} of a buffer of {old.size}) inside TinyJit is not supported")
    # (an all-reduce writes every buffer it binds; the new values straight from one are put back by a copy)
    writer = max(i for i, ei in enumerate(items) if ei.bufs[0] is new or (ei.ast.op is Ops.ALLREDUCE and new in ei.bufs))
    ast, bufs = items[writer].ast, items[writer].bufs
    in_place = ast.op not in (Ops.COPY, Ops.ALLREDUCE) and not any(old in ei.bufs for ei in items[writer + 1:]) and \
      (old not in bufs or _reads_only_where_it_writes(ast, bufs.index(old)))
    old.ensure_allocated().copyin(new.as_bytes())  # this call's result, where the next call reads it
    kept.add(id(old))
    nodes[id(old)] = before.base
    assigned_to.pop(before.base)  # t stays in its old memory: nothing moved
    # (in place, a copy of the old values into the new memory, before a kernel that writes only a box of it, copies
    # the memory onto itself: dropped)
    if in_place: return [ExecItem(ei.ast, ei.runner, bufs) for ei in items
                         if (bufs := [old if b is new else b for b in ei.bufs]) and not (ei.ast.op is Ops.COPY and bufs[0] is bufs[1])]
    return [*items, ExecItem(UOp(Ops.COPY, before.dtype, (), before.device), BufferCopy(old.nbytes, old.device, new.device), [old, new])]
