"""Tensor graph -> an ordered list of kernels (DESIGN §3.3).
Deciding where buffers must exist is the scheduler's one decision; everything else is indexing."""
from __future__ import annotations
import itertools, json
from dataclasses import dataclass, field
from typing import Any, Callable, Container
from attograd.dtype import dtypes, DType
from attograd.helpers import cached_property, gc_paused, prod, dedup, DEBUG, CACHELEVEL, cache_path, cache_read, cache_write, code_version, content_hash
from attograd.uop.ops import AxisKind, UOp, Ops, GroupOp, BufferArg, Template, arg_key, sint, smax, sym_prod, sym_eq
from attograd.uop import patterns
from attograd.uop.patterns import Pass, graph_rewrite, run_passes, PatternMatcher, UPat
from attograd.uop.serialize import graph_data, graph_from_data, graph_key
from attograd.uop.symbolic import symbolic, gated_index, inbounds_load
from attograd.codegen.lower import reduce_identity, fresh_range_id
from attograd.schedule.flash import fuse_attention, flash_kernel, softmax_weighted
from attograd.schedule.indexing import IndexingContext, pushdown, tindex, linearize_index, sizes_in_index_dtype, as_index_size

@dataclass(frozen=True, init=False)
class ScheduleItem:
  """One unit of work: a kernel AST over PARAMs (ast.op is SINK) or a COPY, and the BUFFERs
  it binds, output first."""
  ast: UOp
  bufs: tuple[UOp, ...]
  def __init__(self, ast: UOp, bufs: tuple[UOp, ...]):  # (as BufferArg's: a schedule filled in makes 250 a training step)
    d = self.__dict__
    d["ast"], d["bufs"] = ast, bufs

_buffer_ids = itertools.count()
def new_buffer(device: str, size: sint, dtype) -> UOp:
  """A buffer of `size` elements; a symbolic size gets memory for its largest value, so every value
  bound later (a TinyJit replay) fits in it."""
  return UOp(Ops.BUFFER, dtype, (), BufferArg(next(_buffer_ids), device, smax(size)))

def buffer_view(buf: UOp, shape: tuple[sint, ...]) -> UOp:
  """buf holding a tensor of `shape` contiguously; with a symbolic shape, the tensor is a prefix of it."""
  if shape == buf.shape: return buf
  if isinstance(n := sym_prod(shape), UOp): buf = UOp(Ops.SHRINK, buf.dtype, (buf,), ((0, n),))
  return UOp(Ops.RESHAPE, buf.dtype, (buf,), shape) if shape != buf.shape else buf

def is_contiguous_buffer(u: UOp) -> bool:
  """A whole buffer seen in some shape, or the prefix of one that a symbolic shape fills (buffer_view)."""
  # (reshapes can stack: a realized (1, 1, V) result reshaped to (V,) is a whole buffer still, and reading it must not copy)
  while u.op is Ops.RESHAPE: u = u.src[0]
  if u.op is Ops.SHRINK and len(u.arg) == 1 and u.arg[0][0] == 0 and isinstance(u.arg[0][1], UOp): u = u.src[0]
  return u.op is Ops.BUFFER

def is_view_of_buffer(u: UOp) -> bool: return u.base.op is Ops.BUFFER
def has_real_expand(u: UOp) -> bool: return u.op is Ops.EXPAND and not sym_eq(sym_prod(u.src[0].shape), sym_prod(u.shape))

def inline_is_free(expand: UOp, src: UOp, reduced: frozenset[int]) -> bool:
  """Is what `expand` broadcasts (src, holding reduces) computed once per value it has when left
  inside the kernel? Loops nest in axis order with reduce loops innermost, and a loop waits for the
  reduces its body needs that don't depend on it (codegen/linearize.py). So it is free when every
  axis src varies along is an outer output axis, and every axis it is broadcast along is inside them
  (softmax's x - x.amax(1): the max is computed once per row, before the row's inner loops)."""
  varies = [i for i, s in enumerate(src.shape) if s != 1]
  broadcast = [i for i, (a, b) in enumerate(zip(src.shape, expand.shape)) if a == 1 and b != 1]
  if any(i in reduced for i in varies): return False
  return all(i in reduced or i > max(varies, default=-1) for i in broadcast)

# ALU work of one op, in adds: what a fused value costs each time a loop around it repeats it (a load costs 1). A
# transcendental is an inline polynomial of tens of instructions; a division or square root is several adds' latency; a
# pad is a compare and a select around its loads
# (a concatenation of three gradients costs three loads, three gates and two adds)
OP_COST = {**{op: 16 for op in GroupOp.Transcendental}, Ops.FDIV: 4, Ops.SQRT: 4, Ops.RECIP: 4, Ops.PAD: 2}
# a value costing more than this per element is computed once into a buffer rather than repeated: under an expand that
# a kernel's loops don't make free (a matmul re-reads its input once per output tile), or by two kernels. A relu or a
# scale and shift is cheaper to repeat than to store and load; an erf-GELU (~40 ops) or an exp is not
RECOMPUTE_MAX = 8
NESTED_SUM_MIN = 32  # a sum at least this long inside another reduce's loops gets a buffer (walk_kernel)
EPILOGUE_NODES = 32  # elementwise ops a stored nested sum's epilogue may span (store_epilogues: a hardswish is 8)
PASS_COST = 4  # ops per element: what storing a value and loading it back costs, in the units of OP_COST
MIN_REPEATED_WORK = 1 << 15  # ops: below this, two kernels repeating a value cost less than a launch of a third
# a transcendental's value (an exp and what is computed from it) shared by two kernels has its store and loads cost this
# many times PASS_COST where its buffer is more than a core's L2 keeps (CACHED_BYTES): they stream it from L3 or memory,
# and the kernel that stores it is one pass more than the kernel that computed it inline. A tanh-GELU's sigmoid (~25 ops
# an element: an exp and a reciprocal), read by its forward and its gradient, a d=128 GPT's (2048, 512) a layer (4 MiB):
# stored, the forward was two kernels (the sigmoid 1.1 ms, x * it 1.1 ms: that pass over three 4 MiB buffers cost what
# the exp did) and the gradient read it back; computed by both, one kernel each: the step's 12 such kernels 15.4 -> 9.8
# ms (one core, in one process). Values of loads and a few ops (a batchnorm's normalized input, beautiful_mnist's 26 MB)
# stay as they were: recomputed there, the step measured the same within noise
WIDE_PASS_FACTOR, CACHED_BYTES = 3, 2 << 20

def pass_cost(u: UOp, points: dict[UOp, None]) -> int:
  """What storing u (a value two kernels share) and loading it back costs per element, in the units of OP_COST."""
  if smax(sym_prod(u.shape)) * u.dtype.itemsize <= CACHED_BYTES: return PASS_COST
  # a transcendental computed in u itself: down to the buffers, realize points and reduces it reads, as elementwise_cost
  seen, stack = set(), [u]
  while stack:
    if (x := stack.pop()) in seen or x.op in (Ops.BUFFER, Ops.DEVICE, Ops.REDUCE_AXIS) or (x is not u and x in points): continue
    if x.op in GroupOp.Transcendental: return PASS_COST * WIDE_PASS_FACTOR
    seen.add(x)
    stack.extend(x.src)
  return PASS_COST

def elementwise_cost(u: UOp, points: dict[UOp, None], memo: dict, stop: int | None = None) -> int:
  """Ops per element that computing u inside a kernel takes, down to the buffers, realize points and reduces it reads
  (each shared node once, as the kernel computes it once). A scalar broadcast to every element is computed once, before
  the loops: it costs nothing per element. With `stop`, a cost over it is returned as soon as the walk has seen that
  much (a part of the cost, not kept): the walk of a kernel asks this of every value it passes, and a long chain of
  them made whole walks quadratic."""
  if (hit := memo.get(u)) is not None: return hit
  # a cost over `stop` is kept under (u, stop): the walk of a kernel asks again for every path that reaches u
  if stop is not None and (hit := memo.get((u, stop))) is not None: return hit
  seen: set[UOp] = set()
  stack, cost = [u], 0
  while stack:
    if (x := stack.pop()) in seen or x.op is Ops.DEVICE: continue
    if x.op is Ops.EXPAND and all(d == 1 for d in x.src[0].shape): continue
    seen.add(x)
    if x.op is Ops.BUFFER or (x is not u and x in points): cost += 1; continue  # a load
    if x.op is Ops.REDUCE_AXIS: continue  # a loop of its own, which the rules for reduces decide about
    cost += OP_COST.get(x.op, 1 if x.op in GroupOp.ALU else 0)
    if stop is not None and cost > stop:
      memo[(u, stop)] = cost
      return cost
    stack.extend(x.src)
  memo[u] = cost
  return cost

def reduce_cost(r: UOp, points: dict[UOp, None], memo: dict[UOp, int]) -> int:
  """Ops per output element of a reduce: its value's ops (and the add) once per element reduced."""
  return (elementwise_cost(r.src[0], points, memo) + 1) * prod(smax(r.src[0].shape[a]) for a in r.arg[1])

def _unmoved(x: UOp) -> UOp:
  while x.op in GroupOp.Movement or x.op is Ops.CAST: x = x.src[0]
  return x

def conjuncts(c: UOp) -> list[UOp]:
  """The terms of an AND of booleans: a gather may carry more conditions beside its index match."""
  if c.op is not Ops.AND or c.dtype != dtypes.bool: return [c]
  return [t for s in c.src for t in conjuncts(s)]

def gather_parts(red: UOp) -> tuple[UOp, UOp] | None:
  """(v, e) of a sum of where(e == arange, v, 0) over the arange's axis: indexing turns it into a read of one row of
  v (collapse_one_hot), so e is computed once per output, not once per row of the table. With more conditions and-ed
  to the match, e is the whole condition (computed once per output as well)."""
  x = red.src[0]
  if red.arg[0] is not Ops.ADD or x.op is not Ops.WHERE or (z := _unmoved(x.src[2])).op is not Ops.CONST or z.arg != 0: return None
  terms = conjuncts(cond := _unmoved(x.src[0]))
  for t in (_unmoved(t) for t in terms):
    if t.op is not Ops.CMPEQ: continue
    for a, e in (t.src, t.src[::-1]):
      if _unmoved(a).op is Ops.IOTA: return x.src[1], (_unmoved(e) if len(terms) == 1 else cond)
  return None

def _moved_axes(u: UOp, axes: frozenset[int]) -> frozenset[int] | None:
  """The axes of u's shape along which it may vary, given those its source varies along (None: a symbolic reshape)."""
  if u.op is Ops.PERMUTE: return frozenset(i for i, p in enumerate(u.arg) if p in axes)
  if u.op is Ops.RESHAPE:
    old, new = u.src[0].shape, u.shape
    if not all(isinstance(s, int) for s in (*old, *new)): return None
    # row-major: axis k of a shape holds the element strides [prod(shape[k+1:]), prod(shape[k:])); an axis of the new
    # shape varies where its strides overlap those of an axis that varied
    def span(shape: tuple, k: int) -> tuple[int, int]: return prod(shape[k + 1:]), prod(shape[k:])
    return frozenset(j for j in range(len(new)) for k in axes if max(span(new, j)[0], span(old, k)[0]) < min(span(new, j)[1], span(old, k)[1]))
  return axes  # an expand broadcasts along axes that were 1 (no variation there); pad, shrink, flip and casts keep axes

def _varying(x: UOp) -> frozenset[int] | None:
  """The axes x may vary along: an iota along its one axis, any other value along each axis longer than 1, carried
  through the movement ops above them. A superset, never a subset: the reduce then stays a dense sum."""
  if x.op in GroupOp.Movement or x.op is Ops.CAST:
    return None if (s := _varying(x.src[0])) is None else _moved_axes(x, s)
  if x.op is Ops.IOTA: return frozenset({0})
  return frozenset(i for i, n in enumerate(x.shape) if not (isinstance(n, int) and n == 1))

def is_scatter(red: UOp) -> bool:
  """Is red the transpose of a gather: a sum of where(e == arange, v, 0) over axes the arange doesn't vary along, and e
  doesn't vary along the arange's (an embedding's gradient sums each token's row into the table row its index picks)?
  Indexing makes it a scatter-add (scatter_kernel), which needs the sum alone in its kernel: it is stored."""
  if red.op is not Ops.REDUCE_AXIS or red.dtype in (dtypes.bool, dtypes.float16, dtypes.bfloat16) or gather_parts(red) is None: return False
  chain, cond = [], red.src[0].src[0]
  while cond.op in GroupOp.Movement or cond.op is Ops.CAST: chain.append(cond); cond = cond.src[0]
  kinds = set()
  for a, e in (cond.src, cond.src[::-1]):
    if _unmoved(a).op is not Ops.IOTA: continue
    ia, ea = _varying(a), _varying(e)
    for u in reversed(chain):
      if ia is None or ea is None: break
      ia, ea = _moved_axes(u, ia), _moved_axes(u, ea)
    if not ia or ea is None or ia & ea: continue
    kinds.add("gather" if ia <= set(red.arg[1]) else "scatter" if not ia & set(red.arg[1]) else "")
  # arange == arange (a position embedding's gradient) reads as both: indexing makes it a gather (collapse_one_hot)
  return kinds == {"scatter"} or kinds == {"scatter", ""}

@dataclass
class KernelWalk:
  """What the walk of one kernel (from a realize point down to the next ones) found: every node it looked at, the
  reduces and costly values it reads (which other kernels may read too), and what it must not compute itself."""
  reached: set[UOp]
  reads: set[UOp]
  to_store: dict[UOp, str]  # each with why (a REALIZE_WHY key)

# of the times a kernel's loops compute a value broadcast into them, those one computation serves: a register tile's row
# (a value loaded once per row of outputs feeds up to 32 of them)
TILE_REUSE = 32
REPEATED_MIN_ELEMENTS = 1 << 16  # elements of a repeated value from which a kernel of its own pays (else a launch costs more)

def repeats_cost(s: UOp, repeat: int, points: dict[UOp, None], cost: dict) -> bool:
  """Is a value computed `repeat` times an element by a kernel's loops (the broadcasts around it) costlier than
  storing it once and loading it back: its ops, once for each TILE_REUSE uses, beyond the first time, against PASS_COST?"""
  if repeat <= TILE_REUSE or smax(sym_prod(s.shape)) < REPEATED_MIN_ELEMENTS: return False
  # a value wider than everything it is computed from stays in its readers: weights dequantized from bytes, read by a
  # matmul over many rows, stay quantized in memory (stored, their floats were 7x the bytes: SmolLM2's decode step wrote
  # its whole tied embedding table as floats every token, 2.3x slower and 100 MiB more)
  if s.dtype.itemsize > widest_read(s, points): return False
  return elementwise_cost(s, points, cost) * (repeat // TILE_REUSE - 1) > PASS_COST

def widest_read(u: UOp, points: dict[UOp, None]) -> int:
  """The largest element, in bytes, of the buffers, realize points and reduces computing u inside a kernel reads element
  for element. A broadcast read (through an EXPAND: one value for many elements, such as a quantized block's float32
  scale) counts only when every read is one."""
  seen: set[tuple[UOp, bool]] = set()
  stack, widest = [(s, False) for s in u.src], [0, 0]  # widest read element for element, through a broadcast
  while stack:
    if (key := stack.pop()) in seen or key[0].op is Ops.DEVICE: continue
    seen.add(key)
    x, broadcast = key
    if x.op in (Ops.BUFFER, Ops.REDUCE_AXIS) or x in points: widest[broadcast] = max(widest[broadcast], x.dtype.itemsize)
    else: stack.extend((s, broadcast or x.op is Ops.EXPAND) for s in x.src)
  return widest[0] or widest[1]

def walk_kernel(p: UOp, points: dict[UOp, None], cost: dict[UOp, int]) -> KernelWalk:
  """A reduce read through an expand is kept in the kernel when the loops keep it cheap (see inline_is_free), else it
  (and likewise a costly value) gets its own buffer, as does a reduce computed in two of the kernel's loop nests."""
  walk = KernelWalk({p}, set(), {})
  # a write to a slice computes only its value, in the value's loops (region_of): the pads around it are no concatenation's
  root = region[0] if p.op is Ops.ASSIGN and (region := region_of(p)) is not None else p
  if root is not p:
    if root.op in {Ops.BUFFER, Ops.DEVICE} or root in points: return walk
    walk.reached.add(root)
  # state: node, whether the path from p keeps axes aligned with p's loops, the axes reduced on the way (those loops are
  # reduce loops), whether an expand was passed on an unaligned path, whether the node is needed in every iteration
  # of the loops around it (no expand since the last reduce: not hoisted out of them), and whether a pad of the output's
  # loops was passed (one no reduce is around: a concatenation's, not a conv window's)
  seen: set[tuple] = set()
  # (and whether arithmetic was passed since the last reduce: a sum computed on, not only moved, as a nested one)
  # (and how many times the kernel's loops repeat each element: the broadcasts passed that the loops don't make free)
  stack: list[tuple[UOp, bool, frozenset[int], bool, bool, bool, bool, int]] = [(root, True, frozenset(), False, True, False, False, 1)]
  # the loop nests each reduce is computed in (by the reduces around it): in two of them, it is computed twice
  nests: dict[UOp, set[frozenset[int]]] = {}
  while stack:
    state = stack.pop()
    if state in seen: continue
    seen.add(state)
    u, aligned, reduced, expanded, direct, padded, computed, repeat = state
    # below an expand, work is repeated per broadcast element unless the loops keep it free
    repeated_here = has_real_expand(u) and not (aligned and inline_is_free(u, u.src[0], reduced))
    expanded_here = expanded or repeated_here
    if repeated_here: repeat *= smax(sym_prod(u.shape)) // max(1, smax(sym_prod(u.src[0].shape)))
    keeps_axes = u.op in GroupOp.Elementwise or u.op in {Ops.REDUCE_AXIS, Ops.EXPAND, Ops.CONTIGUOUS, Ops.ASSIGN, Ops.DETACH}
    below = (aligned and keeps_axes, reduced | set(u.arg[1]) if u.op is Ops.REDUCE_AXIS else reduced, expanded_here,
             u.op is Ops.REDUCE_AXIS or (direct and not has_real_expand(u)), (u.op is Ops.PAD and not reduced) or (padded and u.op is not Ops.REDUCE_AXIS),
             u.op in GroupOp.ALU or (computed and u.op is not Ops.REDUCE_AXIS), repeat)
    srcs = [(s, below) for s in u.src]
    if u.op is Ops.REDUCE_AXIS and (picked := gather_parts(u)) is not None:
      # a gather runs no loop over its table: the row it reads is computed once per output, its index with it
      srcs = [(picked[0], (aligned, reduced, expanded_here, direct, False, False, repeat)), (picked[1], (False, reduced, False, direct, False, False, 1))]
    for s, below in srcs:
      if s.op in {Ops.BUFFER, Ops.DEVICE} or s in points: continue
      walk.reached.add(s)
      if s.op is Ops.REDUCE_AXIS and below[3]: nests.setdefault(s, set()).add(below[1])
      if s.op is Ops.REDUCE_AXIS or (s.op in GroupOp.ALU and elementwise_cost(s, points, cost, RECOMPUTE_MAX) > RECOMPUTE_MAX):
        walk.reads.add(s)
        # a linear layer's gradient after softmax would otherwise redo its exps once per output tile of both matmuls
        if expanded_here: walk.to_store[s] = "expand"; continue
        # a piece of a concatenation (gradients laid end to end): the kernel's loops are the padded output's, where the
        # reduce would lose its own schedule (a register tile) and every other piece's reads are gated in it (a cat of
        # an MLP's 4 gradients: 154 ms as one kernel)
        if s.op is Ops.REDUCE_AXIS and below[4]: walk.to_store[s] = "pad"; continue
        # a long sum (a conv, a matmul) inside another reduce's loops (an average pool of a conv's output): fused, it is
        # one loop of the nest, where no register tile applies (PP-OCR rec's 480 -> 480 1x1 conv + hardswish under a 3x2
        # pool: 24 ms at 4 GFLOPS a core); a short one (a conv gradient's window, summed one axis at a time) stays, as does
        # one read through an expand, the same for the whole outer sum (a layernorm's mean under its variance), and one
        # the outer sum adds up as it is (a conv's input gradient: a sum over the window of sums over channels, which
        # lowering merges into one loop nest): only one computed on (a bias, an activation) first
        if s.op is Ops.REDUCE_AXIS and below[1] and below[3] and below[5] and s.arg[0] is Ops.ADD and gather_parts(s) is None and \
            prod(smax(s.src[0].shape[a]) for a in s.arg[1]) >= NESTED_SUM_MIN: walk.to_store[s] = "nested"; continue
      # a cheap value the loops compute many times an element (a previous layer's bias and relu, read by a conv's forward
      # and weight gradient once per output channel and window element: 800 times each) costs more than its store
      elif s.op in GroupOp.ALU and below[2] and repeats_cost(s, below[6], points, cost): walk.to_store[s] = "repeated"; continue
      stack.append((s, *below))
  # a reduce computed in two loop nests (attention's dP = dO @ V^T, read by the softmax gradient's row sum and again for
  # each output) is stored, unless it is cheaper to compute twice than to store and load
  walk.to_store.update((r, "two_nests") for r, ns in nests.items() if len(ns) > 1 and reduce_cost(r, points, cost) > RECOMPUTE_MAX)
  return walk

# why a node gets a buffer: realize_points keeps the rule that made each one a point (the first) as its value, for the
# schedule VIZ shows (create_schedule hands them to the recorder; nothing reads them otherwise)
REALIZE_WHY = {
  "output": "asked for: a realize() target (realize, numpy, item, tolist, a kernel's result the program reads)",
  "contiguous": "contiguous() asks for its own buffer",
  "copy": "a COPY between devices",
  "allreduce": "an all-reduce of a sharded reduce's parts (in place, no new buffer)",
  "copy_source": "the source of a COPY: a copy moves memory, so its input is computed first",
  "assign": "an assign's target (the value is written to new memory: graphs built before it read the old)",
  "scatter": "a one-hot sum over tokens (an embedding's gradient): a scatter-add kernel of its own",
  "expand": f"an expand would recompute it per broadcast element (a reduce, or a value costing > RECOMPUTE_MAX={RECOMPUTE_MAX} ops an element)",
  "pad": "a reduce read through a pad (a piece of a concatenation): computed with its own loops, then copied in",
  "nested": "a long sum (a conv, a matmul) inside another reduce's loops: computed with its own loops (a register tile)",
  "repeated": f"a value the kernel's loops compute more than TILE_REUSE={TILE_REUSE} times an element, where that costs more than "
              f"storing it (a bias and relu under a conv's windows and output channels)",
  "two_nests": "a reduce one kernel would compute in two loop nests (attention's dP), costlier to redo than to store",
  "shared_reduce": "a reduce that two or more kernels read: computed once",
  "shared_value": f"a value costing > RECOMPUTE_MAX={RECOMPUTE_MAX} ops an element that several kernels read, where the repeated work "
                  f"is worth a launch (MIN_REPEATED_WORK={MIN_REPEATED_WORK}) and costs more than storing and loading it (PASS_COST={PASS_COST})",
}
_OP_WHY = {Ops.CONTIGUOUS: "contiguous", Ops.COPY: "copy", Ops.ASSIGN: "assign"}

def realize_points(sink: UOp) -> dict[UOp, str]:
  """The nodes that get their own buffer: what the user asked for, CONTIGUOUS/COPY/ASSIGN, a reduce that would be
  recomputed for every element of an expand (softmax's x - x.max()) or that two kernels read, and likewise a value
  costing more than RECOMPUTE_MAX ops per element. Repeated until stable; a kernel is walked again only when a node
  it reached became a realize point. Each point's value says why (a REALIZE_WHY key)."""
  points: dict[UOp, str] = {}
  for t in sink.src:
    if not is_view_of_buffer(t) and t.base.op not in (Ops.CONST, Ops.MSELECT): points[t.base] = "output"
  for u in sink.toposort:
    if u.op in {Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN} or is_scatter(u): points.setdefault(u, _OP_WHY.get(u.op, "scatter"))
    # (an all-reduce's result is its inputs' memory: a copy reads it where it is)
    if u.op is Ops.COPY and not is_view_of_buffer(u.src[0]) and u.src[0].base.op is not Ops.MSELECT: points.setdefault(u.src[0].base, "copy_source")
  walks: dict[UOp, KernelWalk] = {}
  added: set[UOp] = set()
  while True:
    cost: dict[UOp, int] = {}
    for p in points:
      if p not in walks or not walks[p].reached.isdisjoint(added): walks[p] = walk_kernel(p, points, cost)
    readers: dict[UOp, set[UOp]] = {}
    for p, w in walks.items():
      for s in w.reads: readers.setdefault(s, set()).add(p)
    new = {s: why for w in walks.values() for s, why in w.to_store.items() if s not in points}
    shared = [r for r, ps in readers.items() if len(ps) > 1 and r not in points]
    for r in shared:
      if r.op is Ops.REDUCE_AXIS: new.setdefault(r, "shared_reduce")
    # a costly value two kernels share, once the costly parts broadcast into it have buffers (they change its cost), when
    # the work repeated is worth a kernel launch and costs more than storing and loading it
    repeated = lambda r: smax(sym_prod(r.shape)) * elementwise_cost(r, points, cost) * (len(readers[r]) - 1)
    shared = [r for r in shared if r.op is not Ops.REDUCE_AXIS and repeated(r) >= MIN_REPEATED_WORK
              and elementwise_cost(r, points, cost) * (len(readers[r]) - 1) > pass_cost(r, points) * (len(readers[r]) + 1)]
    # of it and a costly part of it that the same kernels read, it: no kernel needs the part then (a GELU's normal cdf,
    # which its forward and its gradient compute, and the steps of its polynomial inside)
    shared = [r for r in shared if not any(o is not r and readers[o] == readers[r] and r in o.ancestors for o in shared)]
    # of it and a costly part of it that other kernels read too, the part first: with a buffer for it, the rest may be
    # cheap to repeat
    if not new: new = {r: "shared_value" for r in shared if not any(o in r.ancestors for o in shared if o is not r)}
    if not new: break
    added = set(new)
    points.update(new)
  # a shared value that a buffer found later for a costly part of it made cheap is repeated by its readers after all (a
  # tanh-GELU's 1 + tanh(u), shared by its forward and its gradient before tanh(u) itself got a buffer: a kernel that
  # only added 1, 1M elements a layer of a d=128 GPT)
  for r in [r for r, why in points.items() if why == "shared_value"]:
    if elementwise_cost(r, {p: None for p in points if p is not r}, {}) <= PASS_COST: del points[r]
  return fuse_attention(sink, store_epilogues(sink, points))

def store_epilogues(sink: UOp, points: dict[UOp, str]) -> dict[UOp, str]:
  """A stored reduce whose one use is a cheap elementwise op of the same shape (a scale, a mask: attention's
  where(i >= j, q @ k^T * scale, -inf)) is stored after it, and so on up such a chain: the epilogue is computed once per
  element in the reduce's kernel, not in each loop nest of the kernels that read it (a softmax reads its scores in
  three), and a mask is then where the sum is. The other operands must cost little and read no reduce a kernel doesn't
  already store. A nested sum's epilogue may also read it more than once (joined): PP-OCR cls's last conv is stored
  after its hardswish, computed once per element in the conv's register tile, not in the scalar loops of the pools that
  read it."""
  users: dict[UOp, list[UOp]] = {}
  for u in sink.toposort:
    for x in u.src: users.setdefault(x, []).append(u)
  cost: dict[UOp, int] = {}
  def cheap(x: UOp) -> bool:
    return elementwise_cost(x, points, cost, RECOMPUTE_MAX) <= RECOMPUTE_MAX and \
      not any(y.op is Ops.REDUCE_AXIS and y not in points for y in x.toposort)
  order = {u: i for i, u in enumerate(sink.toposort)}
  def joined(top: UOp) -> UOp | None:
    """The node every use of top flows into through elementwise ops of its shape (a hardswish, x * clip(x + 3, 0, 6) / 6,
    reads x twice: its last multiply), every other operand of them cheap; None if a use leaves that region first."""
    pending, seen = {top}, set()
    while len(pending) > 1 or top in pending:
      n = min(pending, key=order.__getitem__)  # in order: a node is expanded after every source of it in the region
      pending.discard(n)
      seen.add(n)
      for u in users.get(n, []):
        if u in points or u.op not in GroupOp.ALU or u.shape != top.shape: return None
        pending.add(u)
      if len(seen) > EPILOGUE_NODES or not pending: return None
    (end,) = pending
    return end if all(cheap(x) for r in (seen - {top}) | {end} for x in r.src if x not in seen) else None
  for p, why in list(points.items()):
    if p.op is not Ops.REDUCE_AXIS or why not in ("two_nests", "shared_reduce", "nested") or p not in points: continue
    top = p
    # (a reshape moves nothing: the matmul's (..., 1) sum is read as (...))
    while True:
      if len(us := users.get(top, [])) == 1 and (u := us[0]) not in points and u.src.count(top) == 1 and \
          ((u.op is Ops.RESHAPE and not u.symbolic_shape) or (u.op in GroupOp.ALU and u.shape == top.shape and all(cheap(x) for x in u.src if x is not top))):
        top = u
      elif why == "nested" and len(users.get(top, [])) > 1 and (u := joined(top)) is not None: top = u
      else: break
    while top.op is Ops.RESHAPE: top = top.src[0]  # a point is a value; the reshape is its readers'
    if top is not p:
      del points[p]
      points[top] = why
  return points

def merge_nested_reduce(outer: UOp) -> UOp | None:
  """sum_i (g_i ? sum_j x_ij : 0) = sum_ij (g_i ? x_ij : 0), and the same for max: one loop nest with one
  accumulator instead of one per level (a conv's backward sums its window one axis at a time)."""
  v, gate, identity = outer.src[0], None, reduce_identity(outer.arg, outer.dtype)
  if v.op is Ops.WHERE and v.src[2].op is Ops.CONST and v.src[2].arg == identity and v.src[1].op is Ops.REDUCE: gate, v = v.src[0], v.src[1]
  if v.op is not Ops.REDUCE or v.arg is not outer.arg or v.dtype != outer.dtype: return None
  x = v.src[0] if gate is None else UOp(Ops.WHERE, v.dtype, (gate, v.src[0], UOp.const(v.dtype, identity)))
  return UOp(Ops.REDUCE, outer.dtype, (x, *outer.src[1:], *v.src[1:]), outer.arg)

def same_reduce(ctx: dict[UOp, UOp], red: UOp) -> UOp | None:
  """A reduce computing what an earlier one does over loops of their own is that one: each use of a tensor gets
  loops of its own in indexing (logsumexp's row max, read inside the sum and again outside, was computed twice)."""
  canon = {r: UOp(Ops.RANGE, r.dtype, r.src, (-1 - i, AxisKind.REDUCE)) for i, r in enumerate(red.src[1:])}
  first = ctx.setdefault(red.replace(src=(red.src[0].substitute(canon), *canon.values())), red)
  return None if first is red else first
reduce_dedup = PatternMatcher([(UPat(Ops.REDUCE, name="red"), same_reduce)])

def _selected(x: UOp) -> tuple[UOp, UOp] | None:
  """(condition, value) of a value kept only where a condition holds: c ? v : 0, or v * (float)c."""
  if x.op is Ops.WHERE and x.src[2].op is Ops.CONST and x.src[2].arg == 0: return x.src[0], x.src[1]
  if x.op is Ops.MUL:
    for c, v in (x.src, x.src[::-1]):
      if c.op is Ops.CAST and c.src[0].dtype == dtypes.bool: return c.src[0], v
  return None

def _range_of(x: UOp) -> UOp:
  """x without integer casts that keep its value: an int32 loop counter compared with an int64 index, or cast to int64
  and back to int32 (advanced indexing's flat index is int32)."""
  while x.op is Ops.CAST and dtypes.is_int(x.dtype) and dtypes.is_int(x.src[0].dtype) and \
      dtypes.min(x.dtype) <= x.src[0].vmin and x.src[0].vmax <= dtypes.max(x.dtype): x = x.src[0]
  return x

def _row(e: UOp, r: UOp) -> tuple[UOp, UOp]:
  """(0 <= e < n, e clamped into [0, n) as r's dtype) for loop r over n rows: the row an index picks, always in the
  buffer, and whether it picks one at all (an out-of-range index picks none: a gather reads 0, a scatter adds nothing)."""
  n = r.src[0].cast(e.dtype)
  return (e < n) & (e < 0).logical_not(), e.maximum(0).minimum(n - 1).cast(r.dtype)

def collapse_one_hot(red: UOp) -> UOp | None:
  """A sum over r of (r == e ? v(r) : 0), e not depending on r, is v(e) where 0 <= e < n and 0 elsewhere: a gather (an
  embedding lookup, cross entropy's pick of each target's logit) reads one row per output, not every row of the table.
  e is clamped into the loop's range first, so the row read is always in the buffer, and its bounds keep index math
  narrow."""
  if red.arg is not Ops.ADD or (sel := _selected(red.src[0])) is None: return None
  cond, value = sel
  terms = conjuncts(cond)
  for cmp in terms:
    if cmp.op is not Ops.CMPEQ: continue
    for a, e in (cmp.src, cmp.src[::-1]):
      if (r := _range_of(a)) not in red.src[1:] or r.op is not Ops.RANGE or r in e.toposort: continue
      valid, row = _row(e, r)
      # the other conditions hold at that row or nowhere (a permutation's gather checks its inverse there, so its
      # gradient, a sum over outputs, collapses the same way: sort's values)
      for t in terms:
        if t is not cmp: valid = valid & t.substitute({r: row})
      picked = valid.where(value.substitute({r: row}), UOp.const(red.dtype, 0))
      rest = tuple(x for x in red.src[1:] if x is not r)
      return UOp(Ops.REDUCE, red.dtype, (picked, *rest), red.arg) if rest else picked
  return None

def sum_of_negation(red: UOp, x: UOp) -> UOp | None:
  """sum_r(-x) = -sum_r(x), exactly: the sum below may then be one the other rules simplify."""
  return UOp(Ops.NEG, red.dtype, (red.replace(src=(x.src[0], *red.src[1:])),)) if red.arg is Ops.ADD else None

def sum_of_invariant(red: UOp, x: UOp) -> UOp | None:
  """sum_r(a + b) = a * n + sum_r(b) for an a that no loop of the sum changes (n: the loops' trip count): cross entropy's
  gradient summed a row's constant over the vocabulary beside a one-hot, in a 128-wide written-out kernel that took gcc
  half a second; the one-hot then collapses to a pick."""
  if red.arg is not Ops.ADD or red.dtype == dtypes.bool: return None
  loops = set(red.src[1:])
  for a, b in (x.src, x.src[::-1]):
    if loops.isdisjoint(a.toposort):
      n = prod(r.src[0] for r in red.src[1:]).cast(red.dtype)
      return UOp(Ops.ADD, red.dtype, (UOp(Ops.MUL, red.dtype, (a, n)), red.replace(src=(b, *red.src[1:]))))
  return None

def scatter_kernel(sink: UOp) -> UOp | None:
  """A kernel storing a sum over t of (r == e(t) ? v(r, t) : 0), r an output loop that e doesn't depend on (the
  transpose of a gather: an embedding's gradient), becomes a scatter-add costing O(tokens), not O(rows x tokens):

    for the other output loops (d): out[r, d] = 0 for every r; then for t in order: out[e(t), d] += v(e(t), t)

  The loops over r and t are 'serial': no Opt names them and no GPU thread id replaces them, so every thread or core
  owns whole columns of the output (the store's address is one-to-one in the output's loops, so other values of d
  never meet) and adds its tokens in one fixed order: no races, the same bits every run. An index outside [0, n)
  adds nothing, as a gather with it reads 0. Float16/bfloat16 sums stay dense (rounding each add would differ)."""
  ends, st = [], sink.src[0] if len(sink.src) == 1 else None
  while st is not None and st.op is Ops.END: ends.append(st.src[1]); st = st.src[0]
  if st is None or st.op is not Ops.STORE or (red := st.src[1]).op is not Ops.REDUCE or red.arg is not Ops.ADD: return None
  if red.dtype in (dtypes.bool, dtypes.float16, dtypes.bfloat16) or len(st.src[0].src) != 2: return None
  if (sel := _selected(red.src[0])) is None or sel[0].op is not Ops.CMPEQ: return None
  out, addr = st.src[0].src
  for a, e in (sel[0].src, sel[0].src[::-1]):
    if (r := _range_of(a)) not in ends or r.arg[1] is not AxisKind.GLOBAL or r in e.toposort: continue
    first = fresh_range_id(sink)
    rows = UOp(Ops.RANGE, r.dtype, r.src, (first, AxisKind.SERIAL))
    fill = out.index(addr.substitute({r: rows})).store(UOp.const(red.dtype, 0)).end(rows)
    tokens = {t: UOp(Ops.RANGE, t.dtype, t.src, (first + 1 + i, AxisKind.SERIAL)) for i, t in enumerate(red.src[1:])}
    row = _row(e.substitute(tokens), r)[1]
    at = addr.substitute({r: row})
    # an index out of range stores nothing. The gate says so as "clamping the index changes nothing": bounds on the
    # index itself (0 <= e < n) would let the address under the gate drop the clamp and with it its narrow bounds
    e = e.substitute(tokens)
    picks = row.cast(e.dtype).eq(e)
    # the read of the output is after the fill and inside the token loops: each token's add sees the one before it
    acc = out.after(fill, *tokens.values()).index(at, picks).load()
    add = out.index(at, picks).store(acc + sel[1].substitute({**tokens, r: row})).end(*tokens.values())
    return add.end(*(x for x in ends if x is not r)).sink()
  return None
scatter = PatternMatcher([(UPat(Ops.SINK, name="sink"), scatter_kernel)])

# after pushdown: size-1 ranges are the constant 0, and a loop over nothing ends nothing
kernel_cleanup = PatternMatcher([
  (UPat(Ops.REDUCE, name="red"), collapse_one_hot),
  (UPat(Ops.REDUCE, src=(UPat(Ops.NEG, name="x"),), allow_any_len=True, name="red"), sum_of_negation),
  (UPat(Ops.REDUCE, src=(UPat(Ops.ADD, name="x"),), allow_any_len=True, name="red"), sum_of_invariant),
  (UPat(Ops.REDUCE, name="outer"), merge_nested_reduce),
  (UPat(Ops.RANGE, src=(UPat.const(None, 1),), name="r"), lambda r: r.const_like(0)),
  (UPat(Ops.END, src=(UPat.var("x"), UPat(Ops.CONST))), lambda x: x),
]) + symbolic + gated_index + inbounds_load

# built once: graph_rewrite marks the nodes a matcher left unchanged, by the matcher (a new one per kernel would pile up)
scatter_cleanup = scatter + kernel_cleanup

def index_dtype_for(*sizes: int):
  """The narrowest index dtype a kernel might use: a loop or buffer of 2**31 elements needs int64.
  The final choice also looks at every intermediate of the index math (index_math_fits)."""
  return dtypes.int64 if max(sizes, default=0) >= 2**31 else dtypes.int32

def index_math_fits(ast: UOp) -> bool:
  """No index or gate can wrap around, by the bounds of every node in it (DESIGN invariant 8). A
  wrapping node makes all above it inexact, and rules never rewrite into a wrapped value's place
  something that looks exact, so checking the roots checks every intermediate."""
  return all(s.exact for u in ast.toposort if u.op is Ops.INDEX and u.src[0].op is Ops.PARAM for s in u.src[1:])

_ast_cache: dict[tuple[UOp, tuple[int, ...], UOp], tuple[UOp, list[int]]] = {}

def kernel_ast(value: UOp, shape: tuple[int, ...], out_buf: UOp, at: Region | None = None) -> tuple[UOp, list[UOp]]:
  """The AST that stores `value` (a tensor graph over BUFFERs) contiguously into out_buf, PARAM 0 (or, with `at`, into
  that box of it: region_of). Returns it and the input BUFFERs in PARAM order (1, 2, ...). The same graph over other
  buffers gives the same AST, so it is built once: buffers are renamed to their order of appearance."""
  bufs = dedup([out_buf] + [u for u in value.toposort if u.op is Ops.BUFFER])
  anon = {b: b.replace(arg=BufferArg(-i, "", b.arg.size)) for i, b in enumerate(bufs)}
  key = (value.substitute(anon), shape, anon[out_buf], at)
  if (hit := _ast_cache.get(key)) is None:
    if len(_ast_cache) > 4096: _ast_cache.clear()
    ast, params = _build_kernel_ast(*key)
    hit = _ast_cache[key] = (ast, [-p.arg.uid for p in params])
  return hit[0], [bufs[i] for i in hit[1]]

def _build_kernel_ast(value: UOp, shape: tuple[int, ...], out_buf: UOp, at: Region | None = None) -> tuple[UOp, list[UOp]]:
  buf_sizes = [u.arg.size for u in value.toposort if u.op is Ops.BUFFER]
  # constants of the index math (a dim, a pad or shrink offset) must fit the dtype before bounds can say anything
  consts = [abs(smax(c)) for u in value.toposort if u.op in GroupOp.Movement for c in
            (*u.shape, *(x for p in (u.arg if u.op in {Ops.PAD, Ops.SHRINK} else ()) for x in p))]
  consts += [abs(smax(c)) for c in (at[0] + at[1] if at is not None else ())]
  # int32 index math where it provably can't overflow, else int64: a reshape of an expand can index a
  # virtual 2**32 elements on the way to a small buffer
  ast, params = _pushdown(value, shape, out_buf, index_dtype_for(out_buf.arg.size, prod(smax(s) for s in shape), *buf_sizes, *consts), at=at)
  if not index_math_fits(ast): ast, params = _pushdown(value, shape, out_buf, dtypes.int64, at=at)
  return ast, params

_ALL_KEPT = frozenset(GroupOp.Movement - {Ops.PAD})  # movement ops that keep a tensor of one value all that value
# where a value goes in a bigger buffer: the buffer's shape and the value's first element along each axis
Region = tuple[tuple[int, ...], tuple[sint, ...]]

def region_of(assign: UOp) -> tuple[UOp, Region] | None:
  """An assign that writes only a box of its target (a write to a slice: where(pad(True), pad(v), target), with one pad
  for both, Tensor._assign_through's form) as (v, where v goes), else None. Its kernel stores v there, over the target's
  values copied first, instead of selecting between v and the target at every element: a KV cache's write of one
  position moves one row, not the whole cache."""
  target, w = assign.src
  if w.op is not Ops.WHERE or w.src[2] is not target or not is_contiguous_buffer(target) or target.base.arg.offset: return None
  mask, val = w.src[0], w.src[1]
  if mask.op is not Ops.PAD or val.op is not Ops.PAD or mask.arg != val.arg or not all(isinstance(s, int) for s in target.shape): return None
  m = mask.src[0]
  while m.op in _ALL_KEPT: m = m.src[0]  # (a pad inside would make some of the box False: a strided slice's write)
  if m.op is not Ops.CONST or m.arg is not True or target.size != target.base.arg.size: return None
  return val.src[0], (target.shape, tuple(b for b, _ in val.arg))

def merge_loops(sink: UOp) -> UOp:
  """Neighbouring loops of one kind that every index reads as one become one loop: output loops (a batch and its rows,
  b*T + t, in a linear layer over (B, T, C): a matmul then tiles all B*T rows under each weight panel it packs, where
  16 batches of 64 rows packed each panel 16 times) and the loops of one sum (its weight gradient sums over B*T tokens
  in one loop, which a tile's panel loop can go around). Tried pair by pair: loops that some index still divides or
  takes a remainder of (a gate, a transposed read) stay apart."""
  for kind in (AxisKind.GLOBAL, AxisKind.REDUCE):
    loops = sorted((u for u in sink.toposort if u.op is Ops.RANGE and u.arg[1] is kind), key=lambda r: r.arg)
    k = 0
    while k + 1 < len(loops):
      if (merged := _merge_pair(sink, loops[k], loops[k + 1])) is None: k += 1; continue
      sink, m = merged
      loops = loops[:k] + [m] + loops[k + 2:]
  return sink

def _merge_pair(sink: UOp, a: UOp, b: UOp) -> tuple[UOp, UOp] | None:
  """(the kernel with loops a and b as one loop, that loop), or None where an index would divide it."""
  # (symbolic sizes stay apart; an empty loop runs nothing either way, and its bounds can't say what an index is)
  if a.src[0].op is not Ops.CONST or b.src[0].op is not Ops.CONST or a.src[0].arg * b.src[0].arg == 0: return None
  # two loops of a sum are one only if they are loops of the same sum
  if any(u.op is Ops.REDUCE and (a in u.src[1:]) != (b in u.src[1:]) for u in sink.toposort): return None
  n = UOp.const(a.dtype, b.src[0].arg)
  m = UOp(Ops.RANGE, a.dtype, (UOp.const(a.dtype, a.src[0].arg * n.arg),), a.arg)
  new: dict[UOp, UOp] = {a: UOp(Ops.IDIV, a.dtype, (m, n)), b: UOp(Ops.MOD, a.dtype, (m, n))}
  for u in sink.toposort:
    if u in new: continue
    if u.op is Ops.END and u.src[1] in (a, b): new[u] = new[u.src[0]] if u.src[1] is b else UOp(Ops.END, u.dtype, (new[u.src[0]], m))
    elif u.op is Ops.REDUCE and a in u.src[1:]:
      new[u] = u.replace(src=(new[u.src[0]], *(m if r is a else new[r] for r in u.src[1:] if r is not b)))
    else: new[u] = u.replace(src=tuple(new[s] for s in u.src)) if u.src else u
  merged = graph_rewrite(new[sink], symbolic, name="merge_loops/simplify")
  if any(u.op in (Ops.IDIV, Ops.MOD) and m in u.src[0].toposort for u in merged.toposort): return None
  return merged, m

# a kernel's STORE of an INDEX over its value -> its AST, pass by pass (docs/pipeline.md says what each does)
INDEXING_PASSES: list[Pass] = [
  ("pushdown", lambda sink, ctx: graph_rewrite(sink, pushdown, ctx, name="pushdown")),
  ("kernel_cleanup", kernel_cleanup),
  ("reduce_dedup", lambda sink, ctx: graph_rewrite(sink, reduce_dedup, {}, name="reduce_dedup")),
  ("scatter_cleanup", scatter_cleanup),
  ("merge_loops", lambda sink, ctx: merge_loops(sink)),
  ("flash_attention", lambda sink, ctx: sink if (f := flash_kernel(sink)) is None else f),
]

def _pushdown(value: UOp, shape: tuple[int, ...], out_buf: UOp, idx_dtype, cleanup: bool = True,
              at: Region | None = None) -> tuple[UOp, list[UOp]]:
  """The kernel AST with index math in idx_dtype: movement ops pushed into indices, then simplified
  (bench/rewrite.py times the two steps apart). With `at`, the value is stored at that box of out_buf (region_of)."""
  out = UOp(Ops.PARAM, value.dtype.ptr(out_buf.arg.size), (), 0)
  value, shape = sizes_in_index_dtype(value, shape, idx_dtype)
  ctx = IndexingContext(idx_dtype, len(shape), {out_buf: out})  # PARAM 0 is the output, inputs count from 1
  ranges = tuple(UOp(Ops.RANGE, ctx.idx_dtype, (UOp.const(ctx.idx_dtype, s),), (i, AxisKind.GLOBAL)) for i, s in enumerate(shape))
  if at is None: store_idx = linearize_index(ranges, shape, UOp.const(ctx.idx_dtype, 0))
  else:  # element (r0, r1, ...) of the value lands at (start0 + r0, start1 + r1, ...) of the buffer's shape
    full, starts = at
    starts = tuple(as_index_size(b, idx_dtype) if isinstance(b, UOp) else b for b in starts)
    store_idx = linearize_index(tuple(r + b if not (isinstance(b, int) and b == 0) else r for r, b in zip(ranges, starts)), full,
                                UOp.const(ctx.idx_dtype, 0))
  sink = UOp(Ops.INDEX, out.dtype, (out, store_idx)).store(tindex(value, UOp.const(dtypes.bool, True), ranges)).end(*ranges).sink()
  sink = run_passes(sink, INDEXING_PASSES if cleanup else INDEXING_PASSES[:1], ctx)
  # a buffer whose every read simplified away (a pad of an empty tensor) is no argument: renumber
  used = {u for u in sink.toposort if u.op is Ops.PARAM}
  kept = [(b, p) for b, p in ctx.params.items() if p in used]
  renumber = {p: p.replace(arg=i) for i, (_, p) in enumerate(kept) if p.arg != i}
  return sink.substitute(renumber) if renumber else sink, [b for b, _ in kept if b is not out_buf]

def graph_structure(sink: UOp, stop: Callable[[UOp], bool] | None = None, watch: Container[Ops] = (),
                    watch_ids: Container[int] = (), quiet: Container[tuple] = ()) -> tuple[tuple, list[UOp]] | None:
  """The graph as the scheduler sees it, with its buffers anonymized (two graphs that differ only in which memory they read
  have the same structure) and those buffers in order of appearance. A WITH_DERIVATIVE node reads as its value (the
  derivative it carries is autograd's): walking through it here, rather than stripping it first, spares rebuilding every
  node above it on each call, when the schedule is a cached one.
  `stop`: a check made in the same walk (realize's: would the graph be run as it is?), called on each node whose op is
  in `watch` or whose id is in `watch_ids`, and on the nodes below the sources a WITH_DERIVATIVE carries besides its
  value (not part of the structure, walked for the check after the rest); the first True ends the walk with None.
  `quiet`: (op, arg) pairs of watched ops that stop is known to pass for (the caller's memo of a check that is a function
  of them alone): such a node is checked only if its id is in `watch_ids`."""
  position: dict[UOp, int] = {}
  # four entries a node, in one flat tuple (op, dtype, arg, its sources' positions; a buffer's: BUFFER, dtype, device,
  # (size, offset)): a tuple a node was ~1,700 more objects a training step's realize made, freed, and while its template is
  # cached, one more for each full pass of the cycle collector to walk
  parts: list = []
  bufs: list[UOp] = []
  extra: list[UOp] = []  # a WITH_DERIVATIVE's derivative sources, for stop
  # (names bound locally and the sources' numbers by map: ~30% of this walk's time, which every realize pays per node)
  at, WD, BUF = position.__getitem__, Ops.WITH_DERIVATIVE, Ops.BUFFER
  nodes, sources = [sink], [iter(sink.src)]  # a depth-first walk, sources in order, as UOp.toposort's
  while sources:
    for s in sources[-1]:
      if s not in position:
        nodes.append(s); sources.append(iter(s.src if s.op is not WD else s.src[:1]))
        break
    else:
      sources.pop()
      u = nodes.pop()
      op = u.op
      if stop is not None and ((op in watch and (op, u.arg) not in quiet) or id(u) in watch_ids) and stop(u): return None
      if op is WD:
        position[u] = position[u.src[0]]
        if stop is not None: extra += u.src[1:]
      elif op is BUF:
        position[u] = len(parts)
        a = u.arg
        parts += (BUF, u.dtype, a.device, (a.size, a.offset))
        bufs.append(u)
      else:
        position[u] = len(parts)
        arg = u.arg  # (arg_key inlined: one call fewer per node of a training step's thousands)
        parts += (op, u.dtype, ("float", arg.hex()) if type(arg) is float else arg, tuple(map(at, u.src)))
  seen: set[UOp] = set()
  while extra:
    if (u := extra.pop()) in position or u in seen: continue
    seen.add(u)
    if (u.op in watch or id(u) in watch_ids) and stop(u): return None
    extra += u.src
  return tuple(parts), bufs

@dataclass(frozen=True)
class ScheduleTemplate:
  """A schedule over numbered buffers: the inputs of the graph (0..n_inputs-1), then the buffers it
  creates. Scheduling a graph of the same structure again only fills in the numbers."""
  n_inputs: int
  outputs: tuple[tuple[str, int, DType], ...]        # device, size, dtype of each created buffer
  items: tuple[tuple[UOp, tuple[int, ...]], ...]     # AST (or COPY) and its buffers by number
  becomes: tuple[UOp, ...]                           # each target afterwards, over placeholder buffers
  placeholders: tuple[tuple[UOp, int], ...]          # those placeholders and the numbers of the buffers they stand for
  key: int
  why: tuple[str, ...] = ()                          # why each item's output is a buffer (REALIZE_WHY keys; () from disk)
  # what realize derives from the template alone, kept with it: its memory plans, by (buffers created, buffers kept) numbers
  plans: dict = field(default_factory=dict, compare=False, repr=False)
  @cached_property
  def becomes_sink(self) -> UOp: return UOp(Ops.SINK, dtypes.void, self.becomes)
  @cached_property
  def becomes_rebuilt(self) -> Template | None:
    """becomes_sink as a Template over the placeholders (becomes_of rebuilds only the views above them, from rows: a
    substitute walked the whole SINK and replaced each node, ~100 targets a training step); None when it can't be one."""
    try: t = Template(tuple(p for p, _ in self.placeholders), self.becomes_sink)
    except AssertionError: return None  # (no target reads a placeholder)
    return None if t.opaque else t
  @cached_property
  def fresh_key(self) -> tuple[tuple[int, ...], frozenset[int]]:
    """The (buffers created, buffers kept) numbers of realize's schedule filled in anew from it (fill_in): every item's
    output created, the buffers its targets' views name kept. Its plan's key in `plans`."""
    return tuple(numbers[0] for _, numbers in self.items), frozenset(n for _, n in self.placeholders)

class Schedule(list):
  """create_schedule's items (a list of ScheduleItems), with the template they were filled in from and its buffers by
  number (inputs, then those it creates): realize keeps what depends on the template alone (the memory plan) with it."""
  template: ScheduleTemplate
  numbered: list[UOp]
  made: tuple[ScheduleItem, ...]  # the items as filled in (frozen): the list still holds exactly these if each is here

def _placeholder(i: int, b: UOp) -> UOp: return b.replace(arg=BufferArg(-1 - i, b.arg.device, b.arg.size, b.arg.offset))

def _template(sink: UOp, inputs: list[UOp], key: int) -> ScheduleTemplate:
  schedule, becomes, why = _schedule_graph(sink)
  outputs = [si.bufs[0] for si in schedule]
  number = {b: i for i, b in enumerate((*inputs, *outputs))}
  placeholders = {b: _placeholder(i, b) for b, i in number.items()}
  items = tuple((si.ast if si.ast.op is not Ops.COPY else UOp(Ops.COPY, si.ast.dtype, (), si.ast.device), tuple(number[b] for b in si.bufs))
                for si in schedule)
  after = tuple(becomes[t].substitute(placeholders) for t in sink.src)
  used = {u for b in after for u in b.toposort if u.op is Ops.BUFFER}
  return ScheduleTemplate(len(inputs), tuple((b.arg.device, b.arg.size, b.dtype) for b in outputs), items, after,
                          tuple((p, number[b]) for b, p in placeholders.items() if p in used), key, tuple(why))

# ***** templates on disk: a new process schedules nothing an earlier one scheduled (same code, same graph) *****

def _disk_key(sink: UOp, inputs: list[UOp]) -> str:
  # the number of inputs too: a template numbers the buffers it creates after them, and a graph can have inputs it doesn't
  # read (a CALL's source its body reads only through a derivative, which scheduling drops: a gradient's, gradient.py).
  # Two graphs the same but for those had one key, and the second read the first's template: its kernels wrote the
  # buffers it creates into its unused inputs
  return content_hash("schedule", code_version(), str(len(inputs)), graph_key(sink, {b: _placeholder(i, b) for i, b in enumerate(inputs)}))

def template_data(t: ScheduleTemplate) -> dict[str, Any]:
  """The template as plain data (JSON): what the disk keeps, and what realize's scheduling child sends."""
  outputs = [UOp(Ops.BUFFER, dt, (), BufferArg(-1, device, size)) for device, size, dt in t.outputs]  # (their dtypes)
  roots = [*(ast for ast, _ in t.items), *t.becomes, *(p for p, _ in t.placeholders), *outputs]
  return {"graph": graph_data(roots), "inputs": t.n_inputs, "items": [list(n) for _, n in t.items], "becomes": len(t.becomes),
          "placeholders": [n for _, n in t.placeholders], "outputs": len(outputs)}

def template_from_data(e: dict[str, Any], key: int) -> ScheduleTemplate:
  """template_data's data as a template again, with the key it is known by."""
  roots = iter(graph_from_data(e["graph"]))
  items = tuple((next(roots), tuple(int(n) for n in numbers)) for numbers in e["items"])
  becomes = tuple(next(roots) for _ in range(e["becomes"]))
  placeholders = tuple((next(roots), int(n)) for n in e["placeholders"])
  outputs = tuple((b.arg.device, b.arg.size, b.dtype) for b in (next(roots) for _ in range(e["outputs"])))
  return ScheduleTemplate(int(e["inputs"]), outputs, items, becomes, placeholders, key)

def save_template(key: str, data: dict[str, Any]) -> None:
  """A template's data (template_data) on disk, under its disk key."""
  cache_write(cache_path("schedule", f"{key}.json"), json.dumps(data).encode())

def _load_template(key: str) -> ScheduleTemplate | None:
  return cache_read(cache_path("schedule", f"{key}.json"), lambda raw: template_from_data(json.loads(raw), int(key[:16], 16)))

_schedule_cache: dict[tuple, ScheduleTemplate] = {}

def forget_schedules(templates: list[ScheduleTemplate]) -> None:
  """Drop these templates from the cache (by identity): a TinyJit's, once it has captured them, which no replay reads
  again. Each is keyed by its graph's whole structure, a tuple a node: a 30-layer LLM's prompt pass and decode step
  held 4.5 MiB of them. (The same graph realized again outside the TinyJit is scheduled anew, or read from disk.)"""
  drop = {id(t) for t in templates}
  for key in [k for k, t in _schedule_cache.items() if id(t) in drop]: del _schedule_cache[key]

SPLIT_REDUCE_LENGTH = 2048  # a float sum at least this long over at least SPLIT_REDUCE_OUTPUTS outputs is split
SPLIT_REDUCE_OUTPUTS = 1 << 16
SPLIT_REDUCE_CHUNK = 1024
# the chunks tried, longest first: the longest whose narrower operand (a chunk's rows of the smaller kept axis, in floats)
# stays within SPLIT_CHUNK_L2_BYTES (half of a core's 2 MiB L2): the register tile reads that operand in place, once per
# block of the other one, while the other's packed block and panels stream through the rest. One core, interleaved in one
# process, a d=384 transformer's weight gradients over 4096 tokens (its 384-wide operand 1.5 MiB a chunk of 1024, 0.75 of
# 512), medians: (4096, 1536)^T @ (4096, 384) 138 -> 83 ms, (4096, 384)^T @ (4096, 1536) 122 -> 86, (4096, 1152)^T @
# (4096, 384) 114 -> 66, with the partials' sum. Chunks of 256 took the first and third to 82 and 61 but the second to 192
# (its column operand fell under PACK_MIN_PANELS, to the heuristics' across_tile), so 512 is the shortest. A d=128
# model's (GPT's) 128-wide operand keeps 1024
SPLIT_REDUCE_CHUNKS = (SPLIT_REDUCE_CHUNK, 512)
SPLIT_CHUNK_L2_BYTES = 1 << 20

def split_chunk(n: int, kept: list[int], itemsize: int) -> int | None:
  """The chunk a sum of length n into outputs of the kept axes' sizes is split in (split_long_sum), or None: a length
  the longest chunk doesn't divide isn't split."""
  if n % SPLIT_REDUCE_CHUNK: return None
  fitting = [c for c in SPLIT_REDUCE_CHUNKS if n % c == 0]
  # a product of two operands, each along one kept axis (a weight gradient's (out, in)): the narrower stays in L2
  dims = [d for d in kept if d > 1]
  narrow = min(dims) if len(dims) >= 2 else 0
  return next((c for c in fitting if c * narrow * itemsize <= SPLIT_CHUNK_L2_BYTES), fitting[-1])

def split_long_sum(red: UOp) -> UOp | None:
  """A long sum into many outputs (a weight gradient over 4096 tokens) is summed in chunks (of 1024; 512 where an
  operand's chunk would outgrow L2: split_chunk) into partial buffers, then the partials: a register tile's loop over
  the whole length streams its column panel and its strided rows through the caches once per tile (a (384, 1536)
  gradient over 4096 tokens ran at 26 GFLOPS a core, 65 over 1024). The partials cost one write and read of the output
  per chunk. The reduced axes (a batch and a sequence) are taken as one."""
  op, axes = red.arg
  # (a gather's one-hot sum runs no loop over its table, and a scatter-add has its own kernel: neither is split)
  if op is not Ops.ADD or not dtypes.is_float(red.dtype) or gather_parts(red) is not None or is_scatter(red): return None
  # (nor is attention's P @ V over enough keys for its fused kernel, schedule/flash.py)
  if softmax_weighted(red): return None
  x = red.src[0]
  shape = x.shape
  if not all(isinstance(s, int) for s in shape) or not isinstance(size := sym_prod(red.shape), int): return None
  if size < SPLIT_REDUCE_OUTPUTS:
    return split_batch_sum(red) if size >= SPLIT_BATCH_OUTPUTS or (size >= SPLIT_PRODUCT_OUTPUTS and x.op is Ops.MUL) else None
  n = prod(shape[a] for a in axes)
  kept = [i for i in range(len(shape)) if i not in axes]
  if n < SPLIT_REDUCE_LENGTH or (chunk := split_chunk(n, [shape[i] for i in kept], red.dtype.itemsize)) is None: return None
  parts, k = n // chunk, len(kept)
  # (kept axes..., the reduced ones as one) -> (chunk index, kept axes..., position in the chunk): the partials are laid
  # out as the sum's own outputs, one copy per chunk
  rows = x.permute((*kept, *axes)).reshape((*(shape[i] for i in kept), parts, chunk)).permute((k, *range(k), k + 1))
  partials = UOp(Ops.CONTIGUOUS, red.dtype, (rows.reduce_axis(Ops.ADD, (k + 1,)),))
  return partials.reduce_axis(Ops.ADD, (0,)).reshape(red.shape)

SPLIT_BATCH_OUTPUTS, SPLIT_BATCH_LENGTH = 4096, 1 << 14
# and from this many where the sum is of a product (a weight gradient, g * x): beautiful_mnist's first conv's, 32x1x5x5 over
# 512 x 24 x 24, in chunks of 4 images gets its channel tile (packed per chunk): one core, 43-55 -> 24-25 ms with the
# partials' sum, in one process
SPLIT_PRODUCT_OUTPUTS = 512

def split_batch_sum(red: UOp) -> UOp | None:
  """A long sum into fewer outputs, whose reduced axes are more than one (a conv's weight gradient: 32x32x5x5 outputs
  over batch x 20 x 20) is summed in chunks of its outermost reduced axis (8 images: the sum over the rest at least
  SPLIT_REDUCE_LENGTH), then the partials. A tile's pass over the whole batch streamed the output gradient and the input
  (63 MB at batch 512) through the caches once per tile; a chunk's stay in them (one core, 5x5 32->32 at 24px: 30 ->
  43 GFLOPS at batch 8). The image axes stay whole, so the chunk's reads index as before, with no division."""
  op, axes = red.arg
  x = red.src[0]
  shape = x.shape
  a0 = min(axes)
  batch, rest = shape[a0], prod(shape[a] for a in axes if a != a0)
  if len(axes) < 2 or batch * rest < SPLIT_BATCH_LENGTH: return None
  chunk = next((c for c in range(1, batch + 1) if batch % c == 0 and c * rest >= SPLIT_REDUCE_LENGTH), batch)
  if chunk == batch: return None
  parts = batch // chunk
  # (..., batch, ...) -> (..., parts, chunk, ...): the chunk and the other reduced axes are summed, the parts kept, then
  # moved in front (the partials are laid out as the sum's outputs, one copy per part) and summed
  rows = x.reshape((*shape[:a0], parts, chunk, *shape[a0 + 1:]))
  part = rows.reduce_axis(Ops.ADD, (a0 + 1, *(a + 1 for a in axes if a != a0)))
  order = (a0, *(i for i in range(len(shape) + 1) if i != a0))
  partials = UOp(Ops.CONTIGUOUS, red.dtype, (part.permute(order),))
  return partials.reduce_axis(Ops.ADD, (0,)).reshape(red.shape)

# each WITH_DERIVATIVE node becomes its value: the derivative it carries is autograd's (a graph without one is left as it
# is at the cost of one check of its op mask); a long sum into many outputs is split (split_long_sum)
VALUE_OF_DERIVATIVE = (UPat(Ops.WITH_DERIVATIVE, name="x"), lambda x: x.src[0])
# and each CALL its graph over its sources (a CALL inside it, in turn): they have a schedule only once expanded
CALL_EXPANDED = (UPat(Ops.CALL, name="c"), lambda c: c.arg.expand(c.src))
derivatives_dropped = PatternMatcher([VALUE_OF_DERIVATIVE, CALL_EXPANDED])
values_only = PatternMatcher([VALUE_OF_DERIVATIVE, CALL_EXPANDED, (UPat(Ops.REDUCE_AXIS, name="red"), split_long_sum)])

def create_schedule(targets: list[UOp], structure: tuple[tuple, list[UOp]] | None = None) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
  """Kernels to run, in order, and what each target becomes afterwards (a graph over views of the new
  buffers). A graph of the same structure as an earlier one (other buffers, same shapes) reuses its
  schedule: the Python work of scheduling a training step is done once, and once per machine when the disk cache is on
  (CACHELEVEL=2). `structure` is graph_structure of the targets' SINK when the caller found it already (realize finds
  it in the walk that checks the graph for realized nodes: one walk of a training step's thousands of nodes fewer)."""
  template, inputs = schedule_template(targets, structure)
  return fill_in(template, inputs, targets)

def schedule_template(targets: list[UOp], structure: tuple[tuple, list[UOp]] | None = None) -> tuple[ScheduleTemplate, list[UOp]]:
  """The template of the targets' graph (scheduled, or read from disk, the first time its structure is seen) and the
  graph's buffers it numbers as its inputs, in order. create_schedule fills it in; realize may run it without that
  (a template whose planned run is kept needs no node for a buffer that lives only inside the run)."""
  sink = UOp(Ops.SINK, dtypes.void, tuple(targets))
  structure, inputs = graph_structure(sink) if structure is None else structure
  if (template := _schedule_cache.get(structure)) is None:
    sink = graph_rewrite(sink, values_only, name="values_only")
    if len(_schedule_cache) > 1024: _schedule_cache.clear()
    key = _disk_key(sink, inputs) if CACHELEVEL >= 2 else None
    if key is None or (template := _load_template(key)) is None:
      # (made elsewhere, it is saved there)
      if template_elsewhere is None or (template := template_elsewhere(sink, inputs, hash(structure), key)) is None:
        with gc_paused(): template = _template(sink, inputs, hash(structure))
        if key is not None: save_template(key, template_data(template))
    _schedule_cache[structure] = template
    if DEBUG >= 1: print(f"schedule {template.key & 0xFFFFFFFF:08x}: {len(template.items)} kernels, new")
  elif DEBUG >= 1: print(f"schedule {template.key & 0xFFFFFFFF:08x}: {len(template.items)} kernels, cached")
  if patterns.tracker is not None:  # VIZ: why each item's output is a buffer, for the schedule being recorded
    patterns.tracker.note(why=[(w, REALIZE_WHY[w]) for w in template.why])
  return template, inputs

def fill_in(template: ScheduleTemplate, inputs: list[UOp], targets: list[UOp]) -> tuple[Schedule, dict[UOp, UOp]]:
  """The template's schedule over these input buffers and new ones for what it creates, and what each target becomes."""
  bufs = [*inputs, *(new_buffer(*o) for o in template.outputs)]
  at = bufs.__getitem__  # (each item's buffers by map: a generator per item was a fifth of filling a template in)
  made = tuple(ScheduleItem(ast, tuple(map(at, numbers))) for ast, numbers in template.items)
  schedule = Schedule(made)
  schedule.template, schedule.numbered, schedule.made = template, bufs, made
  return schedule, becomes_of(template, bufs, targets)

def becomes_of(template: ScheduleTemplate, numbered: list[UOp | None], targets: list[UOp]) -> dict[UOp, UOp]:
  """What each target becomes, over the buffers by number (`numbered` needs only those the targets' views name:
  template.placeholders)."""
  if (t := template.becomes_rebuilt) is not None: return dict(zip(targets, t(*[numbered[i] for _, i in template.placeholders]).src))
  fill = {p: numbered[i] for p, i in template.placeholders}
  # (one walk of all of them, their SINK's, kept with the template: a substitute each walked ~100 small graphs apart)
  return dict(zip(targets, template.becomes_sink.substitute(fill).src))

# asked to make a new template elsewhere, when set: realize's scheduling child, (sink, inputs, key, disk key to save it
# under or None) -> the template, or None (it is made here)
template_elsewhere: Callable[[UOp, list[UOp], int, str | None], ScheduleTemplate | None] | None = None

# told of each kernel (its AST and device) as _schedule_graph makes it, when set: realize sets it while it schedules what it
# will run, so a kernel is lowered and handed to the compiler while the ones after it are still being scheduled
kernel_made: Callable[[UOp, str], None] | None = None

def _schedule_graph(sink: UOp) -> tuple[list[ScheduleItem], dict[UOp, UOp], list[str]]:
  """One pass over the graph, children first: each realize point becomes a kernel (or a copy)
  writing a new buffer, and is read as that buffer by the kernels after it. Also why each item's output is a buffer."""
  points = realize_points(sink)
  rebuilt: dict[UOp, UOp] = {}
  schedule: list[ScheduleItem] = []
  why: list[str] = []
  for u in sink.toposort:
    src = u.replace(src=tuple(rebuilt[s] for s in u.src)) if u.src else u
    if u.op is Ops.ALLREDUCE:
      # an item of its own (no kernel): it combines its sources' memory in place (each a contiguous buffer of its own,
      # made for it by schedule/multi.py), and its parts (MSELECT) are read from there
      schedule.append(ScheduleItem(UOp(Ops.ALLREDUCE, u.dtype, (), (u.arg, u.device)), tuple(s.base for s in src.src)))
      why.append("allreduce")
      rebuilt[u] = src
      continue
    if u.op is Ops.MSELECT: rebuilt[u] = rebuilt[u.src[0]].src[u.arg]; continue
    if u not in points: rebuilt[u] = src; continue
    if u.op is Ops.COPY:
      out = new_buffer(u.device, u.size, u.dtype)
      schedule.append(ScheduleItem(src, (out, src.src[0].base)))
    elif u.op is Ops.ASSIGN and (region := region_of(src)) is not None:
      # a write to a box of the target: the target's values copied to the new memory, then the box stored over them (a
      # TinyJit capture that finds the old memory free drops the copy and writes the box in place: jit._write_in_place)
      value, at = region
      out = new_buffer(u.device, u.size, u.dtype)
      schedule.append(ScheduleItem(UOp(Ops.COPY, u.dtype, (src.src[0].base, UOp(Ops.DEVICE, dtypes.void, (), u.device))), (out, src.src[0].base)))
      why.append("assign")
      ast, ins = kernel_ast(value, value.shape, out, at)
      schedule.append(ScheduleItem(ast, (out, *ins)))
      if kernel_made is not None: kernel_made(ast, out.arg.device)
    else:
      # an assign's value goes to new memory too: graphs built before it still read the old values
      value = src.src[1] if u.op is Ops.ASSIGN else src.src[0] if u.op is Ops.CONTIGUOUS else src
      out = new_buffer(u.device, u.size, u.dtype)
      ast, ins = kernel_ast(value, u.shape, out)
      schedule.append(ScheduleItem(ast, (out, *ins)))
      if kernel_made is not None: kernel_made(ast, out.arg.device)
    rebuilt[u] = buffer_view(out, u.shape)
    why.append(points[u])
  return schedule, {t: rebuilt[t] for t in sink.src}, why
