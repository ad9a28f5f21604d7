"""BEAM search over Opts (DESIGN §3.4): from the unoptimized kernel, try every legal next Opt on each
of the best `width` kernels so far, compile the candidates in parallel, time them on the device,
keep the fastest, until a round brings no gain. The winner's Opts are cached on disk, keyed by the
kernel's AST, the device and the search settings, so a second run picks them without searching."""
from __future__ import annotations
import json, os, pathlib, struct, time
from typing import Any, Callable
from attograd.helpers import DEBUG, CACHELEVEL, Progress, cache_path, cache_read, cache_write, content_hash
from attograd.dtype import dtypes
from attograd.uop.ops import AxisKind, UOp, Ops
from attograd.uop.serialize import graph_key
from attograd.codegen.opt import Opt, OptOps, KernelOptError, axes, const_size
from attograd.codegen.heuristic import heuristic_opts, cores
from attograd.runtime.device import Device, Buffer

SEARCH_VERSION = "4"  # bump when Opts or their lowering change meaning: old cached winners are then ignored
MAX_ROUNDS = 8

def actions(ast: UOp, threads: int, local: bool = False) -> list[Opt]:
  """Every Opt worth trying next on this kernel (illegal ones are weeded out by applying them); with
  `local` (a GPU target), work-groups too: LOCAL on global axes, GROUP on reduce axes."""
  out: list[Opt] = []
  ax = axes(ast)
  for i, r in enumerate(ax):
    size = const_size(r)
    if r.arg[1] is AxisKind.GLOBAL:
      out += [Opt(OptOps.UPCAST, i, n) for n in (2, 3, 4, 8, 16, 32)]
      if size is not None and size % 8: out += [Opt(OptOps.PADTO, i, n) for n in (8, 32)]
      if threads > 1: out += [Opt(OptOps.THREAD, i, n) for n in (threads, 4 * threads)]  # 4 per core: see codegen/heuristic.py split_across_cores
      out += [Opt(OptOps.SWAP, i, j) for j in range(i + 1, len(ax)) if ax[j].arg[1] is AxisKind.GLOBAL]
      if local: out += [Opt(OptOps.LOCAL, i, n) for n in (2, 4, 8, 16, 32)]
      else:  # a per-call scratch, a C loop, a reduce run once per row: CPU only
        out += [Opt(OptOps.PACK, i, 0), Opt(OptOps.WIDEN, i, 0), *(Opt(OptOps.SIMD, i, n) for n in (8, 16))]
        out += [Opt(OptOps.STASH, i, j) for j in range(len(ax)) if ax[j].arg[1] is AxisKind.REDUCE]
    else:
      out += [Opt(OptOps.UPCAST, i, n) for n in (4, 8, 16)]
      out += [Opt(OptOps.UNROLL, i, n) for n in (2, 4)]
      if size is not None and size <= 8 and size not in (2, 4): out.append(Opt(OptOps.UNROLL, i, size))
      if local: out += [Opt(OptOps.GROUP, i, n) for n in (8, 16, 32, 64, 128, 256)]
  return out

def _buffers(ast: UOp, device: str) -> list[Any]:
  """The kernel's buffers, written: memory never written reads as one shared page of zeros, always in the nearest cache,
  and made a candidate that streams its inputs look faster than it is (a BERT matmul's tile: 15-30% on fresh buffers,
  3-5% on written ones). Floats hold 1.0 (no denormals, no NaN), other types 0 (an index buffer stays in range)."""
  params = sorted((u for u in ast.toposort if u.op is Ops.PARAM), key=lambda u: u.arg)
  return [_written(Buffer(device, max(p.dtype.size, 1), p.dtype.base))._buf for p in params]

def _written(buf: Buffer) -> Buffer:
  dt = buf.dtype
  one = struct.pack(dt.fmt, 1.0) if dtypes.is_float(dt) and dt.fmt is not None else bytes(dt.itemsize)
  return buf.copyin(memoryview(one * buf.size))

def time_kernel(ck: Any, bufs: list[Any], sync: Callable[[], None], reps: int = 3, budget: float | None = None) -> float:
  """The fastest of a few runs (the minimum: other work on the machine only ever adds time)."""
  best = float("inf")
  for _ in range(reps):
    st = time.perf_counter(); ck(bufs, {}); sync()
    best = min(best, time.perf_counter() - st)
    if budget is not None and best > budget: break  # far behind the leaders: no need to be precise
  return best

def _cache_path(ast: UOp, device: str, width: int, threads: int):
  return cache_path("beam", f"{content_hash(SEARCH_VERSION, graph_key(ast), device, str(width), str(threads))}.json")

def _read_winner(path: pathlib.Path) -> list[Opt] | None:
  return cache_read(path, lambda data: [Opt(OptOps[op], int(axis), int(amount)) for op, axis, amount in json.loads(data)])

def beam_search(ast: UOp, device: str, width: int, compile_kernel: Callable[[UOp, str, list[Opt]], Any],
                progress: Progress | None = None) -> list[Opt]:
  """The fastest Opts found for this kernel on this device (cached on disk); `progress` hears of every candidate."""
  dev = Device[device]
  threads = cores(dev.renderer)
  # sizes only known at run time, or a device that can't be timed here: nothing to search on
  if any(u.op is Ops.DEFINE_VAR for u in ast.toposort): return []
  path = _cache_path(ast, device, width, threads) if CACHELEVEL >= 1 else None
  if path is not None and (cached := _read_winner(path)) is not None: return cached
  st = time.perf_counter()
  bufs = _buffers(ast, device)
  def build(opts: list[Opt]) -> tuple[list[Opt], Any] | None:
    try: return opts, compile_kernel(ast, device, opts)
    except KernelOptError: return None
  from concurrent.futures import ThreadPoolExecutor  # (with its logging: 0.75 MiB at import, for BEAM only)
  pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1)  # the compiler runs outside the GIL
  base = compile_kernel(ast, device, [])
  beam: list[tuple[float, list[Opt]]] = [(time_kernel(base, bufs, dev.synchronize), [])]
  seen = {base.src}
  # the heuristics' choice starts in the beam too: the search only ever improves on it
  local = dev.renderer.has_local
  if (hc := heuristic_opts(ast, dev.renderer)) and (built := build(hc)) is not None:
    seen.add(built[1].src)
    beam = sorted(beam + [(time_kernel(built[1], bufs, dev.synchronize), hc)], key=lambda x: x[0])[:max(width, 1)]
  try:
    for rnd in range(MAX_ROUNDS):
      candidates = [opts + [a] for _, opts in beam for a in actions(ast, threads, local)]
      # compile everything first, then time one kernel at a time on a machine the compiler left alone
      built = []
      for i, b in enumerate(pool.map(build, candidates)):
        if progress is not None: progress.update(0, f"BEAM round {rnd + 1}: {i + 1}/{len(candidates)} candidates")
        if b is not None: built.append(b)
      timed: list[tuple[float, list[Opt]]] = []
      for opts, ck in built:
        if ck.src in seen: continue  # two Opt lists can give the same program
        seen.add(ck.src)
        timed.append((time_kernel(ck, bufs, dev.synchronize, budget=3 * beam[0][0]), opts))
      best = sorted(beam + timed, key=lambda x: x[0])[:width]
      if DEBUG >= 2: print(f"BEAM round: {len(timed)} kernels, best {best[0][0] * 1e3:.3f} ms {best[0][1]}")
      improved = best[0][0] < beam[0][0] * 0.98
      beam = best
      if not improved: break
  finally: pool.shutdown(wait=True)
  winner = beam[0][1]
  if DEBUG >= 1: print(f"BEAM={width}: {winner} in {time.perf_counter() - st:.1f} s, {beam[0][0] * 1e3:.3f} ms (was {time_kernel(base, bufs, dev.synchronize) * 1e3:.3f} ms)")
  if path is not None: cache_write(path, json.dumps([[o.op.name, o.axis, o.amount] for o in winner]).encode())
  return winner
