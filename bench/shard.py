"""Devices side by side (issue 20): one data-parallel training step (an MLP, SGD, TinyJit) with the batch split over CPU:0
and CPU:1 and the model replicated, next to the same step on one device using all THREADS cores, in the same run (rounds
interleaved, so the machine's load falls on each alike). With lanes (engine/lanes.py) each device runs its kernels on
its own share of the cores at the same time; LANES=0 runs the two devices' kernels one after another.

Prints per case the median wall time of a step, and the process's CPU time over wall time (all threads): near the number
of cores when they all compute at once, near 1 when one at a time.

  python bench/shard.py        # BATCH=256 DIM=256 HIDDEN=1024 ROUNDS=9"""
import os, statistics, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import numpy as np
from attograd import Tensor, TinyJit, nn
from attograd.helpers import Context
from attograd.nn import optim
from attograd.nn.state import get_parameters
from attograd.codegen.opt import THREADS

BATCH, DIM, HIDDEN, ROUNDS = (int(os.getenv(k, d)) for k, d in (("BATCH", 256), ("DIM", 256), ("HIDDEN", 1024), ("ROUNDS", 9)))
D2 = ("CPU", "CPU:1")

class MLP:
  def __init__(self):
    self.l1, self.l2, self.l3 = nn.Linear(DIM, HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, 10)
  def __call__(self, x: Tensor) -> Tensor: return self.l3(self.l2(self.l1(x).relu()).relu())

def make_step(devices: tuple[str, ...] | None):
  """A jitted training step of a fresh model, with its input and labels (split over devices, or on one)."""
  Tensor.manual_seed(0)
  m = MLP()
  params = get_parameters(m)
  if devices:
    for p in params: p.shard_(devices)
  opt = optim.SGD(params, lr=0.01)
  rng = np.random.default_rng(0)
  X, Y = Tensor(rng.standard_normal((BATCH, DIM)).astype(np.float32)), Tensor(rng.integers(0, 10, BATCH))
  if devices: X, Y = X.shard(devices, 0).realize(), Y.shard(devices, 0).realize()
  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    with Tensor.train():
      opt.zero_grad()
      loss = m(x).cross_entropy(y).backward()
      loss.realize(*opt.schedule_step())
    return loss
  return step, lambda: step(X, Y)

def main() -> None:
  jit, side = make_step(D2)
  cases = {f"one device, {THREADS.value} threads": (make_step(None)[1], 1),
           "CPU:0 + CPU:1 side by side": (side, 1),
           "CPU:0 + CPU:1, LANES=0 (in turn)": (make_step(D2)[1], 0)}
  lane_cpu: list[list[float]] = []
  wall: dict[str, list[float]] = {k: [] for k in cases}
  cpu: dict[str, list[float]] = {k: [] for k in cases}
  for r in range(ROUNDS + 3):  # 3 warm-up rounds: the first two calls of a TinyJit aren't replays
    for name, (fn, lanes) in cases.items():
      with Context(LANES=lanes):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        w, c = time.perf_counter() - w0, time.process_time() - c0
      if r >= 3: wall[name].append(w); cpu[name].append(c / w)
      if r >= 3 and fn is side: lane_cpu.append(list(jit.replay.plan.lanes.cpu_s))
  print(f"one SGD step of an MLP {DIM}-{HIDDEN}-{HIDDEN}-10 on a batch of {BATCH}, {ROUNDS} rounds, {os.cpu_count()} cores "
        f"(a shared machine: wall times are noisy, the ratios are within this run)")
  for k in cases:
    print(f"  {k:34s} median {statistics.median(wall[k]) * 1e3:8.2f} ms   range {min(wall[k]) * 1e3:.2f} - {max(wall[k]) * 1e3:.2f}"
          f"   CPU/wall {statistics.median(cpu[k]):.2f}")
  per_lane = [statistics.median(c[i] for c in lane_cpu) for i in range(len(lane_cpu[0]))]
  print(f"side by side: thread CPU time of each device's lane {' + '.join(f'{t * 1e3:.1f}' for t in per_lane)} ms a step "
        f"(each device's kernels on a thread of its own: with a core each they overlap)")
  one, side, turn = (statistics.median(wall[k]) for k in cases)
  print(f"side by side / one device: {side / one:.2f}x the time   side by side / in turn: {side / turn:.2f}x the time")

if __name__ == "__main__":
  main()
