"""The rewrite recorder behind VIZ: every graph_rewrite as a named pass with each rewrite step (the rule that fired, by
its file:line, and the node before and after), grouped by what ran it (scheduling, a kernel's lowering), and the run
loop's launches as a timeline.

Off (the default) nothing here runs: patterns.tracker stays None. On (VIZ=1, or `with recording() as t:`), the tracker
is swapped in and graph_rewrite's one loop keeps each step it makes. The trace holds the UOps themselves;
tracefile.py writes it as JSON, which attograd/viz serves (started at exit as a program: nothing in the core imports it).

Replaying a pass's steps in order, each as a lookup (replay()), gives the pass's output: that is how the visualizer
draws the graph after any step, and what test_viz checks."""
from __future__ import annotations
import atexit, contextlib, os, sys, tempfile, threading, time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator
from attograd.helpers import CACHELEVEL, ContextVar
from attograd.uop.ops import UOp
from attograd.uop import patterns, tracefile
from attograd.uop.patterns import PatternMatcher, UPat

VIZ = ContextVar("VIZ", 0)

@dataclass
class Step:
  before: UOp   # the node the rule matched (its sources already rewritten)
  after: UOp    # what the rule returned
  rule: int     # index in Trace.rules; -1: no rule, `before` had been rewritten already to `after` in this pass

@dataclass
class PassRecord:
  name: str
  group: int    # index in Trace.groups
  parent: int   # index in Trace.passes of the pass that ran this one, -1 for none
  input: UOp
  output: UOp | None = None
  steps: list[Step] = field(default_factory=list)
  start: float = 0.0
  dur: float = 0.0
  rewrite: bool = True  # False: a function pass of run_passes (its rewrites are its children)

@dataclass
class Group:
  """What a set of passes belongs to: 'schedule' (a realize's scheduling), 'kernel' (lowering one kernel) or 'other'
  (rewrites run outside both, e.g. by the front end)."""
  kind: str
  name: str
  start: float
  dur: float = 0.0
  info: dict[str, Any] = field(default_factory=dict)  # a kernel's ast, device, opts, src, uops, lower/compile times
  def set(self, **kw: Any) -> None: self.info.update(kw)

@dataclass
class Event:
  """One launch of the run loop: a kernel or a copy."""
  device: str
  name: str
  start: float
  dur: float
  group: int        # the kernel's Group, -1 when it was lowered before recording started
  mem: int          # device memory in use after it (GlobalCounters.mem_used)
  jit: bool = False # a TinyJit replay's
  ops: int = 0      # arithmetic ops it ran
  nbytes: int = 0   # bytes of the buffers it bound

class Trace:
  """What one recording holds: groups (index 0 is 'other'), passes in the order they started, launches, and the rules
  that fired (each once). Written by patterns.tracker and the run loop; read by attograd/viz."""
  def __init__(self) -> None:
    self.t0 = time.perf_counter()
    self.groups: list[Group] = [Group("other", "other", 0.0)]
    self.passes: list[PassRecord] = []
    self.events: list[Event] = []
    self.transfers: list[Event] = []  # host <-> device copies outside the run loop (a tensor's data in, numpy() out)
    self.memory: list[tuple[float, int]] = []  # (time, device memory in use) at each allocation and free
    self.rules: list[tuple[PatternMatcher, int]] = []   # (matcher, rule index): the rule's pattern and location
    self.skipped: dict[str, int] = {}  # rewrites that changed nothing, by pass name (not stored: the front end runs many)
    self._rule_ids: dict[tuple[int, int], int] = {}
    # what is open, per thread: BEAM lowers its candidates on a thread pool, each its own kernel with its own passes
    self._local = threading.local()
    self._lock = threading.Lock()
    self.kernel_of: dict[tuple[UOp, str], int] = {}  # (ast, device) -> its last kernel Group, for the launches

  def now(self) -> float: return time.perf_counter() - self.t0
  def rule_id(self, pm: PatternMatcher, i: int) -> int:
    if (rid := self._rule_ids.get((id(pm), i))) is None:
      with self._lock:
        if (rid := self._rule_ids.get((id(pm), i))) is None:
          rid = self._rule_ids[(id(pm), i)] = len(self.rules)
          self.rules.append((pm, i))
    return rid
  def _stacks(self) -> tuple[list[int], list[int]]:
    """This thread's open groups and passes."""
    if (st := getattr(self._local, "stacks", None)) is None: st = self._local.stacks = ([], [])
    return st

  # ***** what patterns.tracker calls *****
  def _open_pass(self, name: str, sink: UOp, rewrite: bool) -> PassRecord:
    groups, passes = self._stacks()
    rec = PassRecord(name, groups[-1] if groups else 0, passes[-1] if passes else -1, sink, rewrite=rewrite, start=self.now())
    with self._lock:
      passes.append(len(self.passes))
      self.passes.append(rec)
    return rec
  def _close_pass(self, rec: PassRecord, out: UOp | None) -> None:
    self._stacks()[1].pop()
    rec.output, rec.dur = out, self.now() - rec.start
    # outside scheduling and lowering, a rewrite that did nothing and ran nothing is counted, not kept: UOp.simplify
    # on every symbolic size would bury the passes worth seeing (a kernel shows all its passes, even those that did nothing)
    if rec.group == 0 and rec.rewrite and not rec.steps and out is rec.input:
      with self._lock:
        if self.passes[-1] is rec:
          self.passes.pop()
          self.skipped[rec.name] = self.skipped.get(rec.name, 0) + 1

  def graph_rewrite(self, sink: UOp, pm: PatternMatcher, ctx: Any, name: str, max_steps: int) -> UOp:
    rec, out = self._open_pass(name, sink, True), None
    raw: list[tuple[UOp, UOp, UPat | None]] = []
    try: out = patterns.graph_rewrite(sink, pm, ctx, name=name, max_steps=max_steps, steps=raw)
    finally:
      rec.steps = [Step(before, after, -1 if pat is None else self.rule_id(pm, _rule_index(pm)[pat])) for before, after, pat in raw]
      self._close_pass(rec, out)
    return out

  def call_pass(self, name: str, fn: Callable[[UOp, Any], UOp], sink: UOp, ctx: Any) -> UOp:
    rec, out = self._open_pass(name, sink, False), None
    try: out = fn(sink, ctx)
    finally: self._close_pass(rec, out)
    return out

  @contextlib.contextmanager
  def group(self, kind: str, name: str, **info: Any) -> Iterator[Group]:
    g, stack = Group(kind, name, self.now(), info=info), self._stacks()[0]
    with self._lock:
      stack.append(idx := len(self.groups))
      self.groups.append(g)
    try: yield g
    finally:
      stack.pop()
      g.dur = self.now() - g.start
      if kind == "kernel" and "ast" in info: self.kernel_of[(info["ast"], info.get("device", ""))] = idx

  def note(self, **info: Any) -> None:
    """Facts for the group open on this thread (the scheduler's why of each realize point), from code that runs in it."""
    if (groups := self._stacks()[0]): self.groups[groups[-1]].set(**info)

  def transfer(self, device: str, name: str, start: float, dur: float, nbytes: int, mem: int) -> None:
    self.transfers.append(Event(device, name, start - self.t0, dur, -1, mem, nbytes=nbytes))
  def mem(self, used: int) -> None: self.memory.append((self.now(), used))

  def launch(self, device: str, name: str, start: float, dur: float, key: tuple[UOp, str] | None, mem: int, jit: bool = False,
             ops: int = 0, nbytes: int = 0) -> None:
    self.events.append(Event(device, name, start - self.t0, dur, self.kernel_of.get(key, -1) if key else -1, mem, jit, ops, nbytes))

def _rule_index(pm: PatternMatcher) -> dict[UPat, int]:
  """Each of pm's patterns' index in pm.rules, found once per matcher while recording."""
  if (index := pm.__dict__.get("_viz_rule_index")) is None: index = pm.__dict__["_viz_rule_index"] = {pat: i for i, (pat, _) in enumerate(pm.rules)}
  return index

# ***** replay: the graph after any step *****
def _lookup(ctx: dict[UOp, UOp], x: UOp) -> UOp | None: return ctx.get(x)
_replayer = PatternMatcher([(UPat(name="x"), _lookup)])

def replay(sink: UOp, steps: list[Step]) -> UOp:
  """sink with these steps applied as rewrites (each `before` becomes its `after`, to a fixed point, children first):
  the whole list gives the pass's output, a prefix the graph as it was after that step."""
  table = {s.before: s.after for s in steps}
  # with steps of its own (thrown away), so the recorder doesn't take it: the replay is no pass of the program
  return patterns.graph_rewrite(sink, _replayer, table, name="replay", steps=[])

# ***** switching it on *****
current: Trace | None = None

def clock() -> float:
  """Seconds since the recording started (0 when not recording): when something on the host ended."""
  return 0.0 if current is None else current.now()

def start() -> Trace:
  """Record from now on (VIZ=1 does this at import). The program and schedule caches (CACHELEVEL 2) are turned off
  while recording: a kernel loaded from them is never lowered, so its passes would not be seen."""
  global current
  if current is None:
    current = Trace()
    patterns.tracker = current
  return current

def stop() -> Trace | None:
  global current
  tr, current, patterns.tracker = current, None, None
  return tr

@contextlib.contextmanager
def recording() -> Iterator[Trace]:
  """with recording() as tr: ... records what runs inside (for tests and notebooks; VIZ=1 records a whole program)."""
  if current is not None: yield current; return
  old_cache = CACHELEVEL.value
  CACHELEVEL.value = min(old_cache, 1)
  try: yield start()
  finally:
    stop()
    CACHELEVEL.value = old_cache

class _NoGroup:
  def set(self, **kw: Any) -> None: pass
_no_group = _NoGroup()

@contextlib.contextmanager
def _nothing() -> Iterator[_NoGroup]: yield _no_group

def group(kind: str, name: str, **info: Any) -> contextlib.AbstractContextManager:
  """The run loop's and scheduler's grouping of passes: a context that does nothing when not recording."""
  return _nothing() if current is None else current.group(kind, name, **info)

def _at_exit() -> None:
  """VIZ=1 at program exit: save the trace (VIZ_TRACE, default a file in the temp folder), then serve it unless
  VIZ_SERVE=0, with the visualizer started as a program by its path (the core imports none of it) until Ctrl-C."""
  if (tr := stop()) is None: return
  if not (tr.passes or tr.events):
    print("VIZ: nothing was recorded (no graph was rewritten or run)", file=sys.stderr)
    return
  path = os.getenv("VIZ_TRACE") or os.path.join(tempfile.gettempdir(), f"attograd-viz-{os.getpid()}.json")
  data = tracefile.save(tr, path)
  print(f"VIZ: trace of {len(data['passes'])} passes, {len(data['groups']) - 1} groups, {len(data['events'])} launches saved to {path}"
        f" (serve it again: python -m attograd.viz {path})", file=sys.stderr, flush=True)
  if os.getenv("VIZ_SERVE", "1") == "0": return
  import subprocess  # (only to serve a trace: not at import)
  try: subprocess.run([sys.executable, "-m", "attograd.viz", path, "--port", os.getenv("VIZ_PORT", "8000")])
  except KeyboardInterrupt: pass  # Ctrl-C ends the server and this program with it

def _worker() -> bool:
  """In a process multiprocessing started (a DataLoader worker): it inherits VIZ=1 but must not record, nor serve at
  its exit (it would hold the port and never end)."""
  import multiprocessing
  return multiprocessing.parent_process() is not None

if VIZ and not _worker():
  CACHELEVEL.value = min(CACHELEVEL.value, 1)
  start()
  atexit.register(_at_exit)
