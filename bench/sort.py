"""Sort, argsort, topk and scans of long rows: attograd (bitonic network / blocked scan) next to torch
and numpy on the same inputs, medians of warm runs (the first run compiles every stage's kernel).
  python bench/sort.py           # 1M elements
  N=65536 python bench/sort.py   # another size"""
from __future__ import annotations
import os, statistics, time
import numpy as np
import torch
from attograd import Tensor, GlobalCounters

N = int(os.getenv("N", str(1 << 20)))
REPS = int(os.getenv("REPS", "5"))

def median_ms(fn, reps: int = REPS) -> float:
  times = []
  for _ in range(reps):
    st = time.perf_counter(); fn(); times.append(time.perf_counter() - st)
  return statistics.median(times) * 1e3

def ours(make, arr: np.ndarray):
  """(a timed run on a fresh input buffer each time: realized graphs are memoized, first run's time, kernels run)."""
  inputs = iter([Tensor(arr).realize() for _ in range(REPS + 1)])
  st = time.perf_counter()
  GlobalCounters.reset()
  Tensor.realize_all(list(make(next(inputs))))
  first, kernels = time.perf_counter() - st, GlobalCounters.kernel_count
  return (lambda: Tensor.realize_all(list(make(next(inputs))))), first, kernels

def main():
  rng = np.random.default_rng(0)
  a = rng.standard_normal(N).astype(np.float32)
  ta = torch.from_numpy(a)
  torch.set_num_threads(2)
  print(f"{N:,} float32 elements; ms, median of {REPS} (attograd's first run compiles, shown apart)")
  print(f"{'op':<10} {'attograd':>10} {'torch':>9} {'numpy':>9} {'kernels':>8} {'first run':>10}")
  rows = [
    ("sort", lambda x: x.sort(), lambda: torch.sort(ta, stable=True), lambda: np.sort(a, kind="stable")),
    ("argsort", lambda x: (x.argsort(),), lambda: torch.argsort(ta, stable=True), lambda: np.argsort(a, kind="stable")),
    ("topk(10)", lambda x: x.topk(10), lambda: torch.topk(ta, 10), None),
    ("cumsum", lambda x: (x.cumsum(),), lambda: torch.cumsum(ta, 0), lambda: np.cumsum(a)),
    ("logcumsumexp", lambda x: (x.logcumsumexp(),), lambda: torch.logcumsumexp(ta, 0), None),
  ]
  for name, fa, ft, fn in rows:
    run, first, kernels = ours(fa, a)
    t_ours = median_ms(run)
    t_torch = median_ms(ft)
    t_np = median_ms(fn) if fn is not None else float("nan")
    print(f"{name:<10} {t_ours:>10.1f} {t_torch:>9.1f} {t_np:>9.1f} {kernels:>8} {first * 1e3:>9.0f}ms")

if __name__ == "__main__": main()
