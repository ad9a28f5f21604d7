"""The on-disk program cache: a kernel's lowered program (name, source, Opts, variables, op count, launch dims), so a new
process that meets a kernel an earlier one compiled skips choosing Opts and all of lowering; the device compiler's own
cache then finds the binary by the source.

The key names everything the program is a function of: the AST (uop/serialize.py's graph key), the Opts or what chose
them (the heuristics and the core count they split work for, or BEAM's width), the device and its renderer's settings,
and the version of the code (a hash of attograd's source files, so any change to lowering, a renderer or the heuristics
makes new keys). An entry is JSON: variables and symbolic launch sizes as a graph in serialize's format, never pickle."""
from __future__ import annotations
import json, pathlib
from typing import Any
from attograd.helpers import cache_path, cache_read, cache_write, content_hash, code_version
from attograd.uop.ops import UOp, Ops
from attograd.uop.serialize import graph_data, graph_from_data, graph_key
from attograd.codegen.opt import Opt, OptOps

FORMAT = "1"  # bump when an entry's fields change meaning

class _NotData(Exception): pass

def _plain(x: Any) -> Any:
  """x as JSON-able data in a fixed order (_NotData if it holds an object that isn't data)."""
  if x is None or isinstance(x, (bool, int, float, str)): return x
  if isinstance(x, (tuple, list)): return [_plain(e) for e in x]
  if isinstance(x, (set, frozenset)): return sorted((_plain(e) for e in x), key=json.dumps)  # a set's order varies by process
  if isinstance(x, dict): return [[str(k), _plain(v)] for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))]
  raise _NotData(type(x).__name__)

def renderer_id(renderer: Any) -> str | None:
  """The renderer's class and settings (what it was made with: a device's limits, an architecture), or None when it
  holds something that isn't data (a rewrite pass swapped in): its programs are then not cached."""
  try: settings = _plain(vars(renderer))
  except _NotData: return None
  return f"{type(renderer).__module__}.{type(renderer).__qualname__} {json.dumps(settings)}"

def program_key(ast: UOp, device: str, renderer: Any, choice: str) -> str | None:
  """The key of the program for ast on device with the Opts `choice` names (None: not cacheable)."""
  if (rid := renderer_id(renderer)) is None: return None
  return content_hash("program", FORMAT, code_version(), graph_key(ast), device, rid, choice)

def _path(key: str) -> pathlib.Path: return cache_path("program", f"{key}.json")

def program_entry(key: str, name: str, src: str, opts: list[Opt], ops: int, variables: list[UOp],
                  launch: tuple[tuple[UOp | int, ...], tuple[int, ...]] | None) -> dict[str, Any]:
  """The program as plain data (JSON): what the cache keeps, and what a lowering child sends (engine/realize.py)."""
  syms = [d for d in launch[0] if isinstance(d, UOp)] if launch is not None else []
  graph = graph_data([*variables, *syms])
  # a symbolic count of work-groups names its root in the graph: {"r": i}
  groups = [d if isinstance(d, int) else {"r": len(variables) + syms.index(d)} for d in launch[0]] if launch is not None else None
  return {"format": FORMAT, "key": key, "name": name, "src": src, "opts": [[o.op.name, o.axis, o.amount] for o in opts],
          "ops": ops, "graph": graph, "variables": len(variables), "launch": None if launch is None else [groups, list(launch[1])]}

def write_program(key: str, name: str, src: str, opts: list[Opt], ops: int, variables: list[UOp],
                  launch: tuple[tuple[UOp | int, ...], tuple[int, ...]] | None) -> None:
  cache_write(_path(key), json.dumps(program_entry(key, name, src, opts, ops, variables, launch)).encode())

def program_cached(key: str) -> bool: return _path(key).exists()

def read_program(key: str) -> dict[str, Any] | None:
  """The entry write_program stored under key, its fields as the kernel needs them (the scalar arguments as nodes,
  launch dims with their symbolic sizes as UOps); None when there is none, or it is damaged (then with a warning)."""
  return cache_read(_path(key), lambda raw: decode_program(json.loads(raw), key))

def decode_program(entry: dict[str, Any], key: str) -> dict[str, Any]:
  """program_entry's data as the kernel needs it (ValueError: it was written for another key)."""
  if entry["format"] != FORMAT or entry["key"] != key: raise ValueError("written for another key")
  roots = graph_from_data(entry["graph"])
  variables = roots[:entry["variables"]]
  if not all(v.op in (Ops.DEFINE_VAR, Ops.CORE_ID) for v in variables): raise ValueError("an argument that isn't a DEFINE_VAR or CORE_ID")
  launch = None
  if entry["launch"] is not None:
    groups, local = entry["launch"]
    launch = (tuple(d if isinstance(d, int) else roots[d["r"]] for d in groups), tuple(int(d) for d in local))
  opts = [Opt(OptOps[op], int(axis), int(amount)) for op, axis, amount in entry["opts"]]
  return {"name": str(entry["name"]), "src": str(entry["src"]), "opts": opts, "ops": int(entry["ops"]), "variables": variables,
          "launch": launch}
