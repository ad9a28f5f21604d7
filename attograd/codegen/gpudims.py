"""Thread ids for GPU targets (DESIGN §3.5). The two Opts that shape work-groups (LOCAL and GROUP) are applied in
codegen/opt.py with the other Opts, and chosen in codegen/heuristic.py.

A GPU runs a kernel as a grid of work-groups, each a block of threads that share fast local memory
and can wait for each other at a barrier. Here that is explicit in the IR:

- SPECIAL(count) is a thread id valued 0..count-1. arg "gidx<d>" is the work-group's id in launch
  dimension d (OpenCL get_group_id(d), CUDA blockIdx, WGSL workgroup_id); "lidx<d>" is the thread's
  id within its work-group (get_local_id(d), threadIdx, local_invocation_id). Dimension 0 is the one
  whose neighbouring ids are neighbouring threads, so it takes the innermost axis (contiguous memory).
- On a GPU target (a renderer with `global_max`), add_gpudims turns every global RANGE into gidx
  ids and every local RANGE into lidx ids, so those loops disappear: the launch runs one thread per
  iteration. Reduce loops stay loops inside each thread.
- LOCAL(i, n) splits global axis i into n threads of one work-group times size/n work-groups.
- GROUP(i, n) splits reduce axis i across n threads of a work-group: each thread reduces
  every n-th element into a register, writes its partial result to local memory (DEFINE_LOCAL),
  waits at a BARRIER, then reads the n partials back and finishes the reduction.

Both Opts are ordinary loop rewrites, so the graph they build also means the right thing as plain
loops: a local axis is a loop like any other until add_gpudims makes it a thread id. A store that
doesn't depend on some local axis would then be done by every thread of that axis; add_gpudims
gates it to thread 0 (after GROUP every thread of the group holds the finished value).

The launch size comes from the SPECIALs of the linear program (launch_dims): work-groups per
dimension (which may be symbolic) and threads per work-group."""
from __future__ import annotations
from attograd.dtype import dtypes
from attograd.helpers import prod
from attograd.uop.ops import AxisKind, UOp, Ops, sym_infer
from attograd.uop.patterns import UPat, PatternMatcher, graph_rewrite
from attograd.codegen.opt import Opt, OptOps, KernelOptError, axes, global_ranges, ranges_of, apply_opts
from attograd.renderer import Renderer

# ***** ranges -> thread ids *****

drop_ends = PatternMatcher([
  (UPat(Ops.END, src=(UPat.var("x"), UPat(name="r"))), lambda x, r: x if r.op is not Ops.RANGE else None),
])

def _thread_ids(ranges: list[UOp], prefix: str, maxes: tuple[int, ...]) -> dict[UOp, UOp]:
  """Ranges (innermost first) -> expressions of SPECIALs. One range per launch dimension where that
  fits; beyond the dimensions there are, the outermost share the last one (div/mod), and where a
  size exceeds its dimension's limit everything shares dimension 0."""
  if not ranges: return {}
  def fits(dims: list[list[UOp]]) -> bool:
    return len(dims) <= len(maxes) and all(not isinstance(s := _size(d), int) or s <= m for d, m in zip(dims, maxes))
  dims = [[r] for r in ranges[:len(maxes) - 1]] + [ranges[len(maxes) - 1:]] if len(ranges) >= len(maxes) else [[r] for r in ranges]
  if not fits(dims): dims = [ranges]
  if not fits(dims): raise KernelOptError(f"{_size(dims[0])} threads in one dimension is over this device's limit of {maxes[0]}")
  out: dict[UOp, UOp] = {}
  for d, group in enumerate(dims):
    size = _size(group)
    sp = UOp(Ops.SPECIAL, dtypes.int32, (UOp.const(dtypes.int32, size) if isinstance(size, int) else size.cast(dtypes.int32),), f"{prefix}{d}")
    stride: UOp | int = 1
    for i, r in enumerate(group):
      v = sp if stride == 1 else sp // (stride if isinstance(stride, UOp) else UOp.const(dtypes.int32, stride))
      if i < len(group) - 1: v = v % r.src[0].cast(dtypes.int32)
      out[r] = v.cast(r.dtype)
      stride = stride * r.src[0].cast(dtypes.int32) if isinstance(stride, UOp) or r.src[0].op is not Ops.CONST else stride * r.src[0].arg
  return out

def _size(group: list[UOp]) -> UOp | int:
  """The product of the ranges' sizes: an int when all are constants."""
  if all(r.src[0].op is Ops.CONST for r in group): return prod(r.src[0].arg for r in group)
  return prod((r.src[0] for r in group[1:]), group[0].src[0])

def add_gpudims(ast: UOp, renderer: Renderer) -> UOp:
  """On a GPU target, global and local loops become thread ids; elsewhere a local axis is refused."""
  local = ranges_of(ast, AxisKind.LOCAL)[::-1]
  if renderer.global_max is None:
    if local: raise KernelOptError(f"{renderer.device or type(renderer).__name__} has no work-groups: LOCAL and GROUP need a GPU target")
    return ast
  if (threads := prod(r.src[0].arg for r in local)) > renderer.workgroup_max:
    raise KernelOptError(f"{threads} threads per work-group is over this device's limit of {renderer.workgroup_max}")
  gated: dict[UOp, UOp] = {}
  for st in ast.toposort:
    if st.op is Ops.STORE and st.src[0].dtype.addrspace == "global" and (idle := [l for l in local if l not in st.live_ranges]):
      gate = idle[0].eq(0)
      for l in idle[1:]: gate = gate & l.eq(0)
      ix = st.src[0]
      ix = ix.replace(src=(*ix.src[:2], gate if ix.gate is None else ix.gate & gate))
      gated[st] = st.replace(src=(ix, *st.src[1:]))
  ids = _thread_ids(ranges_of(ast, AxisKind.GLOBAL)[::-1], "gidx", renderer.global_max) | _thread_ids(local, "lidx", renderer.local_max)
  return graph_rewrite(ast.substitute(gated).substitute(ids), drop_ends, name="gpu_dims/drop_ends")

def launch_dims(uops: list[UOp]) -> tuple[tuple[UOp | int, ...], tuple[int, ...]]:
  """(work-groups per dimension, threads per work-group per dimension), three of each. Counts of
  work-groups may be symbolic: evaluate them with global_size(var_vals)."""
  groups: list[UOp | int] = [1, 1, 1]
  local = [1, 1, 1]
  for u in uops:
    if u.op is not Ops.SPECIAL: continue
    c = u.src[0].arg if u.src[0].op is Ops.CONST else u.src[0]
    if u.arg.startswith("gidx"): groups[int(u.arg[4:])] = c
    else: local[int(u.arg[4:])] = c
  return tuple(groups), tuple(local)

def eval_dims(dims: tuple[UOp | int, ...], var_vals: dict[UOp, int] | None) -> tuple[int, ...]:
  return tuple(d if isinstance(d, int) else int(sym_infer(d, var_vals or {})) for d in dims)
