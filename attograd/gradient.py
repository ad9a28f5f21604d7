"""Autograd as rewrite rules (DESIGN §3.2): for each forward op, a rule maps (the op's node,
the gradient flowing into it) to the gradients of its sources. Gradients are lazy UOps and
fuse like any other graph."""
from __future__ import annotations
import functools
import math
from typing import Any, Callable
from attograd.dtype import DType, dtypes
from attograd.helpers import ContextVar, Switch, argsort
from attograd.uop.ops import UOp, Ops, GroupOp, Vjp, Template
from attograd.uop.patterns import UPat, PatternMatcher
from attograd.schedule.multi import shard_uop
from attograd.schedule.schedule import CALL_EXPANDED
from attograd.uop.patterns import graph_rewrite

def _c(like: UOp, v: float) -> UOp: return like.const_shaped(v)

def _reduce_to(g: UOp, shape: tuple[int, ...]) -> UOp:
  """Sum a gradient over the axes an expand broadcast."""
  return g.reduce_axis(Ops.ADD, tuple(i for i, (s, n) in enumerate(zip(shape, g.shape)) if s != n)).reshape(shape)

def _max_grad(ctx: UOp, ret: UOp) -> tuple[UOp, UOp]:
  # ties split the gradient evenly, as torch.maximum does
  a, b = ret.src
  half = _c(ctx, 0.5)
  ga = (a < b).where(_c(ctx, 0), UOp(Ops.CMPEQ, dtypes.bool, (a, b)).where(ctx * half, ctx))
  gb = (b < a).where(_c(ctx, 0), UOp(Ops.CMPEQ, dtypes.bool, (a, b)).where(ctx * half, ctx))
  return ga, gb

def _bounds(m: UOp) -> tuple[tuple[int, int], ...] | None:
  """(start, end) of each part of a MULTI along its split axis (None: replicated)."""
  if m.arg is None: return None
  ends = [0]
  for p in m.src: ends.append(ends[-1] + p.shape[m.arg])
  return tuple(zip(ends[:-1], ends[1:]))

def _shard_grad(ctx: UOp, ret: UOp) -> tuple[UOp]:
  (i, axis, bounds, _), x = ret.arg, ret.src[0]
  g = UOp(Ops.COPY, ctx.dtype, (UOp(Ops.CONTIGUOUS, ctx.dtype, (ctx,)), UOp(Ops.DEVICE, dtypes.void, (), x.device)))
  if axis is None: return (g,)
  return (g.pad(tuple((bounds[i][0], n - bounds[i][1]) if a == axis else (0, 0) for a, n in enumerate(x.shape))),)

def _reduce_grad(ctx: UOp, ret: UOp) -> tuple[UOp]:
  x = ret.src[0]
  if ret.arg[0] is Ops.ADD: return (ctx.expand(x.shape),)
  if ret.arg[0] is Ops.MAX:
    # like torch.amax: the gradient is shared evenly by every element equal to the max
    hit = UOp(Ops.CMPEQ, dtypes.bool, (x, ret.expand(x.shape))).cast(ctx.dtype)
    count = hit.reduce_axis(Ops.ADD, ret.arg[1])
    return ((ctx / count).expand(x.shape) * hit,)
  if ret.arg[0] is Ops.MUL:
    # as torch: the product of the others, where ctx*ret/x is 0/0: with one zero in the group the zero's gradient is the
    # product of the rest and the others' 0; with two or more every gradient is 0
    axes = ret.arg[1]
    zero = UOp(Ops.CMPEQ, dtypes.bool, (x, _c(x, 0)))
    zeros = zero.cast(x.dtype).reduce_axis(Ops.ADD, axes)
    rest = zero.where(_c(x, 1), x).reduce_axis(Ops.MUL, axes)  # the product of the nonzero ones
    one_zero = UOp(Ops.CMPEQ, dtypes.bool, (zeros, _c(zeros, 1))).expand(x.shape)
    none_zero = UOp(Ops.CMPEQ, dtypes.bool, (zeros, _c(zeros, 0))).expand(x.shape)
    g = ctx.expand(x.shape)
    at_zero = one_zero.where(zero.where(g * rest.expand(x.shape), _c(g, 0)), _c(g, 0))
    return (none_zero.where(g * ret.expand(x.shape) / none_zero.where(x, _c(x, 1)), at_zero),)
  raise NotImplementedError(f"no gradient for reduce {ret.arg[0]}")

def _cos(x: UOp) -> UOp:
  # 1 - 2*sin(x/2)^2, as Tensor.cos: x/2 is exact, while sin(pi/2 - x) rounds away the digits of a large x (the gradient
  # of sin at 1e10 had the wrong sign)
  s = (x * _c(x, 0.5)).alu(Ops.SIN)
  return _c(x, 1) - _c(x, 2) * s * s

def _pad_grad(ctx: UOp, ret: UOp) -> tuple[UOp]:
  return (ctx.shrink(tuple((b, b + s) for (b, _), s in zip(ret.arg, ret.src[0].shape))),)

def _shrink_grad(ctx: UOp, ret: UOp) -> tuple[UOp]:
  return (ctx.pad(tuple((b, s - e) for (b, e), s in zip(ret.arg, ret.src[0].shape))),)

pm_gradient = PatternMatcher([
  (UPat(Ops.ADD, name="ret"), lambda ctx, ret: (ctx, ctx)),
  (UPat(Ops.SUB, name="ret"), lambda ctx, ret: (ctx, -ctx)),
  (UPat(Ops.MUL, name="ret"), lambda ctx, ret: (ctx * ret.src[1], ctx * ret.src[0])),
  (UPat(Ops.MULACC, name="ret"), lambda ctx, ret: (ctx * ret.src[1], ctx * ret.src[0], ctx)),
  (UPat(Ops.FDIV, name="ret"), lambda ctx, ret: (ctx / ret.src[1], -ctx * ret / ret.src[1])),
  (UPat(Ops.NEG, name="ret"), lambda ctx, ret: (-ctx,)),
  (UPat(Ops.EXP, name="ret"), lambda ctx, ret: (ctx * ret,)),
  (UPat(Ops.EXP2, name="ret"), lambda ctx, ret: (ctx * ret * _c(ctx, math.log(2)),)),
  (UPat(Ops.LOG2, name="ret"), lambda ctx, ret: (ctx / (ret.src[0] * _c(ctx, math.log(2))),)),
  (UPat(Ops.SIN, name="ret"), lambda ctx, ret: (ctx * _cos(ret.src[0]),)),
  (UPat(Ops.SQRT, name="ret"), lambda ctx, ret: (ctx / (ret * _c(ctx, 2)),)),
  (UPat(Ops.RECIP, name="ret"), lambda ctx, ret: (-ctx * ret * ret,)),
  (UPat(Ops.TRUNC, name="ret"), lambda ctx, ret: (_c(ctx, 0),)),
  (UPat(Ops.MAX, name="ret"), _max_grad),
  (UPat(Ops.WHERE, name="ret"), lambda ctx, ret: (None, ret.src[0].where(ctx, _c(ctx, 0)), ret.src[0].where(_c(ctx, 0), ctx))),
  (UPat(GroupOp.Comparison | {Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.IDIV, Ops.MOD}, name="ret"),
   lambda ctx, ret: (None,) * len(ret.src)),
  (UPat(Ops.CAST, name="ret"), lambda ctx, ret: (ctx.cast(ret.src[0].dtype) if dtypes.is_float(ret.src[0].dtype) else None,)),
  (UPat(Ops.RESHAPE, name="ret"), lambda ctx, ret: (ctx.reshape(ret.src[0].shape),)),
  (UPat(Ops.PERMUTE, name="ret"), lambda ctx, ret: (ctx.permute(tuple(argsort(ret.arg))),)),
  (UPat(Ops.EXPAND, name="ret"), lambda ctx, ret: (_reduce_to(ctx, ret.src[0].shape),)),
  (UPat(Ops.PAD, name="ret"), _pad_grad),
  (UPat(Ops.SHRINK, name="ret"), _shrink_grad),
  (UPat(Ops.FLIP, name="ret"), lambda ctx, ret: (ctx.flip(ret.arg),)),
  (UPat(Ops.REDUCE_AXIS, name="ret"), _reduce_grad),
  (UPat(Ops.CONTIGUOUS, name="ret"), lambda ctx, ret: (ctx,)),
  (UPat(Ops.CONTIGUOUS_BACKWARD, name="ret"), lambda ctx, ret: (UOp(Ops.CONTIGUOUS, ctx.dtype, (ctx,)),)),
  (UPat(Ops.DETACH, name="ret"), lambda ctx, ret: (None,)),
  # a copy between devices: the gradient goes back to the device the value came from (contiguous, as a copy's source is)
  # (to a sharded tensor's devices: a copy on each, whatever its split; schedule/multi.py reshards where it is used)
  (UPat(Ops.COPY, name="ret"), lambda ctx, ret: (shard_uop(ctx, ret.src[0].device, None) if isinstance(ret.src[0].device, tuple) else
                                                 UOp(Ops.COPY, ctx.dtype, (UOp(Ops.CONTIGUOUS, ctx.dtype, (ctx,)),
                                                                           UOp(Ops.DEVICE, dtypes.void, (), ret.src[0].device))), None)),
  # a sharded tensor's part i is the gradient's part i, split as the tensor is (schedule/multi.py reshards it if need be).
  # Replicated, every part is the one logical value: the gradient flows once, through the first
  (UPat(Ops.MULTI, name="ret"), lambda ctx, ret: tuple(UOp(Ops.SHARD, ctx.dtype, (ctx,), (i, ret.arg, _bounds(ret), ret.device))
                                                       if ret.arg is not None or i == 0 else None for i in range(len(ret.src)))),
  # a part of x goes back where x is and into its place along the split axis
  (UPat(Ops.SHARD, name="ret"), _shard_grad),
  # (a Vjp's, the functions autograd calls, are called by compute_gradient: only for the sources a target needs)
  (UPat(Ops.WITH_DERIVATIVE, name="ret"), lambda ctx, ret: (None,) + sum(((ctx * d, None) for d in ret.src[2::2]), ())),
])

_CALL_BIT, _calls_expanded = 1 << Ops.CALL.value, PatternMatcher([CALL_EXPANDED])

# ***** a backward pass as CALLs of a Template kept by the structure of the graph it differentiates *****
# A training step differentiates a graph of one structure every step, over other buffers (the batch, the weights the last
# step wrote). The rules build its gradients once; they are kept as a Template (uop/ops.py) over the graph's leaves, and
# later passes make one CALL node per gradient over this pass's leaves: the scheduler expands them into the graph the rules
# build (the same kernels), and realize's walk sees a node per gradient where the rules built ~400 a step.
# The key is everything the rules read: each node's op, dtype, arg and sources by place (its buffers anonymous), the
# functions a Vjp calls (their code and what their closures hold: a tensor by its node's place), which nodes are targets,
# the gradient flowing in, and the switches the front-end ops a Vjp calls may read (grad mode, Context variables).
_backward_templates: dict[tuple, Any] = {}
_BACKWARD_TEMPLATES_KEPT = 16
_seen_once: dict[int, None] = {}  # the keys' hashes of graphs differentiated once: a template is made the second time
_SEEN_KEPT = 64
_UNUSABLE = object()  # a graph whose gradients can't be a template (see _backward_template): the rules each time
_NO_TEMPLATE_OPS = frozenset({Ops.BUFFER, Ops.BIND, Ops.ASSIGN, Ops.CALL, Ops.DEFINE_VAR})
# graphs differentiated by the rules every time: sharded ones (a CALL is scheduled on one device, as the optimizers'
# templates), symbolic sizes (a Variable's binding must reach every node) and pending writes (an ASSIGN's graph)
_RULES_ONLY = sum(1 << op.value for op in (Ops.MULTI, Ops.SHARD, Ops.BIND, Ops.DEFINE_VAR, Ops.ASSIGN))

def _value_key(v: Any, at: dict[UOp, int], depth: int) -> Any:
  """What a vjp's closure holds, as part of a key (_UNUSABLE: something a key can't cover)."""
  if v is None or type(v) in (int, bool, str): return (type(v), v)
  if type(v) is float: return ("float", v.hex())
  if isinstance(v, UOp): return ("node", at[v]) if v in at else _UNUSABLE
  if isinstance(v, (type, DType, Ops)): return v  # a class (the Tensor type a vjp wraps its gradient in), a dtype
  if isinstance(u := getattr(v, "uop", None), UOp): return ("tensor", at[u]) if u in at else _UNUSABLE  # a Tensor: its node
  if isinstance(v, tuple):
    out = tuple(_value_key(x, at, depth) for x in v)
    return _UNUSABLE if any(x is _UNUSABLE for x in out) else out
  if hasattr(v, "__code__"): return _fn_key(v, at, depth + 1)
  if type(v) is functools.partial and not v.keywords:  # (a Vjp's make: a function with some arguments given)
    out = ("partial", _value_key(v.func, at, depth + 1), _value_key(v.args, at, depth))
    return _UNUSABLE if _UNUSABLE in out else out
  return _UNUSABLE

def _fn_key(fn: Any, at: dict[UOp, int], depth: int = 0) -> Any:
  """A function a Vjp calls, as a key: its code, defaults and what its closure holds (nested functions in turn)."""
  if depth > 6 or getattr(fn, "__kwdefaults__", None): return _UNUSABLE
  try: held = (*(fn.__defaults__ or ()), *(c.cell_contents for c in fn.__closure__ or ()))
  except ValueError: return _UNUSABLE  # (an empty cell)
  out = (fn.__code__, fn.__module__, *(_value_key(v, at, depth) for v in held))
  return _UNUSABLE if any(x is _UNUSABLE for x in out) else out

def _structure(topo: dict[UOp, None], root: UOp, root_grad: UOp, targets: set[UOp],
               kept: set[UOp]) -> tuple[tuple, list[UOp], list[UOp]] | None:
  """(key, leaves, targets in the graph in the key's order) of a backward pass, or None when the key can't cover it. The
  leaves: the buffers, the Vjps' nodes and the nodes in `kept` (targets, tensors that require grad) the graph holds."""
  at: dict[UOp, int] = {}
  # the graph as one flat tuple, node after node: (BUFFER, dtype, device, size, offset) or (op, dtype, arg, number of
  # sources, each source's place): read from the start it can only be this graph. (A tuple a node was a third slower to
  # build, and to hash and compare when looked up)
  flat: list = []
  ext = flat.extend
  leaves: list[UOp] = []
  vjps: list[UOp] = []
  pos, BUF, WD, CALL = at.__getitem__, Ops.BUFFER, Ops.WITH_DERIVATIVE, Ops.CALL
  for nodes in (topo, root_grad.toposort):
    for u in nodes:
      if u in at: continue
      at[u] = len(at)
      if (op := u.op) is BUF:
        a = u.arg
        ext((BUF, u.dtype, a.device, a.size, a.offset))
        leaves.append(u)
      else:
        arg, src = u.arg, u.src
        if op is WD and type(arg) is Vjp: vjps.append(u); leaves.append(u); arg = None  # (its functions: below)
        elif op is CALL and arg.body.opmask & _RULES_ONLY: return None  # (what its expansion holds: see _RULES_ONLY)
        ext((op, u.dtype, ("float", arg.hex()) if type(arg) is float else arg, len(src)))
        ext(map(pos, src))
  # (a Vjp given by make and the nodes it reads by those: its functions aren't made for the key)
  vjp_keys = tuple(_value_key((u.arg.make, u.arg.captured), at, 0) if u.arg.make is not None else _fn_key(f, at)
                   for u in vjps for f in ((None,) if u.arg.make is not None else u.arg.fns))
  if any(k is _UNUSABLE for k in vjp_keys): return None
  wanted = sorted((t for t in targets if t in at), key=pos)
  # the targets and the other tensors that require grad are leaves too (a CALL's sources): a gradient differentiated again
  # (a gradient penalty) must hold them, or the second pass finds none (a parameter is a view of its buffer, not the buffer)
  known = set(leaves)
  shown = sorted((v for v in kept if v in at and v not in known), key=pos)
  leaves += shown
  switches = (GradMode.enabled, dtypes.default_float, tuple(v.value for v in ContextVar._all.values()))
  key = (tuple(flat), vjp_keys, tuple(map(pos, wanted)), tuple(map(pos, shown)), at[root], at[root_grad], switches)
  return key, leaves, wanted

def _backward_template(leaves: list[UOp], outputs: list[UOp], forward: dict[UOp, None]) -> Any:
  """The gradients' Template over the leaves, or _UNUSABLE when rebuilt they could go stale: a node no leaf is below that
  reads memory (a vjp read a tensor outside the graph: rebuilt, it would read the values of then), or a Vjp made by the
  backward pass itself (its functions hold that pass's tensors: a second-order gradient through a rebuilt one would
  differentiate the graph of then). One the forward pass made (in `forward`, the expanded graph differentiated: a
  replayed composite's) is rebuilt over the template's nodes as the replay builds it."""
  try: t = Template(tuple(leaves), UOp(Ops.SINK, dtypes.void, tuple(outputs)))
  except AssertionError: return _UNUSABLE  # (no gradient depends on a leaf)
  if t.opaque: return _UNUSABLE
  made = UOp(Ops.SINK, dtypes.void, tuple(outputs)).toposort
  if any(u.op is Ops.WITH_DERIVATIVE and type(u.arg) is Vjp and u not in forward for u in made): return _UNUSABLE
  for f in t.fixed:
    if any(u.op in _NO_TEMPLATE_OPS or (u.op is Ops.WITH_DERIVATIVE and type(u.arg) is Vjp) for u in f.toposort): return _UNUSABLE
  return t

def compute_gradient(root: UOp, root_grad: UOp, targets: set[UOp],
                     requiring: set[UOp] | frozenset = frozenset()) -> dict[UOp, UOp]:
  """Gradients of root with respect to each target, by reverse-mode accumulation: built by the rules, or as CALLs of the
  template kept for graphs of this structure. `requiring`: the nodes of the tensors that require grad, which a gradient's
  graph keeps as they are (its CALLs' sources), for a backward pass through it."""
  topo = root.toposort
  rules_only = (root.opmask | root_grad.opmask) & _RULES_ONLY
  structure = None if rules_only else _structure(topo, root, root_grad, targets, targets | requiring)
  if structure is None: return _expanded_gradient(root, root_grad, targets)
  key, leaves, wanted = structure
  if (t := _backward_templates.get(key)) is not None:
    if t is _UNUSABLE: return _expanded_gradient(root, root_grad, targets)
    body, which = t
    return dict(zip([wanted[i] for i in which], body.calls(*leaves)))
  grads, forward = _expanded_gradient(root, root_grad, targets, with_topo=True)
  # the template is made the second time a graph of this structure is differentiated: one seen once may never come again
  if (h := hash(key)) not in _seen_once:
    if len(_seen_once) >= _SEEN_KEPT: del _seen_once[next(iter(_seen_once))]
    _seen_once[h] = None
    return grads
  del _seen_once[h]
  which = tuple(i for i, w in enumerate(wanted) if w in grads)
  body = _backward_template(leaves, [grads[wanted[i]] for i in which], forward)
  if len(_backward_templates) >= _BACKWARD_TEMPLATES_KEPT: del _backward_templates[next(iter(_backward_templates))]
  _backward_templates[key] = _UNUSABLE if body is _UNUSABLE else (body, which)
  # (this pass's gradients as CALLs too: its schedule is the one the next passes reuse)
  return grads if body is _UNUSABLE else dict(zip([wanted[i] for i in which], body.calls(*leaves)))

def _expanded_gradient(root: UOp, root_grad: UOp, targets: set[UOp], with_topo: bool = False) -> Any:
  """The rules' gradients (and, with_topo, the graph they walked). A CALL (a replayed composite's, a sort's: uop/ops.py) is
  differentiated as the graph it stands for: the graph is expanded, with the targets (a target may be a CALL, or above one)."""
  if not root.opmask & _CALL_BIT:
    topo = root.toposort
    grads = _rules_gradient(topo, root, root_grad, targets)
  else:
    order = list(targets)
    sink = graph_rewrite(UOp(Ops.SINK, dtypes.void, (root, *order)), _calls_expanded, name="calls_expanded")
    topo = sink.src[0].toposort
    got = _rules_gradient(topo, sink.src[0], root_grad, set(sink.src[1:]))
    grads = {t: got[e] for t, e in zip(order, sink.src[1:]) if e in got}
  return (grads, topo) if with_topo else grads

def _rules_gradient(topo: dict[UOp, None], root: UOp, root_grad: UOp, targets: set[UOp]) -> dict[UOp, UOp]:
  """Gradients of root with respect to each target, built by the rules (reverse-mode accumulation over topo)."""
  # only walk nodes that lie on a path from root to some target
  # (plain loops, no any() over a generator: a model's graph has thousands of nodes, walked twice per backward)
  on_path: dict[UOp, bool] = {}
  for u in topo:
    if u in targets: on_path[u] = True; continue
    on_path[u] = False
    if u.op is Ops.DETACH: continue
    for s in u.src:
      if on_path[s]: on_path[u] = True; break
  grads: dict[UOp, UOp] = {root: root_grad}
  for u in reversed(topo):
    if u not in grads: continue
    for s in u.src:
      if on_path[s]: break
    else: continue
    if u.op is Ops.WITH_DERIVATIVE and isinstance(u.arg, Vjp):  # only the products a target needs are built
      src_grads = (None, *(f(grads[u]) if on_path[s] else None for f, s in zip(u.arg.fns, u.src[1:])))
    else: src_grads = pm_gradient.first_result(u, ctx=grads[u])
    if src_grads is None: raise NotImplementedError(f"no gradient rule for {u.op}")
    for s, g in zip(u.src, src_grads):
      if g is None or not on_path[s]: continue
      grads[s] = grads[s] + g if s in grads else g
  return {t: grads[t] for t in targets if t in grads}

class GradMode:
  """Whether autograd records (PyTorch's grad mode). Under no_grad a realized result forgets the graph it came from,
  so no gradient flows back through it (and its graph can be freed), and in-place ops may write leaves that require
  grad (an optimizer step, an EMA of the weights). A still-lazy result made under no_grad keeps its graph: realize it
  inside the block if a later backward() must not see through it."""
  enabled: bool = True

class no_grad(Switch):
  """`with attograd.no_grad():`, `@attograd.no_grad()` or `@attograd.no_grad` (as torch): autograd doesn't record (see GradMode)."""
  def __new__(cls, fn: Callable | None = None) -> Any:
    if fn is None: return super().__new__(cls)
    return cls()(fn)  # the bare decorator: no_grad(fn) is no_grad()(fn)
  def __init__(self, fn: Callable | None = None) -> None: super().__init__(GradMode, "enabled", False)
class enable_grad(Switch):
  """Autograd records again inside a no_grad block (also a bare decorator, as no_grad)."""
  def __new__(cls, fn: Callable | None = None) -> Any:
    if fn is None: return super().__new__(cls)
    return cls()(fn)
  def __init__(self, fn: Callable | None = None) -> None: super().__init__(GradMode, "enabled", True)
class inference_mode(Switch):
  """torch.inference_mode: here the same as no_grad. inference_mode(False) records as usual."""
  def __init__(self, mode: bool = True) -> None: super().__init__(GradMode, "enabled", not mode)
def is_grad_enabled() -> bool: return GradMode.enabled
class set_grad_enabled(Switch):
  """torch.set_grad_enabled(mode): sets grad mode at the call (a plain function call keeps it set), and as a context
  manager or decorator restores the previous mode afterwards."""
  def __init__(self, mode: bool) -> None:
    super().__init__(GradMode, "enabled", bool(mode))
    self.prev.append(GradMode.enabled)  # what __exit__ of the `with` restores: the mode before this call
    GradMode.enabled = bool(mode)
  def __enter__(self) -> Switch:
    if self.prev: return self  # entered right after the call, which already set the mode
    return super().__enter__()
  def __call__(self, fn: Callable) -> Callable:
    GradMode.enabled = self.prev.pop()  # as a decorator the mode is set per call, not by making it (as torch)
    return super().__call__(fn)
