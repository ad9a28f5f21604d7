"""A graph's structure compiled into a check of other graphs (realize's loop steps, DESIGN §3.3).

graph_structure walks a graph and builds its structure (buffers anonymized), and a dict lookup finds the schedule made
for that: every realize of a training step pays the walk of its ~1,700 nodes in generic Python (a dict probe an edge, an
iterator and a tuple a node). A loop realizes graphs of one structure over and over, so once a template runs from a kept
plan, realize compiles the graph it has just seen into a matcher: straight-line Python that goes down a new graph by the
recorded paths and compares each node's op, dtype and arg with the recorded ones. A part of the graph that names no
buffer (constants, an arange, their reshapes) is the very node hash-consing builds again, checked by identity without
going into it. The matcher accepts only graphs of the recorded graph's structure and returns their buffers in the order
graph_structure lists them; anything else gets None, and the caller takes the generic walk."""
from __future__ import annotations
from typing import Any, Callable
from attograd.uop.ops import UOp, Ops

_WD = Ops.WITH_DERIVATIVE
_KEPT_MASK = (1 << Ops.BUFFER.value) | (1 << _WD.value)  # a subgraph with neither is checked by identity

class Match:
  """What a matcher found in a graph of its structure: the buffers (in graph_structure's order), the WITH_DERIVATIVE
  nodes (their derivative sources are not part of the structure: a caller that needs them clean checks them) and the
  nodes it went through (each compared by op, dtype and arg, or by identity)."""
  __slots__ = ("bufs", "derivs", "nodes")
  def __init__(self, bufs: list[UOp], derivs: tuple[UOp, ...], nodes: set[UOp]):
    self.bufs, self.derivs, self.nodes = bufs, derivs, nodes

class StructureMatcher:
  """sink's structure compiled: called with a graph, a Match if graph_structure of it equals sink's, else None.

  Each node of sink's graph that holds a buffer (opmask) is compared by op, dtype and arg (a float arg by its bits, as
  graph_structure keys it) and gone into by its sources (a WITH_DERIVATIVE by its value only, as graph_structure does);
  a buffer by dtype, device, size and offset. A node that holds none is kept (`kept`, with every node below it in
  `inside_ids`) and must be the graph's node there: while it lives, hash-consing builds no other node of its key. A source
  reached again must be the node reached first, and the nodes reached must be as many distinct ones as sink's. So a
  graph it accepts maps one to one onto sink's graph, node for node: its structure is sink's, and its buffers come in
  the same order. It keeps no buffer of sink's graph alive (only the kept parts, which hold none)."""
  def __init__(self, sink: UOp):
    consts: dict[tuple, tuple[str, Any]] = {}  # what the code reads besides its nodes (ops, dtypes, args, kept nodes)
    def const(v: Any) -> str:
      # (by type and identity: equal values of two types, 1 and True, stay apart)
      return consts.setdefault((type(v), id(v)), (f"k{len(consts)}", v))[0]
    names: dict[UOp, str] = {sink: "n0"}
    lines = [f"if n0.op is not {const(sink.op)} or n0.dtype is not {const(sink.dtype)}: return None"]
    derivs: list[str] = []
    kept: list[UOp] = []
    todo = [sink]  # nodes named and checked, whose sources are still to name (any order: each is named once)
    while todo:
      u = todo.pop()
      n = names[u]
      srcs = u.src[:1] if u.op is _WD else u.src
      if u.op is _WD: derivs.append(n)
      if not srcs:
        lines.append(f"if {n}.src: return None")
        continue
      targets, again = [], []
      for s in srcs:
        if s in names:  # reached before: must be the same node
          targets.append(t := f"t{len(again)}")
          again.append(f"if {t} is not {names[s]}: return None")
          continue
        names[s] = m = f"n{len(names)}"
        targets.append(m)
        if s.op is Ops.BUFFER and not s.src:
          a = s.arg
          again.append(f"if {m}.op is not {const(Ops.BUFFER)} or {m}.dtype is not {const(s.dtype)} or "
                       f"({m}.arg.device, {m}.arg.size, {m}.arg.offset) != {const((a.device, a.size, a.offset))}: return None")
          todo.append(s)  # (its sources: none, checked)
        elif not s.opmask & _KEPT_MASK:
          again.append(f"if {m} is not {const(s)}: return None")
          kept.append(s)
        elif s.op is _WD:  # (its arg, the derivative's functions, and its dtype aren't part of the structure)
          again.append(f"if {m}.op is not {const(_WD)}: return None")
          todo.append(s)
        else:
          # (the arg as graph_structure keys it: a float by its bits, so 1.0 is not 1 there)
          arg = s.arg
          check = (f"type({m}.arg) is float and {m}.arg.hex() == {const(arg.hex())}" if type(arg) is float else
                   f"type({m}.arg) is not float and {m}.arg == {const(arg)}" if type(arg) in (int, bool) else f"{m}.arg == {const(arg)}")
          again.append(f"if {m}.op is not {const(s.op)} or {m}.dtype is not {const(s.dtype)} or not ({check}): return None")
          todo.append(s)
      lines.append(f"{targets[0]} = {n}.src[0]" if u.op is _WD else f"{', '.join(targets)}, = {n}.src")
      lines += again
    # the buffers in graph_structure's order: its walk's (depth first, sources in order, a node after its sources)
    order: list[str] = []
    seen, nodes, sources = {sink}, [sink], [iter(sink.src)]
    while sources:
      for s in sources[-1]:
        if s not in seen:
          seen.add(s); nodes.append(s); sources.append(iter(s.src[:1] if s.op is _WD else s.src))
          break
      else:
        sources.pop()
        if (u := nodes.pop()).op is Ops.BUFFER and not u.src: order.append(names[u])
    self.kept = tuple(kept)
    # the kept nodes and all below them, by id (they live as long as the matcher: their ids are theirs)
    self.inside_ids = tuple(dict.fromkeys(id(x) for k in kept for x in k.toposort))
    self.n_nodes, self.n_bufs = len(names), len(order)
    visited = [n for u, n in names.items()]
    code = "\n".join([f"def make({', '.join(name for name, _ in consts.values())}):",
                      " def match(n0):",
                      "  try:",
                      *(f"   {line}" for line in lines),
                      "  except ValueError: return None  # (a node with another number of sources than the recorded one's)",
                      f"  nodes = {{{', '.join(visited)}}}",
                      f"  if len(nodes) != {len(visited)}: return None  # (one node where the recorded graph had two)",
                      f"  return Match([{', '.join(order)}], ({''.join(d + ', ' for d in derivs)}), nodes)",
                      " return match"])
    scope: dict[str, Any] = {"Match": Match}
    exec(compile(code, f"<structure matcher of {len(names)} nodes>", "exec"), scope)
    self.match: Callable[[UOp], Match | None] = scope["make"](*(v for _, v in consts.values()))
  def __call__(self, sink: UOp) -> Match | None: return self.match(sink)
