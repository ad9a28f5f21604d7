"""Sort, argsort, topk, median, unique and scans of one long row: attograd next to torch and numpy on the same inputs
(torch on 2 threads), medians of warm runs; attograd's first run compiles its kernels and is shown apart. Beside the
wall-clock ratio, the ratio of CPU time (all threads of the process, time.process_time): on a machine shared with other
work, wall time counts the time others held the cores, CPU time only the work done. "kernel ms": the wall time of
attograd's run loop (GlobalCounters.time_sum, the kernels alone); the rest of its wall time is Python (building the
graph, finding its schedule, binding buffers).
  python bench/sort.py            # 100k elements
  N=1048576 python bench/sort.py  # another size"""
from __future__ import annotations
import os, statistics, time
import numpy as np
import torch
from attograd import Tensor, GlobalCounters

N = int(os.getenv("N", "100000"))
REPS = int(os.getenv("REPS", "7"))

def median_ms(fn, reps: int = REPS) -> tuple[float, float]:
  """(wall, CPU) ms, the median of each over reps runs."""
  wall, cpu = [], []
  for _ in range(reps):
    st, sc = time.perf_counter(), time.process_time(); fn()
    wall.append(time.perf_counter() - st); cpu.append(time.process_time() - sc)
  return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3

def outputs(r) -> list: return list(r) if isinstance(r, tuple) else [r]

def ours(make, arr: np.ndarray):
  """(a timed run on a fresh input buffer each time: realized graphs are memoized, first run's time, kernels run, the
  run loop's time of each timed run)."""
  inputs = iter([Tensor(arr).realize() for _ in range(REPS + 1)])
  st = time.perf_counter()
  GlobalCounters.reset()
  Tensor.realize_all(outputs(make(next(inputs))))
  first, kernels, kernel_s = time.perf_counter() - st, GlobalCounters.kernel_count, []
  def run():
    GlobalCounters.reset()
    Tensor.realize_all(outputs(make(next(inputs))))
    kernel_s.append(GlobalCounters.time_sum)
  return run, first, kernels, kernel_s

def main():
  rng = np.random.default_rng(0)
  a = rng.standard_normal(N).astype(np.float32)
  ints = rng.integers(0, max(N // 10, 1), N)
  ta, tints = torch.from_numpy(a), torch.from_numpy(ints)
  torch.set_num_threads(2)
  print(f"{N:,} elements (float32; unique: int64 in [0, N/10)); ms, median of {REPS} (attograd's first run compiles, shown apart)")
  print(f"{'op':<13} {'attograd':>9} {'torch':>8} {'numpy':>8} {'x torch':>8} {'cpu ms':>8} {'torch cpu':>9} {'x (cpu)':>8} {'kernels':>8} {'kernel ms':>9} {'first run':>10}")
  rows = [
    ("sort", a, lambda x: x.sort(), lambda: torch.sort(ta, stable=True), lambda: np.sort(a, kind="stable")),
    ("argsort", a, lambda x: x.argsort(), lambda: torch.argsort(ta, stable=True), lambda: np.argsort(a, kind="stable")),
    ("topk(10)", a, lambda x: x.topk(10), lambda: torch.topk(ta, 10), None),
    ("topk(1000)", a, lambda x: x.topk(1000), lambda: torch.topk(ta, 1000), None),
    ("median", a, lambda x: x.median(), lambda: torch.median(ta), lambda: np.median(a)),
    ("unique", ints, lambda x: x.unique(return_counts=True), lambda: torch.unique(tints, return_counts=True), lambda: np.unique(ints, return_counts=True)),
    ("cumsum", a, lambda x: x.cumsum(), lambda: torch.cumsum(ta, 0), lambda: np.cumsum(a)),
    ("logcumsumexp", a, lambda x: x.logcumsumexp(), lambda: torch.logcumsumexp(ta, 0), None),
  ]
  for name, arr, fa, ft, fn in rows:
    run, first, kernels, kernel_s = ours(fa, arr)
    (t_ours, c_ours), (t_torch, c_torch) = median_ms(run), median_ms(ft)
    t_np = median_ms(fn)[0] if fn is not None else float("nan")
    print(f"{name:<13} {t_ours:>9.2f} {t_torch:>8.2f} {t_np:>8.2f} {t_ours / t_torch:>7.1f}x {c_ours:>8.2f} {c_torch:>9.2f} "
          f"{c_ours / max(c_torch, 1e-3):>7.1f}x {kernels:>8} {statistics.median(kernel_s) * 1e3:>9.2f} {first * 1e3:>8.0f}ms")

if __name__ == "__main__": main()
