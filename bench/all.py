"""The speed table: attograd next to numpy and torch on the same inputs, in one run (medians).
  python bench/all.py            # everything (a few minutes)
  QUICK=1 python bench/all.py    # smaller sizes, a smoke run
  BENCH_BEAM=2 python bench/all.py   # also matmul 512/1024 with BEAM=2 (the search's winners are cached on disk)
  BENCH_DEVICES=LLVM,CL,WEBGPU python bench/all.py   # a column per backend (default LLVM; CL on PoCL and WEBGPU
                                                     # on lavapipe are GPUs emulated on the CPU: slow at these sizes)
Ratios are peer time / attograd time: above 1 means attograd is faster. After the table: the speedup
of 2 cores over 1 (THREADS=1) and the first-call compile latency of a small kernel."""
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
  from attograd.runtime.device import Device
  dev = Device[device]
  def run() -> None:
    make(*next(it)).realize()
    dev.synchronize()  # GPU-style devices queue kernels: the time is until they finished
  return run

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
  parts = [f32(1024 if not QUICK else 256, k) for k in (256, 512, 256)]
  yield "cat 3 along dim 1 (1024,1024)" if not QUICK else "cat 3 along dim 1 (256,1024)", 0, (lambda *v: v[0].cat(*v[1:], dim=1), *parts), \
    lambda: np.concatenate(parts, 1), (lambda tp=[torch.tensor(p) for p in parts]: torch.cat(tp, 1))
  yield "sum 16M" if not QUICK else "sum 1M", 0, (lambda v: v.sum(), x), lambda: x.sum(), (lambda tx=torch.tensor(x): tx.sum())

def with_beam(make, arrays, width: int) -> float:
  from attograd import Context
  from attograd.engine import realize
  realize._kernel_cache.clear()
  with Context(BEAM=width): ms = median_ms(ours(make, *arrays), 5)
  realize._kernel_cache.clear()
  return ms

def thread_scaling() -> None:
  from attograd import Context
  from attograd.engine import realize
  rng = np.random.default_rng(1)
  n16m, n = 1 << (20 if QUICK else 24), 512 if QUICK else 1024
  x, y, z = (rng.standard_normal(n16m).astype(np.float32) for _ in range(3))
  a, b = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
  for name, make, arrays in [("elementwise chain", lambda x, y, z: ((x * 2 + 1).relu() * y - z).exp(), (x, y, z)),
                             (f"matmul {n}", lambda p, q: p @ q, (a, b))]:
    times = {}
    for t in (1, os.cpu_count() or 1):
      realize._kernel_cache.clear()
      with Context(THREADS=t): times[t] = median_ms(ours(make, *arrays), 5)
    realize._kernel_cache.clear()
    one, many = times[1], times[max(times)]
    print(f"threads {name:22s} 1 core {one:9.2f} ms  {max(times)} cores {many:9.2f} ms  speedup {one / many:5.2f}x")

def compile_latency() -> None:
  """First call of a small kernel never seen before: schedule, opts, render, compile, load, run."""
  from attograd import Tensor, Context
  x = Tensor(np.arange(1000, dtype=np.float32)).realize()
  times = []
  for i in range(5):
    with Context(CACHELEVEL=0):  # no disk cache: the compiler really runs
      st = time.perf_counter(); (x * (3.5 + i) + 1).sqrt().realize(); times.append(time.perf_counter() - st)
  print(f"first-call latency of a small kernel (compile included): {statistics.median(times) * 1e3:.1f} ms (median of 5)")

def other_devices() -> list[str]:
  """The backends named by BENCH_DEVICES that run here (the ratios are the CPU device's)."""
  from attograd.runtime.device import Device
  def runs(d: str) -> bool:
    try: return Device[d].renderer is not None
    except Exception: return False
  return [d for d in os.getenv("BENCH_DEVICES", "LLVM").split(",") if d and runs(d)]

def on_device(make, arrays, device: str) -> float:
  try: return median_ms(ours(make, *arrays, device=device), 5)
  except (TypeError, RuntimeError): return float("nan")  # a kernel the backend refuses (WEBGPU: lavapipe's loop limit)

def main() -> None:
  import torch
  torch.set_num_threads(os.cpu_count() or 1)
  beam = int(os.getenv("BENCH_BEAM", "0"))
  devices = other_devices()
  print(f"{'benchmark':30s} {'attograd ms':>12s}" + "".join(f" {d + ' ms':>9s}" for d in devices) +
        f" {'numpy ms':>10s} {'torch ms':>10s} {'vs numpy':>9s} {'vs torch':>9s} {'GFLOPS':>8s}"
        + (f" {f'BEAM={beam} ms':>11s} {'vs numpy':>9s} {'GFLOPS':>8s}" if beam else ""))
  for name, flops, (make, *arrays), np_fn, torch_fn in cases():
    a = median_ms(ours(make, *arrays), 5)
    others = "".join(f" {on_device(make, arrays, d):9.2f}" for d in devices)
    n = median_ms(np_fn, 5) if np_fn else float("nan")
    t = median_ms(torch_fn, 5)
    gf = f"{flops / a / 1e6:8.1f}" if flops else f"{'':8s}"
    line = f"{name:30s} {a:12.2f}{others} {n:10.2f} {t:10.2f} {n / a:8.2f}x {t / a:8.2f}x {gf}"
    if beam and name in ("matmul 1024", "matmul 512"):  # the search takes minutes per kernel: the target size only
      bm = with_beam(make, arrays, beam)
      line += f" {bm:11.2f} {n / bm:8.2f}x {flops / bm / 1e6:8.1f}"
    print(line, flush=True)
  thread_scaling()
  compile_latency()

if __name__ == "__main__": main()
