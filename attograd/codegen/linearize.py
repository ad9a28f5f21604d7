"""Lowered kernel graph -> a straight list of UOps with explicit loop ends (DESIGN §3.5)."""
from __future__ import annotations
import heapq
from attograd.uop.ops import UOp, Ops

def _loops_around(x: UOp, end_of: dict[UOp, UOp], enclosing: dict[UOp, set[UOp]]) -> set[UOp]:
  """The loops loop x sits in: those still open at its END, and everything around them (remembered in enclosing)."""
  if x not in enclosing:
    enclosing[x] = set()
    for outer in end_of[x].live_ranges: enclosing[x] |= {outer} | _loops_around(outer, end_of, enclosing)
  return enclosing[x]

def linearize(sink: UOp) -> list[UOp]:
  """Order nodes so that loops nest. A loop opens only when everything its body needs from
  outside it is done (an accumulator's init, an earlier sibling loop), and opens as late as possible."""
  order = list(sink.toposort)
  position = {u: i for i, u in enumerate(order)}
  deps: dict[UOp, set[UOp]] = {u: set(u.src) for u in order}
  end_of = {u.src[1]: u for u in order if u.op is Ops.END}
  enclosing: dict[UOp, set[UOp]] = {}
  # every loop a node is inside, found once per node (not once per node and loop), and once per set of live ranges: most
  # nodes share theirs with many others (the walks below were half of linearize's time, most of it building these sets)
  body: dict[UOp, frozenset[UOp]] = {}
  around: dict[frozenset[UOp], frozenset[UOp]] = {}
  for r, end in end_of.items():
    # what the loop's body reads from outside it: found walking down through the body only (what lies below those
    # nodes is done before them), not every node under the END
    stack, seen, outside = list(end.src), set(), deps[r]
    while stack:
      if (u := stack.pop()) in seen: continue
      seen.add(u)
      if (b := body.get(u)) is None:
        if (b := around.get(live := u.live_ranges)) is None: b = around[live] = frozenset().union(*({x} | _loops_around(x, end_of, enclosing) for x in live))
        body[u] = b
      if r in b: stack.extend(u.src)
      else: outside.add(u)
  users: dict[UOp, list[UOp]] = {u: [] for u in order}
  for u, ds in deps.items():
    for d in ds: users[d].append(u)
  waiting = {u: len(ds) for u, ds in deps.items()}
  # a ready loop opens after all other ready work; of two, the one nested deeper in the open loops
  # first (a loop's path is the ids of the loops around it, then its own): a loop split off inside
  # another must not let a sibling of the outer one open in between
  def key(u: UOp) -> tuple[int, tuple[int, ...]]:
    if u.op is not Ops.RANGE: return (0, (position[u],))
    return (1, tuple(sorted(r.arg[0] for r in (_loops_around(u, end_of, enclosing) if u in end_of else ()))) + (u.arg[0],))
  ready = [(key(u), position[u], u) for u in order if waiting[u] == 0]
  heapq.heapify(ready)
  out: list[UOp] = []
  while ready:
    _, _, u = heapq.heappop(ready)
    out.append(u)
    for v in users[u]:
      waiting[v] -= 1
      if waiting[v] == 0: heapq.heappush(ready, (key(v), position[v], v))
  assert len(out) == len(order), "kernel graph has a cycle"
  return out
