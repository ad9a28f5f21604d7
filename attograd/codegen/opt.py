"""Kernel optimizations as explicit actions (DESIGN §3.4). An Opt names what to do to which axis,
axes named by role and index (global 0, global 1, ...); a kernel's program is a pure function of
its AST and its list of Opts. Heuristics (and later a search) only choose Opts."""
from __future__ import annotations
import os
from dataclasses import dataclass
from enum import Enum, auto
from attograd.helpers import ContextVar, prod
from attograd.uop.ops import UOp, Ops
from attograd.uop.patterns import graph_rewrite
from attograd.uop.symbolic import symbolic

class OptOps(Enum):
  THREAD = auto()   # split a global axis across CPU cores: each core runs one contiguous slice
  LOCAL = auto()    # GPU: split a global axis into threads of one work-group (codegen/gpudims.py)
  GROUP = auto()    # GPU: split a reduce axis across a work-group, combined through local memory

@dataclass(frozen=True)
class Opt:
  op: OptOps
  axis: int         # index among the kernel's global axes
  amount: int

class KernelOptError(ValueError): pass

THREADS = ContextVar("THREADS", os.cpu_count() or 1)
CORE_ID = "core_id"

def global_ranges(ast: UOp) -> list[UOp]:
  return sorted((u for u in ast.toposort if u.op is Ops.RANGE and u.arg[1] == "global"), key=lambda r: r.arg)

def apply_opts(ast: UOp, opts: list[Opt]) -> UOp:
  for opt in opts:
    if opt.op is OptOps.THREAD: ast = apply_thread(ast, opt)
    elif opt.op in (OptOps.LOCAL, OptOps.GROUP):
      from attograd.codegen.gpudims import apply_gpu_opt  # it builds on this module: imported when used
      ast = apply_gpu_opt(ast, opt)
  return ast

def apply_thread(ast: UOp, opt: Opt) -> UOp:
  """Global axis `axis` of size S becomes core_id*(S/n) + r with r over S/n: core_id is a kernel
  argument from 0 to n-1, and the runtime calls the kernel once per core, in parallel."""
  ranges = global_ranges(ast)
  if not 0 <= opt.axis < len(ranges): raise KernelOptError(f"{opt}: the kernel has {len(ranges)} global axes")
  if any(u.op is Ops.DEFINE_VAR and u.arg[0] == CORE_ID for u in ast.toposort): raise KernelOptError(f"{opt}: already threaded")
  r = ranges[opt.axis]
  size = r.src[0].arg if r.src[0].op is Ops.CONST else None
  if size is None or opt.amount < 2 or size % opt.amount: raise KernelOptError(f"{opt}: axis size {size} doesn't split in {opt.amount}")
  chunk = size // opt.amount
  inner = UOp(Ops.RANGE, r.dtype, (UOp.const(r.dtype, chunk),), r.arg)
  core = UOp(Ops.DEFINE_VAR, r.dtype, (), (CORE_ID, 0, opt.amount - 1))
  # the loop's END now closes the smaller range; every use of the old index gets the offset
  ends = {u: UOp(Ops.END, u.dtype, (u.src[0], inner)) for u in ast.toposort if u.op is Ops.END and u.src[1] is r}
  return graph_rewrite(ast.substitute(ends).substitute({r: core * chunk + inner}), symbolic)

def hand_coded_opts(ast: UOp, threads: int) -> list[Opt]:
  """Thread big kernels over the first global axis that splits evenly across the cores."""
  if threads < 2: return []
  work = prod(u.src[0].arg for u in ast.toposort if u.op is Ops.RANGE and u.src[0].op is Ops.CONST)
  if work < 1 << 16: return []  # a launch on another core costs more than a tiny kernel
  for axis, r in enumerate(global_ranges(ast)):
    if r.src[0].op is Ops.CONST and r.src[0].arg % threads == 0 and r.src[0].arg >= threads: return [Opt(OptOps.THREAD, axis, threads)]
  return []
