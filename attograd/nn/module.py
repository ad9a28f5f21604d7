"""nn.Module, a thin base in PyTorch's shape: attributes that are Parameters, registered buffers and Modules are
found by name, so parameters(), state_dict() (with torch's dotted keys), train()/eval(), to() and zero_grad() walk
them. Attributes stay plain attributes (no __getattr__ indirection): a forward pass reads self.weight at full speed.

Training mode: torch's modules start in training mode, tinygrad's layers follow the global Tensor.training switch.
A module on which train()/eval() was never called follows Tensor.training; once called, its own mode wins."""
from __future__ import annotations
from collections import OrderedDict
from typing import Any, Callable, Iterator, NamedTuple
from attograd.tensor import Tensor, _pending_realize
from attograd.uop.ops import Ops
from attograd.schedule.schedule import is_view_of_buffer
from attograd.dtype import DType, dtypes

def own_memory(t: Tensor) -> Tensor:
  """t in memory of its own, if unrealized: equal graphs are one node (hash-consing), and an assign to an unrealized
  tensor takes the value's node, so two layers' state built alike (Tensor.ones(n).contiguous(), nn.init.zeros_) would
  otherwise be one tensor sharing gradients and updates."""
  return t if t.uop.base.op is Ops.BUFFER else Tensor.empty(*t.shape, dtype=t.dtype, device=t.device).assign(t)

class Parameter(Tensor):
  """A Tensor that a Module registers as a parameter (trainable: requires_grad=True by default)."""
  __slots__ = ()
  def __init__(self, data: Tensor | None = None, requires_grad: bool = True):
    data = Tensor.empty(0) if data is None else data if isinstance(data, Tensor) else Tensor(data)
    if requires_grad and not dtypes.is_float(data.dtype):
      raise TypeError(f"only floating point parameters can require gradients, not {data.dtype}: pass requires_grad=False")
    super().__init__(own_memory(data).uop)
    self.requires_grad = requires_grad
    # a parameter is state: a lazy one (rand(...).contiguous()) is realized with the next realize, so it is drawn
    # once. Left lazy, every use recomputes it, and a TinyJit capture takes its rand kernel: replays re-draw it
    if not is_view_of_buffer(self.uop): _pending_realize[id(self)] = self
  def __repr__(self) -> str: return f"Parameter(shape={self.shape}, dtype={self.dtype}, device={self.device})"
  def __deepcopy__(self, memo: dict) -> Parameter:
    # a copy in memory of its own: gradients find their targets by graph node, so sharing this one's node would
    # send the copy's gradients here too (copy.deepcopy(model) for an EMA model, a frozen teacher...)
    out = Parameter(self.detach().clone().realize(), requires_grad=bool(self._requires_grad))
    memo[id(self)] = out
    return out

def as_tensor(v: Any, device: str | None = None) -> Any:
  """numpy arrays, and torch tensors (through numpy: torch is never imported here), as Tensors; anything else as it is."""
  if type(v).__module__.startswith("torch") and hasattr(v, "detach"): v = v.detach().cpu().numpy()
  return Tensor(v, device=device) if type(v).__module__ == "numpy" and hasattr(v, "dtype") else v

class IncompatibleKeys(NamedTuple):
  missing_keys: list[str]
  unexpected_keys: list[str]

def copy_state(owner: str, params: dict[str, Tensor], state_dict: dict[str, Any], strict: bool = True, verbose: bool = False) -> IncompatibleKeys:
  """Copy state_dict's tensors (attograd Tensors or numpy arrays) into params by name, as torch's load_state_dict.
  Everything is checked before anything is written: on an error nothing is changed."""
  missing = [k for k in params if k not in state_dict]
  unexpected = [k for k in state_dict if k not in params]
  errors = []
  if strict and missing: errors.append("Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing) + ".")
  if strict and unexpected: errors.append("Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected) + ".")
  values = {}
  for k, p in params.items():
    if k not in state_dict: continue
    v = state_dict[k]
    v = as_tensor(v, p.device)
    if not isinstance(v, Tensor): errors.append(f"{k}: expected a Tensor in the state_dict, got {type(v).__name__}"); continue
    if v.shape != p.shape:
      errors.append(f"size mismatch for {k}: copying a param with shape {v.shape} from checkpoint, the shape in current model is {p.shape}.")
    elif v.dtype != p.dtype:
      errors.append(f"dtype mismatch for {k}: copying a param with dtype {v.dtype} from checkpoint, the dtype in current model is {p.dtype}.")
    values[k] = v
  if errors: raise RuntimeError(f"Error(s) in loading state_dict for {owner}:\n\t" + "\n\t".join(errors))
  for k, v in values.items():
    if verbose: print(f"loading {k} {params[k].shape} {params[k].dtype}")
    params[k].assign(v.to(params[k].device))
  Tensor.realize_all(list({id(p): p for p in params.values()}.values()))
  return IncompatibleKeys(missing, unexpected)

Hook = Callable[..., Any]

class Module:
  """Subclass it, set Parameters, buffers (register_buffer) and submodules as attributes, write forward()."""
  # the bookkeeping dicts are made on first use, so a subclass that forgets super().__init__() still works
  def __init__(self) -> None: self._ensure()
  def _ensure(self) -> None:
    if "_parameters" in self.__dict__: return
    d = self.__dict__
    d["_parameters"], d["_buffers"], d["_modules"] = {}, {}, {}  # name -> None: ordered sets of attribute names
    d["_non_persistent"], d["_training"], d["_forward_hooks"], d["_forward_pre_hooks"] = set(), None, {}, {}

  # ***** registration *****
  def __setattr__(self, name: str, value: Any) -> None:
    self._ensure()
    if isinstance(value, Parameter): self._forget(name, keep=self._parameters); self._parameters[name] = None
    elif isinstance(value, Module): self._forget(name, keep=self._modules); self._modules[name] = None
    # a plain Tensor (or None) over a registered parameter or buffer keeps its role: `layer.weight = Tensor(...)`
    elif value is not None and not isinstance(value, Tensor): self._forget(name)
    elif name in self._modules and value is not None: self._forget(name)
    object.__setattr__(self, name, value)
  def _forget(self, name: str, keep: dict | None = None) -> None:
    for reg in (self._parameters, self._buffers, self._modules):
      if reg is not keep and name in reg: del reg[name]
    self._non_persistent.discard(name)
  def __delattr__(self, name: str) -> None:
    self._ensure()
    self._forget(name)
    object.__delattr__(self, name)
  def register_parameter(self, name: str, param: Tensor | None) -> None:
    self._check_name(name)
    if param is not None and not isinstance(param, Parameter): param = Parameter(param, requires_grad=bool(param._requires_grad is not False))
    self._forget(name)
    self._parameters[name] = None
    object.__setattr__(self, name, param)
  def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
    self._check_name(name)
    if tensor is not None and not isinstance(tensor, Tensor): raise TypeError(f"buffer {name!r} must be a Tensor or None, got {type(tensor).__name__}")
    self._forget(name)
    self._buffers[name] = None
    if not persistent: self._non_persistent.add(name)
    object.__setattr__(self, name, tensor)
  def register_module(self, name: str, module: Module | None) -> None: self.add_module(name, module)
  def add_module(self, name: str, module: Module | None) -> None:
    self._check_name(name)
    if module is not None and not isinstance(module, Module): raise TypeError(f"{type(module).__name__} is not a Module")
    self._forget(name)
    self._modules[name] = None
    object.__setattr__(self, name, module)
  def _check_name(self, name: str) -> None:
    self._ensure()
    if not isinstance(name, str) or not name or "." in name: raise KeyError(f"invalid attribute name {name!r} (a non-empty string without '.')")
  def get_submodule(self, target: str) -> Module:
    m: Any = self
    for part in target.split(".") if target else []:
      if part not in m._modules: raise AttributeError(f"{type(m).__name__} has no submodule {part!r}")
      m = getattr(m, part)
    return m

  # ***** walking *****
  def named_children(self) -> Iterator[tuple[str, Module]]:
    self._ensure()
    seen: set[int] = set()
    for name in self._modules:
      if (m := getattr(self, name)) is not None and id(m) not in seen:
        seen.add(id(m))
        yield name, m
  def children(self) -> Iterator[Module]: return (m for _, m in self.named_children())
  def named_modules(self, memo: set[int] | None = None, prefix: str = "", remove_duplicate: bool = True) -> Iterator[tuple[str, Module]]:
    self._ensure()
    memo = set() if memo is None else memo
    if remove_duplicate:
      if id(self) in memo: return
      memo.add(id(self))
    yield prefix, self
    for name in self._modules:
      if (m := getattr(self, name)) is not None: yield from m.named_modules(memo, f"{prefix}.{name}" if prefix else name, remove_duplicate)
  def modules(self) -> Iterator[Module]: return (m for _, m in self.named_modules())
  def _named(self, kind: str, prefix: str, recurse: bool, remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
    seen: set[int] = set()
    mods = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else iter([(prefix, self)])
    for mp, m in mods:
      for name in getattr(m, kind):
        t = getattr(m, name)
        if t is None or (remove_duplicate and id(t) in seen): continue
        seen.add(id(t))
        yield (f"{mp}.{name}" if mp else name), t
  def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
    return self._named("_parameters", prefix, recurse, remove_duplicate)
  def parameters(self, recurse: bool = True) -> Iterator[Tensor]: return (p for _, p in self.named_parameters(recurse=recurse))
  def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
    return self._named("_buffers", prefix, recurse, remove_duplicate)
  def buffers(self, recurse: bool = True) -> Iterator[Tensor]: return (b for _, b in self.named_buffers(recurse=recurse))

  # ***** state *****
  def state_dict(self, destination: dict | None = None, prefix: str = "", keep_vars: bool = False) -> dict[str, Tensor]:
    """Parameters and persistent buffers by dotted name, each module's own first and then its children's (torch's
    order and keys). A tensor shared by two modules appears under both names, as in torch."""
    self._ensure()
    out: dict[str, Tensor] = OrderedDict() if destination is None else destination
    for name in self._parameters:
      if (t := getattr(self, name)) is not None: out[prefix + name] = t
    for name in self._buffers:
      if (t := getattr(self, name)) is not None and name not in self._non_persistent: out[prefix + name] = t
    for name in self._modules:
      if (m := getattr(self, name)) is not None: m.state_dict(out, prefix + name + ".")
    return out
  def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True, assign: bool = False) -> IncompatibleKeys:
    """Copy values in by torch's key names; the values may be Tensors, numpy arrays or torch tensors (a torch
    model's state_dict() as it is). Parameters keep their identity, so optimizers holding them see the values."""
    return copy_state(type(self).__name__, self.state_dict(), state_dict, strict)

  # ***** modes and movement *****
  @property
  def training(self) -> bool: return Tensor.training if self.__dict__.get("_training") is None else self.__dict__["_training"]
  @training.setter
  def training(self, mode: bool) -> None: self._ensure(); self.__dict__["_training"] = mode
  def train(self, mode: bool = True) -> Module:
    if not isinstance(mode, bool): raise ValueError(f"training mode must be a bool, got {mode!r}")
    for m in self.modules(): m.training = mode
    return self
  def eval(self) -> Module: return self.train(False)
  def requires_grad_(self, requires_grad: bool = True) -> Module:
    for p in self.parameters(): p.requires_grad_(requires_grad)
    return self
  def zero_grad(self, set_to_none: bool = True) -> None:
    for p in self.parameters():
      if set_to_none or p.grad is None: p.grad = None
      else: p.grad = p.zeros_like().contiguous().realize()  # (zeros, not None: torch's set_to_none=False)
  def to(self, *args: Any, **kw: Any) -> Module:
    """to(device), to(dtype) or to(device, dtype): parameters and buffers move in place (float ones are cast),
    so optimizers and other holders of them follow."""
    device, dtype = kw.pop("device", None), kw.pop("dtype", None)
    if kw: raise TypeError(f"Module.to() got unexpected keyword(s) {sorted(kw)}")
    for a in args:
      if isinstance(a, DType): dtype = a
      elif isinstance(a, str): device = a
      elif isinstance(a, Tensor): device, dtype = a.device, a.dtype
      else: raise TypeError(f"Module.to() takes a device, a dtype or a tensor, not {type(a).__name__}")
    if dtype is not None and not dtypes.is_float(dtype): raise TypeError(f"Module.to() only casts to floating point dtypes, not {dtype}")
    moved = []
    for t in {id(t): t for t in [*self.parameters(), *self.buffers()]}.values():
      new = t.to(device) if device is not None else t
      if dtype is not None and dtypes.is_float(t.dtype): new = new.cast(dtype)
      if new is not t:
        t.uop, t.grad = new.contiguous().uop, None
        moved.append(t)
    Tensor.realize_all(moved)
    return self
  def cpu(self) -> Module: return self.to("CPU")
  def float(self) -> Module: return self.to(dtypes.float32)
  def half(self) -> Module: return self.to(dtypes.float16)
  def double(self) -> Module: return self.to(dtypes.float64)
  def apply(self, fn: Callable[[Module], Any]) -> Module:
    for m in self.children(): m.apply(fn)
    fn(self)
    return self

  # ***** calling *****
  def forward(self, *args: Any, **kw: Any) -> Any: raise NotImplementedError(f"{type(self).__name__} has no forward()")
  def __call__(self, *args: Any, **kw: Any) -> Any:
    d = self.__dict__
    if not d.get("_forward_pre_hooks") and not d.get("_forward_hooks"): return self.forward(*args, **kw)
    for h in list(d["_forward_pre_hooks"].values()):
      if (r := h(self, args)) is not None: args = r if isinstance(r, tuple) else (r,)
    out = self.forward(*args, **kw)
    for h in list(d["_forward_hooks"].values()):
      if (r := h(self, args, out)) is not None: out = r
    return out
  def register_forward_hook(self, hook: Hook) -> _HookHandle: self._ensure(); return _HookHandle(self._forward_hooks, hook)
  def register_forward_pre_hook(self, hook: Hook) -> _HookHandle: self._ensure(); return _HookHandle(self._forward_pre_hooks, hook)

  def extra_repr(self) -> str: return ""
  def __repr__(self) -> str:
    self._ensure()
    lines = [f"  ({name}): " + repr(getattr(self, name)).replace("\n", "\n  ") for name in self._modules]
    head = f"{type(self).__name__}({self.extra_repr()}"
    return head + ("\n" + "\n".join(lines) + "\n)" if lines else ")")

class _HookHandle:
  _next = 0
  def __init__(self, hooks: dict, hook: Hook):
    self.hooks, self.id = hooks, _HookHandle._next
    _HookHandle._next += 1
    hooks[self.id] = hook
  def remove(self) -> None: self.hooks.pop(self.id, None)
