"""A KV-cache attention decode step over a growing position, issue "symbolic shapes": with pos an int
every new position is a new shape (new kernels to build), with pos a bound Variable every position
reuses the same kernels, eagerly or replayed by TinyJit. torch measured in the same run. Medians of
the per-step times over STEPS consecutive positions (each position is seen once)."""
from __future__ import annotations
import statistics, time
import numpy as np

D, MAX, START, STEPS = 64, 1024, 200, 24

def median_ms(step, positions) -> float:
  times = []
  for p in positions:
    st = time.perf_counter(); step(p); times.append(time.perf_counter() - st)
  return statistics.median(times) * 1e3

def main() -> None:
  from attograd import Tensor, TinyJit, Variable
  import torch
  rng = np.random.default_rng(0)
  kn, vn = rng.standard_normal((MAX, D)).astype(np.float32), rng.standard_normal((MAX, D)).astype(np.float32)
  qs = rng.standard_normal((MAX, 1, D)).astype(np.float32)
  k, v = Tensor(kn).realize(), Tensor(vn).realize()
  attend = lambda q, p: ((q @ k[:p].T) * (1 / 8)).softmax(-1) @ v[:p]
  pos = Variable("pos", 1, MAX)
  jitted = TinyJit(lambda q, p: attend(q, p).realize())
  tk, tv = torch.from_numpy(kn), torch.from_numpy(vn)
  rows = {
    "attograd, pos an int (new shapes)": lambda p: attend(Tensor(qs[p]), p).numpy(),
    "attograd, pos a Variable": lambda p: attend(Tensor(qs[p]), pos.bind(p)).numpy(),
    "attograd, Variable + TinyJit": lambda p: jitted(Tensor(qs[p]), pos.bind(p)).numpy(),
    "torch": lambda p: (torch.softmax(torch.from_numpy(qs[p]) @ tk[:p].T * (1 / 8), -1) @ tv[:p]).numpy(),
  }
  for step in rows.values():
    for p in range(START - 3, START): step(p)  # warm: the Variable kernels compile here, TinyJit captures
  start = START
  for name, step in rows.items():
    ms = median_ms(step, range(start, start + STEPS))
    print(f"{name:36s} {ms:8.3f} ms per step")
    start += STEPS  # fresh positions for every row: an int position never repeats

if __name__ == "__main__": main()
