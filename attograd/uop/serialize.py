"""A UOp graph as plain data (nested lists, strings and numbers: JSON), the same in every process: the key of the
on-disk program cache is a hash of it, and the cache's entries hold graphs in it. Never pickle: a cache file is data
that a damaged or foreign file must not be able to turn into code.

A graph is {"dtypes": [...], "nodes": [[op, dtype, [sources], arg], ...], "roots": [...]}: every node once, after its
sources (a node refers to others by position), so shared structure stays shared. An arg is written as itself when it
is None, a bool, an int or a str; a tuple as a list; anything else as a one-key dict naming its kind: {"f": repr} a
float (repr keeps every bit, nan and inf included), {"e": [class, member]} an enum, {"d": i} a dtype, {"u": i} a node
(a symbolic size in a movement op's arg), {"c": [class, [fields...]]} a frozen dataclass, {"s": [...]} a frozenset."""
from __future__ import annotations
import dataclasses, enum, json
from typing import Any, Callable, Sequence
from attograd.dtype import DType, PtrDType, dtypes, DTYPES_BY_NAME
from attograd.helpers import hasher
from attograd.uop.ops import AxisKind, UOp, Ops, BufferArg

# the enums and dataclasses an arg may hold, by name; layers above add theirs (register_arg_type)
ARG_TYPES: dict[str, type] = {"Ops": Ops, "BufferArg": BufferArg, "AxisKind": AxisKind}
def register_arg_type(cls: type) -> type:
  """Let args hold values of this enum or frozen dataclass (usable as a class decorator)."""
  ARG_TYPES[cls.__name__] = cls
  return cls

class _Writer:
  """The rows of a graph's nodes (and its dtype table), each node after its sources. With `spill`, the rows are handed
  to it SPILL_ROWS at a time and dropped (a key's hash), not kept: the positions still count every row written."""
  def __init__(self, spill: Callable[[list[list]], None] | None = None, leaves: dict[UOp, UOp] | None = None) -> None:
    self.index: dict[UOp, int] = {}
    self.nodes: list[list] = []
    self.spill, self.spilled = spill, 0
    self.leaves = leaves or {}  # leaves written as other leaves (a graph's inputs as placeholders), as if substituted
    self.dtype_index: dict[DType, int] = {}
    self.dtypes: list[list] = []

  def dtype(self, dt: DType) -> int:
    if (i := self.dtype_index.get(dt)) is not None: return i
    # a pointer's base first: the table is read front to back
    enc = ["ptr", self.dtype(dt.base), dt.size, dt.addrspace] if isinstance(dt, PtrDType) else [dt.name, dt.count]
    self.dtype_index[dt] = i = len(self.dtypes)
    self.dtypes.append(enc)
    return i

  def add(self, root: UOp) -> int:
    index, nodes = self.index, self.nodes
    if (i := index.get(root)) is not None: return i
    for u in root.toposort:
      if u in index: continue
      v = self.leaves.get(u, u) if not u.src else u
      # an arg may name nodes outside the sources (a symbolic size): they go in first
      arg = v.arg
      arg = arg if arg is None or type(arg) in _PLAIN else self.arg(arg)
      index[u] = self.spilled + len(nodes)
      nodes.append([v.op.name, self.dtype(v.dtype), [index[s] for s in u.src], arg])
      if self.spill is not None and len(nodes) >= SPILL_ROWS:
        self.spill(nodes)
        self.spilled += len(nodes)
        nodes.clear()
    return index[root]

  def arg(self, x: Any) -> Any:
    t = type(x)
    if t in _PLAIN or x is None: return x
    if t is tuple: return [self.arg(v) for v in x]
    if t is float: return {"f": repr(x)}
    if isinstance(x, UOp): return {"u": self.add(x)}
    if isinstance(x, DType): return {"d": self.dtype(x)}
    if isinstance(x, enum.Enum) and ARG_TYPES.get(t.__name__) is t: return {"e": [t.__name__, x.name]}
    if dataclasses.is_dataclass(x) and ARG_TYPES.get(t.__name__) is t:
      return {"c": [t.__name__, [self.arg(getattr(x, f.name)) for f in dataclasses.fields(x)]]}
    if t is frozenset:  # in a fixed order: a set's own order changes with the process's string hashes
      return {"s": sorted((self.arg(v) for v in x), key=lambda v: json.dumps(v, sort_keys=True))}
    raise TypeError(f"can't serialize a UOp arg of type {t.__name__} ({x!r}): register_arg_type it, or keep args plain data")

_PLAIN = (int, str, bool)
SPILL_ROWS = 1024
_encode = json.JSONEncoder(separators=(",", ":")).encode

def graph_data(roots: Sequence[UOp]) -> dict[str, Any]:
  """The graph under roots as plain data (see the module's docstring), deterministic: the same graph always gives the
  same data, in any process."""
  w = _Writer()
  ids = [w.add(r) for r in roots]
  return {"dtypes": w.dtypes, "nodes": w.nodes, "roots": ids}

def graph_key(root: UOp, leaves: dict[UOp, UOp] | None = None) -> str:
  """A hash naming the graph under root: equal graphs (same ops, dtypes, args and structure) get equal keys in every
  process, and any difference gives another key. `leaves`: source-less nodes to name as others, the key of
  root.substitute(leaves) without building that graph (a schedule's inputs as placeholders: a copy of a 30-layer step)."""
  # hashed as it is written, SPILL_ROWS nodes at a time (then the dtype table and the root): the whole graph as data and
  # one JSON text of it were the peak of Python memory while scheduling a 30-layer LLM step (+14 MiB for its disk key),
  # and the 1 MiB arenas Python took for it stayed, pinned by what lived on
  h = hasher()
  def spill(rows: list[list]) -> None: h.update(_encode(rows).encode()); h.update(b"\n")
  w = _Writer(spill, leaves)
  root_id = w.add(root)
  spill(w.nodes)
  h.update(_encode({"dtypes": w.dtypes, "roots": [root_id]}).encode())
  return h.hexdigest()

def _read_dtype(enc: list, table: list[DType]) -> DType:
  if enc[0] == "ptr": return table[enc[1]].ptr(enc[2], enc[3])
  name, count = enc
  base = dtypes.void if name == "void" else DTYPES_BY_NAME[name]
  return base.vec(count)

class _Reader:
  def __init__(self, data: dict[str, Any]) -> None:
    self.dtypes: list[DType] = []
    for enc in data["dtypes"]: self.dtypes.append(_read_dtype(enc, self.dtypes))
    self.nodes: list[UOp] = []

  def arg(self, x: Any) -> Any:
    if x is None or type(x) in _PLAIN: return x
    if type(x) is list: return tuple(self.arg(v) for v in x)
    (kind, v), = x.items()
    if kind == "f": return float(v)
    if kind == "u": return self.nodes[v]
    if kind == "d": return self.dtypes[v]
    if kind == "e": return ARG_TYPES[v[0]][v[1]]
    if kind == "c": return ARG_TYPES[v[0]](*(self.arg(f) for f in v[1]))
    if kind == "s": return frozenset(self.arg(e) for e in v)
    raise ValueError(f"unknown arg kind {kind!r}")

def graph_from_data(data: dict[str, Any]) -> list[UOp]:
  """The roots of a graph written by graph_data, as UOps (hash-consed: the very nodes this process already has, if
  any). Raises (KeyError, IndexError, ValueError, TypeError) on data that isn't such a graph."""
  r = _Reader(data)
  nodes = r.nodes
  for op, dt, src, arg in data["nodes"]:
    if not all(0 <= i < len(nodes) for i in src): raise ValueError("a node refers to one that isn't before it")
    nodes.append(UOp(Ops[op], r.dtypes[dt], tuple(nodes[i] for i in src), r.arg(arg)))
  return [nodes[i] for i in data["roots"]]
