"""Sequential, ModuleList and ModuleDict: modules holding modules under the names torch gives them ("0", "1", ...)."""
from __future__ import annotations
from collections import OrderedDict
from typing import Any, Iterable, Iterator, Mapping
from attograd.nn.module import Module

class Sequential(Module):
  """Sequential(m0, m1, ...) or Sequential(OrderedDict(name=m)): calls each in turn. Plain callables (Tensor.relu, a
  lambda) are allowed too, as in tinygrad's Tensor.sequential; they hold no state."""
  def __init__(self, *args: Any):
    super().__init__()
    self.__dict__["_order"] = []  # names in calling order: modules and stateless callables alike
    items = args[0].items() if len(args) == 1 and isinstance(args[0], dict) else ((str(i), m) for i, m in enumerate(args))
    for name, m in items: self._put(name, m)
  def _put(self, name: str, m: Any) -> None:
    if isinstance(m, Module): self.add_module(name, m)
    elif callable(m): object.__setattr__(self, name, m)
    else: raise TypeError(f"Sequential holds modules or callables, not {type(m).__name__}")
    if name not in self._order: self._order.append(name)
  def _names(self) -> list[str]: return self._order
  def __len__(self) -> int: return len(self._names())
  def __iter__(self) -> Iterator[Any]: return (getattr(self, n) for n in self._names())
  def __getitem__(self, i: int | slice) -> Any:
    names = self._names()
    if isinstance(i, slice): return Sequential(OrderedDict((n, getattr(self, n)) for n in names[i]))
    return getattr(self, names[_index(i, len(names))])
  def append(self, m: Any) -> Sequential:
    self._put(str(len(self)), m)
    return self
  def forward(self, x: Any) -> Any:
    for m in self: x = m(x)
    return x

def _index(i: int, n: int) -> int:
  if not -n <= i < n: raise IndexError(f"index {i} is out of range for {n} modules")
  return i % n

class ModuleList(Module):
  def __init__(self, modules: Iterable[Module] | None = None):
    super().__init__()
    for m in modules or []: self.append(m)
  def __len__(self) -> int: return len(self._modules)
  def __iter__(self) -> Iterator[Module]: return (getattr(self, str(i)) for i in range(len(self)))
  def __getitem__(self, i: int | slice) -> Any:
    if isinstance(i, slice): return ModuleList(list(self)[i])
    return getattr(self, str(_index(i, len(self))))
  def __setitem__(self, i: int, m: Module) -> None: self.add_module(str(_index(i, len(self))), m)
  def append(self, m: Module) -> ModuleList:
    self.add_module(str(len(self)), m)
    return self
  def extend(self, ms: Iterable[Module]) -> ModuleList:
    for m in ms: self.append(m)
    return self
  def insert(self, index: int, m: Module) -> None:
    ms = list(self)
    ms.insert(index, m)
    for i, x in enumerate(ms): self.add_module(str(i), x)
  def __iadd__(self, ms: Iterable[Module]) -> ModuleList: return self.extend(ms)
  def forward(self, *args: Any, **kw: Any) -> Any: raise NotImplementedError("a ModuleList is not callable: iterate over it")

class ModuleDict(Module):
  def __init__(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | None = None):
    super().__init__()
    if modules is not None: self.update(modules)
  def __len__(self) -> int: return len(self._modules)
  def __iter__(self) -> Iterator[str]: return iter(list(self._modules))
  def __contains__(self, k: str) -> bool: return k in self._modules
  def __getitem__(self, k: str) -> Module:
    if k not in self._modules: raise KeyError(k)
    return getattr(self, k)
  def __setitem__(self, k: str, m: Module) -> None: self.add_module(k, m)
  def __delitem__(self, k: str) -> None: delattr(self, k)
  def keys(self) -> list[str]: return list(self._modules)
  def values(self) -> list[Module]: return [getattr(self, k) for k in self._modules]
  def items(self) -> list[tuple[str, Module]]: return [(k, getattr(self, k)) for k in self._modules]
  def pop(self, k: str) -> Module:
    m = self[k]
    del self[k]
    return m
  def update(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]]) -> None:
    for k, m in (modules.items() if isinstance(modules, Mapping) else modules): self[k] = m
  def forward(self, *args: Any, **kw: Any) -> Any: raise NotImplementedError("a ModuleDict is not callable: index it")
