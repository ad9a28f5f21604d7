"""Realize lazy graphs: schedule them, compile each kernel once (cached by AST and device), then call it with buffers."""
from __future__ import annotations
import ctypes, itertools, json, math, operator, os, sys, threading, time, weakref, zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable
if TYPE_CHECKING: from concurrent.futures import Future, ThreadPoolExecutor
from attograd.dtype import dtypes
from attograd.helpers import BEAM, CACHELEVEL, DEBUG, ContextVar, getenv, NOOPT, GlobalCounters, Progress, cached_property, colored, gc_paused, prod, unwrap
from attograd.uop.ops import UOp, Ops, GroupOp, substitute_sym
from attograd.uop import trace
from attograd.runtime.device import Device, Buffer
from attograd.runtime.threadpool import Steps, array_type, wait_all
from attograd.engine.compilequeue import CompileQueue, timed_compile
from attograd.codegen import to_program
from attograd.renderer import scalar_args
from attograd.codegen.opt import Opt, THREADS
from attograd.codegen.heuristic import heuristic_opts, cores
from attograd.engine.search import beam_search
from attograd.codegen.gpudims import launch_dims, eval_dims
from attograd.schedule.schedule import Schedule, ScheduleItem, ScheduleTemplate, becomes_of, fill_in, graph_structure, is_view_of_buffer, new_buffer, schedule_template, template_data, template_from_data
import attograd.schedule.schedule as schedule_module
from attograd.schedule.multi import MULTI_MASK, lower_graphs
from attograd.schedule.match import StructureMatcher
from attograd.engine.memory import planned_buffers, plan_slots
from attograd.engine import registry
from attograd.engine import roofline
from attograd.engine.allreduce import AllReduce
from attograd.engine.lanes import LANES, Lanes, lane_cores
from attograd.engine.progcache import program_key, program_cached, read_program, write_program, program_entry, decode_program
from attograd.engine.forked import ForkedWorker, ChildGone, tell_parent
from attograd.uop.serialize import graph_data, graph_from_data

@dataclass
class CompiledKernel:
  name: str
  # the source, zlib-compressed (pack_source): read only by DEBUG, BEAM, the program cache's writer and tests, it was kept
  # whole on every kernel (SmolLM2's 73 kernels: 0.55 MiB of resident strings, 0.15 MiB packed; a read costs ~12 us)
  packed: bytes
  program: Any
  ops: int              # arithmetic ops per run, for GFLOPS at DEBUG>=1
  variables: list[UOp]  # the scalar arguments in order (renderer.scalar_args): DEFINE_VARs, then a threaded kernel's CORE_ID
  opts: list[Opt]
  # GPU targets: (work-groups, threads per work-group) in 3 dimensions, passed to program(bufs, vals, groups, local)
  launch: tuple[tuple[UOp | int, ...], tuple[int, ...]] | None = None
  # CPU seconds this process spent lowering it and the compiler compiling it (of a batch, a share by source length);
  # 0 when it came from the disk cache
  lower_s: float = 0.0
  compile_s: float = 0.0
  @property
  def src(self) -> str: return zlib.decompress(self.packed).decode()
  @cached_property
  def threads(self) -> int:
    """The slices the THREAD opt cut the work in (1: one call runs it all). Found once: replays call this often."""
    return self.variables[-1].arg if self.variables and self.variables[-1].op is Ops.CORE_ID else 1
  @cached_property
  def user_vars(self) -> list[UOp]: return [v for v in self.variables if v.op is Ops.DEFINE_VAR]
  def __call__(self, bufs: list[Any], var_vals: dict[UOp, int] | None) -> None:
    # the values of the Variables; the core id is not among them: the thread pool passes each slice its own
    vals = [int(unwrap(var_vals)[v]) for v in self.user_vars]
    if self.launch is not None: return self.program(bufs, vals, eval_dims(self.launch[0], var_vals), self.launch[1])
    if (n := self.threads) == 1: return self.program(bufs, vals)
    # the CPU runtime's native thread pool: each core takes the next slice when it is done with one
    # (in a lane of devices side by side, the device's share of the cores: engine/lanes.py)
    self.program.run_slices(bufs, vals, n, min(n, lane_cores()))

def pack_source(src: str) -> bytes: return zlib.compress(src.encode(), 1)  # (level 1: 3.6x smaller; ~70 us for 7.5 KB, a compile takes ms)

def trips(r: UOp) -> int:
  """A loop's iterations for the op count: a computed count that reads no Variable (a gated sum's loop, run 0 times
  where its gate is false: lower.skip_when_false) at its most; a Variable's count as 1."""
  if r.src[0].op is Ops.CONST: return r.src[0].arg
  return 1 if any(x.op is Ops.DEFINE_VAR for x in r.src[0].toposort) else int(r.src[0].vmax)

def count_ops(uops: list[UOp]) -> int:
  """ALU ops executed, multiplying by the trip count of each enclosing loop."""
  total = 0
  for u in uops:
    if u.op in GroupOp.ALU and u.dtype != dtypes.bool and not dtypes.is_int(u.dtype):
      total += (2 if u.op is Ops.MULACC else 1) * prod(trips(r) for r in u.live_ranges)
  return total

_kernel_cache: dict[tuple, CompiledKernel] = {}
def get_kernel(ast: UOp, device: str, opts: list[Opt] | None = None, progress: Progress | None = None) -> CompiledKernel:
  """The kernel compiled for device, with the given Opts or else the search's or heuristics' (cached in memory, and
  on disk: a program an earlier process lowered is only loaded)."""
  key = (ast, device) if opts is None else (ast, device, tuple(opts))  # explicit [] is not the heuristics' choice
  if (ck := _kernel_cache.get(key)) is not None: return ck
  dev = Device[device]
  if dev.renderer is None:
    raise RuntimeError(f"{device} stores bytes and can't run kernels: move the tensor to a compute device first, e.g. t.to('CPU')")
  pkey = _program_key(ast, device, opts_choice(opts, dev.renderer)) if CACHELEVEL >= 2 else None
  if pkey is not None and DEBUG < 5 and (ck := load_kernel(pkey, ast, device)) is not None:  # DEBUG=5 shows the uops
    _kernel_cache[key] = ck
    return ck
  if (ahead := _ahead.pop(key, None)) is None:
    chosen_by = "caller" if opts is not None else opts_choice(None, dev.renderer)  # VIZ shows who chose the Opts
    if opts is None: opts = choose_opts(ast, device, progress)
    ahead = lower_kernel(ast, device, opts, False, chosen_by)
  ck = _kernel_cache[key] = ahead()
  if pkey is not None: write_program(pkey, ck.name, ck.src, ck.opts, ck.ops, ck.variables, ck.launch)
  return ck

# kernels lowered ahead of their run (compile_ahead), each finished by calling it: it waits for its binary
_ahead: dict[tuple, Callable[[], CompiledKernel]] = {}
_compiler_pool: ThreadPoolExecutor | None = None
_workers = max(THREADS.value, 1)

def compile_ahead(schedule: list[ScheduleItem], progress: Progress | None = None) -> None:
  """Lower the schedule's kernels that aren't compiled (nor in the program cache) and hand each source to the device's
  compiler on a worker thread as soon as it is written: the C compiler (another process) compiles one kernel while
  Python lowers the next, on the other core. BEAM compiles its own candidates."""
  queues: set[CompileQueue] = set()
  try:
    _lower_todo(schedule, queues, progress)
    for (ast, device), p in _waiting.items(): _ahead[(ast, device)] = _lower_here(ast, device, p)  # too few for a child
  finally:
    for q in {*_held, *queues}: q.lowered()
    _held.clear()
    _waiting.clear()  # (after an error: get_kernel lowers them when they are run)
    _end_lowering_child()

def _lower_todo(schedule: list[ScheduleItem], queues: set[CompileQueue], progress: Progress | None) -> None:
  todo = [k for k in dict.fromkeys((si.ast, si.bufs[0].arg.device) for si in schedule if si.ast.op not in NOT_KERNELS)
          if k not in _kernel_cache and k not in _ahead and k not in _waiting]
  if (len(todo) < 2 and not _held) or BEAM >= 1 or DEBUG >= 5: return
  # the program cache's kernels: get_kernel loads them (little work), and a schedule of only those makes no pool
  if not (todo := [k for k in todo if _to_lower(*k)]): return
  queues.update(q for device in {d for _, d in todo} if (q := _pool_queue(device)) is not None)
  for q in queues: q.lowering = True
  with gc_paused():
    for ast, device in todo:
      _lower_ahead(ast, device, progress)
      if progress is not None: progress.update(0, f"lowered {len(_ahead)}")

def _pool_queue(device: str) -> CompileQueue | None:
  """The compile pool (made on first use) and device's compiler queue on it (None: no queue, or a device that can't run)."""
  global _compiler_pool
  if _compiler_pool is None:
    from concurrent.futures import ThreadPoolExecutor  # (with its logging: 0.75 MiB, imported by the first compile)
    _compiler_pool = ThreadPoolExecutor(_workers, thread_name_prefix="compile")
  return compile_queue(device) if Device[device].renderer is not None else None

def _to_lower(ast: UOp, device: str) -> bool:
  """Is the kernel lowered ahead? Not when it is compiled or lowered already, nor when the program cache has it (loading
  it costs little: get_kernel does it), nor on a device that can't run kernels (get_kernel says why)."""
  dev = Device[device]
  if dev.renderer is None or (ast, device) in _kernel_cache or (ast, device) in _ahead or (ast, device) in _waiting: return False
  pkey = _program_key(ast, device, opts_choice(None, dev.renderer)) if CACHELEVEL >= 2 else None
  return pkey is None or not program_cached(pkey)

# the program keys of this realize's kernels: _to_lower, the lowering child's request and get_kernel each need one, and
# each was a hash of the whole AST (~0.2 ms). Kept until the realize has made its kernels (_run_items); keyed by what
# chooses the Opts too, so a setting changed meanwhile finds another key
_keys: dict[tuple[UOp, str, str], str | None] = {}
def _program_key(ast: UOp, device: str, choice: str) -> str | None:
  if (k := (ast, device, choice)) not in _keys: _keys[k] = program_key(ast, device, Device[device].renderer, choice)
  return _keys[k]

def _lower_ahead(ast: UOp, device: str, progress: Progress | None = None) -> None:
  """Lower one kernel (_to_lower's) and queue its source for the compiler: in the lowering child once the realize has
  LOWER_CHILD kernels to lower (until then they wait), else now, here."""
  if not _child_possible(): _ahead[(ast, device)] = _lower_here(ast, device, progress); return
  _waiting[(ast, device)] = progress
  if _child is None and len(_waiting) < LOWER_CHILD.value: return
  for (a, d), p in _waiting.items(): _ahead[(a, d)] = _lower_in_child(a, d) or _lower_here(a, d, p)
  _waiting.clear()

def _lower_here(ast: UOp, device: str, progress: Progress | None = None, on_pool: bool = True) -> Callable[[], CompiledKernel]:
  return lower_kernel(ast, device, choose_opts(ast, device, progress), on_pool, opts_choice(None, Device[device].renderer))

# ***** scheduling and lowering in a child process (engine/forked.py says why) *****
# The child is forked when a realize schedules a big new graph (SCHEDULE_CHILD_NODES: with the graph in its memory, it
# lowers each kernel as it makes it, tells this process of it, and answers the first request with the template) or
# has LOWER_CHILD kernels to lower (with fewer, they are lowered here at its end: a fork costs 5-10 ms in a process of
# 150-250 MiB, as much as lowering a small kernel, and a test suite realizes thousands of small graphs). It is told the
# requests ended when the realize has sent them all (compile_ahead): it answers the rest and exits. It is a copy of
# this process as the realize found it: a setting or a module's value changed before the realize is the child's too.
# A kernel it wasn't forked with is sent as its AST (serialized) with the program key this process computed; the child
# lowers it with the heuristics' Opts if its own key for the AST is the same (a setting changed since the fork gives
# another key) and answers with the program's entry. A program's source goes to the compiler as it arrives; the kernel
# is made when the run loop asks for it. A kernel the child couldn't lower (an error, or the child gone) is lowered
# here, where its exception has its traceback.
LOWER_CHILD = ContextVar("LOWER_CHILD", 4)  # a realize with this many kernels to lower lowers them in the child (0: never)
_waiting: dict[tuple[UOp, str], Progress | None] = {}  # a realize's kernels to lower while it has fewer

def _child_possible() -> bool:
  # not where the passes are recorded (VIZ) or printed, in an MPI process (an MPI library may not survive a fork), nor
  # without fork
  return bool(LOWER_CHILD) and trace.current is None and DEBUG < 3 and "mpi4py.MPI" not in sys.modules and hasattr(os, "fork")

class _LoweringChild(ForkedWorker):
  """The child, forked to lower (and, given the graph it is forked with, to schedule it first: its request 0, whose
  kernels it lowers as it makes them and tells this process of, each compiled as it arrives: `made`, by program key)."""
  def __init__(self, graph: tuple[UOp, list[UOp], int, str | None] | None = None) -> None:
    # each request's compiler, for its reply's source (the reader's functions hold these, not the worker: a cycle)
    compilers: list[Callable[[str, str], Future] | None] = [None] if graph is not None else []
    made: dict[str, tuple[dict, Future]] = {}
    def told(msg: dict) -> None: made[msg["program"]["key"]] = (msg, _compile_submitter(msg["device"])(msg["program"]["name"], msg["program"]["src"]))
    super().__init__(lambda request: _schedule_request(graph) if "schedule" in request else _lower_request(request),
                     lambda i, reply: compilers[i](reply["program"]["name"], reply["program"]["src"]) if "program" in reply else None,  # type: ignore[misc]
                     told)
    self.compilers, self.made = compilers, made
_child: _LoweringChild | None = None

# a graph this big, new (its template is in no cache), is scheduled in the child (its scheduling's garbage as lowering's);
# SmolLM2's prompt pass is ~3,000 nodes, a test's graphs are tens to hundreds
SCHEDULE_CHILD_NODES = 1000

def _schedule_in_child(sink: UOp, inputs: list[UOp], key: int, disk_key: str | None = None) -> ScheduleTemplate | None:
  """The template of a new graph, made in a child forked now (the graph is in its memory), which saves it under disk_key
  (the data is at hand there): None to make it here."""
  global _child
  if _child is not None or not _child_possible() or len(sink.ancestors) < SCHEDULE_CHILD_NODES: return None
  # the compilers take the kernels it tells of as they come: while it schedules, one at a time and all that waits
  for device in {t.device for t in sink.src if isinstance(t.device, str)}:
    if (q := _pool_queue(device)) is not None and q not in _held: q.lowering = True; _held.append(q)
  try:
    child = _child = _LoweringChild((sink, inputs, key, disk_key))
    reply, _ = child.result(child.submit({"schedule": True}))
  except (OSError, ChildGone): return None
  return template_from_data(reply["template"], key) if "template" in reply else None

_told: set[tuple[UOp, str]] = set()  # (in the child) the kernels told of

def _schedule_request(graph: tuple[UOp, list[UOp], int, str | None] | None) -> dict:
  """(In the child) the template of the graph it was forked with, saved on disk; each kernel, as it is made, is lowered
  and told of."""
  assert graph is not None, "a schedule request to a child forked without a graph"
  schedule_module.kernel_made, schedule_module.template_elsewhere = _tell_made, None
  sink, inputs, key, disk_key = graph
  with gc_paused():
    data = template_data(schedule_module._template(sink, inputs, key))
    if disk_key is not None: schedule_module.save_template(disk_key, data)
  return {"template": data}

def _tell_made(ast: UOp, device: str) -> None:
  """(In the child, as it schedules) a new kernel to lower: lowered now, and its program sent to the parent."""
  if ast.op in NOT_KERNELS or (ast, device) in _told or not _to_lower(ast, device): return
  _told.add((ast, device))  # (a kernel made again, each layer's: told once)
  if (key := _program_key(ast, device, opts_choice(None, Device[device].renderer))) is None: return
  try: p = lower_program(ast, device, choose_opts(ast, device))
  except Exception: return  # (the parent lowers it, and raises what it raises there)
  tell_parent({"device": device, **_reply_of(key, p)})

def _lower_in_child(ast: UOp, device: str) -> Callable[[], CompiledKernel] | None:
  """The kernel, lowered by the lowering child (None: lower it here)."""
  global _child
  dev = Device[device]
  if (key := _program_key(ast, device, opts_choice(None, dev.renderer))) is None: return None
  if _child is not None and (made := _child.made.pop(key, None)) is not None:  # lowered as the child scheduled it
    return lambda: _kernel(device, _lowered_of(made[0], key), made[1])
  request = {"ast": graph_data([ast]), "device": device, "key": key}
  try: child = _child = _child or _LoweringChild()
  except OSError: return None  # no fork here (a process limit)
  child.compilers.append(_compile_submitter(device))  # (before the request: its reply may come at once)
  try: i = child.submit(request)
  except OSError:  # the child is gone: this realize's other kernels are lowered here
    child.compilers.pop()
    return None
  def finish() -> CompiledKernel:
    try: reply, binary = child.result(i)
    except ChildGone as e: reply, binary = {"error": str(e)}, None
    if "error" in reply:
      if DEBUG >= 1: print(f"the lowering child didn't lower a kernel ({reply['error']}): lowering it here")
      return _lower_here(ast, device, on_pool=False)()
    return _kernel(device, _lowered_of(reply, key), binary)
  return finish

def _lowered_of(reply: dict, key: str) -> Lowered:
  e = decode_program(reply["program"], key)
  return Lowered(e["name"], e["src"], e["opts"], e["ops"], e["variables"], e["launch"], reply["lower_s"])

def _lower_request(request: dict) -> dict:
  """(In the child) a request's kernel, lowered with the heuristics' Opts: the program's entry and the CPU seconds."""
  ast, device = graph_from_data(request["ast"])[0], request["device"]
  renderer = Device[device].renderer
  if program_key(ast, device, renderer, opts_choice(None, renderer)) != request["key"]:
    raise RuntimeError("the program key differs in the child: a setting changed since it was forked")
  return _reply_of(request["key"], lower_program(ast, device, choose_opts(ast, device)))

def _reply_of(key: str, p: Lowered) -> dict:
  """(In the child) a lowered kernel as it goes to the parent: the program's entry and the CPU seconds (_lowered_of's)."""
  return {"program": program_entry(key, p.name, p.src, p.opts, p.ops, p.variables, p.launch), "lower_s": p.lower_s}

def _end_lowering_child() -> None:
  """This realize has sent the child all its kernels: it answers them and exits."""
  global _child
  if _child is not None: _child.close()
  _child = None

# queues kept at one worker since kernels were lowered as they were scheduled (schedule_lowering): compile_ahead lets go
_held: list[CompileQueue] = []

def _lower_as_made(ast: UOp, device: str) -> None:
  if ast.op in NOT_KERNELS or not _to_lower(ast, device): return
  if (q := _pool_queue(device)) is not None and q not in _held: q.lowering = True; _held.append(q)
  _lower_ahead(ast, device)

class schedule_lowering:
  """While a realize schedules what it runs, each new kernel is lowered as the scheduler makes it and its source goes to
  the compiler then: the C compiler works on the other core while Python schedules the rest, where it waited for the
  whole schedule before (a training step's ~250 kernels take about a second to schedule). Not under BEAM (it compiles
  its candidates in run order) nor DEBUG>=5 (which prints each kernel's uops as it runs)."""
  def __enter__(self) -> None:
    self.prev = schedule_module.kernel_made, schedule_module.template_elsewhere
    if BEAM < 1 and DEBUG < 5: schedule_module.kernel_made, schedule_module.template_elsewhere = _lower_as_made, _schedule_in_child
  def __exit__(self, *exc: Any) -> None: schedule_module.kernel_made, schedule_module.template_elsewhere = self.prev

def opts_choice(opts: list[Opt] | None, renderer: Any) -> str:
  """What decides a kernel's Opts, for the program cache's key: the Opts themselves, or what chooses them with what
  it depends on besides the AST and the renderer (the heuristics and BEAM split work for a number of cores)."""
  if opts is not None: return "opts " + json.dumps([[o.op.name, o.axis, o.amount] for o in opts])
  if NOOPT: return "noopt"
  return f"beam {BEAM.value} threads {cores(renderer)}" if BEAM >= 1 else f"heuristics threads {cores(renderer)} simd {renderer.simd_floats}"

def choose_opts(ast: UOp, device: str, progress: Progress | None = None) -> list[Opt]:
  """The Opts of NOOPT, BEAM or the heuristics, as the switches say."""
  renderer = Device[device].renderer
  if NOOPT: return []
  if BEAM >= 1: return beam_search(ast, device, BEAM.value, compile_kernel, progress)
  return heuristic_opts(ast, renderer)

def load_kernel(pkey: str, ast: UOp, device: str) -> CompiledKernel | None:
  """The kernel of the program cache's entry pkey (None when there is none): only the device compiler runs, and it
  finds the binary in its own cache."""
  st = time.perf_counter()
  if (e := read_program(pkey)) is None: return None
  dev = Device[device]
  prog = dev.runtime(e["name"], dev.compiler.compile(e["src"]))
  if DEBUG >= 3: print(ast, "\nopts:", e["opts"])
  if DEBUG >= 4: print(e["src"])
  if DEBUG >= 2: print(f"loaded {e['name']} from the program cache in {(time.perf_counter() - st) * 1e3:.2f} ms")
  return CompiledKernel(e["name"], pack_source(e["src"]), prog, e["ops"], e["variables"], e["opts"], e["launch"])

def compile_kernel(ast: UOp, device: str, opts: list[Opt]) -> CompiledKernel:
  """The kernel with these opts, compiled (KernelOptError if an opt doesn't apply)."""
  return lower_kernel(ast, device, opts, False, "caller (compile_kernel: BEAM's candidates, tests)")()

_queues: dict[str, CompileQueue] = {}

def compile_queue(device: str) -> CompileQueue | None:
  """The queue of sources for device's compiler on the compile pool (None: its compiler doesn't batch)."""
  if not Device[device].compiler.batches or _compiler_pool is None: return None
  if (queue := _queues.get(device)) is None or queue.pool is not _compiler_pool:
    queue = _queues[device] = CompileQueue(Device[device].compiler, _compiler_pool, _workers)
  return queue

@dataclass
class Lowered:
  """A kernel's program before its binary: what lowering makes (here or in the lowering child), and the program cache keeps."""
  name: str
  src: str
  opts: list[Opt]
  ops: int
  variables: list[UOp]
  launch: tuple[tuple[UOp | int, ...], tuple[int, ...]] | None
  lower_s: float
  rec: Any = trace._no_group  # VIZ: the kernel's record, for its compile time

def lower_program(ast: UOp, device: str, opts: list[Opt], chosen_by: str = "caller") -> Lowered:
  """The kernel lowered with these opts (KernelOptError if one doesn't apply)."""
  dev = Device[device]
  st = time.thread_time()  # CPU time: what lowering costs, however busy the machine is
  with trace.group("kernel", "", ast=ast, device=device, opts=list(opts), chosen_by=chosen_by) as rec:  # VIZ: the kernel's passes
    name, src, uops = to_program(ast, dev.renderer, opts)
  lower_s = time.thread_time() - st
  rec.set(name=name, src=src, uops=uops, lower_s=lower_s)
  if DEBUG >= 3: print(ast, "\nopts:", opts)
  if DEBUG >= 5:
    for i, u in enumerate(uops): print(f"{i:4d} {u.op.name:12s} {u.dtype!r:28s} {u.arg!r}")
  if DEBUG >= 4: print(src)
  variables = scalar_args(uops)
  launch = launch_dims(uops) if dev.renderer.has_local else None
  # per run: the ops of one slice (or work-item) times the slices (the core id's count) or the launch's items
  threads = variables[-1].arg if variables and variables[-1].op is Ops.CORE_ID else 1
  ops = count_ops(uops) * threads * (prod(d for d in (*launch[0], *launch[1]) if isinstance(d, int)) if launch is not None else 1)
  return Lowered(name, src, list(opts), ops, variables, launch, lower_s, rec)

def lower_kernel(ast: UOp, device: str, opts: list[Opt], on_pool: bool, chosen_by: str = "caller") -> Callable[[], CompiledKernel]:
  """Lower the kernel with these opts now (KernelOptError if one doesn't apply) and compile its source, on the compile
  pool if on_pool; the function returned waits for the binary and makes the kernel."""
  p = lower_program(ast, device, opts, chosen_by)
  binary = _compile_submitter(device)(p.name, p.src) if on_pool else None
  return lambda: _kernel(device, p, binary)

def _compile_submitter(device: str) -> Callable[[str, str], Future]:
  """A function (name, source) -> the future of (binary, compile seconds), on the compile pool: the device's batching
  queue if its compiler batches."""
  dev = Device[device]
  if (queue := compile_queue(device)) is not None: return queue.submit
  return lambda name, src: unwrap(_compiler_pool).submit(timed_compile, dev.compiler.compile, src)

def _kernel(device: str, p: Lowered, binary: Future | None) -> CompiledKernel:
  """The kernel of a lowered program, once its binary is built (compiled here when no future is given)."""
  dev = Device[device]
  lib, compile_s = timed_compile(dev.compiler.compile, p.src) if binary is None else binary.result()
  ck = CompiledKernel(p.name, pack_source(p.src), dev.runtime(p.name, lib), p.ops, p.variables, p.opts, p.launch, p.lower_s, compile_s)
  p.rec.set(compile_s=compile_s, ready=trace.clock())  # VIZ: the compile's bar ends when the run loop got the binary
  if DEBUG >= 2: print(f"compiled {p.name}: lowering {p.lower_s * 1e3:.1f} ms, compiling {compile_s * 1e3:.1f} ms (CPU)")
  return ck

def slowest_kernels() -> tuple[CompiledKernel, CompiledKernel, CompiledKernel] | None:
  """The kernels this process took longest to lower, to compile, and to do both (None if it built none: all came from
  the caches)."""
  built = [ck for ck in _kernel_cache.values() if ck.lower_s > 0]
  if not built: return None
  return (max(built, key=lambda ck: ck.lower_s), max(built, key=lambda ck: ck.compile_s),
          max(built, key=lambda ck: ck.lower_s + ck.compile_s))

def buffer_of(u: UOp) -> Buffer:
  """The runtime Buffer behind a BUFFER node (registry.buffers): memory lives as long as a graph names it."""
  if (b := registry.buffers.get(u)) is None: b = registry.buffers[u] = Buffer(u.arg.device, u.arg.size, u.dtype, u.arg.offset)
  return b

class JitError(RuntimeError): pass

class BufferCopy:
  """A copy between devices, run like a kernel: called with the device memory of (destination, source)."""
  ops = 0
  def __init__(self, nbytes: int, dst: str, src: str):
    self.nbytes, self.dst, self.src, self.name = nbytes, Device[dst].allocator, Device[src].allocator, f"copy {src} -> {dst}"
  def __call__(self, raw: list[Any], var_vals: dict[UOp, int] | None) -> None:
    data = memoryview(bytearray(self.nbytes))
    if self.nbytes: self.src.copyout(data, raw[1])
    self.dst.copyin(raw[0], data)

# schedule items that aren't kernels, and the runner each becomes (from the item's ast and its buffers)
NOT_KERNELS: dict[Ops, Callable[[UOp, list[Buffer]], Any]] = {
  Ops.COPY: lambda ast, bufs: BufferCopy(bufs[0].nbytes, bufs[0].device, bufs[1].device),
  Ops.ALLREDUCE: lambda ast, bufs: AllReduce(ast.arg[0], bufs[0].dtype, tuple(b.device for b in bufs), bufs[0].size)}

class ExecItem:
  """One step of a run: a kernel or a copy (its runner) with the buffers it binds, and their memory as the runner takes
  it. A new kind of step (an all-reduce) is a new runner: ExecPlan runs every kind the same way."""
  __slots__ = ("ast", "runner", "bufs", "raw", "addrs")
  def __init__(self, ast: UOp, runner: CompiledKernel | BufferCopy, bufs: list[Buffer]):
    self.ast, self.runner, self.bufs = ast, runner, bufs  # ast: the kernel's, or the COPY
    self.raw = [b._buf if b._buf is not None else b.ensure_allocated()._buf for b in bufs]  # (most are: no call)
    self.addrs: ctypes.Array | None = None  # raw's addresses, read by a native run loop (ExecPlan.native) once it has one
  def bind(self, j: int, mem: Any) -> None:
    """Buffer j's memory is now mem (a replay's input, rebound), for the native run loop too."""
    self.raw[j] = mem
    if self.addrs is not None: self.addrs[j] = mem.addr
  def rebind(self, j: int, buf: Buffer) -> None:
    self.bufs[j] = buf
    self.bind(j, buf.ensure_allocated()._buf)

def native_entry(ei: ExecItem) -> int | None:
  """The address of the item's entry point for a native run loop (threadpool.Steps): a CPU kernel's slice entry, or None
  for a runner Python must call (a copy, an all-reduce, a GPU kernel)."""
  return getattr(ei.runner.program, "slice_entry", None) if isinstance(ei.runner, CompiledKernel) and ei.runner.launch is None else None

def written(ast: UOp) -> tuple[int, ...]:
  """The positions among a kernel's buffers of those it stores to (its PARAMs' numbers). (Asked once per plan, by
  ExecPlan._uses: a memo by AST kept every kernel's graph alive.)"""
  return tuple(sorted({u.src[0].src[0].arg for u in ast.toposort if u.op is Ops.STORE and u.src[0].op is Ops.INDEX
                       and u.src[0].src[0].op is Ops.PARAM} or {0}))

DEFER = getenv("DEFER", 1)  # 0: an eager loop's kernels run before realize returns (as they do at THREADS=1)
# a plan with a kernel that does more float ops (~2 ms on a core) or binds more bytes (~1 ms of one core's memory
# bandwidth) runs on all cores before realize returns (a small transformer step's biggest: its MLP's matmuls, 34M ops)
DEFER_MAX_OPS, DEFER_MAX_BYTES = 1 << 26, 1 << 24
def _big(ei: ExecItem) -> bool: return ei.runner.ops > DEFER_MAX_OPS or sum(b.nbytes for b in ei.bufs) > DEFER_MAX_BYTES

LANES_MIN_OPS, LANES_MIN_BYTES = 1 << 21, 1 << 21  # a plan's ops or bytes bound from which its devices run side by side

class ExecPlan:
  """Kernels and copies ready to run, in order. An eager schedule runs one once; a TinyJit replays one on every call
  (with new memory rebound into its items). __call__ is the one run loop."""
  def __init__(self, items: list[ExecItem], print_at: int = 1):
    # a replay prints its kernels from DEBUG=2: at 1 a training loop would print every step's
    self.items, self.print_at = items, print_at
    self.ops, self.nbytes = sum(ei.runner.ops for ei in items), sum(b.nbytes for ei in items for b in ei.bufs)
    # items on several devices: a lane each, run side by side (engine/lanes.py); a device a buffer is on never changes
    # (a plan on one device, an eager step's, has one lane: its items aren't sorted into lanes, 250 of them each step)
    one = len({b.device for ei in items for b in ei.bufs}) <= 1
    self.lanes = Lanes([] if one else [tuple(dict.fromkeys(b.device for b in ei.bufs)) for ei in items])
    # ... when there is work enough: handing a lane to a thread costs ~50-100 us, more than a few tiny kernels take
    self.side_by_side = len(self.lanes) > 1 and (self.ops >= LANES_MIN_OPS or self.nbytes >= LANES_MIN_BYTES)
    # the plan as runs of CPU kernels, each one native call (threadpool.Steps), between the items Python runs; made on the
    # second quiet run: a plan run once (an eager realize's) would spend more on the tables than they save
    self.ran_quiet, self.native = False, None
    # run on the pool's runner thread, returning before the kernels are done (threadpool.Deferred): a kept plan's, when it
    # is one native run (PlannedRun.adopt)
    self.defer = False
    self._where: tuple[list[tuple[list, int]], list[int], list[int]] | None = None  # (_uses)
    self.variables: list[UOp] = []  # the Variables of the native runs' kernels, by their number in self.table
    self.table: ctypes.Array | None = None  # (made with the native runs)
  def __call__(self, var_vals: dict[UOp, int] | None) -> None:
    st, items = time.perf_counter(), self.items
    quiet = DEBUG < self.print_at and trace.current is None  # nothing to say per item: the counters are the plan's totals
    if self.side_by_side and LANES:  # each device's items on its own thread (a timeline and DEBUG lines as they end)
      self.lanes.run((lambda i: items[i].runner(items[i].raw, var_vals)) if quiet else (lambda i: self._run_one(i, var_vals)))
    elif quiet and not self.ran_quiet:
      self.ran_quiet = True
      for ei in items: ei.runner(ei.raw, var_vals)
    elif quiet:
      if self.native is None: self.native = self._native_runs()
      table, cores = self.table, lane_cores()
      for k, v in enumerate(self.variables): table[k] = int(unwrap(var_vals)[v])
      # deferred: the runner has the cores but the one this thread builds the next graph on (THREADS=2: the kernels on one
      # core, unsplit, while Python runs on the other; split on both they took turns with Python: 1.15x slower a step)
      if self.defer and DEFER and cores > 1: self.native[0].submit(table, cores - 1, self._uses, self)
      else:
        for part in self.native:
          if type(part) is Steps: part(table, cores)
          else: part.runner(part.raw, var_vals)
    else:
      for i in range(len(items)): self._run_one(i, var_vals)
    GlobalCounters.time_sum += time.perf_counter() - st
    GlobalCounters.kernel_count += len(self.items)
    GlobalCounters.global_ops += self.ops
    GlobalCounters.global_mem += self.nbytes
  def _native_runs(self) -> list[Steps | ExecItem]:
    """The items as runs of consecutive CPU kernels of one device, a native call each, and the items between them (copies:
    Python runs those). Each kernel's buffer addresses go in an array of its own (ExecItem.addrs: rebinding writes it), its
    Variables are numbered in self.variables, whose values each run writes in self.table once for all the kernels."""
    numbers: dict[UOp, int] = {}
    parts: list[Steps | ExecItem] = []
    run: list[ExecItem] = []
    def end_run() -> None:
      if not run: return
      steps = [(native_entry(ei), ei.addrs, [numbers.setdefault(v, len(numbers)) for v in ei.runner.user_vars], ei.runner.threads) for ei in run]
      parts.append(Steps(run[0].runner.program.pool, steps))
      run.clear()
    for ei in self.items:
      if native_entry(ei) is None:
        end_run()
        parts.append(ei)
        continue
      if run and ei.runner.program.pool != run[0].runner.program.pool: end_run()
      if ei.addrs is None: ei.addrs = array_type(ctypes.c_void_p, max(len(ei.raw), 1))(*[m.addr for m in ei.raw])
      run.append(ei)
    end_run()
    self.variables, self.table = list(numbers), array_type(ctypes.c_int64, max(len(numbers), 1))()
    return parts
  def _uses(self) -> tuple[dict[int, int], dict[int, int]]:
    """For a deferred run (threadpool.Deferred): by id of the memory its items bind, the index of the last item that
    writes it, and of the last that reads or writes it (a later item's index replaces an earlier one's)."""
    if self._where is None:  # (the items' memory lists are rebound in place: where to look is made once, ~100 -> ~20 us)
      self._where = ([(ei.raw, j) for ei in self.items for j in written(ei.ast)], [i for i, ei in enumerate(self.items) for _ in written(ei.ast)],
                     [i for i, ei in enumerate(self.items) for _ in ei.raw])
    at, wi, ti = self._where
    return dict(zip([id(raw[j]) for raw, j in at], wi)), dict(zip(map(id, itertools.chain.from_iterable(ei.raw for ei in self.items)), ti))
  def _run_one(self, i: int, var_vals: dict[UOp, int] | None) -> None:
    """Item i, timed: on VIZ's timeline and (from DEBUG=print_at) a line."""
    ei = self.items[i]
    t0 = time.perf_counter()
    ei.runner(ei.raw, var_vals)
    t = time.perf_counter() - t0
    nbytes = sum(b.nbytes for b in ei.bufs)  # the buffers it binds, as GlobalCounters.global_mem counts them
    if trace.current is not None:  # VIZ's timeline
      trace.current.launch(ei.bufs[0].device, ei.runner.name, t0, t, (ei.ast, ei.bufs[0].device), GlobalCounters.mem_used,
                           self.print_at > 1, ei.runner.ops, nbytes)
    if DEBUG < self.print_at: return
    print(f"*** {ei.bufs[0].device:6s} {GlobalCounters.kernel_count + i + 1:4d} {colored(f'{ei.runner.name:30s}', 'cyan')} "
          f"arg {len(ei.bufs):2d} tm {t * 1e6:9.2f}us {ei.runner.ops / max(t, 1e-9) * 1e-9:8.2f} GFLOPS" +
          (f" {nbytes / max(t, 1e-9) * 1e-9:8.2f} GB/s" + roofline.describe(ei.bufs[0].device, ei.runner.ops, nbytes, t) if DEBUG >= 2 else ""))

class Capture:
  """What TinyJit records while a function runs: every kernel and copy with the buffers it bound, and
  the tensors assigned (with the view they had before), so the replay can write them in place."""
  def __init__(self) -> None:
    self.items: list[ExecItem] = []
    self.nodes: dict[int, UOp] = {}  # the BUFFER node of each Buffer seen, by id
    self.var_vals: dict[UOp, int] = {}
    self.assigned: dict[Any, UOp] = {}
    self.templates: list[ScheduleTemplate] = []  # the schedules the function's realizes used (a replay needs none of them)
_captures: list[Capture] = []
def capturing() -> Capture | None: return _captures[-1] if _captures else None
# TinyJit calls running (its first, plain call and its capture): work that the capture must do as kernels (an index
# check) is done as kernels in the first call too, so both calls build the same graph and the capture reuses the first
# call's schedule (a training step's ~250 kernels scheduled once, not twice)
jit_calls: list[int] = [0]
def in_jit_call() -> bool: return jit_calls[0] > 0
# the schedules the running TinyJit first call used (realize_graphs adds each): forgotten with the capture's once it has
# captured (a replay reads neither; the first call's was kept when the capture's graph differed: a 736-kernel prompt pass)
first_call_templates: list[list[ScheduleTemplate]] = []

def run_schedule(schedule: list[ScheduleItem], var_vals: dict[UOp, int] | None = None, keep: set[UOp] | None = None) -> None:
  """Compile (or load) the schedule's kernels, then run them in order. With `keep` (the buffers that outlive the
  schedule), the buffers the schedule creates share memory where lifetimes don't overlap (engine/memory.py): a kept
  one may take the memory of one that died before it was written (an MLP's output, that of its second-last layer).
  A schedule filled in from a template (create_schedule's) has its memory plan made once per template and set of
  buffers created and kept (schedule.ScheduleTemplate.plans): a plan is a function of those alone. So is the run: the
  next schedule of that plan reuses the first's ExecPlan with its buffers rebound (PlannedRun)."""
  # (when every buffer the schedule creates outlives it, none can share: each gets its own memory below)
  if keep is not None and not all(si.bufs[0] in keep for si in schedule):
    if isinstance(schedule, Schedule) and _as_filled_in(schedule):
      run, created = _planned_run(schedule, keep)
      # (a run another thread is in, a DataLoader worker's realize, isn't shared: its held memory and items are the run's)
      if _reusable() and run.lock.acquire(blocking=False):
        try:
          if run.plan is not None: return run(schedule.numbered, var_vals)
          planned = run, _place_planned(run, created, schedule.numbered)
          return _run_items(schedule, var_vals, planned)
        finally: run.lock.release()
      _place_planned(run, created, schedule.numbered)
    else:
      internal = {si.bufs[0]: Buffer(si.bufs[0].arg.device, si.bufs[0].arg.size, si.bufs[0].dtype) for si in schedule
                  if si.bufs[0] not in registry.buffers}
      for u, b in planned_buffers([si.bufs for si in schedule], internal, keep).items(): registry.buffers[u] = b
  _run_items(schedule, var_vals, None)

def _run_items(schedule: list[ScheduleItem], var_vals: dict[UOp, int] | None, planned: tuple[PlannedRun, list[Buffer]] | None) -> None:
  """Make the schedule's items (compiling what isn't) and run them; a planned run (with the slots' memory) may keep them."""
  progress: Progress | None = None
  items: list[ExecItem] = []
  placed = registry.buffers.by_id.get
  try:
    for i, si in enumerate(schedule):
      bufs = [e.value if (e := placed(id(b))) is not None else buffer_of(b) for b in si.bufs]  # (buffer_of inlined)
      if (make := NOT_KERNELS.get(si.ast.op)) is not None: runner: CompiledKernel | BufferCopy | AllReduce = make(si.ast, bufs)
      elif (ck := _kernel_cache.get((si.ast, bufs[0].device))) is not None: runner = ck
      else:  # to compile (or load): a bar shows if this schedule's take long
        if progress is None:
          progress = Progress(_uncompiled(schedule[i:]), "compiling kernels")
          compile_ahead(schedule[i:], progress)
        runner = get_kernel(si.ast, bufs[0].device, progress=progress)
        progress.update(1, runner.name)
      items.append(ExecItem(si.ast, runner, bufs))
  finally:
    if progress is not None: progress.close()
    _end_lowering_child()  # (a child forked to schedule this realize's graph, when nothing was left to lower)
    _keys.clear()
  if _captures:
    _captures[-1].items += items
    _captures[-1].nodes.update((id(b), u) for si, ei in zip(schedule, items) for b, u in zip(ei.bufs, si.bufs))
    _captures[-1].var_vals.update(var_vals or {})
  plan = ExecPlan(items)
  if planned is not None and not plan.side_by_side:
    # (a plan run once, a one-off realize's, holds nothing: from its second run on, it is likely a loop's)
    if planned[0].seen: planned[0].adopt(plan, schedule.template, planned[1])
    planned[0].seen = True
  plan(var_vals)

def _fresh_run(template: ScheduleTemplate) -> PlannedRun | None:
  """The template's planned run for realize's set, locked by this thread, when its plan can run realize's next schedule
  of the template (a loop's step from its third run): PlannedRun.run_fresh runs it, then the caller releases the lock."""
  if not _reusable() or (run := template.plans.get(template.fresh_key)) is None or not run.lock.acquire(blocking=False): return None
  if run.plan is None: run.lock.release(); return None  # (not adopted yet, or released: no longer among _holding's)
  return run

def _reusable() -> bool:
  """May a planned run's ExecPlan run this schedule: nothing watches each item (DEBUG lines, VIZ's timeline) nor records
  it (a TinyJit capture keeps its items and their buffers)?"""
  return DEBUG < 1 and trace.current is None and not _captures

def _as_filled_in(schedule: Schedule) -> bool:
  """Is the schedule still the one its template was filled in with (each item its AST over those buffers)? A list can
  be changed after create_schedule: its plan would then be another's."""
  # (items are frozen: the same objects in the same places are the same schedule, checked at C speed, where comparing
  # each item's buffers with the template's numbers built a tuple per item, 250 a training step)
  return len(schedule) == len(schedule.made) and all(map(operator.is_, schedule, schedule.made))

# planned runs holding memory between their runs, most recently run last: a few, so graphs of many structures (a model
# run at many shapes) don't each keep their scratch memory
_holding: dict[int, PlannedRun] = {}
HOLDING_MAX = 4

class PlannedRun:
  """A template's memory plan for one set of buffers created and kept (slots by buffer number), and once a quiet run
  used it, that run's ExecPlan. The next schedule filled in from the template with the same sets runs the same kernels
  over the same layout, so it reuses the plan: the slots only its internal buffers use keep their memory between runs
  (the kernels find them where they were), the buffers read from outside those (inputs, kept buffers, slots a kept one
  shares) are rebound (ExecItem.bind, which the native run loop reads), and no Buffer, ExecItem or plan is made for the
  ~250 kernels of a training step. The ExecPlan's items keep the memory of the last run's outside buffers until the next.
  The plan is kept from the second quiet run on (a one-off realize holds no memory) and runs natively from then."""
  def __init__(self, slot_of: dict[int, int], slots: list[tuple[str, int]], created: tuple[int, ...], kept: frozenset[int]):
    self.slot_of, self.slots, self.created, self.kept = slot_of, slots, created, kept
    self.plan: ExecPlan | None = None
    self.seen = False  # has a quiet run used it
    self.lock = threading.Lock()  # held by the thread running it
    self.held: list[Buffer | None] = []         # a slot's memory kept between runs (None: a kept buffer's slot, fresh each run)
    self.placed: list[int] = []                 # numbers of the kept buffers created, and of the internal ones in their
    self.unheld: list[tuple[int, int]] = []     # slots, each with that kept buffer's number (adopt)
    # the buffer numbers to rebind, each with where it is bound: the items' memory lists and native address arrays
    self.outside: list[tuple[int, list[tuple[list, int]], list[tuple[ctypes.Array, int]]]] = []
  def adopt(self, plan: ExecPlan, template: ScheduleTemplate, memory: list[Buffer]) -> None:
    """Keep plan, which runs the schedule this run placed in `memory` (its slots' allocations), for the next ones."""
    fresh = {self.slot_of[n] for n in self.created if n in self.kept}
    self.held = [None if s in fresh else m for s, m in enumerate(memory)]
    inside = {n for n in self.created if self.held[self.slot_of[n]] is not None}
    # the created buffers a run places: each kept one gets a Buffer of its own, fresh memory, and an internal one in its
    # slot that memory (those in held slots are placed already); a run loops over these alone. (A slot not held is a kept
    # buffer's, of its size: plan_slots. A uint8 Buffer of the slot and a view of it for the kept one were two a buffer.)
    created = dict.fromkeys(self.created)
    self.placed = [n for n in created if n in self.kept]
    kept_in = {self.slot_of[n]: n for n in self.placed}
    self.unheld = [(n, kept_in[self.slot_of[n]]) for n in created if n not in self.kept and self.held[self.slot_of[n]] is None]
    # its native runs now, not on its second run: it will run again (their address arrays are what rebinding writes)
    plan.native, plan.ran_quiet = plan._native_runs(), True
    # deferred, a plan's kernels run on the cores Python doesn't use (one of two): it pays where the step's Python is what
    # takes the time, many small kernels (a small transformer's training step: 0.96 -> 1.13x torch at 2 threads), and
    # halves a big kernel's speed (bench/all.py matmul 2048 on the runner's one core: 40 -> 77 ms)
    plan.defer = len(plan.native) == 1 and type(plan.native[0]) is Steps and not any(map(_big, plan.items))
    where: dict[int, tuple[list[tuple[list, int]], list[tuple[ctypes.Array, int]]]] = {}
    for ei, (_, numbers) in zip(plan.items, template.items):
      for j, n in enumerate(numbers):
        if n in inside: continue
        raws, addrs = where.setdefault(n, ([], []))
        raws.append((ei.raw, j))
        if ei.addrs is not None: addrs.append((ei.addrs, j))
    self.outside, self.plan = [(n, raws, addrs) for n, (raws, addrs) in where.items()], plan
    # (the items' Buffers were this run's: the plan keeps memory, not them)
    for ei in plan.items: ei.bufs = []
    _holding.pop(id(self), None)
    _holding[id(self)] = self
    while len(_holding) > HOLDING_MAX:
      # (one another thread is running keeps what it holds)
      if (old := _holding.pop(next(iter(_holding)))).lock.acquire(blocking=False):
        try: old.release()
        finally: old.lock.release()
  def release(self) -> None: self.plan, self.held, self.outside, self.placed, self.unheld = None, [], [], [], []
  def __call__(self, numbered: list[UOp | None], var_vals: dict[UOp, int] | None) -> None:
    """Run the plan over the buffers by number (those read from outside it and the kept ones; an internal one may be
    None): kept ones get fresh memory in the plan's layout."""
    wait_all()  # (its last run may still be running: the rebinding below writes the address arrays it reads)
    _holding.pop(id(self), None)  # the most recently run last
    _holding[id(self)] = self
    buffers = registry.buffers
    mem: dict[int, Any] = {}
    for n in self.placed:
      u = numbered[n]
      b = buffers[u] = Buffer(u.arg.device, u.arg.size, u.dtype)
      mem[n] = b.ensure_allocated()._buf
    for n, k in self.unheld: mem[n] = mem[k]
    placed = buffers.by_id.get
    for n, raws, addrs in self.outside:  # (ExecItem.bind inlined: ~600 positions a training step)
      if (m := mem.get(n)) is None:
        b = e.value if (e := placed(id(u := numbered[n]))) is not None else buffer_of(u)  # (buffer_of inlined)
        m = b._buf if b._buf is not None else b.ensure_allocated()._buf
      if raws[0][0][raws[0][1]] is m: continue  # (a parameter, the optimizer's state: the same memory every step)
      for raw, j in raws: raw[j] = m
      if addrs:
        addr = m.addr
        for arr, j in addrs: arr[j] = addr
    self.plan(var_vals)
  def run_fresh(self, template: ScheduleTemplate, inputs: list[UOp], targets: list[UOp], var_vals: dict[UOp, int] | None) -> dict[UOp, UOp]:
    """Run the template over these inputs as realize_graphs' schedule of it would run (its plan's set: every other buffer
    created, the targets' kept), without filling the schedule in: only a buffer that outlives the run gets a BUFFER node;
    an internal one is its slot's memory, and no ScheduleItem is made (a training step's 250 of each, and their deaths,
    were a third of its realize's Python). What each target becomes."""
    numbered: list[UOp | None] = [*inputs, *[None] * len(template.outputs)]
    outputs, n_inputs = template.outputs, template.n_inputs
    for n in self.kept:
      if n >= n_inputs: numbered[n] = new_buffer(*outputs[n - n_inputs])
    self(numbered, var_vals)
    return becomes_of(template, numbered, targets)

def _planned_run(schedule: Schedule, keep: set[UOp]) -> tuple[PlannedRun, tuple[int, ...]]:
  """The template's planned run for the numbers of the buffers schedule creates and keeps (made once: planning a training
  step's 250 buffers took 3 ms), and the numbers of those it creates."""
  template, numbered = schedule.template, schedule.numbered
  number = {u: i for i, u in enumerate(numbered)}
  created = tuple(number[si.bufs[0]] for si in schedule if si.bufs[0] not in registry.buffers)
  kept = frozenset(number[u] for u in keep if u in number)
  if (run := template.plans.get(key := (created, kept))) is None:
    if len(template.plans) >= 8: template.plans.clear()  # (a template sees one or two sets in practice)
    sizes = {n: (numbered[n].arg.device, numbered[n].arg.size * numbered[n].dtype.itemsize) for n in created}
    run = template.plans[key] = PlannedRun(*plan_slots([numbers for _, numbers in template.items], sizes, kept), created, kept)
  return run, created

def _place_planned(run: PlannedRun, created: tuple[int, ...], numbered: list[UOp]) -> list[Buffer]:
  """planned_buffers for a schedule filled in from a template (its buffers by number in `numbered`), laid out as the
  planned run says; the slots' allocations."""
  slot_of, slots = run.slot_of, run.slots
  if DEBUG >= 2 and created:
    before = sum(numbered[n].arg.size * numbered[n].dtype.itemsize for n in created)
    print(f"memory plan: {len(created)} buffers in {len(slots)} allocations, {sum(nb for _, nb in slots) / 1e6:.2f} MB instead of {before / 1e6:.2f} MB")
  memory = [Buffer(device, nbytes, dtypes.uint8) for device, nbytes in slots]
  for n in created:
    u = numbered[n]
    registry.buffers[u] = Buffer(u.arg.device, u.arg.size, u.dtype, base=memory[slot_of[n]])
  return memory

def _uncompiled(items: list[ScheduleItem]) -> int:
  """How many distinct kernels of items this process hasn't compiled yet."""
  return len({k for si in items if si.ast.op not in NOT_KERNELS and (k := (si.ast, si.bufs[0].arg.device)) not in _kernel_cache})

# ***** lazy graphs to buffer views *****
# A realized node's buffer view is remembered (registry.realized): lazy graphs built before the realize read that
# buffer instead of recomputing. A graph being realized gets its own buffer even if an identical node was realized
# before (only nodes strictly below it use memos), so no two tensors share memory by accident.
def realized_view(node: UOp) -> UOp | None: return r() if (r := registry.realized.get(node)) is not None else None

def runnable(roots: UOp) -> tuple[UOp, dict[UOp, int], dict[UOp, UOp]]:
  """The graph with realized nodes (below the roots) read from their buffers and bound Variables
  unbound (kernels take the variable, the run gets the value), those values, and the slices given variable offsets
  (new node -> the slice as it was). Variables are found as values and in symbolic shapes; a slice of a buffer at
  nonzero int offsets gets variables for them. One variable can't have two values at once."""
  swap: dict[UOp, UOp] = {}
  sliced: dict[UOp, UOp] = {}
  vals: dict[UOp, int] = {}
  in_shapes: dict[UOp, UOp] = {}
  def value_of(b: UOp) -> None:
    if vals.setdefault(b.src[0], b.src[1].arg) != b.src[1].arg:
      raise ValueError(f"variable {b.src[0].arg[0]!r} is bound to both {vals[b.src[0]]} and {b.src[1].arg} in one graph")
  offsets: dict[tuple[int, int, int], list[int]] = {}  # the offsets given variables, by where they slice
  memo = registry.realized.by_id.get  # (realized_view inlined: no Python call a node of a training step's thousands)
  BIND, SHRINK, sized = Ops.BIND, Ops.SHRINK, GroupOp.Sized  # (bound once: the loop runs for every node of the graph)
  for n in roots.toposort:
    if (op := n.op) is BIND:
      value_of(n)
      swap[n] = n.src[0]
    elif (e := memo(id(n))) is not None and (v := e.value()) is not None and n not in roots.src: swap[n] = v
    elif op in sized and n.sym_args:
      for b in (b for x in n.sym_args for b in x.toposort if b.op is Ops.BIND): value_of(b); in_shapes[b] = b.src[0]
    elif op is SHRINK and is_view_of_buffer(n.src[0]) and n not in roots.src and any(b for b, _ in n.arg):
      # a slice of stored data at Python-int offsets (a batch cut from a dataset: data[i:i+T]) is read at variable ones,
      # so the next batch's offsets reuse the kernel and the schedule instead of compiling new ones
      arg = []
      for axis, ((b, e), size) in enumerate(zip(n.arg, n.src[0].shape)):
        if b == 0: arg.append((b, e)); continue
        # named by where it slices (axis, size, length) and which of the offsets such slices have here: each layer's
        # slice of its own weight at the same place (a quantized block's second scale) is one variable with one value,
        # and the layers' kernels one kernel. Numbered in the graph's order, each was a variable of its own, and 30
        # layers compiled 30 copies of each kernel (SmolLM2's first decode: 406 kernels, 36 s)
        held = offsets.setdefault((axis, size, e - b), [])
        if b not in held: held.append(b)
        var = UOp.variable(f"offset{axis}_{size}_{e - b}_{held.index(b)}", 0, size - (e - b))
        vals[var] = b
        arg.append((var, var + (e - b)))
      swap[n] = n.replace(arg=tuple(arg))
      sliced[swap[n]] = n
  if in_shapes: return substitute_sym(roots, swap, lambda x: x.substitute(in_shapes)), vals, sliced
  return (roots.substitute(swap) if swap else roots), vals, sliced

def runnable_structure(roots: UOp) -> tuple[tuple, list[UOp]] | None:
  """schedule.graph_structure of roots, found in the walk that checks what runnable would change, when it changes
  nothing (None otherwise: no node below the roots realized, no Variable, no slice of stored data at int offsets). A
  training step's realize is that case: runnable's walk of its 2,000 nodes and graph_structure's were two. The check
  (the same as runnable's) is graph_structure's stop hook, called on the ops it is about and on realized nodes."""
  return graph_structure(roots, _change_check(roots), _WATCHED, registry.realized.by_id, _static)

def _change_check(roots: UOp) -> Callable[[UOp], bool]:
  """runnable_structure's check of a node below roots: would runnable change it?"""
  top = set(roots.src)
  realized = registry.realized.by_id
  memo = realized.get
  BIND, SHRINK, PAD, IOTA = Ops.BIND, Ops.SHRINK, Ops.PAD, Ops.IOTA
  def changed(u: UOp) -> bool:  # what runnable would swap, unbind or give variable offsets
    if (op := u.op) in _SIZED_INT:  # (most of the nodes checked: the int check first, without sym_args, a cached
      # property that would give each of a training step's ~700 reshapes and expands a __dict__)
      # (a static shape's product is an int, one C call; a generator over the sizes was a third of this check)
      if type(math.prod(u.arg) if op is not IOTA else u.arg) is not int: return True
      if len(_static) >= 4096: _static.clear()  # (distinct shapes: a model's are a few hundred)
      _static.add((op, u.arg))  # the next graph's nodes of this shape are checked only if realized
      return id(u) in realized and (e := memo(id(u))).value() is not None and u not in top
    if op is BIND or ((e := memo(id(u))) is not None and e.value() is not None and u not in top): return True
    if op is SHRINK or op is PAD:
      if u.sym_args: return True
      if op is SHRINK and is_view_of_buffer(u.src[0]) and u not in top and any(b for b, _ in u.arg): return True
    return False
  return changed
_SIZED_INT = frozenset(GroupOp.Sized - {Ops.SHRINK, Ops.PAD})  # sized ops whose arg is the sizes themselves
# (op, arg) of the sized-int ops found static: the check of their sizes is a function of the two, made once for each (it
# was a Python call for each of a training step's ~570 reshapes and expands, a third of runnable_structure)
_static: set[tuple[Ops, Any]] = set()
_WATCHED = frozenset({Ops.BIND, *GroupOp.Sized})

# ***** a loop's graphs recognised by their compiled structure (schedule/match.py) *****
# A template whose kept plan has run MATCH_AFTER times gets a matcher of the graph realize last ran it for; the next graphs
# are tried against the matchers first, most recently matched first: one that matches is that template's, with its
# buffers found, and no generic walk nor structure key is made. (Building one compiles ~60 us of Python a node, once:
# a training step's 1,500 nodes take ~85 ms, which its ~1 ms a step less pays back after about a hundred steps: only a
# loop gets one, from its sixth step or so, and not for a graph so big that its compile would stall the loop long.)
MATCH_AFTER, MATCHERS_MAX, MATCH_NODES_MAX = 4, 4, 8000
_matchers: list[tuple[StructureMatcher, ScheduleTemplate]] = []  # most recently matched first
_matchers_lock = threading.Lock()
_fresh_runs: dict[int, int] = {}  # id(template) -> its kept plan's runs by realize_graphs, until it has a matcher (-1: had one)

def _matched(roots: UOp) -> tuple[ScheduleTemplate, list[UOp]] | None:
  """The template and the buffers (in graph_structure's order) of the first matcher that accepts roots, when runnable
  would leave the graph as it is (None otherwise: the generic walk decides)."""
  for entry in tuple(_matchers):
    m, template = entry
    if (found := m(roots)) is None: continue
    if entry is not _matchers[0]:
      with _matchers_lock:  # (another thread's realize may reorder them meanwhile)
        if entry in _matchers: _matchers.remove(entry); _matchers.insert(0, entry)
    # runnable_structure's check: structure equal, the graph holds no Variable and no slice at int offsets (the recorded
    # one held none); what can differ is a node realized since (by id: any such node, alive or not, leaves it to the walk)
    realized = registry.realized.by_id
    if realized and not (realized.keys().isdisjoint(map(id, found.nodes)) and realized.keys().isdisjoint(m.inside_ids)): return None
    if found.derivs:  # and the derivative sources a WITH_DERIVATIVE carries, as graph_structure's walk checks them
      changed, named, seen = _change_check(roots), found.nodes, set()
      extra = [s for d in found.derivs for s in d.src[1:]]
      while extra:
        if (u := extra.pop()) in named or u in seen: continue
        seen.add(u)
        if (u.op in _WATCHED or id(u) in realized) and changed(u): return None
        extra += u.src
    return template, found.bufs
  return None

def _note_fresh_run(template: ScheduleTemplate, roots: UOp) -> None:
  """A realize ran template's kept plan for the graph roots (of the template's whole structure): from its MATCH_AFTER-th
  run, roots' structure is compiled into a matcher (once a template: one evicted isn't compiled again)."""
  if (n := _fresh_runs.get(key := id(template), 0)) < 0: return
  if n + 1 < MATCH_AFTER:
    if len(_fresh_runs) >= 4096:  # (counts of templates run a few times each: forgotten, not piled up)
      for k in [k for k, v in _fresh_runs.items() if v >= 0]: del _fresh_runs[k]
    _fresh_runs[key] = n + 1
    return
  _fresh_runs[key] = -1
  if len(roots.toposort) > MATCH_NODES_MAX: return
  # (a template that dies frees its key: the note goes with it)
  weakref.finalize(template, _fresh_runs.pop, key, None)
  matcher = StructureMatcher(roots)
  with _matchers_lock:
    _matchers.insert(0, (matcher, template))
    del _matchers[MATCHERS_MAX:]

def bind_shapes(u: UOp, var_vals: dict[UOp, int]) -> UOp:
  """u with the Variables of its shapes bound to these values again (a realized symbolic tensor's view)."""
  binds = {v: v.bind(x) for v, x in var_vals.items()}
  return substitute_sym(u, {}, lambda x: x.substitute(binds))

def realize_graphs(graphs: list[UOp], keep_source: list[bool]) -> list[UOp]:
  """Run everything these lazy graphs need and return each as a view of device memory (the front end's realize).
  A computed graph whose keep_source is set stays reachable from its view (registry.sources), for backward()."""
  if any(g.opmask & MULTI_MASK for g in graphs): return _realize_sharded(graphs, keep_source)
  roots = UOp(Ops.SINK, dtypes.void, tuple(graphs))
  bound_graphs = roots.src
  # a graph a matcher knows (a loop's step) is its template's; one runnable leaves as it is (a training step's) is
  # scheduled with the structure found while checking that
  structure: tuple[tuple, list[UOp]] | None = None
  if (matched := _matched(roots) if _matchers and _reusable() else None) is not None: var_vals, sliced = {}, {}
  elif (structure := runnable_structure(roots)) is not None: var_vals, sliced = {}, {}
  else: roots, var_vals, sliced = runnable(roots)
  out, todo = list(roots.src), []
  for i, u in enumerate(roots.src):
    if not is_view_of_buffer(u): todo.append(i)
    # a view runs no kernel: its slices keep their int offsets (a variable one, bound, is no view a later kernel renders)
    elif var_vals: out[i] = bind_shapes(u.substitute(sliced) if sliced else u, var_vals)
  if not todo: return out
  targets = [out[i] for i in todo]
  # (the structure found is of the SINK of all the graphs: of the targets' only when every graph is one)
  with trace.group("schedule", "schedule") as rec, schedule_lowering():
    # (a matched graph is all targets: its structure is that of a graph that was)
    template, inputs = matched if matched is not None else schedule_template(targets, structure if len(todo) == len(out) else None)
    # a template whose planned run for realize's set has its plan (a loop's step, from its third run) runs it as it is
    if (fresh := _fresh_run(template)) is None: schedule, becomes = fill_in(template, inputs, targets)
  if fresh is not None:
    try: becomes = fresh.run_fresh(template, inputs, targets, var_vals)
    finally: fresh.lock.release()
    if matched is None and structure is not None and len(todo) == len(out): _note_fresh_run(template, roots)
  else:
    if (capture := capturing()) is not None: capture.templates.append(template)
    elif first_call_templates: first_call_templates[-1].append(template)
    rec.set(items=schedule)  # VIZ: which kernels and buffers this realize made
    run_schedule(schedule, var_vals, keep={u for v in becomes.values() for u in v.toposort if u.op is Ops.BUFFER})
  for k, v in becomes.items():
    if is_view_of_buffer(v): registry.realized[k] = weakref.ref(v)
  graph_of = dict(zip(roots.src, bound_graphs)) if var_vals else {}
  notes = bool(_captures or registry.jit_replays)  # (assigned_to's readers: none, no note)
  for i in todo:
    old = out[i]
    # a symbolic shape shows its bound value: the view takes the variables' values back
    out[i] = view = bind_shapes(becomes[old], var_vals) if var_vals else becomes[old]
    # (the source keeps its Variables bound: gradients must run with this run's values)
    if old.op is not Ops.ASSIGN and keep_source[i] and is_view_of_buffer(view) and view is not old:
      registry.sources[view] = graph_of[old] if var_vals else old
    # an assign over a whole buffer leaves a forwarding note: a TinyJit replay reads the new memory
    if notes and old.op is Ops.ASSIGN and (was := old.src[0]).base.op is Ops.BUFFER and was.size == was.base.arg.size and not was.base.arg.offset:
      registry.assigned_to[was.base] = view.base
  return out

def is_realized(u: UOp) -> bool:
  """A view of device memory: of one buffer, or a sharded tensor whose every part is one."""
  return is_view_of_buffer(u) or (u.op is Ops.MULTI and all(is_view_of_buffer(p) for p in u.src))

def _realize_sharded(graphs: list[UOp], keep_source: list[bool]) -> list[UOp]:
  """Graphs over sharded tensors: nodes realized before are read from their memory, the sharded ops are written per device
  (schedule/multi.py), and every device's part is realized as a graph of its own, all in one schedule. A sharded result
  is the MULTI of its parts' views; the logical node remembers it (registry.realized), as a one-device one does."""
  swap = {n: v for g in graphs for n in g.toposort if n not in graphs and (v := realized_view(n)) is not None}
  logical = [g.substitute(swap) for g in graphs] if swap else graphs
  lowered = lower_graphs(logical)
  flat, keep = [], []
  for low, k in zip(lowered, keep_source):
    parts = low.src if low.op is Ops.MULTI else (low,)
    flat += parts
    keep += [False] * len(parts)  # the logical graph is the source backward() sees through, not the per-device ones
  views = iter(realize_graphs(flat, keep))
  out = []
  for g, low, k in zip(graphs, lowered, keep_source):
    view = low.replace(src=tuple(next(views) for _ in low.src)) if low.op is Ops.MULTI else next(views)
    # (a graph lowered to memory that was there already, a replicated tensor gathered, ran nothing: nothing to note)
    if is_realized(view) and not is_realized(low) and view is not g:
      registry.realized[g] = weakref.ref(view)
      if k and g.op is not Ops.ASSIGN: registry.sources[view] = g
    out.append(view)
  return out
