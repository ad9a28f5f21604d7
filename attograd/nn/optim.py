"""Optimizers, with PyTorch's names (param_groups, betas=, state_dict) beside tinygrad's (b1=, b2=, schedule_step,
OptimizerGroup). One step() realizes every parameter update and optimizer state together.

Every numeric hyperparameter of a group (lr, betas, momentum, weight_decay, eps, ...) lives in a 0-d Tensor that the
update kernels read, so changing one (`group["lr"] = 0.01`, `opt.lr = 0.01`, a scheduler) compiles nothing and a
TinyJit replay reads the new value: nothing is baked into a kernel that could go stale."""
from __future__ import annotations
import math, struct
from typing import Any, Callable, Iterable
from attograd.tensor import Tensor, _buffer_from_bytes
from attograd.dtype import DType, dtypes
from attograd.helpers import gc_paused
from attograd.nn.module import as_tensor
from attograd.engine.realize import capturing, is_realized
from attograd.uop.ops import UOp, Ops, Template
import attograd.nn.lr_scheduler as lr_scheduler  # torch's torch.optim.lr_scheduler, here as nn.optim.lr_scheduler
import sys as _sys
# also importable by torch's path (from attograd.nn.optim.lr_scheduler import StepLR), though optim is a module
_sys.modules.setdefault(__name__ + ".lr_scheduler", lr_scheduler)

def _filled(raw: bytes, shape: tuple[int, ...], dtype: DType, device: Any) -> Tensor | None:
  """A tensor of these bytes copied to device memory: optimizer state starts this way, not by a kernel each (a fill
  kernel bakes its value in: a new process compiled one per hyperparameter value and parameter size before its first
  step). None where memory can't be written so (a sharded tensor's devices)."""
  if not isinstance(device, str): return None
  return Tensor(_buffer_from_bytes(raw, dtype, shape, device))

def _scalar(v: float, device: str) -> Tensor:
  if (t := _filled(struct.pack("<f", float(v)), (), dtypes.float32, device)) is not None: return t
  return Tensor.full((), float(v), dtype=dtypes.float32, device=device).contiguous().realize()
def _is_number(v: Any) -> bool: return isinstance(v, (int, float)) and not isinstance(v, bool)
def _live(v: Any) -> bool: return _is_number(v) or (isinstance(v, tuple) and len(v) > 0 and all(_is_number(x) for x in v))

class ParamGroup(dict):
  """torch's param group dict ("params", "lr", ...). Setting a numeric entry also writes the Tensor the kernels read."""
  def __init__(self, values: dict[str, Any], device: str, hyper: Iterable[str]):
    super().__init__(values)
    self.device = device
    self.tensors: dict[str, Any] = {}  # key -> Tensor, or a tuple of Tensors for a tuple entry (betas)
    self._seen: dict[str, Any] = {}    # key -> the uops the tensors had when last set: a direct assign is noticed
    self.factors: dict[str, Tensor] = {}  # scalars an optimizer derives from the hyperparameters once a step (Adam's)
    self._factors_at: dict[tuple, dict[str, Tensor]] = {}  # factors_at's, for this step's factors
    for k in hyper:
      if _live(values[k]): self._make(k, values[k])
  def set_factors(self, factors: dict[str, Tensor]) -> None:
    self.factors, self._factors_at = factors, {}
  def factors_at(self, shape: tuple, dtype: Any) -> dict[str, Tensor]:
    """This step's factors broadcast to a parameter's shape, once a step for each shape and dtype: the parameters of one
    shape read the same nodes, which each scalar op with a 0-d factor found again (a reshape and an expand, for 8
    factors and every parameter each step). A factor of another dtype stays 0-d: weak beside the parameter, as before."""
    if (d := self._factors_at.get(key := (shape, dtype))) is None:
      d = self._factors_at[key] = {k: t._broadcast_to(shape) if t.dtype == dtype else t for k, t in self.factors.items()}
    return d
  def _make(self, k: str, v: Any) -> None:
    self.tensors[k] = tuple(_scalar(x, self.device) for x in v) if isinstance(v, tuple) else _scalar(v, self.device)
    self._mark(k)
  @property
  def tensor_backed(self) -> set[str]:
    """The entries kernels read from Tensors: TinyJit lets them change between replays (jit.py _watch_list)."""
    return set(self.tensors)
  def _uops(self, k: str) -> tuple:
    t = self.tensors[k]
    return tuple(x.uop for x in t) if isinstance(t, tuple) else (t.uop,)
  def _mark(self, k: str) -> None: self._seen[k] = self._uops(k)
  def __setitem__(self, k: str, v: Any) -> None:
    if k in self._seen:  # a hyperparameter (not the optimizer's own tensors, "step" and the like, also in self.tensors)
      t = self.tensors[k]
      if isinstance(v, Tensor):  # (opt.lr = Tensor(...)): the value is copied in; the tensor stays the one kernels read
        if isinstance(t, tuple): raise TypeError(f"param group entry {k!r} is a tuple of {len(t)} numbers, not a Tensor")
        t.assign(v.reshape(()).cast(t.dtype).to(t.device)).realize()
        self._mark(k)
        return super().__setitem__(k, float(t.item()))
      if not _live(v) or isinstance(v, tuple) != isinstance(t, tuple) or (isinstance(v, tuple) and len(v) != len(t)):
        raise TypeError(f"param group entry {k!r} must stay a {'tuple of numbers' if isinstance(t, tuple) else 'number'}, got {v!r}")
      # the value comes in as bytes in memory of its own (_scalar), copied by a kernel that reads it: assigned as a
      # Python float it was a constant of the copy kernel, a new kernel to compile for every value (a scheduler's every
      # step: examples/gpt.py's LambdaLR waited on the C compiler 40-150 ms a step, more than the step's own work)
      for x, y in zip(t, v) if isinstance(t, tuple) else [(t, v)]: x.assign(_scalar(float(y), x.device) if isinstance(x.device, str) else float(y)).realize()
      self._mark(k)
    super().__setitem__(k, v)
  def __getitem__(self, k: str) -> Any:
    if k in self._seen:  # someone assigned the tensor directly (opt.lr.assign(...)): read the value it now holds
      t = self.tensors[k]
      if any(a is not b for a, b in zip(self._uops(k), self._seen[k])):
        v = tuple(float(x.item()) for x in t) if isinstance(t, tuple) else float(t.item())
        self._mark(k)
        super().__setitem__(k, v)
    return super().__getitem__(k)
  def get(self, k: str, default: Any = None) -> Any: return self[k] if k in self else default
  def setdefault(self, k: str, default: Any = None) -> Any:
    if k not in self: self[k] = default
    return self[k]
  def t(self, k: str) -> Any: return self.tensors[k]

class Optimizer:
  """Base class: params is a list of Tensors, or of dicts {"params": [...], "lr": ...} (one param group each)."""
  _saves_step = True  # whether state_dict() lists each parameter's step, as torch's counterpart does (SGD doesn't)
  _structural: frozenset[str] = frozenset()  # numeric hyperparameters that shape the graph (loop counts): not Tensors
  def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]] | Tensor, defaults: dict[str, Any]):
    if isinstance(params, Tensor): raise TypeError("params must be an iterable of Tensors or of dicts, not a Tensor")
    self.defaults = defaults
    self.param_groups: list[ParamGroup] = []
    self.state: dict[Tensor, dict[str, Tensor]] = {}  # per parameter: its optimizer state tensors, by torch's names
    params = list(params)
    if params and isinstance(params[0], tuple): params = [p for _, p in params]  # torch's named parameters: (name, tensor)
    for g in (params if params and isinstance(params[0], dict) else [{"params": params}]): self.add_param_group(g)
    if not self.params: raise ValueError("optimizer got no parameters that require grad")
    # the parameters' initial values are computed now (in one schedule), as torch's exist once made: left lazy, the first
    # step computed them fused into its forward pass, in kernels no later step runs (a new process scheduled and
    # compiled the first step apart from the second)
    if capturing() is None and (lazy := [p for p in self.params if not is_realized(p.uop)]): Tensor.realize_all(lazy)
  @staticmethod
  def _trainable(params: Iterable[Tensor]) -> list[Tensor]:
    """The tensors the optimizer will train: floating point ones not marked requires_grad=False. Like tinygrad, a
    float tensor that never said is made to require grad; ints (BatchNorm's num_batches_tracked) are skipped."""
    out = []
    for p in params:
      if not isinstance(p, Tensor): raise TypeError(f"optimizer params must be Tensors, got {type(p).__name__}")
      if not dtypes.is_float(p.dtype) or p._requires_grad is False: continue
      if p._requires_grad is None: p.requires_grad = True
      out.append(p)
    return list(dict.fromkeys(out))
  def add_param_group(self, group: dict[str, Any]) -> None:
    if "params" not in group: raise ValueError("a param group needs a 'params' entry")
    ps = [group["params"]] if isinstance(group["params"], Tensor) else list(group["params"])
    ps = self._trainable(ps)
    taken = {id(p) for g in self.param_groups for p in g["params"]}
    if any(id(p) in taken for p in ps): raise ValueError("some parameters appear in more than one parameter group")
    unknown = set(group) - set(self.defaults) - {"params", "initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum", "name"}
    if unknown: raise TypeError(f"{type(self).__name__} has no hyperparameter(s) {sorted(unknown)}")
    values = {**self.defaults, **{k: v for k, v in group.items() if k != "params"}, "params": ps}
    self._check(values)
    device = ps[0].device if ps else "CPU"
    g = ParamGroup(values, device, [k for k in self.defaults if k not in self._structural])
    g.tensors["step"] = _scalar(0, device)  # how many steps this group has taken (float, as torch keeps it)
    self._init_group(g)
    self.param_groups.append(g)
    for p in ps: self.state[p] = self._init_state(p, g)
  def _check(self, group: dict[str, Any]) -> None:
    for k in ("lr", "eps", "weight_decay", "momentum"):
      if k in group and _is_number(group[k]) and group[k] < 0: raise ValueError(f"invalid {k}: {group[k]} (must be >= 0)")
    if "betas" in group and not all(0 <= b < 1 for b in group["betas"]): raise ValueError(f"invalid betas {group['betas']}: each must be in [0, 1)")
  @property
  def params(self) -> list[Tensor]: return [p for g in self.param_groups for p in g["params"]]
  @property
  def lr(self) -> Tensor:
    """The first group's learning rate tensor; `opt.lr = x` sets every group's."""
    return self.param_groups[0].t("lr")
  @lr.setter
  def lr(self, value: float | Tensor) -> None:
    for g in self.param_groups: g["lr"] = value
  def zero_grad(self, set_to_none: bool = True) -> None:
    for p in self.params:
      if set_to_none or p.grad is None: p.grad = None
      else: p.grad = p.zeros_like().contiguous()
  def step(self, closure: Callable[[], Any] | None = None) -> Any:
    loss = closure() if closure is not None else None
    with gc_paused(): Tensor.realize_all(self.schedule_step())  # thousands of acyclic nodes: no collection (helpers.gc_paused)
    return loss
  def state_tensors(self) -> list[Tensor]:
    """Every tensor a step writes besides the parameters."""
    return [*(t for s in self.state.values() for t in s.values()), *(g.t("step") for g in self.param_groups), *self._extra_state()]
  def _extra_state(self) -> list[Tensor]: return []
  def schedule_step(self) -> list[Tensor]:
    """Assign the updates lazily and return everything that must be realized for them."""
    for g in self.param_groups:
      step = g.t("step")
      step.assign(step + 1)
      self._group_step(g)
      inputs = None
      for p in g["params"]:
        if p.grad is None: continue
        # (the gradient's values without its graph, as detach() gives them, but no view of p.grad: nothing writes to
        # this tensor, and a view's bookkeeping, weak references both ways, was 2 us a parameter every step)
        grad = Tensor(UOp(Ops.DETACH, p.grad.dtype, (p.grad.uop,))).cast(p.dtype)
        if inputs is None: inputs = _group_inputs(g) if type(self)._update in _OWN_UPDATES else ()
        p.assign(self._called_update(p, grad, g, inputs).cast(p.dtype))
    return [*self.params, *self.state_tensors()]
  def _called_update(self, p: Tensor, grad: Tensor, group: ParamGroup, inputs: tuple) -> Tensor:
    """_update, as CALL nodes (uop/ops.py): its graph is built by _update once for each kind of parameter (shape, dtype,
    device, the group's entries) and kept as Templates over its inputs (the parameter, its gradient and state, the
    group's tensors and factors): one for each state tensor's new value, over those inputs and the state written before
    it, and one for the parameter's, over all of them. Later steps make a CALL node for each, and the state writes
    (Tensor.assign) between them: the scheduler expands the CALLs into the very graph _update builds (the same kernels),
    and realize's walk of a step's graph sees a few nodes for each parameter, where AdamW's update was ~33 built by the
    front end each step. This module's own updates only (_OWN_UPDATES): their graphs depend on nothing else, where a
    subclass's may read a Python number that changes (test_eager_step). `inputs`: the group's part (_group_inputs), ()
    for an update built every step."""
    state = self.state[p]
    if not inputs or not isinstance(p.device, str): return self._update(p, grad, group, state)
    group_uops, group_key = inputs
    names = tuple(state)
    # each leaf's place among the distinct ones (a factor may be a group tensor itself: Adam's eps), by a dict: by
    # list.index, each miss a rich comparison of two nodes, it was 14 us a parameter
    slot: dict[UOp, int] = {}
    aliases = tuple([slot.setdefault(u, len(slot)) for u in (p.uop, grad.uop, *(state[n].uop for n in names), *group_uops)])
    unique = list(slot)
    key = (type(self), p.shape, p.dtype, p.device, grad.dtype, names, group_key, aliases)
    # (a state tensor not in memory, or a view's base, Tensor.assign writes otherwise: built as _update builds it)
    if (t := _update_templates.get(key)) is None or t is _UNUSABLE or \
       not all(is_realized(state[n].uop) and state[n]._view_of is None for n in names):
      before = [state[n].uop for n in names]
      out = self._update(p, grad, group, state)
      if t is None:
        if len(_update_templates) >= _UPDATE_TEMPLATES_KEPT: del _update_templates[next(iter(_update_templates))]
        _update_templates[key] = _update_templates_of(unique, names, before, [state[n].uop for n in names], out.uop)
      return out
    writes, value = t
    for n, body in writes:
      state[n].assign(Tensor(body.calls(*unique)[0]))
      unique.append(state[n].uop)
    return Tensor(value.calls(*unique)[0])
  def _init_group(self, group: ParamGroup) -> None: """Make per-group state tensors."""
  def _group_step(self, group: ParamGroup) -> None: """Per-group work before the parameter updates (bias corrections)."""
  def _init_state(self, p: Tensor, group: ParamGroup) -> dict[str, Tensor]: return {}
  def _update(self, p: Tensor, g: Tensor, group: ParamGroup, state: dict[str, Tensor]) -> Tensor: raise NotImplementedError

  # ***** saving and loading, in torch's layout *****
  def state_dict(self) -> dict[str, Any]:
    """{"state": {index: {name: Tensor}}, "param_groups": [{hyperparameters..., "params": [indices]}]}: torch's layout
    and names (parameters numbered across groups in order), so a torch optimizer's state dict loads here and back."""
    state, groups, i = {}, [], 0
    for g in self.param_groups:
      idx = list(range(i, i + len(g["params"])))
      for j, p in zip(idx, g["params"]): state[j] = {**({"step": g.t("step")} if self._saves_step else {}), **self.state[p]}
      groups.append({**{k: g[k] for k in g if k != "params"}, "params": idx})
      i += len(idx)
    return {"state": state, "param_groups": groups}
  def load_state_dict(self, state_dict: dict[str, Any]) -> None:
    """Load what state_dict() (ours or torch's, tensors as attograd Tensors or numpy arrays) gave. Checked first: on an
    error nothing changes."""
    groups, state = state_dict["param_groups"], state_dict["state"]
    if len(groups) != len(self.param_groups): raise ValueError(f"state dict has {len(groups)} param groups, the optimizer {len(self.param_groups)}")
    for sg, g in zip(groups, self.param_groups):
      if len(sg["params"]) != len(g["params"]): raise ValueError(f"a param group of {len(sg['params'])} parameters for one of {len(g['params'])}")
    writes: list[tuple[Tensor, Tensor]] = []
    for sg, g in zip(groups, self.param_groups):
      for j, p in zip(sg["params"], g["params"]):
        for name, v in state.get(j, {}).items():
          v = as_tensor(v)
          if not isinstance(v, Tensor): v = Tensor(float(v))
          target = g.t("step") if name == "step" else self.state[p].get(name)
          if target is None: raise ValueError(f"{type(self).__name__} has no state {name!r} (parameter {j})")
          if v.shape != target.shape and v.numel() != target.numel():
            raise ValueError(f"state {name!r} of parameter {j}: shape {v.shape} for {target.shape}")
          writes.append((target, v.reshape(target.shape)))
        if state.get(j) and "step" not in state[j] and g.t("step").item() == 0:
          writes.append((g.t("step"), Tensor(1.0)))  # torch's SGD keeps no step: a saved state means it has stepped
    for target, v in writes: target.assign(v.cast(target.dtype).to(target.device))
    Tensor.realize_all([t for t, _ in writes])
    for sg, g in zip(groups, self.param_groups):
      for k, v in sg.items():
        if k != "params" and k in g.tensors and k != "step": g[k] = tuple(v) if isinstance(v, list) else v
        elif k != "params" and k not in g.tensors: dict.__setitem__(g, k, v)

# ***** updates as CALLs of templates (Optimizer._called_update) *****
_update_templates: dict[tuple, Any] = {}
_UPDATE_TEMPLATES_KEPT = 256
_UNUSABLE = object()  # a kind of update that can't be templated: built by _update every step
_MEMORY_OPS = frozenset({Ops.BUFFER, Ops.ASSIGN, Ops.BIND, Ops.DEFINE_VAR, Ops.CALL})

def _group_inputs(g: ParamGroup) -> tuple[list[UOp], tuple] | tuple:
  """The group's part of an update's inputs this step (its tensors' nodes and its factors') and of its templates' key
  (the names of those, and the group's other entries: values an update reads in Python), or () when an entry can't be
  part of a key."""
  uops = [u for t in g.tensors.values() for u in ((x.uop for x in t) if isinstance(t, tuple) else (t.uop,))]
  uops += [t.uop for t in g.factors.values()]
  key = (tuple(g.tensors), tuple(g.factors), tuple((k, v) for k, v in dict.items(g) if k != "params" and k not in g.tensors))
  try: hash(key)
  except TypeError: return ()
  return uops, key

def _update_templates_of(inputs: list[UOp], names: tuple[str, ...], before: list[UOp], after: list[UOp], value: UOp) -> Any:
  """The templates of an update _update built over these inputs: ((state name, template of its new value), ...) in
  the order the writes depend on each other, and the parameter's value's template; or _UNUSABLE when a state tensor's
  node afterwards is neither what it was nor an ASSIGN to it, or when a node below the update that isn't one of its
  inputs reads memory (a tensor the inputs don't name: rebuilt, it would be read as it was then, a stale value)."""
  written = {a: n for n, a, b in zip(names, after, before) if a is not b}
  if any(a.op is not Ops.ASSIGN or a.src[0] is not b for n, a, b in zip(names, after, before) if a is not b): return _UNUSABLE
  order = [a for a in UOp(Ops.SINK, dtypes.void, (value, *written)).toposort if a in written]  # (a write may read another)
  leaves, writes = list(inputs), []
  try:
    for a in order:
      writes.append((written[a], Template(tuple(leaves), a.src[1])))
      leaves.append(a)
    body = Template(tuple(leaves), value)
  except AssertionError: return _UNUSABLE  # (a value that reads none of the inputs)
  if any(u.op in _MEMORY_OPS for t in (*(t for _, t in writes), body) for f in t.fixed for u in f.toposort): return _UNUSABLE
  return tuple(writes), body

def _zeros(p: Tensor) -> Tensor:
  if not p.uop.symbolic_shape and (t := _filled(bytes(p.numel() * p.dtype.itemsize), p.shape, p.dtype, p.device)) is not None: return t
  return Tensor.zeros(*p.shape, dtype=p.dtype, device=p.device).contiguous().realize()

def _betas(betas: tuple[float, float] | None, b1: float | None, b2: float | None, default: tuple[float, float]) -> tuple[float, float]:
  """torch's betas=(b1, b2) or tinygrad's b1=, b2= (not both)."""
  if betas is not None and (b1 is not None or b2 is not None): raise TypeError("give betas=(b1, b2) or b1=/b2=, not both")
  if betas is not None: return (float(betas[0]), float(betas[1]))
  return (default[0] if b1 is None else b1, default[1] if b2 is None else b2)

class SGD(Optimizer):
  """torch.optim.SGD: momentum (with dampening), nesterov, L2 weight_decay, maximize."""
  _saves_step = False
  def __init__(self, params, lr: float = 0.001, momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
               nesterov: bool = False, maximize: bool = False):
    if nesterov and (momentum <= 0 or dampening != 0): raise ValueError("nesterov momentum needs momentum > 0 and zero dampening")
    super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov, maximize=maximize))
  def _init_state(self, p: Tensor, group: ParamGroup) -> dict[str, Tensor]:
    return {"momentum_buffer": _zeros(p)} if group["momentum"] else {}
  def _update(self, p: Tensor, g: Tensor, group: ParamGroup, state: dict[str, Tensor]) -> Tensor:
    if group["maximize"]: g = -g
    g = g + group.t("weight_decay") * p
    if "momentum_buffer" in state:
      buf, m = state["momentum_buffer"], group.t("momentum")
      first = group.t("step") == 1  # torch's first step sets the buffer to the gradient itself
      b = buf.assign(first.where(g, m * buf + (1 - group.t("dampening")) * g))
      g = g + m * b if group["nesterov"] else b
    return p - group.t("lr") * g

class Adam(Optimizer):
  """torch.optim.Adam (weight_decay is L2, added to the gradient; amsgrad, maximize); decoupled_weight_decay=True is AdamW."""
  def __init__(self, params, lr: float = 0.001, betas: tuple[float, float] | None = None, eps: float = 1e-8, weight_decay: float = 0.0,
               amsgrad: bool = False, *, maximize: bool = False, decoupled_weight_decay: bool = False, b1: float | None = None,
               b2: float | None = None):
    super().__init__(params, dict(lr=lr, betas=_betas(betas, b1, b2, (0.9, 0.999)), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                  maximize=maximize, decoupled_weight_decay=decoupled_weight_decay))
  def _init_state(self, p: Tensor, group: ParamGroup) -> dict[str, Tensor]:
    return {"exp_avg": _zeros(p), "exp_avg_sq": _zeros(p), **({"max_exp_avg_sq": _zeros(p)} if group["amsgrad"] else {})}
  def _init_group(self, group: ParamGroup) -> None: group.tensors["bc"] = (_scalar(1, group.device), _scalar(1, group.device))
  def _group_step(self, group: ParamGroup) -> None:
    # the bias corrections with the current betas, as torch computes them: once a step, not once per element
    (b1, b2), step = group.t("betas"), group.t("step")
    # b**step as pow computes it for a base in [0, 1) (2**(step * log2 b), the same bits): pow's special cases and its
    # derivatives were 100 nodes a step, a quarter of building an update
    for bc, b in zip(group.t("bc"), (b1, b2)): bc.assign(1 - (step * b.log2()).exp2())
    # the group's scalar factors, built once a step rather than once per parameter (the same values: each update reads
    # these nodes): a 30-parameter model's update graph is a third smaller, and building it is Python time every step
    lr, wd, (bc1, bc2) = group.t("lr"), group.t("weight_decay"), group.t("bc")
    group.set_factors({"decay": 1 - lr * wd, "1-b1": 1 - b1, "1-b2": 1 - b2, "step_size": lr / bc1, "bc2_sqrt": bc2.sqrt(),
                       "b1": b1, "b2": b2, "eps": group.t("eps")})
  def _extra_state(self) -> list[Tensor]: return [t for g in self.param_groups for t in g.tensors.get("bc", ())]
  def _update(self, p: Tensor, g: Tensor, group: ParamGroup, state: dict[str, Tensor]) -> Tensor:
    if group["maximize"]: g = -g
    f = group.factors_at(p.shape, p.dtype)  # (the nodes `b1 * m` and the like build with the 0-d factors themselves)
    if group["decoupled_weight_decay"]: p = p * f["decay"]
    else: g = g + group.t("weight_decay") * p
    m = state["exp_avg"].assign(f["b1"] * state["exp_avg"] + f["1-b1"] * g)
    # g * g, not g.square(): the same value node without the derivative square() carries for autograd (an update is
    # never differentiated), two nodes and three front-end ops fewer a parameter every step
    v = state["exp_avg_sq"].assign(f["b2"] * state["exp_avg_sq"] + f["1-b2"] * (g * g))
    if group["amsgrad"]: v = state["max_exp_avg_sq"].assign(state["max_exp_avg_sq"].maximum(v))
    return p - f["step_size"] * m / ((v.sqrt() / f["bc2_sqrt"]) + f["eps"])

class AdamW(Adam):
  """torch.optim.AdamW: Adam with decoupled weight decay, 0.01 by default."""
  def __init__(self, params, lr: float = 0.001, betas: tuple[float, float] | None = None, eps: float = 1e-8, weight_decay: float = 0.01,
               amsgrad: bool = False, *, maximize: bool = False, b1: float | None = None, b2: float | None = None):
    super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize, decoupled_weight_decay=True, b1=b1, b2=b2)

class LAMB(Adam):
  """Adam moments with a per-parameter trust ratio ||p|| / ||update|| (LAMB); adam=True skips the ratio and gives
  AdamW's decoupled weight decay (tinygrad's spelling)."""
  def __init__(self, params, lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6, weight_decay: float = 0.0,
               adam: bool = False, betas: tuple[float, float] | None = None):
    Optimizer.__init__(self, params, dict(lr=lr, betas=_betas(betas, None, None, (b1, b2)), eps=eps, weight_decay=weight_decay, adam=adam,
                                          amsgrad=False, maximize=False, decoupled_weight_decay=True))
  def _update(self, p: Tensor, g: Tensor, group: ParamGroup, state: dict[str, Tensor]) -> Tensor:
    if group["adam"]: return super()._update(p, g, group, state)
    lr, wd, (b1, b2), (bc1, bc2) = group.t("lr"), group.t("weight_decay"), group.t("betas"), group.t("bc")
    m = state["exp_avg"].assign(b1 * state["exp_avg"] + (1 - b1) * g)
    v = state["exp_avg_sq"].assign(b2 * state["exp_avg_sq"] + (1 - b2) * g.square())
    up = (m / bc1) / ((v / bc2).sqrt() + group.t("eps")) + wd * p
    pn, un = p.square().sum().sqrt(), up.square().sum().sqrt()
    trust = ((pn > 0) & (un > 0)).where(pn / un, 1.0)
    return p - lr * trust * up

class LARS(Optimizer):
  """LARS (You et al. 2017): SGD with momentum whose step for each parameter is scaled by the trust ratio
  tcoef * ||p|| / (||g|| + weight_decay * ||p||) (1 when a norm is 0)."""
  _saves_step = False
  def __init__(self, params, lr: float = 0.001, momentum: float = 0.9, weight_decay: float = 1e-4, nesterov: bool = False, tcoef: float = 0.001):
    super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov, tcoef=tcoef))
  def _init_state(self, p: Tensor, group: ParamGroup) -> dict[str, Tensor]: return {"momentum_buffer": _zeros(p)}
  def _update(self, p: Tensor, g: Tensor, group: ParamGroup, state: dict[str, Tensor]) -> Tensor:
    wd, m = group.t("weight_decay"), group.t("momentum")
    pn, gn = p.square().sum().sqrt(), g.square().sum().sqrt()
    trust = ((pn > 0) & (gn > 0)).where(group.t("tcoef") * pn / (gn + wd * pn), 1.0)
    g = (g + wd * p) * trust
    b = state["momentum_buffer"].assign(m * state["momentum_buffer"] + g)
    return p - group.t("lr") * (g + m * b if group["nesterov"] else b)

class Muon(Optimizer):
  """torch.optim.Muon for 2-D parameters: the momentum buffer moves toward the gradient by 1 - momentum (nesterov: the
  update is the gradient moved toward the buffer by momentum), the update is orthogonalized by ns_steps quintic
  Newton-Schulz iterations (ns_coefficients), scaled by sqrt(max(1, rows / cols)) ("match_rms_adamw":
  0.2 * sqrt(max(rows, cols))), with decoupled weight decay. The iterations run in the parameter's dtype (torch: bfloat16)."""
  _saves_step = False
  _structural = frozenset({"ns_steps"})
  def __init__(self, params, lr: float = 0.001, weight_decay: float = 0.1, momentum: float = 0.95, nesterov: bool = True,
               ns_coefficients: tuple[float, float, float] = (3.4445, -4.775, 2.0315), eps: float = 1e-7, ns_steps: int = 5,
               adjust_lr_fn: str | None = None):
    if adjust_lr_fn not in (None, "original", "match_rms_adamw"): raise ValueError(f"unknown adjust_lr_fn {adjust_lr_fn!r}")
    if not 0 < ns_steps < 100: raise ValueError(f"ns_steps must be in 1..99, got {ns_steps}")
    super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov, ns_coefficients=tuple(ns_coefficients),
                                  eps=eps, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn))
    if any(p.ndim != 2 for p in self.params): raise ValueError("Muon trains 2-D parameters only; give the others to another optimizer")
  def _init_state(self, p: Tensor, group: ParamGroup) -> dict[str, Tensor]: return {"momentum_buffer": _zeros(p)}
  def _update(self, p: Tensor, g: Tensor, group: ParamGroup, state: dict[str, Tensor]) -> Tensor:
    m, (a, b, c) = group.t("momentum"), group.t("ns_coefficients")
    buf = state["momentum_buffer"].assign(state["momentum_buffer"] + (g - state["momentum_buffer"]) * (1 - m))
    x = g + (buf - g) * m if group["nesterov"] else buf
    rows, cols = p.shape
    if rows > cols: x = x.T
    x = x / x.square().sum().sqrt().maximum(group.t("eps"))  # spectral norm at most 1
    for _ in range(group["ns_steps"]):
      gram = x @ x.T
      x = a * x + (b * gram + c * (gram @ gram)) @ x
    if rows > cols: x = x.T
    scale = 0.2 * math.sqrt(max(rows, cols)) if group["adjust_lr_fn"] == "match_rms_adamw" else math.sqrt(max(1, rows / cols))
    lr = group.t("lr")
    return p * (1 - lr * group.t("weight_decay")) - lr * scale * x

class OptimizerGroup(Optimizer):
  """Several optimizers stepped as one (one schedule), as tinygrad's OptimizerGroup."""
  def __init__(self, *optimizers: Optimizer):
    if not optimizers: raise ValueError("OptimizerGroup of no optimizers")
    self.optimizers = list(optimizers)
  def __getitem__(self, i: int) -> Optimizer: return self.optimizers[i]
  @property
  def param_groups(self) -> list[ParamGroup]: return [g for o in self.optimizers for g in o.param_groups]  # type: ignore[override]
  @property
  def state(self) -> dict[Tensor, dict[str, Tensor]]: return {p: s for o in self.optimizers for p, s in o.state.items()}  # type: ignore[override]
  def state_tensors(self) -> list[Tensor]: return [t for o in self.optimizers for t in o.state_tensors()]
  def zero_grad(self, set_to_none: bool = True) -> None:
    for o in self.optimizers: o.zero_grad(set_to_none)
  def schedule_step(self) -> list[Tensor]: return [t for o in self.optimizers for t in o.schedule_step()]
  def state_dict(self) -> dict[str, Any]: return {"optimizers": [o.state_dict() for o in self.optimizers]}
  def load_state_dict(self, state_dict: dict[str, Any]) -> None:
    for o, sd in zip(self.optimizers, state_dict["optimizers"]): o.load_state_dict(sd)

# the updates whose graphs depend only on their inputs and the group's entries (Optimizer._called_update)
_OWN_UPDATES = frozenset({SGD._update, Adam._update, LAMB._update, LARS._update, Muon._update})
