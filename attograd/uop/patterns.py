"""The one engine: UPat patterns, PatternMatcher rule sets and graph_rewrite to a fixed point."""
from __future__ import annotations
import inspect, itertools
from typing import Any, Callable, Iterator, Sequence
from attograd.dtype import DType
from attograd.helpers import DEBUG
from attograd.uop.ops import UOp, Ops, GroupOp

class UPat:
  """A pattern over UOps. src as a tuple matches in order, as a list in any order (commutative ops),
  as a single UPat every source; name binds the matched node for the rule's function."""
  __slots__ = ("op", "dtype", "src", "arg", "name", "allow_any_len", "required_src_ops")
  def __init__(self, op: Ops | Sequence[Ops] | set[Ops] | None = None, dtype: DType | Sequence[DType] | None = None,
               src: UPat | tuple[UPat, ...] | list[UPat] | None = None, arg: Any = None, name: str | None = None,
               allow_any_len: bool = False):
    self.op = None if op is None else (frozenset((op,)) if isinstance(op, Ops) else frozenset(op))
    self.dtype = None if dtype is None else (frozenset((dtype,)) if isinstance(dtype, DType) else frozenset(dtype))
    self.arg, self.name, self.allow_any_len = arg, name, allow_any_len
    # src kinds: None (anything), ("seq", pats), ("perm", pats), ("all", pat)
    if src is None: self.src = None
    elif isinstance(src, UPat): self.src = ("all", src)
    elif isinstance(src, list): self.src = ("perm", tuple(src))
    else: self.src = ("seq", tuple(src))
    # a cheap test before matching: which ops must appear among the direct sources
    req = [p.op for p in (self.src[1] if self.src and self.src[0] != "all" else ()) if p.op is not None and len(p.op) == 1]
    self.required_src_ops = frozenset(next(iter(o)) for o in req)

  @staticmethod
  def var(name: str | None = None, dtype: DType | Sequence[DType] | None = None) -> UPat: return UPat(dtype=dtype, name=name)
  @staticmethod
  def cvar(name: str | None = None, dtype: DType | Sequence[DType] | None = None) -> UPat: return UPat(Ops.CONST, dtype, name=name)
  @staticmethod
  def const(dtype: DType | Sequence[DType] | None, value: Any) -> UPat: return UPat(Ops.CONST, dtype, arg=value)
  def __repr__(self) -> str: return f"UPat({self.op and sorted(o.name for o in self.op)}, name={self.name!r})"

  # building patterns with operators reads like the math it matches: UPat.var("x") + UPat.cvar("c")
  def _alu(self, op: Ops, *src: UPat) -> UPat:
    return UPat(op, src=list((self, *src)) if op in GroupOp.Commutative and len(src) == 1 else (self, *src))
  def __add__(self, x: UPat) -> UPat: return self._alu(Ops.ADD, x)
  def __sub__(self, x: UPat) -> UPat: return self._alu(Ops.SUB, x)
  def __mul__(self, x: UPat) -> UPat: return self._alu(Ops.MUL, x)
  def __floordiv__(self, x: UPat) -> UPat: return self._alu(Ops.IDIV, x)
  def __mod__(self, x: UPat) -> UPat: return self._alu(Ops.MOD, x)
  def __lt__(self, x: UPat) -> UPat: return self._alu(Ops.CMPLT, x)
  def __and__(self, x: UPat) -> UPat: return self._alu(Ops.AND, x)
  def __or__(self, x: UPat) -> UPat: return self._alu(Ops.OR, x)
  def maximum(self, x: UPat) -> UPat: return self._alu(Ops.MAX, x)
  def ne(self, x: UPat) -> UPat: return self._alu(Ops.CMPNE, x)

  def match(self, u: UOp, store: dict[str, UOp]) -> Iterator[dict[str, UOp]]:
    """Every way the pattern matches u, each as the bindings it makes (extending store)."""
    if (self.op is not None and u.op not in self.op) or (self.dtype is not None and u.dtype not in self.dtype) or \
       (self.arg is not None and self.arg != u.arg): return
    if self.name is not None:
      if (bound := store.get(self.name)) is not None:
        if bound is not u: return
      else: store = {**store, self.name: u}
    if self.src is None: yield store; return
    kind, pats = self.src
    if kind == "all":
      yield from _match_seq((pats,) * len(u.src), u.src, store); return
    if len(u.src) < len(pats) or (len(u.src) != len(pats) and not self.allow_any_len): return
    if kind == "seq": yield from _match_seq(pats, u.src, store)
    else:
      for perm in itertools.permutations(pats): yield from _match_seq(perm, u.src, store)


def _match_seq(pats: Sequence[UPat], srcs: Sequence[UOp], store: dict[str, UOp]) -> Iterator[dict[str, UOp]]:
  if not pats: yield store; return
  for s in pats[0].match(srcs[0], store): yield from _match_seq(pats[1:], srcs[1:], s)

RuleFn = Callable[..., UOp | None]

def rule_location(fn: Any) -> str:
  """Where a rule's function is written, as file:line (the visualizer shows it beside each rewrite it made)."""
  while (inner := getattr(fn, "func", None)) is not None: fn = inner  # functools.partial
  code = getattr(fn, "__code__", None)
  return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else repr(fn)

class PatternMatcher:
  """An ordered list of (UPat, function) rules, dispatched on the node's op first so that the
  cost of a rewrite doesn't grow with the number of rules for other ops."""
  def __init__(self, rules: Sequence[tuple[UPat, RuleFn]]):
    self.rules = list(rules)
    # each rule's file:line, found once here: a recorded rewrite (uop/trace.py, VIZ) names the rule that fired
    self.locations = [rule_location(fn) for _, fn in self.rules]
    self.by_op: dict[Ops, list[tuple[UPat, RuleFn, bool]]] = {}
    for pat, fn in self.rules:
      takes_ctx = "ctx" in inspect.signature(fn).parameters
      for op in (pat.op if pat.op is not None else Ops):
        self.by_op.setdefault(op, []).append((pat, fn, takes_ctx))
    self.opmask = sum(1 << op.value for op in self.by_op)  # UOp.opmask: a graph without these ops is a fixed point
    self.fixed_bit = 0  # UOp.fixed's bit for this matcher, given when graph_rewrite first marks nodes with it
  def __add__(self, other: PatternMatcher) -> PatternMatcher: return PatternMatcher(self.rules + other.rules)
  def rewrite(self, u: UOp, ctx: Any = None, steps: list | None = None) -> UOp | None:
    """What the first rule that changes u returns, else None. With `steps` (a recording, VIZ), (u, result, pattern) is
    appended for the rewrite made."""
    if (rules := self.by_op.get(u.op)) is None: return None  # most nodes of a big graph: no rule to try
    src_ops = {s.op for s in u.src}
    for pat, fn, takes_ctx in rules:
      if pat.required_src_ops and not pat.required_src_ops <= src_ops: continue
      for store in pat.match(u, {}):
        ret = fn(ctx=ctx, **store) if takes_ctx else fn(**store)
        if ret is not None and ret is not u:
          if steps is not None: steps.append((u, ret, pat))
          return ret
    return None

  def first_result(self, u: UOp, ctx: Any = None) -> Any:
    """What the first rule matching u returns other than None, for a table whose rules give something else than a
    rewrite: whether a node is legal (a spec), the gradients of a node's sources (autograd's rules)."""
    for pat, fn, takes_ctx in self.by_op.get(u.op, ()):
      for store in pat.match(u, {}):
        if (ret := fn(ctx=ctx, **store) if takes_ctx else fn(**store)) is not None: return ret
    return None

class RewriteLoopError(RuntimeError): pass

_fixed_bits = itertools.count()  # the next PatternMatcher.fixed_bit (the matchers used without ctx first get the small ints)
FIXED_BITS = 1024  # matchers marked at most (the core has ~30; one made per call, as a program might, would grow every mark)

# VIZ (uop/trace.py) sets this to its recorder; None (the default) leaves graph_rewrite and run_passes as they are, at
# the cost of one test per call (not per node)
tracker: Any = None

def graph_rewrite(sink: UOp, pm: PatternMatcher, ctx: Any = None, *, name: str, max_steps: int = 1_000_000,
                  steps: list | None = None) -> UOp:
  """Rewrite to a fixed point, children first, each node once (memoized). A rule's result is
  itself rewritten, so rules may produce nodes other rules then simplify. `name` is the pass's, as docs/pipeline.md
  and the visualizer show it: every rewrite is a named pass. With `steps` (the recorder's, uop/trace.py), each rewrite
  is appended as (before, after, pattern), and (before, after, None) where a result had been rewritten already."""
  if tracker is not None and steps is None: return tracker.graph_rewrite(sink, pm, ctx, name, max_steps)
  done: dict[UOp, UOp] = {}
  # stack items: (node, state, rewritten-to) — 0: visit children, 1: rebuild and apply rules, 2: take result of rewrite
  stack: list[tuple[UOp, int, UOp | None]] = [(sink, 0, None)]
  count = 0
  # Rules are pure functions of the graph below a node (and ctx): what a rewrite without ctx returned is a fixed point of
  # the matcher, marked on the node (a bit of UOp.fixed), and a later rewrite by the same matcher stops there without
  # walking under it. Lowering rewrites a kernel's graph with `symbolic` again after small changes, and most of it is such
  # a node. (A bit, not a set in the node's __dict__: a dict and a set for every node a rewrite made were most of
  # lowering's allocations, and those of long-lived nodes, made among its garbage, pinned the arenas it freed)
  bit = 0  # (with a ctx, rules may read it: nothing is marked)
  if ctx is None and (bit := pm.fixed_bit) == 0 and (n := next(_fixed_bits)) < FIXED_BITS: bit = pm.fixed_bit = 1 << n
  opmask = pm.opmask
  while stack:
    node, state, other = stack.pop()
    if state == 0:
      if node in done: continue
      if not node.opmask & opmask or node.fixed & bit:
        done[node] = node
        continue
      stack.append((node, 1, None))
      for s in reversed(node.src):
        if s not in done: stack.append((s, 0, None))
    elif state == 1:
      if node in done: continue
      new_src = tuple([done[s] for s in node.src])
      rebuilt = node if new_src == node.src else UOp(node.op, node.dtype, new_src, node.arg)
      count += 1
      if count > max_steps: raise RewriteLoopError(f"pass {name!r} did not reach a fixed point in {max_steps} steps")
      ret = pm.rewrite(rebuilt, ctx, steps)
      if ret is None:
        done[node] = rebuilt
        if rebuilt is not node: done.setdefault(rebuilt, rebuilt)
      elif ret in done:
        done[node] = done[ret]
        if steps is not None and done[ret] is not ret: steps.append((ret, done[ret], None))
      else:
        stack.append((node, 2, ret))
        stack.append((ret, 0, None))
    else:
      done[node] = done[other]  # type: ignore[index]
  if bit:
    for u in done.values(): u.fixed |= bit
  return done[sink]

# A pipeline is a list of named passes, run in order: a PatternMatcher is rewritten to a fixed point without a ctx (so
# its results are marked as fixed points), anything else is a function (graph, the pipeline's ctx) -> graph, for the
# steps a rule can't be (one that sees the whole graph at once, or rewrites only when the graph needs it).
Pass = tuple[str, PatternMatcher | Callable[[UOp, Any], UOp]]

def run_passes(sink: UOp, passes: Sequence[Pass], ctx: Any = None) -> UOp:
  """sink through each pass in order. DEBUG>=5 prints each pass's name and the graph's size after it."""
  for name, step in passes:
    if isinstance(step, PatternMatcher): sink = graph_rewrite(sink, step, name=name)
    else: sink = step(sink, ctx) if tracker is None else tracker.call_pass(name, step, sink, ctx)
    if DEBUG >= 5: print(f"pass {name:20s} {len(sink.toposort):6d} nodes")
  return sink
