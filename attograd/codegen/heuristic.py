"""The Opts a kernel gets from its AST alone (BEAM, engine/search.py, times candidates instead).

`heuristic_opts(ast, renderer)` makes the one choice between targets: a GPU (a renderer with work-groups) gets
`gpu_opts`, a CPU the named steps of CPU_STEPS, run in order on one `Plan`. Each step is for one kernel shape and
says which; a step proposes Opts, and an Opt the kernel refuses (KernelOptError: over the written-out budget, an
axis that doesn't split) is skipped. DEBUG>=3 prints every step's choices and every refusal with its reason.

The measurements quoted below are one core of the development machine (AVX-512, gcc 12) unless they say otherwise."""
from __future__ import annotations
import functools
from attograd.dtype import dtypes
from attograd.helpers import DEBUG, prod
from attograd.uop.ops import UOp, Ops, GroupOp, AxisKind
from attograd.uop.patterns import graph_rewrite
from attograd.uop.symbolic import symbolic, split_terms
from attograd.codegen.lower import VECTOR_STEP
from attograd.codegen.opt import (Opt, OptOps, KernelOptError, THREADS, PACK_MAX, apply_opts, axes, const_size, copies, global_ranges,
                                  ranges_of, stash_plan)
from attograd.renderer import Renderer

# a register tile's outputs at most, in vector registers (of the renderer's simd_floats): AVX2 has sixteen of 8 floats. A
# 16x6 tile (12 registers, with 2 for a row of the right operand and 1 for a broadcast of the left) keeps everything in
# registers: 52-68 GFLOPS on one core over a small transformer's matmuls and a 1024^3 one; 16x8 spilled three
# accumulators to the stack (48-53), 32x8 most (35). With AVX-512's 32 registers a 32x6 tile of them does 102-111 where
# 16x6 did 66-68 (torch 96), and 32x8 the same
TILE_REGISTERS = 16
SWAP_MAX_ROWS = 1 << 21  # elements of a matmul's row operand that a loop over column panels can re-read from cache
# elements of a matmul's column operand (k x width) from which its panels are packed: unpacked, every block of rows
# reads all of it again, from L3 once it outgrows a core's L2 (2 MiB here). One core, 4096 rows, k x width floats:
# 1536x384 and 384x1536 (2.4 MB) 46 -> 103 and 29 -> 52 GFLOPS packed; 768x384 (1.2 MB) 80 -> 59, 512x512 77 -> 57
# (packing costs more than the reads it saves); 1152x384 (1.8 MB) within noise either way, under load
PACK_MIN_PANELS = 1 << 19
# and rows of the tile's other axis from which it is: a weight gradient of a d=128 model, (2048, 128)^T @ (2048, 512) on
# one core, both rows' and columns' operand read across their rows, went 11.3 -> 5.0 ms packed ((2048, 128)^T @ (2048,
# 384): 9.7 -> 4.9), its 16 row blocks each re-reading the 2 MiB column operand from L3 unpacked
PACK_MIN_ROWS = 128
BLOCKED_PACK_MIN_PANELS = 3 << 17  # and elements from which it is where the rows are cut in blocks that L2 keeps (row_blocks)
# a tile whose width a SIMD loop divides is that loop (two registers wide) by rows, not written out: a 32x8 tile written
# out was ~3600 uops, 250-350 ms of lowering and 400-700 ms of gcc; the loop ~180 uops, 15-30 ms and 100-180 ms, and ran
# as fast or faster (one core, AVX-512, both in one process): 1024^3 20.7 -> 19.1 ms, 2048^3 148 -> 146, 512^3 3.9 ->
# 2.5, 4096x384 @ (1152x384)^T 60 -> 52, a small transformer's 17 tiled matmuls 5.25 -> 4.23 ms in all. (False: the
# written-out tiles first again, for comparisons.) A width no loop divides (a vocabulary of 90) stays written out: padded
# to a loop of 16s it ran 6x slower
LOOP_TILES = True
FULL_TILE = 8  # registers of accumulators: 16x6 written out (of 8-float registers), a SIMD loop of 16 by 6 rows, 8x8

def heuristic_opts(ast: UOp, renderer: Renderer) -> list[Opt]:
  """The Opts for a kernel on this renderer's target, chosen from the AST alone."""
  if renderer.has_local: return gpu_opts(ast, renderer)
  return cpu_opts(ast, cores(renderer), renderer.simd_floats)

def cores(renderer: Renderer) -> int:
  """The cores a kernel may be split across (THREAD): the THREADS switch where the target runs slices in a pool."""
  return THREADS.value if renderer.has_threads else 1

# ***** the plan the steps share *****

# the steps ask this of the same reads again (register_tile, then column_sum, window_loop): half of a small transformer's
# 137 questions were repeats, each a rewrite of the index; remembered for the reads of the kernels planned last
@functools.lru_cache(maxsize=4096)
def unit_stride(index: UOp, r: UOp) -> bool:
  """Do neighbouring iterations of loop r read neighbouring elements?"""
  # an index where r is a term of its own and in no other term (no r // c, no r % c): the step is r's coefficient, which
  # is what the rewrite below folds the difference to; 9 of 10 of a small transformer's reads, a tenth of its heuristics
  terms, _ = split_terms(index)
  if all(n is r or r not in n.ranges for n, _ in terms): return sum(k for n, k in terms if n is r) == 1
  step = graph_rewrite(index.substitute({r: r + 1}) - index, symbolic, name="heuristics/unit_stride")
  return step.op is Ops.CONST and step.arg == 1

def dividing(size: int | None, amounts: tuple[int, ...]) -> tuple[int, ...]:
  return tuple(a for a in amounts if size is not None and size % a == 0 and size >= a)

def largest(size: int | None, amounts: tuple[int, ...]) -> int | None:
  return next(iter(dividing(size, amounts)), None)

class Plan:
  """The kernel as the steps have left it, the Opts chosen so far, and what the steps read of the kernel as it was
  given (`ax`, its axes by role: global ones then reduce ones; `glob`, the positions of the global ones; `work`, its
  iterations) and as the first step left it (`reds`, its reduces; `gates`, what gated loads' gates depend on)."""
  def __init__(self, ast: UOp, threads: int, simd: int):
    self.ast, self.threads, self.simd, self.opts, self.step = ast, threads, simd, [], ""
    self.ax = axes(ast)
    self.glob = [i for i, r in enumerate(self.ax) if r.arg[1] is AxisKind.GLOBAL]
    self.work = prod(const_size(r) or 1 for r in self.ax)
    self.cost = kernel_cost(ast)  # (split_across_cores)
    self.reds: list[UOp] = []
    self.gates: list[list[UOp]] = []
    self.tiled = False  # a register tile was chosen: the reduce steps leave the kernel alone
  def first(self, *choices: Opt | tuple[Opt, ...]) -> bool:
    """Apply the first of the choices (an Opt or a sequence of them) the kernel accepts: a smaller tile when a wider
    one is over the budget of written-out code. False if it accepts none."""
    for choice in choices:
      seq = list(choice) if isinstance(choice, tuple) else [choice]
      try: self.ast = apply_opts(self.ast, seq)
      except KernelOptError as e:
        if DEBUG >= 3: print(f"  heuristics {self.step}: {seq} refused: {e}")
        continue
      self.opts.extend(seq)
      return True
    return False

PADDED_LOOP_SUM = 256  # terms each output sums from which a loop padded to whole registers beats a narrower one that fits

def loop_width(n: int, simd: int) -> tuple[int, int]:
  """(a SIMD loop's width, the size its axis is padded to) for an axis of n iterations: the width whose lanes do most useful
  work, a lane of a register run half full (a loop narrower than a register) counting half as an FMA of a half-register
  width issues at the full one's rate; of equals, the least padding, then the widest (two registers: more accumulators
  per row). One core, AVX-512, in one process: a 5x5 conv's 20-wide rows (32 -> 32 channels at 24x24, batch 512) padded
  to 32, a loop of 32 by 8 rows 179 ms, of 16 232; its input gradient's 24-wide rows a loop of 8 320 ms, padded to a loop
  of 32 232. A width a register divides keeps its loop: 8 wide stays a loop of 8 (padding to 16 does no more work)."""
  def score(w: int) -> tuple[float, int, int]:
    padded = -(-n // w) * w
    return (n / padded * min(1.0, w / simd), -padded, w)
  w = max((w for w in (2 * simd, simd, simd // 2) if w >= 4), key=score)
  return w, -(-n // w) * w

def tile_rows(p: Plan, i: int, cap: int, more: tuple[int, ...] = ()) -> None:
  """A tile's rows: 6, where they divide the axis or the padding's reads stay in the spare page after a buffer (a padded
  row gates every read of its copy otherwise: 1024^3 fell from 53 to 47), else 8 down to 2 (after `more`, the caller's
  first choices), with the accumulators in at most `cap`. (Measured on written-out columns; a SIMD loop's tile, a conv's,
  keeps its 8 rows.)"""
  rows = const_size(axes(p.ast)[i]) or 0
  padded = -(-rows // 6) * 6
  reduced = prod(const_size(r) or 0 for r in axes(p.ast) if r.arg[1] is AxisKind.REDUCE)
  six = ((Opt(OptOps.PADTO, i, 6),) if padded != rows else ()) + (Opt(OptOps.UPCAST, i, 6),)
  fits = (padded - rows) * reduced * 4 <= 4096 and copies(p.ast) * 6 <= cap and not ranges_of(p.ast, AxisKind.SIMD)
  p.first(*((six,) if fits else ()), *(Opt(OptOps.UPCAST, i, a) for a in dividing(rows, (*more, 8, 6, 4, 5, 3, 2)) if copies(p.ast) * a <= cap))

# ***** the CPU steps, in order *****

def stash_transcendentals(p: Plan) -> None:
  """Softmax: a transcendental that both the output and a reduce compute per element (the exp) is computed once and
  kept (STASH) for the output to read back."""
  for g, k in ((g, k) for g in p.glob for k, r in enumerate(p.ax) if r.arg[1] is AxisKind.REDUCE):
    try: value = stash_plan(p.ast, Opt(OptOps.STASH, g, k), p.ax)[2]
    except KernelOptError: continue
    if any(u.op in GroupOp.Transcendental for u in value.toposort): p.first(Opt(OptOps.STASH, g, k))
  p.reds = [u for u in p.ast.toposort if u.op is Ops.REDUCE]
  # what the gated loads' gates depend on (a padded conv's input gradient gates its reads along the window and the width)
  p.gates = [u.src[0].gate.toposort for red in p.reds for u in red.src[0].toposort if u.op is Ops.LOAD and u.src[0].gate is not None]

def register_tile(p: Plan) -> None:
  """Matmul, conv: one sum whose inputs are each re-read along some output axis. A tile of outputs in registers: the
  output's contiguous axis (j, up to 32 wide) by an axis no input read along j depends on (i, the rows), so each value
  loaded feeds many multiply-adds. A big or strided one also gets its column panels packed (SWAP, PACK)."""
  if len(p.glob) < 2 or (red := tile_reduce(p)) is None: return
  ax = p.ax
  # what a load reads is decided by its address: a pad's gate (which a conv's gradient puts on every load) doesn't
  # make a weight vary along the image
  loads = [u.src[0].src[1].toposort for u in red.src[0].toposort if u.op is Ops.LOAD]
  j = p.glob[-1]
  # the other tile axis: one that no input read along j depends on, and preferably another input does (matmul's rows,
  # conv's channels; not a batch axis, which only a bias read along j doesn't depend on; an embedding's gradient
  # compares its rows' index with the tokens, and no input is read along it)
  along_j = [ld for ld in loads if ax[j] in ld]
  tile_axes = [g for g in p.glob[:-1] if along_j and all(ax[g] not in ld for ld in along_j) and (const_size(ax[g]) or 0) >= 8]
  # of several (a batched matmul's batch and rows), the innermost: its loop is the one around j's, which SWAP exchanges
  i = next((g for g in reversed(tile_axes) if any(ax[g] in ld for ld in loads)), tile_axes[-1] if tile_axes else None)
  # a tile pays when each load is reused along one of its axes: one that varies along both (a layernorm's gradient,
  # whose rows are summed with the rows' own statistics) would be loaded once per output of the tile anyway
  if i is None or len(along_j) >= len(loads) or p.work < 1 << 16 or any(ax[i] in ld and ax[j] in ld for ld in loads): return
  # a SIMD loop over j reads whole vectors only where the reads along j are contiguous (a linear layer's (out, in)
  # weight is read along out with a stride: a loop over it gathers, written-out copies load one value each)
  contiguous_j = all(unit_stride(u.src[0].src[1], ax[j]) for u in red.src[0].toposort if u.op is Ops.LOAD and ax[j] in u.src[0].src[1].toposort)
  if channel_tile(p, i, j, red) or across_tile(p, i, j, red, contiguous_j): return
  if (const_size(ax[j]) or 99) <= 4: small_window_tile(p, i, j, loads, contiguous_j)
  elif contiguous_j and merged_rows(p, i, j, red): pass
  elif (n := const_size(ax[j]) or 0) % 8 and ((padded := -(-n // 16) * 16) - n <= n // 8 or any(ax[j] in g for g in p.gates)) and contiguous_j:
    # a width no multiple of 8 divides (a conv's 30): written out, its outputs don't line up with SIMD registers
    # and gcc vectorizes them poorly (measured 42 vs 64 GFLOPS); padded to 16s, it is one innermost loop. Reads
    # gated along it (a padded conv's input gradient, 13 wide) are masked loads in that loop, where written-out
    # copies are a select each: padded even at more cost (3/16 more lanes, measured 2.4x faster)
    w, padded = loop_width(n, p.simd)
    if padded != n: p.first(Opt(OptOps.PADTO, j, padded))
    p.first(Opt(OptOps.SIMD, j, w))
    tile_rows(p, i, TILE_REGISTERS * p.simd)
  elif not l1_panel_tile(p, i, j, contiguous_j): widest_tile(p, i, j, red, contiguous_j)
  p.tiled = True
  reduced = prod(const_size(r) or 0 for r in ax if r.arg[1] is AxisKind.REDUCE)
  rows, width = const_size(ax[i]) or 0, const_size(ax[j]) or 0
  big = len(p.glob) >= 2 and rows >= PACK_MIN_ROWS and reduced * width >= PACK_MIN_PANELS
  # a smaller column operand read in place by rows past L2 in blocks of rows (row_blocks) that L2 keeps: packed, each
  # panel is read from cache by a block's rows (one core, (4096, 1152) @ (1152, 384): 61 -> 103 GFLOPS in 16 blocks;
  # (4096, 768) @ (768, 384) 76 in place, 72-75 packed in blocks: not there)
  big = big or (reduced * width >= BLOCKED_PACK_MIN_PANELS and (const_size(axes(p.ast)[j]) or 0) >= ROW_BLOCK_MIN_PANELS and
                row_block_count(rows, reduced, const_size(axes(p.ast)[i]) or 0, p.threads) is not None)
  if big or not contiguous_j: pack_panels(p, i, j, red, reduced)
  # a column operand that big read by a few blocks of rows (a classifier over a big vocabulary, PP-OCR rec's 40 x 120 @
  # 120 x 6625): the loop over column panels outside the rows', so each panel comes from memory once and every block of
  # rows reads it from cache (one core, 4.0-5.5 -> 2.1-3.2 ms); too few rows to pay for packing
  elif reduced * (const_size(ax[j]) or 0) >= PACK_MIN_PANELS: p.first(Opt(OptOps.SWAP, i, j))

def tile_reduce(p: Plan) -> UOp | None:
  """The sum a register tile is for: the kernel's one reduce, or the one that varies along the output's innermost axis
  when the others are row statistics of loads (no reduce inside them) that don't: each is computed once per row of the
  tile. Attention's dS = P * (dO @ V^T - rowsum(dO * O)): 1.04 -> 0.39 ms at (64, 64, 64) x 16, one core, where its
  row sum kept it off the tile."""
  if len(p.reds) == 1: return p.reds[0] if p.reds[0].arg is Ops.ADD else None
  j = p.ax[p.glob[-1]]
  along = [r for r in p.reds if j in r.toposort]
  if len(along) != 1 or along[0].arg is not Ops.ADD: return None
  rest = [r for r in p.reds if r is not along[0]]
  if any(r in along[0].toposort or any(u.op is Ops.REDUCE for u in r.src[0].toposort) for r in rest): return None
  return along[0]

def row_stride(red: UOp, y: UOp, x: UOp) -> int | None:
  """The one row stride of every read the sum makes along rows y and columns x: each is linear in both, x's step 1 and
  y's the same S for all (a conv's input rows, S its width). None if a read moves along them otherwise (y // 2, a
  gradient's rows of another width) or is gated along them (a padded conv's columns: merged, each lane's gate would be
  a division and a remainder of the loop's counter)."""
  strides = set()
  for ld in (u for u in red.src[0].toposort if u.op is Ops.LOAD):
    ix, gate = ld.src[0].src[1], ld.src[0].gate
    if gate is not None and (y in gate.toposort or x in gate.toposort): return None
    if y not in ix.toposort and x not in ix.toposort: continue
    terms, _ = split_terms(ix)
    if any(t not in (y, x) and (y in t.toposort or x in t.toposort) for t, _ in terms): return None
    if sum(k for t, k in terms if t is x) != 1: return None
    strides.add(sum(k for t, k in terms if t is y))
  return strides.pop() if len(strides) == 1 else None

def merged_rows(p: Plan, i: int, j: int, red: UOp) -> bool:
  """Output rows narrower than a SIMD loop's registers (a 5x5 conv's 20 from its input's 24) padded to the input's row
  stride S and merged with the rows loop around them (MERGE): every read along them is then linear in one loop of rows
  x S, which a SIMD loop runs across rows, the lanes past a row's end reading the next row's start (thrown away by the
  gated store). Where that keeps more lanes busy than the row alone padded to whole registers (loop_width), and each
  output sums enough for the multiply-adds to outweigh its store (a div and mod per output, once the rows are merged).
  One core, AVX-512, beautiful_mnist batch 512, in one process: the 5x5 32->32 conv at 24x24 191 -> 136 ms (20 of 32
  lanes -> 20 of 24)."""
  ax = p.ax
  n, k = const_size(ax[j]) or 0, p.glob.index(j) - 1
  if k < 0 or (y := p.glob[k]) == i or not n or (rows := const_size(ax[y]) or 0) < 2: return False
  if prod(const_size(r) or 0 for r in ax if r.arg[1] is AxisKind.REDUCE) < PADDED_LOOP_SUM: return False
  if (stride := row_stride(red, ax[y], ax[j])) is None or not n <= stride <= 2 * n: return False
  w, padded = loop_width(n, p.simd)
  mw, mpadded = loop_width(rows * stride, p.simd)
  if rows * n / mpadded * min(1.0, mw / p.simd) <= n / padded * min(1.0, w / p.simd): return False
  seq = ((Opt(OptOps.PADTO, j, stride),) if stride != n else ()) + (Opt(OptOps.MERGE, y, j),)
  if not p.first(seq + ((Opt(OptOps.PADTO, j, mpadded),) if mpadded != rows * stride else ()) + (Opt(OptOps.SIMD, j, mw),)): return False
  tile_rows(p, i, TILE_REGISTERS * p.simd)
  return True

CHANNEL_TILE_REGISTERS = 24  # vector accumulators of a channel tile at most (of 32 AVX-512 registers: the rest load and broadcast)

def channel_tile(p: Plan, i: int, j: int, red: UOp) -> bool:
  """A conv's weight gradient, summed over images (dW[co, ci, kh, kw] = sum g[n, co, p] x[n, ci, p + (kh, kw)]): its
  window's width j (3, 5) is too narrow for a SIMD loop (5 padded to a loop of 8 keeps 5 of 16 AVX-512 lanes busy), while
  the tile's other axis i (the output channels) is wide. The loop goes over i instead, two registers of it, innermost
  (SWAPs move i inside the other output loops); the window (j and its other small axes no read along i moves) is written
  out, each of its values loaded once and broadcast; and the read along i, strided (g's channels are a plane apart), is
  packed (PACK) once per iteration of the innermost loop it moves along (a chunk of images), in the order the sum reads
  it: one contiguous vector per step. One core, AVX-512, batch 128, in one process: 5x5 32->32 at 24x24 69 -> 23.6 ms
  (kw padded to a loop of 8 by 8 channels before), and no padding: 111 GFLOPS. Only where each output sums a long
  stretch (the pack is paid once per chunk) and a lane of the window's loop would idle (loop_width's share below 3/4)."""
  ax = p.ax
  n, rows = const_size(ax[j]) or 0, const_size(ax[i]) or 0
  w, padded = loop_width(n, p.simd)
  if not n or n / padded * min(1.0, w / p.simd) >= 0.75: return False
  if (width := next((a for a in (2 * p.simd, p.simd) if rows % a == 0), None)) is None: return False
  reduced = prod(const_size(r) or 0 for r in ax if r.arg[1] is AxisKind.REDUCE)
  if reduced < PADDED_LOOP_SUM: return False
  # the read along i, the one to pack: it must not move along the window
  along_i = [u for u in red.src[0].toposort if u.op is Ops.LOAD and ax[i] in u.src[0].src[1].toposort]
  if len(along_i) != 1 or any(ax[g] in along_i[0].src[0].src[1].toposort for g in p.glob if g > i): return False
  # the window's values are broadcast one at a time: a value computed on the way (a relu and bias of the previous layer,
  # fused) is computed again for each, in scalar code. Then only where a loop over the window keeps under a quarter of
  # the lanes busy (3 of a loop of 4): beautiful_mnist in one process, one core, batch 512: a 3x3 dW with a relu fused
  # 67 -> 49 ms, while its 6-wide forward conv went 40 -> 50 and the 5x5 dW (5 of a loop of 8) stayed 316 -> 305
  packed = along_i[0]
  computed = [u for u in red.src[0].toposort if u.op in GroupOp.ALU and dtypes.is_float(u.dtype) and packed not in u.toposort and
              any(x.op is Ops.LOAD for x in u.toposort)]
  if len(computed) > 1 and n / padded * min(1.0, w / p.simd) >= 0.25: return False
  last = p.glob[-1]
  # i to the innermost output loop (the others move up one), its loop of `width` split off there, and what is left of i
  # (64 channels: 2 blocks of 32) moved back out to where i was: the window's loops run inside each block
  there = [Opt(OptOps.SWAP, k, k + 1) for k in range(i, last)]
  back = [Opt(OptOps.SWAP, k - 1, k) for k in range(last, i, -1)]
  trial = Plan.__new__(Plan)
  trial.__dict__.update(p.__dict__, opts=list(p.opts))
  if not trial.first((*there, Opt(OptOps.SIMD, last, width), *back)): return False
  regs = width // p.simd
  # the window written out: j, then the other small axes the packed read doesn't move (a 3x3 window's rows), while the
  # accumulators fit
  read = along_i[0].src[0].src[1].toposort
  for g in [j] + [g for g in reversed(p.glob) if g not in (i, j) and ax[g] not in read and (const_size(ax[g]) or 99) <= 8]:
    if regs * (size := const_size(ax[g]) or 1) <= CHANNEL_TILE_REGISTERS and trial.first(Opt(OptOps.UPCAST, g, size)): regs *= size
  # the tile is the window: a row too wide to write out (a linear layer's 20 outputs by two registers of rows) isn't one
  if regs < CHANNEL_TILE_REGISTERS // 3 or ranges_of(trial.ast, AxisKind.UPCAST) == []: return False
  # packed once per iteration of the innermost output loop the read moves along (a block of channels, a chunk of images)
  moved = [g for g in p.glob if g != i and ax[g] in read] + ([i] if rows > width else [])
  # where no loop outside that one moves the read (a conv's forward or input gradient: the weight is the same for every
  # image), that loop goes outermost, so each block is packed once, not once per image: one core, beautiful_mnist at batch
  # 512, in one process: 3x3 convs 32->64 at 10x10 28 -> 19 ms, 64->64 at 8x8 34 -> 16, 64->64's input gradient 48 -> 37
  k = max(moved, default=0)
  outward = tuple(Opt(OptOps.SWAP, g - 1, g) for g in range(k, 0, -1)) if moved and not any(g < k for g in moved) else ()
  if not moved or not trial.first(*(((*outward, Opt(OptOps.PACK, 0, 0)),) if outward else ()), Opt(OptOps.PACK, k, 0)): return False
  p.ast, p.opts, p.tiled = trial.ast, trial.opts, True
  return True

# rows of a tile whose rows' operand is read across its rows (across_tile), the first that divides them: one and a half or
# one cache line of that operand's floats per step of the sum, each row one vector accumulator
ACROSS_ROWS = (24, 16)
ACROSS_MIN_PANELS = 4  # column blocks (of one register) that reuse each packed row block at least

def across_tile(p: Plan, i: int, j: int, red: UOp, contiguous_j: bool) -> bool:
  """A weight gradient dW = X^T @ dY (summed over tokens): both operands are read across their rows, a new row of each
  every step of the sum, X contiguous along the tile's rows i. Its rows are packed (PACK along i) once per block of them,
  which every column block then reads contiguously, and a row block is a whole cache line of X (16 or 24 rows, by one
  register of columns): 8 rows by 32 columns read each line of X half, from a page 2 KiB away each step, once per column
  block. Only where the column operand is read in place (k x width under PACK_MIN_PANELS; a wider one gets its panels
  packed instead, pack_panels) and with AVX-512's 32 registers (the 24 accumulators of 24 rows; unmeasured on AVX2).
  One core, in one process, interleaved (GPT d=128's weight gradients over 1024 / 2048 tokens): (1024, 512)^T @ (1024,
  128) 5.8 -> 4.0 ms as 16 by 16 (8 by 32 packed 4.7), (2048, 384)^T @ (2048, 128) 3.3 -> 2.5 as 24 by 16 (16 by 16 2.9)."""
  ax = p.ax
  n, rows = const_size(ax[j]) or 0, const_size(ax[i]) or 0
  reduced = prod(const_size(r) or 0 for r in ax if r.arg[1] is AxisKind.REDUCE)
  if p.simd < 16 or not contiguous_j or n % p.simd or n // p.simd < ACROSS_MIN_PANELS or reduced * n >= PACK_MIN_PANELS: return False
  # and only where the two operands outgrow what L2 keeps (ROWS_IN_L2): where they fit, the plain tile (a SIMD loop of 32 by
  # 8 rows, widest_tile) reads both from L2 unpacked, and packing is work it doesn't repay. One core, AVX-512, under load,
  # each A/B in one process (1024 tokens: a d=64 model's): (1024, 256)^T @ (1024, 64) 0.39 -> 0.34 ms, (1024, 64)^T @
  # (1024, 256) 0.54 -> 0.37 (min of 41), (1024, 192)^T @ (1024, 64) 0.26 -> 0.20; the small transformer's step, kernels in
  # order, 16.9 -> 16.3 ms; (2048, 128)^T @ (2048, 128) 1.6 -> 1.2 (median). Past it the tile stays: (2048, 384)^T @ (2048,
  # 128) plain 1.11-1.2x slower, (1024, 512)^T @ (1024, 128) 1.4x
  if (rows + n) * reduced <= ROWS_IN_L2: return False
  inner = max((r for r in ax if r.arg[1] is AxisKind.REDUCE), key=lambda r: r.arg)
  rows_read = [u.src[0].src[1] for u in red.src[0].toposort if u.op is Ops.LOAD and ax[j] not in u.src[0].src[1].toposort]
  if len(rows_read) != 1 or not (inner in rows_read[0].toposort and not unit_stride(rows_read[0], inner) and unit_stride(rows_read[0], ax[i])):
    return False
  if (r := largest(rows, ACROSS_ROWS)) is None or r > CHANNEL_TILE_REGISTERS or r * reduced > PACK_MAX: return False
  if not p.first((Opt(OptOps.SIMD, j, p.simd), Opt(OptOps.UPCAST, i, r), Opt(OptOps.PACK, i, 0))): return False
  p.tiled = True
  return True

def small_window_tile(p: Plan, i: int, j: int, loads: list[list[UOp]], contiguous_j: bool) -> None:
  """A small output window (a conv's weight gradient is 3x3 per channel pair): every small axis that an input doesn't
  read along is written out whole, so each value loaded (and whatever is fused into it, a relu's gradient) feeds all of
  the window. Where the reads along the window's contiguous axis are contiguous, that axis (3 wide, padded to 4) is a
  SIMD loop of 4 by the other window axis and 8 rows: 24 vector accumulators, where written out gcc kept 36 scalar
  ones (one core, AVX-512, batch 512: 64->64 channels at 8x8 178 -> 85 ms, 32->64 at 10x10 112 -> 57, with the
  relu's gradient fused); else scalar accumulators, fewer of the other axis (measured: 4 x 3x3)."""
  ax = p.ax
  n = const_size(ax[j]) or 0
  if contiguous_j and n >= 3 and p.first(((Opt(OptOps.PADTO, j, 4),) if n != 4 else ()) + (Opt(OptOps.SIMD, j, 4),)):
    for g in p.glob:
      if g != j and (const_size(ax[g]) or 99) <= 4 and any(ax[g] not in ld for ld in loads): p.first(Opt(OptOps.UPCAST, g, const_size(ax[g])))
    p.first(*(Opt(OptOps.UPCAST, i, a) for a in dividing(const_size(ax[i]), (8, 4, 2))))
    return
  for g in p.glob:
    if (const_size(ax[g]) or 99) <= 4 and any(ax[g] not in ld for ld in loads): p.first(Opt(OptOps.UPCAST, g, const_size(ax[g])))
  # and 2 partial sums along the innermost reduce axis (the image's rows) where it splits, in place of half the
  # other axis: twice the independent adds per loaded value (conv1's 26-wide weight gradient, measured 1.45x)
  inner = max((k for k, r in enumerate(ax) if r.arg[1] is AxisKind.REDUCE), default=None)
  if inner is not None and (const_size(ax[inner]) or 0) % 2 == 0: p.first(Opt(OptOps.UPCAST, inner, 2))
  tile_rows(p, i, min(36, TILE_REGISTERS * p.simd))

# ops computed from a tile's sums that send it to a SIMD loop first (widest_tile). Written out, a compare or select
# after the sums (a relu, a hardswish, a clip) or a division leaves gcc's copies of the whole tile scalar, its
# accumulators in memory: one core, AVX-512, the tile written out vs a SIMD loop of 16 by 8 rows, in one process:
#   1024^3 matmul + relu 5.0 -> 93 GFLOPS; 512^3 + relu 4.3 -> 69; 1x1 conv 64->128 at 24x80 + relu 4.6 -> 77,
#   + hardswish 4.9 -> 102; PP-OCR cls's 1x1 convs + hardswish (16->104, 32->200 channels at 6x48) 4-6 -> 36-55;
#   5x5 conv 32->32 at 24x24 (batch 32) + relu 5.6 -> 52 (its 20 wide rows padded to 32)
# while a bias add (loads, adds, multiplies) stays vectorized written out: 1024^3 + bias 106 written, 88 looped (a loop of
# 16; one of 32, LOOP_TILES, is as fast as written out)
# a loop two registers wide whose reads are gated along the width (masked loads: a padded conv's input) ran 2.5-3.5x
# slower than a loop of one register once the inputs one row of outputs sums over (the reduce's size x the width, 4
# bytes each) outgrew this, and a row is more than one step of the wide loop (AMD Zen 5, AVX-512, 48 KiB L1d, 1 MiB
# L2; one core, 3x3 convs padded by 1, + relu, 8 rows of output channels, loop of 32 -> 16): 96 -> 24 channels at
# 160x160 (PP-OCR det's head, 553 KB) 23.8 -> 10.3 ms, 48 -> 48 at 160x160 23.9 -> 7.5, 64 -> 64 at 128x128 27.3 ->
# 10.4, 32 -> 32 at 256x256 22.6 -> 8.2, 128 -> 64 at 64x64 11.9 -> 4.0, 96 -> 24 at 64x64 (221 KB) 3.1 -> 0.95.
# Under it the wide loop stays: 64 -> 64 at 64x64 (147 KB) 1.34 vs 1.72 ms, 32 -> 32 at 128x128 (147 KB) even; a row
# of one wide step too (192 -> 32 at 32x32, 0.47 vs 0.63). Not the gate alone: unpadded (no gate), 96 -> 24 at 160x160
# ran 8.5 ms in the wide loop, 12.3 in the narrow one; nor a small window's sum (PP-OCR det's 2x2 transposed conv of 12
# channels at 320 wide, 61 KB, 0.82 vs 0.89 ms)
GATED_WIDE_BYTES = 192 << 10
# and such a loop of one register (AVX-512's 16 floats) takes up to 24 rows (CHANNEL_TILE_REGISTERS accumulators), the
# first of these that divides them, where 8 rows were the default: each masked input load feeds 24 multiply-adds, and
# the input is read once per 24 output channels. One core, Zen 5, 3x3 convs 96 -> 24 channels padded by 1 (PP-OCR det's
# head, min of 25 under load, 8 -> 24 rows): at 160x160 6.8 -> 5.3 ms (12 rows 5.8), at 80x80 1.9 -> 1.27, at 40x40
# (padded to 48 wide) 0.44 -> 0.41
GATED_ROWS = (24, 16, 12)

LOOPED_EPILOGUE = GroupOp.Transcendental | {Ops.WHERE, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.FDIV, Ops.RECIP, Ops.SQRT}

def epilogue(ast: UOp, red: UOp) -> list[UOp]:
  """What the kernel computes from the reduce's result (in topological order, so one pass finds every user)."""
  after = {red}
  for u in ast.toposort:
    if u not in after and any(s in after for s in u.src): after.add(u)
  return [u for u in after if u is not red]

def vector_pieces(w: int, simd: int) -> int:
  """The vectors a row of w written-out floats takes once the C compiler's SLP vectorizer packs it: whole registers, then
  one of each smaller power of two (18 floats with AVX-512: 16 + 2; 10: 8 + 2)."""
  return w // simd + bin(w % simd).count("1")

# vectors of accumulators (vector_pieces a row) a written-out tile of a width no vector divides holds at most. gcc's
# time grows with them, about 7 ms each (the SLP vectorizer's and the induction-variable passes' work on the written-out
# body), and the kernel ran no faster with more: one core, AVX-512, gcc 12, cold, (4096, 384) @ (90, 384)^T + b, tile
# (width x rows: vectors) -> lower + compile ms, run ms: 10x6 (12) 26 + 140, 4.87; 10x4 (8) 13 + 85, 6.65; 18x4 (8)
# 24 + 104, 4.53; 18x3 (6) 20 + 76, 4.68; 18x2 (4) 15 + 67, 4.57; 30x1 (4) 11 + 64, 4.87; 6x8 (16) 16 + 226, 8.1
ODD_TILE_REGISTERS = 4

def odd_widths(width: int, simd: int) -> tuple[int, ...]:
  """A strided tile's written-out widths for a width no 8-float vector divides (a vocabulary of 90): its divisors from 4
  to two registers and a bit (2 * simd + 2), most floats per vector piece first (vector_pieces; of equals, the wider):
  the multiply-adds per output fall with it. 90 with AVX-512: 18 (9 a piece), 30 (7.5), 10 (5), 9, 15, 6, 5. One core,
  (4096, 384) @ (90, 384)^T + b at 4 vectors of accumulators: 18x2 4.57 ms, 30x1 4.87, 10x2 6.88, 9x4 (8) 8.64."""
  if width % 8 == 0: return ()
  ws = [w for w in range(4, min(width, 2 * simd + 2) + 1) if width % w == 0]
  return tuple(sorted(ws, key=lambda w: (-w / vector_pieces(w, simd), -w)))

def widest_tile(p: Plan, i: int, j: int, red: UOp, contiguous_j: bool = True) -> None:
  """A SIMD loop over the width where one divides it (LOOP_TILES), with its rows. Else the first width written out whose
  tile (with its rows) holds FULL_TILE accumulators, else the tile holding most: a
  costly value computed from the tile's sums (a GELU's gradient, ~100 nodes) written out for each of a 16x6 tile's
  outputs is over the budget, and a SIMD loop over the width keeps 6 of it. A transcendental, compare, select or division
  computed from them (LOOPED_EPILOGUE) goes in a SIMD loop first: written out, gcc leaves its copies scalar (32x4 tile
  with a GELU's gradient after it, 4.9 ms; a SIMD loop of 16 by 8 rows, 0.69)."""
  width = const_size(p.ax[j])
  reduced = prod(const_size(r) or 0 for r in p.ax if r.arg[1] is AxisKind.REDUCE)
  written = [Opt(OptOps.UPCAST, j, a) for a in dividing(width, tuple(dict.fromkeys((2 * p.simd, 16, 32, 8))))]
  widths = (2 * p.simd, 16, 8) if LOOP_TILES else (16, 8)
  # reads gated along the width (a padded conv's input) over a wide window of sums: a loop of one register first (AVX-512,
  # where it was measured)
  gated = any(p.ax[j] in g for g in p.gates)
  if gated and p.simd >= 16 and (width or 0) > 2 * p.simd and reduced * (width or 0) * 4 > GATED_WIDE_BYTES:
    widths = (p.simd, *widths)
  looped: list[Opt | tuple[Opt, ...]] = [Opt(OptOps.SIMD, j, a) for a in dividing(width, tuple(dict.fromkeys(widths)))]
  # a width neither divides is padded for the loop: a 5x5 conv's 20 to 16s (32, with a relu after it: 52 GFLOPS,
  # written out 5.6), a 3x3 conv's 6 to 8 (64 -> 64 channels at 8x8 with a relu: 1.3 GFLOPS with no tile, 44 in a loop
  # of 8 by 8 rows)
  # (the loop's width by loop_width: padded to two registers, 20 -> 32, where that keeps more lanes busy than a narrower loop)
  a, to = loop_width(width or 0, p.simd)
  padded = [(Opt(OptOps.PADTO, j, to), Opt(OptOps.SIMD, j, a))] if not looped and width is not None and width > 4 else []
  # a width only a loop narrower than a register divides (24: 8s) is padded where that keeps more lanes busy (24 -> 32),
  # if each output sums enough for the multiply-adds to outweigh its store, gated once padded: a 5x5 conv's input gradient
  # (800 a sum) 101 -> 71 ms at batch 128, while the first 5x5 conv of one channel (25 a sum) went 2.8 -> 5.5
  if looped and contiguous_j and width is not None and a != looped[0].amount and to != width and reduced >= PADDED_LOOP_SUM:
    looped = [(Opt(OptOps.PADTO, j, to), Opt(OptOps.SIMD, j, a)), *looped]
  # a width written out that is no whole number of 8-float vectors (12, 10, 9) only where no loop can take it: gcc leaves
  # such copies mostly scalar, bias add or not (one core, AVX-512, written out vs padded to a SIMD loop of 16 by 8 rows:
  # 5x5 conv 32->32 at 24x24 4.6 -> 84 GFLOPS; 3x3 64->64 at 12x12 7.9 -> 101, at 14x14 9.2 -> 78; (4096,512) @ (512,N)
  # + bias: N=20 20 -> 63, N=36 27 -> 75, N=12 4.6 -> 56). Not where the reads along the width are strided (x @ w.T):
  # there the written-out copies get their panels packed, a loop gathers (a (1024, 64) @ (64, 90) head 0.60 -> 4.05 ms)
  # strided, a width no vector divides is written out in the width of its divisors whose rows the C compiler's SLP
  # vectorizer packs best (odd_widths), with rows up to ODD_TILE_REGISTERS of its vectors
  odd = odd_widths(width or 0, p.simd) if not contiguous_j else ()
  if not contiguous_j or (not looped and not padded): written += [Opt(OptOps.UPCAST, j, a) for a in (odd or dividing(width, (12, 10, 9, 4)))]
  best: tuple[int, UOp, list[Opt]] = (0, p.ast, p.opts)
  # reads gated along the width (a conv padded along it) are a select per written-out copy, masked loads in the loop:
  # PP-OCR rec's 1x3 conv, 960 -> 60 channels at 1x40, 4.0 GFLOPS written out (10 by 6 rows), 42 as a loop of 8
  if (LOOP_TILES and looped) or any(u.op in LOOPED_EPILOGUE for u in epilogue(p.ast, red)) or any(p.ax[j] in g for g in p.gates):
    # the first loop the kernel takes, even with fewer accumulators than a written-out tile (40 wide, 60 rows: 8 by 6)
    choices, enough = [*looped, *padded, *written], 1
  # else the padded loop only where no width is written out (no tile at all ran the 3x3 conv above at 1.3 GFLOPS)
  else: choices, enough = [*written, *looped, *(padded if not written else [])], FULL_TILE * p.simd
  for choice in choices:
    trial = Plan.__new__(Plan)
    trial.__dict__.update(p.__dict__, opts=list(p.opts))
    if not trial.first(choice): continue
    # a padded conv's loop of one AVX-512 register: rows up to CHANNEL_TILE_REGISTERS (GATED_ROWS)
    one = p.simd >= 16 and gated and any(o.op is OptOps.SIMD and o.amount == p.simd for o in (choice if isinstance(choice, tuple) else (choice,)))
    w = choice.amount if isinstance(choice, Opt) and choice.op is OptOps.UPCAST else 0
    cap = ODD_TILE_REGISTERS * w // vector_pieces(w, p.simd) if w in odd else (CHANNEL_TILE_REGISTERS if one else TILE_REGISTERS) * p.simd
    tile_rows(trial, i, cap, GATED_ROWS if one else ())
    if copies(trial.ast) > best[0]: best = (copies(trial.ast), trial.ast, trial.opts)
    if best[0] >= enough: break
  p.ast, p.opts = best[1], best[2]

L1_BYTES = 48 << 10  # a core's L1 data cache (the development machine's: Sapphire Rapids)
# rows of a one-register panel's tile, the first that divides the rows and fits L1 with the panel: 12 (16 rows fill L1
# at k = 384 with the panel: 69 GFLOPS where 12 ran 78 on (768, 384) @ (384, 384)^T), else 16 (BERT's other packed row
# counts, 640, 896, 1024: at 896, one core, interleaved, (896, 384) @ (384, 384)^T 4.84 -> 4.06 ms, @ (384, 1152)^T 9.28
# -> 8.51, @ (384, 1536)^T + GELU 13.99 -> 13.91, least of 25); 8 leave too few accumulators
L1_PANEL_ROWS = (12, 16)

def l1_panel_tile(p: Plan, i: int, j: int, contiguous_j: bool) -> bool:
  """A tile whose column panels are packed (pack_panels: strided, x @ w.T, or big) streams its panel (k x width) once
  per block of rows, with the block's k x rows of the rows' operand beside it: where the two fit L1, each row block
  reads the panel from L1, else from L2. A panel two registers wide (widest_tile's first) that doesn't fit with its
  rows where a panel one register wide does (k = 384: 48 KiB, all of L1, against 24 KiB and 12 rows' 18 KiB) is
  one register wide, by 12 or 16 rows (L1_PANEL_ROWS). One core, AVX-512, BERT MiniLM's 768 packed tokens, x @ w.T + b, each kernel's least
  time in the encode step's order (bench/step_ab.py --model bert, L1_BYTES=0 against this), in one process under load:
  (768, 384) @ (384, 384)^T 16.0 -> 14.8 ms over 6 layers, @ (384, 1152)^T 51.8 -> 47.7, @ (384, 1536)^T with a GELU
  72.7 -> 68.9; the step 0.96x. Alone, interleaved with torch: (768, 384) @ (384, 384)^T 3.9 -> 2.9 ms (torch 2.9).
  A panel no width fits with its rows (k = 1536; GPT d=128's k = 512) keeps widest_tile's, as AVX2 (unmeasured)."""
  ax = p.ax
  width, rows = const_size(ax[j]) or 0, const_size(ax[i]) or 0
  reduced = prod(const_size(r) or 0 for r in ax if r.arg[1] is AxisKind.REDUCE)
  packed = not contiguous_j or (rows >= PACK_MIN_ROWS and reduced * width >= PACK_MIN_PANELS)
  if p.simd < 16 or not packed or width % (2 * p.simd) or reduced * (2 * p.simd + FULL_TILE) * 4 <= L1_BYTES: return False
  # (not where the rows outgrow L2, cut in row blocks (row_blocks), whose tiles were measured two registers wide: a d=384
  # transformer's 4096 tokens, which 16 divides, unmeasured here)
  if rows * reduced > ROWS_IN_L2: return False
  if (r := next((r for r in L1_PANEL_ROWS if rows % r == 0 and reduced * (p.simd + r) * 4 <= L1_BYTES), None)) is None: return False
  return p.first((Opt(OptOps.SIMD, j, p.simd), Opt(OptOps.UPCAST, i, r)))

def pack_panels(p: Plan, i: int, j: int, red: UOp, reduced: int) -> None:
  """A big or strided tile: the loop over column panels goes outside the rows loop, and each panel (k rows of the tile's
  width) is packed once, so every row block streams it contiguously from cache: a big matmul's panel would fall out of
  it, and a strided one (x @ w.T reads w along its rows) would be read a value at a time (35 -> 50 GFLOPS on one core).
  Unless the rows' operand is read across its rows (transposed: each step of the sum a new cache line per row) and too
  big for the cache to hold between panels: then each row block packs its panels (a weight gradient summed over 4096
  tokens, 1152 x 4096 floats: 24 -> 44 GFLOPS; a row-major 2048^3 operand wants the swap, 18 -> 52)."""
  ax = p.ax
  inner = max((r for r in ax if r.arg[1] is AxisKind.REDUCE), key=lambda r: r.arg)
  rows_read = [u.src[0].src[1] for u in red.src[0].toposort if u.op is Ops.LOAD and ax[j] not in u.src[0].src[1].toposort]
  across = any(inner in ix.toposort and not unit_stride(ix, inner) for ix in rows_read)
  # and outside the row axes around the rows' own that the packed panel doesn't vary along (rows split as (sentence,
  # token) by a reshape that doesn't merge, an attention output's projection): inside them, each sentence's 16 rows
  # re-packed every panel (one core, 64 x 16 tokens @ 384x384: 11 -> 51 GFLOPS)
  panel = [u.src[0].src[1].toposort for u in red.src[0].toposort if u.op is Ops.LOAD and ax[j] in u.src[0].src[1].toposort]
  outer = i
  while outer > 0 and all(ax[outer - 1] not in ix for ix in panel): outer -= 1
  fits = lambda k: not across or prod(const_size(ax[x]) or 0 for x in range(k, i + 1)) * reduced <= SWAP_MAX_ROWS
  outer = next(k for k in range(outer, i + 1) if fits(k) or k == i)
  if not fits(i):
    p.first(Opt(OptOps.PACK, i, 0))
    return
  # SWAPs exchange neighbouring loops: the panels' loop moves out one row axis at a time
  swaps = (Opt(OptOps.SWAP, i, j), *(Opt(OptOps.SWAP, k - 1, k) for k in range(i, outer, -1)))
  # the rows' outermost axis after the swaps: the first row axis around the rows' own (moved in by one), else the tile's
  # rows, which the first swap left at j
  # (and the panels' axis, now where the outermost of them was)
  if p.first((*swaps, Opt(OptOps.PACK, outer, 0))): k, panels = (outer + 1 if outer < i else j), outer
  elif p.first((swaps[0], Opt(OptOps.PACK, i, 0))): k, panels = j, i
  else: p.first(swaps[0]); return
  if (const_size(axes(p.ast)[panels]) or 0) >= ROW_BLOCK_MIN_PANELS: row_blocks(p, k, prod(const_size(ax[x]) or 0 for x in range(outer, i + 1)), reduced)

# elements of a matmul's rows operand (rows x k) a core's L2 (2 MiB) keeps while every column panel reads it, and the
# row block's elements at most it is cut to above that (1.25 MiB: the rest of L2 for the panels streaming through)
ROWS_IN_L2, ROW_BLOCK = 1 << 19, 5 << 16
# rows of a block at least: each block packs every panel again (k x width). One core, 4096 rows, in one process:
# (4096, 1536) @ (1536, 384)^T, whose pack transposes, 49 ms as it was, 64 in 16 blocks of 256 rows, 85 in 32 of 128
ROW_BLOCK_MIN_ROWS = 256
# column panels at least: a few read the rows a few times, which L3 streams (GPT d=128's (2048, 512) @ (512, 128)^T, 4
# panels: 4.5 ms, 4.7 in 4 blocks)
ROW_BLOCK_MIN_PANELS = 8

def row_block_count(rows: int, reduced: int, size: int, threads: int) -> int | None:
  """The blocks a matmul's rows (an axis of `size` iterations) are cut in when its panels are packed outside them
  (row_blocks), or None: the rows operand fits L2 whole, or a block that fits has too few rows."""
  if rows * reduced <= ROWS_IN_L2: return None
  least = 4 * threads if threads > 1 else 1
  n = next((n for n in range(least, size + 1) if size % n == 0 and n % threads == 0 and rows // n * reduced <= ROW_BLOCK), None)
  return n if n is not None and rows // n >= ROW_BLOCK_MIN_ROWS else None

def row_blocks(p: Plan, k: int, rows: int, reduced: int) -> None:
  """Panels outside the rows (pack_panels) read the whole rows operand once per panel: one past L2 comes from L3 each
  time. The rows are cut in blocks (THREAD on their outermost axis k: a block is one slice with all the panels inside
  it) that L2 keeps across the panels, every block packing the panels again. The slices are also
  what the cores share: each core its own rows in its own L2, where split by panels both cores streamed all the rows.
  One core, in one process, 4096 rows (a d=384 transformer's linear layers): x @ w.T + b, (4096, 384) @ (384, 1536)
  70 -> 54 ms in 8 blocks of 512 rows, @ (384, 1152) 51 -> 39, @ (384, 384) 20.0 -> 13.1; (4096, 768) @ (768, 384)^T
  48 -> 44 in 16 blocks."""
  if (size := const_size(axes(p.ast)[k])) is not None and (n := row_block_count(rows, reduced, size, p.threads)) is not None:
    p.first(Opt(OptOps.THREAD, k, n))

def unroll_small_windows(p: Plan) -> None:
  """Conv's 3x3, a pool's 2x2: a small innermost reduce window is written out, unless reads along it are gated (a conv's
  input gradient, padded): then each copy tests its own gate, measured slower than the loop. Written out, a pool's
  window leaves a plain loop over its outputs that gcc vectorizes (measured 5x). (Only a reduce with no reduce inside
  it: written-out copies of a loop around another loop are not lowered.)"""
  ax = p.ax
  innermost = {ax.index(r) for red in p.reds if not any(u.op is Ops.REDUCE for u in red.src[0].toposort) for r in red.src[1:] if r in ax}
  for k, r in reversed(list(enumerate(axes(p.ast)))):
    if k in innermost and r.arg[1] is AxisKind.REDUCE and (const_size(r) or 99) <= 4 and not any(ax[k] in g for g in p.gates):
      p.first(Opt(OptOps.UNROLL, k, const_size(r)))

WINDOW = 64  # iterations of a sum small enough to be a window (a depthwise conv's 5x5), not a matmul's reduce
WINDOW_REGISTERS = 4  # registers of accumulators a depthwise conv's SIMD loop keeps (window_loop)
LONG_WINDOW = 16  # taps of a window from which a loop of a whole register gets rows too (window_loop)

def window_loop(p: Plan) -> None:
  """A depthwise conv (each output sums a small window of its own channel, so no input is re-read along another output
  axis and no register tile pays): the output's contiguous axis is a SIMD loop inside the window's loops, one
  accumulator per lane, where every read along it is contiguous. Scalar, each output was one chain of dependent adds
  with a gate per read; in the loop the gates are masked vector loads. PP-OCR cls's 5x5 depthwise convs (one core,
  AVX-512): 104 channels at 2x96, 2.5 -> 21 GFLOPS; 88 at 3x96, 5.5 -> 47 (a loop of 32; written-out copies 8.4)."""
  if p.tiled or len(p.reds) != 1 or p.reds[0].arg is not Ops.ADD or not dtypes.is_float(p.reds[0].dtype) or not p.glob: return
  red, cur = p.reds[0], axes(p.ast)
  window = [const_size(r) for r in red.src[1:] if r.arg[1] is AxisKind.REDUCE]
  if not window or None in window or prod(window) > WINDOW: return
  j = p.glob[-1]
  reads = [u.src[0].src[1] for u in red.src[0].toposort if u.op is Ops.LOAD]
  stores = [u.src[0].src[1] for u in p.ast.toposort if u.op is Ops.STORE]
  along = [ix for ix in reads + stores if cur[j] in ix.toposort]
  if not along or not all(unit_stride(ix, cur[j]) for ix in along): return
  # a window slides along j: a read steps along the innermost window axis as it does along j (not a column sum, x.sum(0),
  # which column_sum writes out); and its loop is still there: an ungated 3x3 window unroll_small_windows wrote out
  # vectorizes as it is (3x3 on 24x64: 66 us; with a SIMD loop of 32 too, 84); a loop of 8 gained nothing (3x3, 40 wide)
  inner = max((r for r in red.src[1:] if r.arg[1] is AxisKind.REDUCE), key=lambda r: r.arg)
  if inner not in cur or not any(cur[j] in ix.toposort and unit_stride(ix, inner) for ix in reads): return
  widths = dividing(const_size(cur[j]), (32, 16, 8, 4))
  # a long window's loop (LONG_WINDOW) one register wide with rows where two registers take none (3 rows of 32 lanes are
  # over WINDOW_REGISTERS): more chains in flight. PP-OCR cls's 5x5 depthwise convs at 3x96 (AVX-512, one core, min of 41,
  # a loop of 32 -> 16 by 3 rows): 88 channels 34 -> 29 us, 48 26 -> 23, 32 22 -> 21
  if len(p.glob) >= 2 and p.simd >= 16 and prod(window) >= LONG_WINDOW and widths and widths[0] > p.simd:
    fit = lambda a: [r for r in dividing(const_size(cur[p.glob[-2]]), (4, 3, 2)) if a * r <= WINDOW_REGISTERS * p.simd]
    if not fit(widths[0]) and p.simd in widths and fit(p.simd): widths = (p.simd, *widths)
  if not p.first(*(Opt(OptOps.SIMD, j, a) for a in widths)): return
  p.tiled = True
  # the loop gets rows too, for as many accumulators in flight: one row's is one chain of multiply-adds (a 5x5 window's 25
  # dependent ones a vector), up to WINDOW_REGISTERS registers of them. A narrow loop (a width only 8 or 4 divides: PP-OCR
  # det's 5x5 depthwise convs at 40x40 and 20x20), one core: 192 channels at 40x40 12.5 -> 1.3-1.5 ms as 8 by 4 rows (8
  # alone 2.2; padded to 48 in loops of 16, 3.3), 384 at 20x20 3.3-5.9 -> 1.0 as 4 by 4 rows (padded to 32 in loops of 16
  # by 2 rows, 1.5). A loop of a whole register or more only for a long window (LONG_WINDOW taps: a 5x5), AVX-512, kernels
  # alone in turn: rec's 5x5 240 channels at 12x80 0.56 -> 0.41 as 16 by 4 rows, 480 at 6x80 0.54 -> 0.39 by 3, 480 at
  # 3x80 0.28 -> 0.20 by 3, det's 96 at 80x80 1.53 -> 1.01 by 4; a 3x3's chain is short, and gcc's code for its rows
  # slower (det's replay, 96 channels at 80x80 as 16 by 4 rows: +3.8 ms; 16 at 320x320 as 32 by 2: +0.8)
  if len(p.glob) >= 2 and ((lanes := p.opts[-1].amount) < 16 or prod(window) >= LONG_WINDOW):
    rows = dividing(const_size(cur[p.glob[-2]]), (4, 3, 2))
    p.first(*(Opt(OptOps.UPCAST, p.glob[-2], a) for a in rows if lanes * a <= WINDOW_REGISTERS * p.simd))

def reduce_accumulators(p: Plan) -> None:
  """Any other float sum or max: independent accumulators, so the adds don't wait on each other."""
  if p.tiled: return
  for red in p.reds:
    if not (red.arg in (Ops.ADD, Ops.MAX) and dtypes.is_float(red.dtype)): continue
    if column_sum(p, red): continue
    # partial accumulators: 16 (a SIMD register) from the innermost reduce axis when they divide it; else factors of the
    # axes from the innermost outward, up to 8 (a conv's bias gradient over batch x 26 x 26: 2x2x2, measured 7x). A max
    # that keeps NaN is a compare, a test and a select per step, twice an add's latency: 32 of them keep two registers'
    # chains in flight (row max of (4096, 1024): 0.35 -> 0.27 ms)
    rs = [p.ax.index(r) for r in sorted((r for r in red.src[1:] if r.arg[1] is AxisKind.REDUCE), key=lambda r: r.arg, reverse=True)]
    size = const_size(axes(p.ast)[rs[0]]) if rs else None
    if rs and (a := largest(size, (32, 16, 8, 4) if red.arg is Ops.MAX else (16, 8, 4))) is not None:
      p.first(Opt(OptOps.UPCAST, rs[0], a)); continue
    # a length that 4 doesn't divide (a vocabulary of 90) is padded to 16s, the padding the reduce's identity: 16 lanes
    # and a few masked ones beat 2 lanes (cross-entropy's row max of (1024, 90): 200 -> 21 us, the sum 44 -> 10)
    if size is not None and size >= 32 and p.first((Opt(OptOps.PADTO, rs[0], 16), Opt(OptOps.UPCAST, rs[0], 16))): continue
    lanes = 1
    for k in rs:
      if (a := largest(const_size(axes(p.ast)[k]), tuple(a for a in (8, 4, 2) if lanes * a <= 8))) is None: continue
      if p.first(Opt(OptOps.UPCAST, k, a)): lanes *= a

WIDE_COLUMN_SUM = 1 << 20  # elements summed from which a column sum's row is written out 128 wide (else at most 64)

def column_sum(p: Plan, red: UOp) -> bool:
  """Reads contiguous along an output axis, not along the reduce (a column sum, x.sum(0) of a row-major matrix): a row
  of outputs is written out, up to 128 wide (as many independent accumulators, each row read is a contiguous run),
  leaving a slice of it per core; partial sums along the reduce would read one float per cache line (sum(0) of
  (4096, 1024): 14.4 -> 0.24 ms, torch 0.66). True if it chose the row."""
  cur = axes(p.ast)
  reads = [u.src[0].src[1] for u in red.src[0].toposort if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.PARAM]
  inner = max((r for r in red.src[1:] if r.arg[1] is AxisKind.REDUCE), key=lambda r: r.arg, default=None)
  # the reads summed (that vary along the reduce): a per-channel parameter read next to them (a batchnorm's scale in a
  # max-pool's window) is contiguous along its channels, and took a pool's argmax for a column sum (32 copies of its
  # nested window reduces, 114 ms)
  reads = [i for i in reads if inner is not None and inner in i.toposort]
  along = [k for k, r in enumerate(cur) if r.arg[1] is AxisKind.GLOBAL and any(unit_stride(i, r) for i in reads)]
  # (reads that don't vary along the row, a layernorm's per-token statistics in its weight's gradient, are one value
  # for all of it)
  # (a sum written out whole, a few partial sums' combination, (4, n).sum(0), has no loop left to keep accumulators for:
  # 128 written-out columns of it were 3861 uops, 360 ms to lower and 810 ms of gcc, for a loop gcc vectorizes as it is)
  if not along or inner is None or all(const_size(r) == 1 for r in cur if r.arg[1] is AxisKind.REDUCE): return False
  if any(unit_stride(i, inner) for i in reads if cur[along[-1]] in i.toposort): return False
  size = const_size(cur[along[-1]]) or 0
  # 128 wide only where the sum is big: written out, 128 columns were ~2000 uops, 100-170 ms of lowering and 170-430 ms of
  # gcc, 64 half that; one core: sum(0) of (4096, 1024) 269 us at 128, 297 at 64; of a small transformer's (1024, 192)
  # bias gradient 9.2 and 8.6 us, of (8, 65536) 24.0 and 24.5
  widths = [w for w in (128, 64, 32, 16, 8) if size % w == 0 and (w < 128 or p.work >= WIDE_COLUMN_SUM)]
  if (w := next((w for w in widths if size // w >= p.threads), widths[0] if widths else None)) is None: return False
  # the row as SIMD loops of a register's width, written out w / simd times: as fast as w scalar columns written out (which
  # gcc packs back into vectors), a tenth of the code: (1024, 192).sum(0) 64 wide, 1043 -> 90 uops, 62 -> 6 ms lowering,
  # 175 -> 57 ms gcc (under load), 13.6 / 13.0 us a core
  def row(x: int) -> Opt | tuple[Opt, ...]:
    if x <= p.simd or x % p.simd: return Opt(OptOps.UPCAST, along[-1], x)
    return (Opt(OptOps.SIMD, along[-1], p.simd), Opt(OptOps.UPCAST, along[-1], x // p.simd))
  # narrower where a costly value summed (a GELU's gradient) would write out too much; then a SIMD loop
  return p.first(*(row(x) for x in widths if x <= w), *(Opt(OptOps.SIMD, along[-1], x) for x in (16, 8) if size % x == 0))

REDUCE_LANES = 16  # partial accumulators reduce_accumulators gives a float sum at most

def divided_axes(p: Plan) -> None:
  """An output axis that an index divides (a pool's gradient reads pooled[x//2]): written out in steps of the divisor,
  each copy's index is a constant offset, and the loop over the rest vectorizes (measured 5x on a pool's gradient).
  Not the innermost output loop where it vectorizes as it is (whole vector steps, or long enough for split_loop to cut
  them off) and the loop left once written out would not (a 20-wide row's 10, which gcc leaves scalar):
  beautiful_mnist's pool gradient (fused with its batchnorm's and relu's, 512x32x20x20), one core, in one process:
  39.4 ms written out along both, 12.1 along the rows only (15.9 neither)."""
  if p.tiled: return
  cur = axes(p.ast)
  divs = sorted({(cur.index(u.src[0]), u.src[1].arg) for u in p.ast.toposort if u.op in (Ops.IDIV, Ops.MOD) and u.src[0] in cur
                 and u.src[1].op is Ops.CONST}, reverse=True)
  last = max((k for k, r in enumerate(cur) if r.arg[1] is AxisKind.GLOBAL), default=None)
  vectorizes = lambda n: n % VECTOR_STEP == 0 or n > 2 * VECTOR_STEP  # (split_loop's cut)
  for k, c in divs:
    if not (2 <= c <= 8 and (n := const_size(axes(p.ast)[k]) or 0) % c == 0): continue
    if k == last and vectorizes(n) and not vectorizes(n // c): continue
    if cur[k].arg[1] is AxisKind.GLOBAL and copies(p.ast) * c <= 16: p.first(Opt(OptOps.UPCAST, k, c))
    # a reduce axis the same way, its loop body repeated: a quantized matvec's axis over half-blocks reads the block's
    # scale at r//2 and picks a byte's low or high nibble by r%2, a select per weight; repeated, each copy has its own
    # nibble and the pair one scale (Q4_1 576x1536, one core: 379 -> 254 us)
    elif cur[k].arg[1] is AxisKind.REDUCE and copies(p.ast) * c <= 2 * REDUCE_LANES: p.first(Opt(OptOps.UNROLL, k, c))

MATVEC_ROWS = (4, 2)  # outputs a matrix-vector product computes at once (each its own chain of accumulators)
MATVEC_MAX_COPIES = 128  # written-out lanes (partial sums x rows) at most
MATVEC_MIN_SUM = 128  # terms each output sums, at least
MATVEC_GROUP_COPIES = 1024  # written-out lanes (partial sums x rows) at most for the rows of a layout's group

def matvec_rows(p: Plan) -> None:
  """A matrix-vector product (a decode step's linear layers, over quantized weights decoded in the loop): every output
  sums a long row of the matrix against the same vector. With one output at a time, its partial sums form one chain of
  dependent multiply-adds (through the accumulators' memory) and the loop runs at that chain's latency, not at memory
  speed; several rows at once are independent chains, and each value of the vector loaded serves them all. One core,
  AVX-512, clang, in one process, under load: Q4_1 1536x576 177 -> 119 us at 4 rows. The rows of a group that the
  weights' layout interleaves (nn.quant.split_fields) come together: SmolLM2-135M Q4_1 decode, one thread, 16 rows of a
  group against 4 rows of the GGUF order, a whole token 10.07 -> 6.90 CPU ms (its kernels alone 6.79 -> 5.52: most of
  the gain is the weights streaming from DRAM), 8 rows of the GGUF order 11.35 (more rows, more streams)."""
  # (a long sum: a depthwise conv's 3x3 window reads its weights the same at every pixel too, but sums 9 terms)
  reduced = prod(const_size(r) or 0 for r in p.ax if r.arg[1] is AxisKind.REDUCE)
  if p.tiled or p.work < 1 << 14 or reduced < MATVEC_MIN_SUM: return
  cur = axes(p.ast)
  sums = [r for r in p.ast.toposort if r.op is Ops.REDUCE and r.arg is Ops.ADD and dtypes.is_float(r.dtype)]
  if not sums or copies(p.ast) < 2: return  # (partial sums: reduce_accumulators found the sum along a contiguous row)
  for g in reversed([k for k, r in enumerate(cur) if r.arg[1] is AxisKind.GLOBAL]):
    loads = [u.src[0].src[1].toposort for red in sums for u in red.src[0].toposort if u.op is Ops.LOAD]
    # the vector: a load the row doesn't move; the matrix: one it does (each row its own values)
    if not (any(cur[g] not in ld for ld in loads) and any(cur[g] in ld for ld in loads)): continue
    size = const_size(cur[g]) or 0
    # rows that the matrix's layout interleaves (nn.quant.split_fields: its index divides the row by a constant, the
    # group) come together: then the kernel reads the matrix as one run front to back, which the prefetcher follows
    groups = sorted({u.src[1].arg for ld in loads for u in ld if u.op in (Ops.IDIV, Ops.MOD) and u.src[0] is cur[g] and u.src[1].op is Ops.CONST}, reverse=True)
    p.first(*(Opt(OptOps.UPCAST, g, a) for a in groups if size % a == 0 and copies(p.ast) * a <= MATVEC_GROUP_COPIES),
            *(Opt(OptOps.UPCAST, g, a) for a in MATVEC_ROWS if size % a == 0 and size >= 4 * a and copies(p.ast) * a <= MATVEC_MAX_COPIES))
    # float16 block scales, read once per block and row: converted for the rows of an iteration at once (WIDEN), as
    # vectors, where each row's copy would convert its own scalar (a Q4_1 576x1536 matvec, one core: 36 -> 28-30 us)
    p.first(Opt(OptOps.WIDEN, g, 0))
    return

def transpose_tile(p: Plan) -> None:
  """A copy that transposes (x.T.contiguous(), a permute): the output's innermost loop reads the input across its rows,
  a new cache line each step, and each line is evicted before the next output row reads its neighbour (at a power-of-two
  row length every line falls in the same few cache sets). A 4x4 block written out reads each line 4 times as long:
  one core, (2048, 512) 10.0 -> 3.9 ms, (2048, 128) 0.30 -> 0.13 ms. (8x8 and 16x16 blocks ran at most 1.4x faster
  again, for 200 ms and 1.4 s more of gcc: 64 and 256 copies of the index math)"""
  if p.reds or len(p.glob) < 2: return
  ax, j = p.ax, p.glob[-1]
  loads = [u.src[0].src[1] for u in p.ast.toposort if u.op is Ops.LOAD]
  across = [g for g in p.glob[:-1] for ix in loads if ax[j] in ix.toposort and not unit_stride(ix, ax[j]) and unit_stride(ix, ax[g])]
  if not across: return
  g = across[-1]
  if (const_size(ax[j]) or 0) % 4 == 0 and (const_size(ax[g]) or 0) % 4 == 0: p.first((Opt(OptOps.UPCAST, j, 4), Opt(OptOps.UPCAST, g, 4)))

# float operations of a kernel (kernel_cost) from which it is cut across cores (split_across_cores). A threaded launch
# cost 1.3-5 us more than the kernel run alone, about what a kernel of this many operations takes on one core (the bound
# was 65536 iterations, whatever each did). Under load (8+ processes on the 2 cores) 1 << 21 had looked best for
# PP-OCR cls; on the quiet machine, Zen 5, 2 threads, alternating runs, 1 << 18 against 1 << 21: cls 0.95/0.98 against
# 1.11/1.15 x onnxruntime, rec 0.82/0.84 against 0.88/0.88, SmolLM2 decode 143.6/110.5 against 101.4/103.3 tok/s (its
# quantized matvecs, 1-2.6M operations a token's kernel, went back to one core under 1 << 21)
THREAD_MIN_COST = 1 << 18
TRANSCENDENTAL_COST = 16  # operations a transcendental counts for (exp2, sin: tens of instructions once expanded)

def kernel_cost(ast: UOp) -> int:
  """The kernel's float operations, roughly (of its AST before any Opt): each one in a sum's terms once per iteration of
  the loops that sum's value depends on (its own and the outputs' it reads along: an SE block's sum over 50 channels
  isn't redone for each of the 192 positions it scales), each one after the sums (or in a kernel with none) once per
  output; at least one per iteration. Index arithmetic isn't counted."""
  ax = axes(ast)
  def weight(u: UOp) -> int: return TRANSCENDENTAL_COST if u.op in GroupOp.Transcendental else 1
  def ops(us: list[UOp]) -> int: return sum(weight(u) for u in us if u.op in GroupOp.ALU and dtypes.is_float(u.dtype))
  reds = [u for u in ast.toposort if u.op is Ops.REDUCE]
  inner = {u for red in reds for u in red.src[0].toposort}
  cost = sum(prod(const_size(r) or 1 for r in ax if r in red.toposort) * max(1, ops(red.src[0].toposort)) for red in reds)
  outer = ops([u for u in ast.toposort if u not in inner])
  return cost + prod(const_size(r) or 1 for r in ax if r.arg[1] is not AxisKind.REDUCE) * (outer if reds else max(1, outer))

def split_across_cores(p: Plan) -> None:
  """A big kernel (THREAD_MIN_COST operations or more: below that, a launch on another core costs more than it saves) is cut in 4
  slices per core, which the cores take as they come free (engine/realize.py): on a machine shared with other work, a
  core that another process holds back leaves its slices to the rest. On the outermost axis that splits evenly."""
  if p.threads < 2 or p.cost < THREAD_MIN_COST: return
  counts = (4 * p.threads, p.threads) if p.work >= 1 << 22 else (p.threads,)
  cur = axes(p.ast)
  # not an axis a sum's value doesn't move: each slice would redo that sum for its own share of the outputs (a layernorm's
  # row statistics read by every column: PP-OCR rec's (40, 120) one split in 8 column slices ran 0.07 -> 0.5 ms of CPU)
  sums = [u.src[0].toposort for u in p.ast.toposort if u.op is Ops.REDUCE]
  glob = [(k, const_size(r) or 0) for k, r in enumerate(cur) if r.arg[1] is AxisKind.GLOBAL and all(r in s for s in sums)]
  for k, size in glob:
    if (n := next((n for n in counts if size % n == 0 and size >= n), None)): p.first(Opt(OptOps.THREAD, k, n)); return
  # no axis splits evenly (a tile of 6 rows over 1024: 171 of them): the fewest slices that the cores share within 15%
  # of evenly (9: 5 and 4 a core), where one core did it all
  for k, size in glob:
    # (up to 64 a core: 415 column panels of a vocabulary of 6625 split in 83 slices of 5, where none of 32 or fewer do)
    if (n := next((n for n in range(p.threads + 1, 64 * p.threads + 1) if size % n == 0 and -(-n // p.threads) * p.threads <= 1.15 * n), None)):
      p.first(Opt(OptOps.THREAD, k, n)); return

CPU_STEPS = [("stash_transcendentals", stash_transcendentals), ("register_tile", register_tile), ("unroll_small_windows", unroll_small_windows),
             ("window_loop", window_loop), ("reduce_accumulators", reduce_accumulators), ("divided_axes", divided_axes), ("matvec_rows", matvec_rows), ("transpose_tile", transpose_tile), ("split_across_cores", split_across_cores)]

def cpu_opts(ast: UOp, threads: int, simd: int = 8) -> list[Opt]:
  """The CPU steps' Opts for a kernel split across `threads` cores with vectors of `simd` floats (elementwise loops are
  left to the C compiler's loop vectorizer)."""
  if ranges_of(ast, AxisKind.SERIAL): return flash_opts(ast, threads, simd) if ranges_of(ast, AxisKind.REDUCE) else scatter_opts(ast, threads)
  p = Plan(ast, threads, simd)
  for name, step in CPU_STEPS:
    p.step, before = name, len(p.opts)
    step(p)
    if DEBUG >= 3 and len(p.opts) > before: print(f"  heuristics {name}: {p.opts[before:]}")
  return p.opts

FLASH_LANES = (8, 4)  # partial sums of a score's dot product: a 4 x 8 tile of scores keeps 32 vectors of 8 (16 lanes measured no faster)

def flash_opts(ast: UOp, threads: int, simd: int) -> list[Opt]:
  """Flash attention (schedule/flash.py: serial loops over the keys and a row's columns, inside the rows): the one
  reduce, a score's dot product over the head dimension, gets a register of partial sums (a lane loop, where one chain
  of multiply-adds waited on each), and the rows are split across the cores. The serial loops are no axis."""
  p = Plan(ast, threads, simd)
  p.step = "flash"
  for k, r in enumerate(axes(p.ast)):
    if r.arg[1] is AxisKind.REDUCE: p.first(*(Opt(OptOps.UPCAST, k, a) for a in dividing(const_size(r), FLASH_LANES)))
  if threads >= 2:
    for k, r in enumerate(global_ranges(p.ast)):
      if (n := next((n for n in (4 * threads, threads) if (const_size(r) or 0) % n == 0 and (const_size(r) or 0) >= n), None)):
        p.first(Opt(OptOps.THREAD, k, n)); break
  if DEBUG >= 3: print(f"  heuristics flash: {p.opts}")
  return p.opts

def scatter_opts(ast: UOp, threads: int) -> list[Opt]:
  """A scatter-add (schedule.py's scatter_kernel: serial loops over the table's rows and the tokens inside the output's
  other loops): 16 columns of a token's row per step as a SIMD loop, which lowering moves inside the token loop (one
  vector read, add and write of the row the token picks; written-out copies, each gated by the index's range, stayed
  scalar in gcc), and the columns split across the cores when the work is big. The serial loops are no axis: never
  split."""
  p = Plan(ast, threads, 8)
  p.step = "scatter"
  glob = global_ranges(ast)
  if not glob: return p.opts
  j = len(glob) - 1  # the innermost output loop, if it is the one contiguous in memory (the table's row axis may be)
  stores = [st for st in ast.toposort if st.op is Ops.STORE and st.src[0].src[0].op is Ops.PARAM]
  if all(unit_stride(st.src[0].src[1], glob[j]) for st in stores):
    p.first(*(Opt(OptOps.SIMD, j, a) for a in dividing(const_size(glob[j]), (16, 8))))
  # iterations of the loops around each store: every column's fill and its adds
  work = sum(prod(const_size(r) or 1 << 10 for r in st.live_ranges) for st in stores)
  # an iteration is one add: a small transformer's embedding gradient (64 columns, 90 rows, 1024 tokens) took 18 us on
  # one core, 30-80 us on two
  if threads >= 2 and work >= 1 << 18:
    for k, r in enumerate(axes(p.ast)):
      if (n := next((n for n in (4 * threads, threads) if (const_size(r) or 0) % n == 0 and (const_size(r) or 0) >= n), None)):
        p.first(Opt(OptOps.THREAD, k, n)); break
  return p.opts

# ***** GPU *****

GROUP_OUTPUTS = 4096  # below this many outputs a kernel can't fill a GPU one thread per output

def divisor(size: int, limit: int) -> int:
  """The largest divisor of size that is at most limit."""
  return max((d for d in range(1, min(size, limit) + 1) if size % d == 0), default=1)

def gpu_opts(ast: UOp, renderer: Renderer) -> list[Opt]:
  """Work-groups of about the device's preferred size over the innermost global axes (neighbouring threads then touch
  neighbouring memory); a long reduce with few outputs is split across a work-group (GROUP) so that the device has
  threads to run."""
  opts: list[Opt] = []
  budget = renderer.workgroup_pref
  glob = global_ranges(ast)
  for axis, r in reversed(list(enumerate(glob))):
    if budget < 2 or r.src[0].op is not Ops.CONST or len(opts) >= len(renderer.local_max): break
    if (n := divisor(r.src[0].arg, min(budget, renderer.local_max[len(opts)]))) > 1:
      opts.append(Opt(OptOps.LOCAL, axis, n))
      budget //= n
  outputs = prod(r.src[0].arg if r.src[0].op is Ops.CONST else 1 << 16 for r in glob)
  if outputs >= GROUP_OUTPUTS or budget < 16: return opts
  reduces = [(r.src[0].arg, axis) for axis, r in enumerate(axes(ast)) if r.arg[1] is AxisKind.REDUCE and r.src[0].op is Ops.CONST]
  for size, axis in sorted(reduces, reverse=True):  # the longest reduce gains most
    if (n := divisor(size, min(budget, size // 4))) < 16: continue  # and each thread reduces 4 elements or more
    try: apply_opts(ast, cand := opts + [Opt(OptOps.GROUP, axis, n)], has_local=True)
    except KernelOptError: continue
    return cand
  return opts
