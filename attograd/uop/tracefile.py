"""A recorded Trace (uop/trace.py) as JSON data, saved and loaded: one table of nodes shared by every graph (UOps are hash-consed, so a
graph rewritten a little adds only its new nodes), passes whose steps are (before, after, rule) node ids, kernels,
launches. JSON only: a saved trace is data, never code (no pickle)."""
from __future__ import annotations
import json, linecache, os
from typing import Any
from attograd.dtype import FLOATS, INTS, UINTS
from attograd.uop.ops import UOp, Ops, GroupOp
from attograd.uop.patterns import UPat

FORMAT = "attograd-viz 1"
# rule locations are shown relative to the folder holding the attograd package (attograd/uop/symbolic.py:177)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARG_CHARS = 120  # a node's arg is shown as text, cut to this

# a set of ops that is one of GroupOp's reads as its name (ALU, Elementwise, ...), dtypes sets by theirs (ints, floats)
_OP_GROUPS = {frozenset(v): k for k, v in vars(GroupOp).items() if not k.startswith("_") and isinstance(v, (set, frozenset))}
_DTYPE_GROUPS = {frozenset(INTS): "ints", frozenset(UINTS): "uints", frozenset(FLOATS): "floats"}

def _ops_str(ops: frozenset) -> str:
  return _OP_GROUPS.get(ops) or "|".join(sorted(o.name for o in ops))

def upat_str(p: UPat, depth: int = 0) -> str:
  """A pattern as it reads: ADD(x, CONST=0) for UPat(Ops.ADD, src=(UPat.var('x'), UPat.const(None, 0)))."""
  if depth > 6: return "…"
  ops = "" if p.op is None or len(p.op) == len(Ops) else _ops_str(p.op)
  head = ops or ("" if p.name else "*")
  if p.name: head = f"{head}:{p.name}" if head else p.name
  if p.dtype is not None: head += "<" + (_DTYPE_GROUPS.get(p.dtype) or "|".join(sorted(str(d).removeprefix("dtypes.") for d in p.dtype))) + ">"
  if p.arg is not None: head += f"={p.arg!r}"
  if p.src is None: return head
  kind, pats = p.src
  if kind == "all": return f"{head}({upat_str(pats, depth + 1)}, ...)"
  inner = ", ".join(upat_str(s, depth + 1) for s in pats) + (", ..." if p.allow_any_len else "")
  return f"{head}[{inner}]" if kind == "perm" else f"{head}({inner})"

def _rule_code(loc: str) -> str:
  """The rule's source lines at file:line (up to the end of the statement's line or 4 lines), for the step list."""
  file, _, line = loc.rpartition(":")
  if not line.isdigit(): return ""
  out = []
  for i in range(int(line), int(line) + 4):
    text = linecache.getline(file, i)
    if not text: break
    out.append(text.rstrip())
    if text.rstrip().endswith(("),", ")", ":")) and out[0].count("(") <= sum(t.count(")") for t in out): break
  return "\n".join(out)

class _Nodes:
  def __init__(self) -> None:
    self.ids: dict[UOp, int] = {}
    self.rows: list[list[Any]] = []
  def add(self, root: UOp | None) -> int:
    """root's id, after adding it and everything below it that isn't in the table yet (children first)."""
    if root is None: return -1
    if (i := self.ids.get(root)) is not None: return i
    stack = [(root, False)]
    while stack:
      u, ready = stack.pop()
      if u in self.ids: continue
      if not ready:
        stack.append((u, True))
        stack.extend((s, False) for s in reversed(u.src) if s not in self.ids)
        continue
      arg = "" if u.arg is None else repr(u.arg)
      self.ids[u] = len(self.rows)
      self.rows.append([u.op.name, str(u.dtype).removeprefix("dtypes."), arg if len(arg) <= ARG_CHARS else arg[:ARG_CHARS] + "…",
                        [self.ids[s] for s in u.src]])
    return self.ids[root]

def _short(loc: str) -> str:
  return os.path.relpath(loc, ROOT) if loc.startswith(ROOT + os.sep) else loc

def to_json(tr: Any) -> dict[str, Any]:
  nodes = _Nodes()
  passes = []
  for p in tr.passes:
    passes.append({"name": p.name, "group": p.group, "parent": p.parent, "rewrite": p.rewrite, "start": p.start, "dur": p.dur,
                   "input": nodes.add(p.input), "output": nodes.add(p.output),
                   "steps": [[nodes.add(s.before), nodes.add(s.after), s.rule] for s in p.steps]})
  groups = []
  for g in tr.groups:
    d: dict[str, Any] = {"kind": g.kind, "name": g.info.get("name") or g.name, "start": g.start, "dur": g.dur}
    if g.kind == "kernel":
      d.update(device=g.info.get("device", ""), opts=[repr(o) for o in g.info.get("opts", [])], chosen_by=g.info.get("chosen_by", ""),
               src=g.info.get("src", ""), ready=g.info.get("ready", 0.0),
               ast=nodes.add(g.info.get("ast")), lower_s=g.info.get("lower_s", 0.0), compile_s=g.info.get("compile_s", 0.0),
               uops=[f"{i:4d} {u.op.name:14s} {str(u.dtype).removeprefix('dtypes.'):24s} {'' if u.arg is None else repr(u.arg)[:ARG_CHARS]}"
                     for i, u in enumerate(g.info.get("uops", []))])
    if g.kind == "schedule":  # the kernels and copies this realize made, with their buffers (output first) and why it's one
      why = g.info.get("why") or []
      d["items"] = [{"kernel": tr.kernel_of.get((si.ast, si.bufs[0].arg.device), -1), "op": si.ast.op.name,
                     "bufs": [[b.arg.uid, str(b.dtype).removeprefix("dtypes."), b.arg.size, b.arg.device] for b in si.bufs],
                     "why": list(why[n]) if n < len(why) else ["", "(scheduled from the disk cache: the reason was not kept)"]}
                    for n, si in enumerate(g.info.get("items", []))]
    groups.append(d)
  rules = []
  for pm, i in tr.rules:
    loc = pm.locations[i]
    rules.append({"loc": loc, "short": _short(loc),
                  "pattern": upat_str(pm.rules[i][0]), "code": _rule_code(loc)})
  events = [{"device": e.device, "name": e.name, "start": e.start, "dur": e.dur, "group": e.group, "mem": e.mem, "jit": e.jit, "ops": e.ops, "nbytes": e.nbytes} for e in tr.events]
  transfers = [{"device": e.device, "name": e.name, "start": e.start, "dur": e.dur, "mem": e.mem, "nbytes": e.nbytes} for e in tr.transfers]
  return {"format": FORMAT, "nodes": nodes.rows, "rules": rules, "groups": groups, "passes": passes, "events": events,
          "transfers": transfers, "memory": tr.memory, "skipped": tr.skipped}

def save(tr: Any, path: str) -> dict[str, Any]:
  """Write the trace's JSON to path, whole or not at all (a temporary file renamed over it), and return it."""
  data = to_json(tr)
  tmp = f"{path}.{os.getpid()}.part"
  try:
    with open(tmp, "w") as f: json.dump(data, f, separators=(",", ":"))
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp): os.remove(tmp)
  return data

def load(path: str) -> dict[str, Any]:
  """A saved trace, checked to be one (a clear error for any other file)."""
  try:
    with open(path) as f: data = json.load(f)
  except (OSError, ValueError) as e: raise ValueError(f"{path}: not a readable VIZ trace ({e})") from None
  if not isinstance(data, dict) or data.get("format") != FORMAT:
    raise ValueError(f"{path}: not a VIZ trace (expected format {FORMAT!r}); write one with VIZ=1 python your_program.py")
  return data
