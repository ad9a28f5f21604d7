"""An optimizer's per-parameter update built once as a graph over placeholders, then filled in every step.

Building AdamW's update with Tensor ops costs ~25 us an op (broadcasts of the group's scalars, dtype checks, assign's
bookkeeping): a 30-parameter model's updates were a fifth of a training step's Python time without TinyJit. The graph
is the same every step but for its inputs (the parameter, its gradient, its state, the group's scalar tensors), so it
is built once per parameter kind (shape, dtype, device, the group's settings), over placeholder tensors, and each step
only its nodes that read an input are made again, as UOps: a few microseconds a node."""
from __future__ import annotations
from typing import Any, Callable
from attograd.tensor import Tensor, _pending_realize
from attograd.uop.ops import UOp, Ops
from attograd.schedule.schedule import new_buffer, buffer_view

def _placeholder(like: Tensor) -> Tensor:
  """A tensor like `like` over a buffer of its own that nothing ever realizes (no memory is allocated for it)."""
  return Tensor(buffer_view(new_buffer(like.device, like.numel(), like.dtype), like.shape))

def _rebuild_plan(root: UOp, stops: set[UOp]) -> list[UOp]:
  """The nodes of root's graph that read a stop node (an input, a state write) without going through one, sources first:
  the only ones a step makes again."""
  reads: dict[UOp, bool] = {}
  plan: list[UOp] = []
  stack = [(root, False)]
  while stack:
    u, ready = stack.pop()
    if u in reads: continue
    if u in stops: reads[u] = True; continue
    if not ready:
      stack += [(u, True), *((s, False) for s in u.src if s not in reads)]
      continue
    if (r := any(reads[s] for s in u.src)): plan.append(u)
    reads[u] = r
  return plan

def _fill(plan: list[UOp], root: UOp, new: dict[UOp, UOp]) -> UOp:
  for u in plan: new[u] = UOp(u.op, u.dtype, tuple(new.get(s, s) for s in u.src), u.arg)
  return new.get(root, root)

def _flat(tensors: dict[str, Any]) -> list[Tensor]:
  """A group's tensors (each a Tensor, or a tuple of them: betas) in a fixed order."""
  return [x for k in sorted(tensors) for x in (tensors[k] if isinstance(tensors[k], tuple) else (tensors[k],))]

class UpdateTemplate:
  """update(p, g, group, state) built over placeholders: `inputs` (placeholder nodes in the order `reals` lists the real
  tensors), the state writes in the order they were made (state name, its ASSIGN node over the placeholder), and the
  update's value."""
  def __init__(self, update: Callable[..., Tensor], p: Tensor, g: Tensor, group: Any, state: dict[str, Tensor]):
    ph = {k: _placeholder(t) for k, t in state.items()}
    proxy = type(group).__new__(type(group))  # the group's settings as they are; its tensors as placeholders
    dict.update(proxy, group)
    proxy.device, proxy._seen = group.device, {}
    proxy.tensors = {k: tuple(_placeholder(x) for x in t) if isinstance(t, tuple) else _placeholder(t) for k, t in group.tensors.items()}
    proxy.factors = {k: _placeholder(t) for k, t in group.factors.items()}
    P, G = _placeholder(p), _placeholder(g)
    placeholders = [P, G, *(ph[k] for k in sorted(ph)), *_flat(proxy.tensors), *_flat(proxy.factors)]
    self.inputs = [t.uop for t in placeholders]
    try: out = update(P, G, proxy, ph)
    finally:
      for t in ph.values(): _pending_realize.pop(id(t), None)  # the placeholders' writes are never realized
    writes = {t.uop: k for k, t in ph.items() if t.uop.op is Ops.ASSIGN}
    order = [u for u in UOp(Ops.SINK, out.dtype, (out.uop, *writes)).toposort if u in writes]
    stops = {*self.inputs, *writes}
    self.writes = [(writes[a], a, _rebuild_plan(a.src[1], stops)) for a in order]
    self.out, self.plan = out.uop, _rebuild_plan(out.uop, stops)

  @staticmethod
  def reals(p: Tensor, g: Tensor, group: Any, state: dict[str, Tensor]) -> list[Tensor]:
    return [p, g, *(state[k] for k in sorted(state)), *_flat(group.tensors), *_flat(group.factors)]

  def __call__(self, p: Tensor, g: Tensor, group: Any, state: dict[str, Tensor]) -> Tensor:
    new = {ph: t.uop for ph, t in zip(self.inputs, self.reals(p, g, group, state))}
    for k, a, plan in self.writes:  # each state write as update() made it, so later reads see the write's node
      state[k].assign(Tensor(_fill(plan, a.src[1], new)))
      new[a] = state[k].uop
    return Tensor(_fill(self.plan, self.out, new))

def group_key(group: Any) -> tuple | None:
  """The part of template_key a group gives (the same for each of its parameters: made once a step): the kinds of its
  tensors and its settings that aren't tensors (maximize, amsgrad, nesterov, ...). None: no template for this group."""
  settings = tuple(sorted((k, v) for k, v in dict.items(group) if k != "params" and k not in group.tensors))
  try: hash(settings)
  except TypeError: return None  # a setting that is no key (a list): build the update as it is
  kinds = tuple((t.shape, t.dtype, t.device) for t in (*_flat(group.tensors), *_flat(group.factors)))
  return (tuple(sorted(group.tensors)), tuple(sorted(group.factors)), kinds, settings)

def template_key(p: Tensor, g: Tensor, state: dict[str, Tensor], group: tuple | None) -> tuple | None:
  """What the update's graph depends on besides its inputs' values: the shapes and dtypes of the inputs, and the group's
  part (group_key). None where no template is made: a sharded or symbolic parameter, a gradient of another shape."""
  if group is None or not isinstance(p.device, str) or g.shape != p.shape or not all(isinstance(s, int) for s in p.shape): return None
  return (p.shape, p.dtype, p.device, g.dtype, tuple((k, t.shape, t.dtype, t.device) for k, t in sorted(state.items())), group)
