"""Where a training step's time goes, kernel by kernel, next to torch's ops: examples/beautiful_mnist.py's model (batch
512), one thread each, CPU time (time.thread_time: on a machine shared with other work, wall-clock time measures the
queue for the cores). attograd's kernels come from the TinyJit replay of the step, each run alone REPS times (the
minimum); torch's aten ops are timed the same way through a dispatch mode around a whole step. Run as
  python bench/step_kernels.py          # BS=512 REPS=5 MIN_MS=0.5 to change them
Compare each big kernel with torch's op of the same shapes (convolution, convolution_backward, batch norm, max pool)."""
from __future__ import annotations
import os, sys, time
os.environ.setdefault("THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
sys.path.insert(0, os.path.dirname(__file__))
REPS, MIN_MS = int(os.getenv("REPS", 5)), float(os.getenv("MIN_MS", 0.5))

def ours(bs: int) -> tuple[list[tuple[int, str, float, int, list]], float]:
  """(index, name, ms, ops, opts) of every kernel of one step, and the whole step's ms."""
  from beautiful_mnist import Net
  from attograd import Tensor, TinyJit
  from attograd.nn import optim
  from attograd.nn.state import get_parameters
  Tensor.manual_seed(0)
  model = Net()
  opt = optim.Adam(get_parameters(model), lr=1e-3)
  x, y = Tensor.randn(bs, 1, 28, 28).realize(), Tensor.randint(bs, high=10).realize()
  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    with Tensor.train():
      opt.zero_grad()
      loss = model(x).cross_entropy(y).backward()
      return loss.realize(*opt.schedule_step())
  for _ in range(3): step(x, y)
  rows = []
  for i, ei in enumerate(step.replay.plan.items):
    best = float("inf")
    for _ in range(REPS):
      st = time.thread_time(); ei.runner(ei.raw, {}); best = min(best, time.thread_time() - st)
    rows.append((i, ei.runner.name, best * 1e3, ei.runner.ops, getattr(ei.runner, "opts", [])))
  whole = float("inf")
  for _ in range(3):
    st = time.thread_time(); step(x, y); whole = min(whole, time.thread_time() - st)
  return rows, whole * 1e3

def theirs(bs: int) -> tuple[dict[tuple[str, tuple], float], float]:
  """torch's ms per (aten op, input shapes) over one step, and the whole step's ms."""
  import torch
  from torch.utils._python_dispatch import TorchDispatchMode
  from mnist_step import torch_step
  torch.set_num_threads(1)
  step = torch_step(bs, True)
  for _ in range(3): step()
  acc: dict[tuple[str, tuple], list[float]] = {}
  class Timed(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
      st = time.thread_time(); out = func(*args, **(kwargs or {})); t = time.thread_time() - st
      shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))[:2]
      acc.setdefault((str(func), shapes), []).append(t)
      return out
  per: dict[tuple[str, tuple], float] = {}
  for _ in range(REPS):
    acc.clear()
    with Timed(): step()
    for k, v in acc.items(): per[k] = min(per.get(k, float("inf")), sum(v))
  whole = float("inf")
  for _ in range(3):
    st = time.thread_time(); step(); whole = min(whole, time.thread_time() - st)
  return {k: v * 1e3 for k, v in per.items()}, whole * 1e3

def main() -> None:
  bs = int(os.getenv("BS", 512))
  t, t_whole = theirs(bs)
  print(f"torch, one thread, ms per op over a step (min of {REPS}):")
  for (op, shapes), ms in sorted(t.items(), key=lambda kv: -kv[1]):
    if ms >= MIN_MS: print(f"  {ms:8.2f}  {op:45s} {shapes}")
  rows, o_whole = ours(bs)
  print(f"attograd, one thread, ms per kernel (min of {REPS}):")
  for i, name, ms, ops, opts in sorted(rows, key=lambda r: -r[2]):
    if ms >= MIN_MS: print(f"  {ms:8.2f} {i:3d} {name:36s} {ops / ms / 1e6:6.1f} GFLOPS  {opts}")
  print(f"whole step, one thread, CPU time: attograd {o_whole:.1f} ms, torch {t_whole:.1f} ms, attograd/torch {o_whole / t_whole:.2f}x")

if __name__ == "__main__": main()
