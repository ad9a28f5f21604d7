"""Composite ops built once per signature and replayed: a composite (layernorm, gelu, linear, softmax, attention, the body
of cross_entropy) whose graph depends on its tensor arguments only through their shapes, dtypes and devices is built
the first time over stand-in leaves and kept as a Template (uop/ops.py); a later call with the same signature rebuilds
the same nodes over its own arguments' nodes, row by row, without the Tensor methods' checks, broadcasting, dtype
promotion, views and Python frames. A small transformer's forward pass built ~550 nodes through ~1,200 Tensor method
calls, 6 us a node.

A replay is one CALL node over the arguments' nodes (uop/ops.py). The graph the composite builds (the same hash-consed
nodes: tests compare them) is what the CALL expands to where it is scheduled or differentiated by the rules, so scheduling
and autograd see no difference; every other walk of the graph (backward's structure key, realize's) sees one node where
the composite built ~20 (a small transformer's forward pass: ~450 nodes a step -> 21 CALLs). A composite called while
another is being built is built as it is (expanded), so a template holds no CALL: a Vjp's captured nodes are plain nodes
of its graph, which a backward template rebuilds (gradient.py).

What a composite may do to be replayed (`replayed` below): read its tensors' shapes, dtypes and devices, never their
graphs or values (contiguous() of a buffer is the buffer, _may_need_grad() walks the graph, index checks read the values:
those stay outside), and no side effect but building nodes (no realize, no random numbers, no views of its inputs handed
back)."""
from __future__ import annotations
import functools
from typing import Any, Callable
from attograd.dtype import DType, dtypes
from attograd.helpers import gc_paused
from attograd.uop.ops import UOp, Ops, Template
from attograd.gradient import GradMode

# the Tensor class (set by tensor.py, which imports this module): what an argument must be to be a leaf, and whose
# `training` switch a composite may read
tensor_class: Any = None

_templates: dict[tuple, tuple[Template, type] | None] = {}  # None: this signature builds a graph a Template can't replay
_KEPT = 1024  # signatures kept (a model has a few dozen; a cleared cache only costs the builds again)
_PLAIN = frozenset({int, bool, str, type(None), DType})

def _stand_in(i: int, shape: tuple[int, ...], dtype: DType, device: str) -> UOp:
  """Leaf i of a composite being built: a node nothing else can be (a constant whose value is a marker), of the shape."""
  u = UOp(Ops.CONST, dtype, (UOp(Ops.DEVICE, dtypes.void, (), device),), ("stand-in", i))
  if not shape: return u
  u = UOp(Ops.RESHAPE, dtype, (u,), (1,) * len(shape))
  return u if u.arg == shape else UOp(Ops.EXPAND, dtype, (u,), shape)

def _arg_key(a: Any) -> Any:
  """a's part of the key, or _UNKEYED for a value the key can't hold (then the composite is built as it is)."""
  t = type(a)
  if t in _PLAIN: return (t, a)
  if t is float: return (t, a.hex())  # by its bits: -0.0 is not 0.0, and NaN is itself
  if t is tuple:
    out = tuple(_arg_key(x) for x in a)
    return _UNKEYED if _UNKEYED in out else out
  return _UNKEYED
_UNKEYED: Any = object()

def replayed(fn: Callable | None = None, *, switches: Callable[[], tuple] | None = None) -> Callable:
  """fn (a composite whose tensor arguments are positional) built once per signature and replayed after: see above.
  The signature: fn, each argument (a tensor by shape, dtype, device and which earlier tensor argument it is, if the
  same), keyword arguments, and the switches a composite's graph may depend on (grad mode, Tensor.training, the default
  dtypes, and what `switches()` gives: the module settings fn reads). Symbolic shapes and sharded tensors are built as
  they are."""
  if fn is None: return functools.partial(replayed, switches=switches)
  @functools.wraps(fn)
  def call(*args: Any, **kw: Any) -> Any:
    tc = tensor_class
    key: list[Any] = [fn, GradMode.enabled, tc.training, dtypes.default_float, dtypes.default_int]
    if switches is not None: key.append(switches())
    leaves: list[UOp] = []
    for a in args:
      if isinstance(a, tc):
        # (an earlier argument's node, by identity: a UOp's == is object's, so `in` is a scan in C, a stack of 30 tensors)
        if (u := a.uop) in leaves: key.append(leaves.index(u))
        else:
          if type(d := u.device) is not str or u.symbolic_shape: return fn(*args, **kw)
          leaves.append(u); key.append((u.shape, u.dtype, d))
      elif (k := _arg_key(a)) is _UNKEYED: return fn(*args, **kw)
      else: key.append(k)
    if kw:
      for name in sorted(kw):
        if (k := _arg_key(kw[name])) is _UNKEYED: return fn(*args, **kw)
        key += (name, k)
    tkey = tuple(key)
    if (entry := _templates.get(tkey, _MISSING)) is None: return fn(*args, **kw)
    if entry is _MISSING: entry = _build(tkey, fn, args, kw, leaves)
    if entry is None: return fn(*args, **kw)
    template, typ = entry
    return typ(template(*leaves) if _building[0] else template.calls(*leaves)[0])  # (one output: the result is a tensor)
  return call
_MISSING: Any = object()
_building = [0]  # composites being built (_build) around this call

def _build(key: tuple, fn: Callable, args: tuple, kw: dict, leaves: list[UOp]) -> tuple[Template, type] | None:
  """fn built over stand-ins for its tensor arguments, kept as a Template; None when the graph can't be replayed."""
  tc = tensor_class
  stand = [_stand_in(i, u.shape, u.dtype, u.device) for i, u in enumerate(leaves)]
  it = iter(stand)
  sub: dict[int, Any] = {}
  for a in args:
    if isinstance(a, tc) and id(a.uop) not in sub: sub[id(a.uop)] = tc(next(it))
  with gc_paused():
    _building[0] += 1
    try: out = fn(*(sub[id(a.uop)] if isinstance(a, tc) else a for a in args), **kw)
    except Exception: return None  # (not kept: the call itself raises, with its own tensors)
    finally: _building[0] -= 1
    entry: tuple[Template, type] | None = None
    # a result that is a view of a tensor still alive (the stand-ins are, here) is a view of an argument: not replayed.
    # One of a tensor the composite made and dropped (matmul's reshape of its sum) is a tensor of its own
    if isinstance(out, tc) and out._requires_grad is None and out.grad is None and ((vo := out._view_of) is None or vo[0]() is None):
      try: template = Template(tuple(stand), out.uop)
      except AssertionError: template = None  # a result that doesn't depend on the tensor arguments
      if template is not None and not template.opaque: entry = (template, type(out))
  if len(_templates) >= _KEPT: del _templates[next(iter(_templates))]  # the oldest: a bounded cache
  _templates[key] = entry
  return entry
