"""Python overhead users feel: a tiny op end to end, warm, and import + first op, cold.
Prints attograd next to torch and numpy measured in the same run (medians); the machine is
shared and noisy, so only ratios within one run mean anything.
  warm: new input each call, so the graph is built, scheduled, run and read back for real
        (kernels come from the compile cache, the result is never a memo of an earlier call)
  cold: a new process that imports the framework and runs its first tiny op (compiled binaries
        already on disk, as after the first run on a machine)
  dispatch: one call of a compiled 64x64 x+1 kernel, unthreaded and split in 2 slices by the THREAD opt
        (the cost a threaded kernel pays to start its cores and wait for them)"""
from __future__ import annotations
import statistics, subprocess, sys, time

def median_us(fn, inputs) -> float:
  times = []
  for x in inputs:
    st = time.perf_counter(); fn(x); times.append(time.perf_counter() - st)
  return statistics.median(times) * 1e6

def warm(n: int = 2000) -> dict[str, float]:
  from attograd import Tensor
  import numpy as np, torch
  data = [[float(i), 2.0, 3.0] for i in range(n + 10)]
  ours = [Tensor(d).realize() for d in data]
  theirs = [torch.tensor(d) for d in data]
  arrays = [np.array(d, dtype=np.float32) for d in data]
  for x in ours[:10]: (x + 1).tolist()
  return {"attograd": median_us(lambda x: (x + 1).tolist(), ours[10:]),
          "torch": median_us(lambda x: (x + 1).tolist(), theirs[10:]),
          "numpy": median_us(lambda x: (x + 1).tolist(), arrays[10:])}

def dispatch(n: int = 2000) -> dict[str, float]:
  from attograd import Tensor
  from attograd.codegen.opt import Opt, OptOps
  from attograd.engine import realize
  from attograd.runtime.device import Buffer
  si = (Tensor.empty(64, 64) + 1).schedule()[-1]
  bufs = [Buffer("CPU", si.bufs[0].arg.size, si.bufs[0].dtype).ensure_allocated()._buf,
          realize.buffer_of(si.bufs[1]).ensure_allocated()._buf]
  out = {}
  for name, opts in (("unthreaded", []), ("2 slices", [Opt(OptOps.THREAD, 0, 2)])):
    ck = realize.compile_kernel(si.ast, "CPU", opts)
    for _ in range(100): ck(bufs, {})
    out[name] = median_us(lambda _: ck(bufs, {}), range(n))
  times = []
  for _ in range(200):  # idle 1 ms first: the pool's workers have gone to sleep, the launch wakes them
    time.sleep(1e-3); st = time.perf_counter(); ck(bufs, {}); times.append(time.perf_counter() - st)
  out["2 slices after 1 ms idle"] = statistics.median(times) * 1e6
  return out

COLD = {"attograd": "from attograd import Tensor; (Tensor([1.0, 2.0, 3.0]) + 1).tolist()",
        "torch": "import torch; (torch.tensor([1.0, 2.0, 3.0]) + 1).tolist()",
        "numpy": "import numpy as np; (np.array([1.0, 2.0, 3.0], dtype=np.float32) + 1).tolist()"}

def cold(runs: int = 5) -> dict[str, float]:
  out = {}
  for name, code in COLD.items():
    subprocess.run([sys.executable, "-c", code], check=True)  # fill disk caches
    times = []
    for _ in range(runs):
      st = time.perf_counter(); subprocess.run([sys.executable, "-c", code], check=True); times.append(time.perf_counter() - st)
    out[name] = statistics.median(times) * 1e3
  return out

def main() -> None:
  w, c, d = warm(), cold(), dispatch()
  print(f"{'':10s} {'warm tiny op (us)':>18s} {'cold import+op (ms)':>20s}")
  for name in ("attograd", "torch", "numpy"): print(f"{name:10s} {w[name]:18.1f} {c[name]:20.1f}")
  print(f"attograd/torch warm ratio {w['attograd'] / w['torch']:.2f}x, cold ratio {c['attograd'] / c['torch']:.2f}x")
  print(f"kernel dispatch (64x64 x+1, us): unthreaded {d['unthreaded']:.1f}, 2 slices {d['2 slices']:.1f}, "
        f"2 slices after 1 ms idle {d['2 slices after 1 ms idle']:.1f}")
  print(f"targets: warm <= 200 us: {'ok' if w['attograd'] <= 200 else 'MISSED'}; cold <= 500 ms: {'ok' if c['attograd'] <= 500 else 'MISSED'}")

if __name__ == "__main__": main()
