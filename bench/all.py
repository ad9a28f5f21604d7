"""The speed table: attograd next to numpy and torch on the same inputs, in one run (medians).
  python bench/all.py            # everything (a few minutes)
  QUICK=1 python bench/all.py    # smaller sizes, a smoke run
Ratios are peer time / attograd time: above 1 means attograd is faster."""
from __future__ import annotations
import os, statistics, time
import numpy as np

QUICK = bool(int(os.getenv("QUICK", "0")))

def median_ms(fn, reps: int) -> float:
  times = []
  for _ in range(reps):
    st = time.perf_counter(); fn(); times.append(time.perf_counter() - st)
  return statistics.median(times) * 1e3

def ours(make, *arrays, device: str = "CPU"):
  """Time attograd on fresh input buffers each run (nothing memoized), kernels already compiled."""
  from attograd import Tensor
  inputs = [[Tensor(a, device=device).realize() for a in arrays] for _ in range(6)]
  make(*inputs[0]).realize()
  it = iter(inputs[1:])
  return lambda: make(*next(it)).realize()

def cases():
  import torch
  rng = np.random.default_rng(0)
  f32 = lambda *s: rng.standard_normal(s).astype(np.float32)
  n16m = 1 << (20 if QUICK else 24)
  for n in ((256, 512) if QUICK else (256, 512, 1024, 2048)):
    a, b = f32(n, n), f32(n, n)
    yield f"matmul {n}", 2 * n ** 3, (lambda x, y: x @ y, a, b), lambda: a @ b, (lambda ta=torch.tensor(a), tb=torch.tensor(b): ta @ tb)
  x, y, z = f32(n16m), f32(n16m), f32(n16m)
  yield "elementwise chain 16M" if not QUICK else "elementwise chain 1M", 0, (lambda x, y, z: ((x * 2 + 1).relu() * y - z).exp(), x, y, z), \
    lambda: np.exp(np.maximum(x * 2 + 1, 0) * y - z), (lambda tx=torch.tensor(x), ty=torch.tensor(y), tz=torch.tensor(z): ((tx * 2 + 1).relu() * ty - tz).exp())
  s = f32(4096 if not QUICK else 512, 1024)
  def np_softmax(v): e = np.exp(v - v.max(1, keepdims=True)); return e / e.sum(1, keepdims=True)
  yield "softmax (4096,1024)", 0, (lambda v: v.softmax(1), s), lambda: np_softmax(s), (lambda ts=torch.tensor(s): ts.softmax(1))
  yield "layernorm (4096,1024)", 0, (lambda v: v.layernorm(1), s), lambda: (s - s.mean(1, keepdims=True)) / np.sqrt(s.var(1, keepdims=True) + 1e-5), \
    (lambda ts=torch.tensor(s): torch.nn.functional.layer_norm(ts, (1024,)))
  img, w = f32(32 if not QUICK else 4, 32, 32, 32), f32(64, 32, 3, 3)
  yield "conv2d b32 32->64 3x3 32x32", 2 * img.shape[0] * 64 * 30 * 30 * 32 * 9, (lambda v, k: v.conv2d(k), img, w), None, \
    (lambda ti=torch.tensor(img), tw=torch.tensor(w): torch.nn.functional.conv2d(ti, tw))
  yield "sum 16M" if not QUICK else "sum 1M", 0, (lambda v: v.sum(), x), lambda: x.sum(), (lambda tx=torch.tensor(x): tx.sum())

def main() -> None:
  import torch
  torch.set_num_threads(os.cpu_count() or 1)
  import importlib.util
  llvm = importlib.util.find_spec("llvmlite") is not None  # the LLVM device's column (the ratios are the CPU device's)
  print(f"{'benchmark':30s} {'attograd ms':>12s} {'LLVM ms':>9s} {'numpy ms':>10s} {'torch ms':>10s} {'vs numpy':>9s} {'vs torch':>9s} {'GFLOPS':>8s}")
  for name, flops, (make, *arrays), np_fn, torch_fn in cases():
    a = median_ms(ours(make, *arrays), 5)
    lv = median_ms(ours(make, *arrays, device="LLVM"), 5) if llvm else float("nan")
    n = median_ms(np_fn, 5) if np_fn else float("nan")
    t = median_ms(torch_fn, 5)
    gf = f"{flops / a / 1e6:8.1f}" if flops else f"{'':8s}"
    print(f"{name:30s} {a:12.2f} {lv:9.2f} {n:10.2f} {t:10.2f} {n / a:8.2f}x {t / a:8.2f}x {gf}")

if __name__ == "__main__": main()
