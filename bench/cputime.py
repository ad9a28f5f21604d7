"""One core each, CPU time per call (process_time, not wall time): attograd with THREADS=1 next to
numpy and torch limited to one thread. On a machine shared with other work, wall-clock medians
measure the queue for the cores; CPU time measures the work. Run as
  OPENBLAS_NUM_THREADS=1 python bench/cputime.py"""
from __future__ import annotations
import os, time
import numpy as np

def cpu_ms(fn, reps: int = 5) -> float:
  fn()
  st = time.process_time()
  for _ in range(reps): fn()
  return (time.process_time() - st) / reps * 1e3

def ours(make, *arrays):
  from attograd import Tensor
  inputs = [[Tensor(a).realize() for a in arrays] for _ in range(7)]
  make(*inputs[0]).realize()
  it = iter(inputs[1:])
  return lambda: make(*next(it)).realize()

def main() -> None:
  import torch
  from attograd import Context
  torch.set_num_threads(1)
  if os.getenv("OPENBLAS_NUM_THREADS") != "1": print("note: set OPENBLAS_NUM_THREADS=1 for a one-core numpy")
  rng = np.random.default_rng(0)
  f32 = lambda *s: rng.standard_normal(s).astype(np.float32)
  a, b, s = f32(1024, 1024), f32(1024, 1024), f32(4096, 1024)
  x, y, z = f32(1 << 24), f32(1 << 24), f32(1 << 24)
  img, w = f32(32, 32, 32, 32), f32(64, 32, 3, 3)
  ta, tb, tx, ty, tz, ts, ti, tw = map(torch.tensor, (a, b, x, y, z, s, img, w))
  cases = [
    ("matmul 1024", 2 * 1024 ** 3, ours(lambda p, q: p @ q, a, b), lambda: a @ b, lambda: ta @ tb),
    ("elementwise chain 16M", 0, ours(lambda x, y, z: ((x * 2 + 1).relu() * y - z).exp(), x, y, z), None,
     lambda: ((tx * 2 + 1).relu() * ty - tz).exp()),
    ("softmax (4096,1024)", 0, ours(lambda v: v.softmax(1), s), None, lambda: ts.softmax(1)),
    ("layernorm (4096,1024)", 0, ours(lambda v: v.layernorm(1), s), None, lambda: torch.nn.functional.layer_norm(ts, (1024,))),
    ("conv2d b32 32->64 3x3 32x32", 2 * 32 * 64 * 30 * 30 * 32 * 9, ours(lambda v, k: v.conv2d(k), img, w), None,
     lambda: torch.nn.functional.conv2d(ti, tw)),
    ("sum 16M", 0, ours(lambda v: v.sum(), x), lambda: x.sum(), lambda: tx.sum()),
  ]
  print(f"{'one core, CPU ms per call':30s} {'attograd':>9s} {'numpy':>9s} {'torch':>9s} {'vs numpy':>9s} {'vs torch':>9s} {'GFLOPS':>8s}")
  with Context(THREADS=1):
    for name, flops, mine, np_fn, torch_fn in cases:
      o, n, t = cpu_ms(mine), cpu_ms(np_fn) if np_fn else float("nan"), cpu_ms(torch_fn)
      gf = f"{flops / o / 1e6:8.1f}" if flops else ""
      print(f"{name:30s} {o:9.2f} {n:9.2f} {t:9.2f} {n / o:8.2f}x {t / o:8.2f}x {gf}")

if __name__ == "__main__": main()
