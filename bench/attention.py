"""Causal attention forward + backward (realized together, as a training step does, under TinyJit), attograd against
torch eager in the same run: kernels per step and the time of a step, for the small and the large transformer of
bench/transformer.py.

  python bench/attention.py            both shapes (B, heads, T, head dim): small (16, 4, 64, 16), large (16, 6, 256, 64)
  SHAPES=small python bench/attention.py
  STEPS=n   timed steps (median; the range printed); THREADS=1 for one core (then the times are the CPU time of this
            thread, time.thread_time, which a loaded machine disturbs less than the wall clock)
"""
from __future__ import annotations
import os, statistics, time
import numpy as np

SHAPES = {"small": (16, 4, 64, 16), "large": (16, 6, 256, 64)}

def clock() -> float: return time.thread_time() if os.getenv("THREADS") == "1" else time.perf_counter()

def attograd_step(shape: tuple[int, ...], hand: bool = False):
  """One step under TinyJit (the kernels replayed, as a training step runs), inputs fixed."""
  import math
  from attograd import Tensor, TinyJit
  rng = np.random.default_rng(0)
  q, k, v, g = (Tensor(rng.standard_normal(shape).astype(np.float32)).realize() for _ in range(4))
  T, D = shape[-2], shape[-1]
  @TinyJit
  def step(q: Tensor, k: Tensor, v: Tensor, g: Tensor) -> list[Tensor]:
    if hand:  # the pattern written out: softmax(q @ k^T / sqrt(d) + causal mask) @ v
      mask = Tensor.arange(T).unsqueeze(1) >= Tensor.arange(T).unsqueeze(0)
      o = mask.where(q @ k.transpose(-2, -1) / math.sqrt(D), -math.inf).softmax(-1) @ v
    else: o = q.scaled_dot_product_attention(k, v, is_causal=True)
    out = [o, *(o * g).sum().gradient(q, k, v)]
    Tensor.realize_all(out)
    return out
  return lambda: step(q, k, v, g)

def torch_step(shape: tuple[int, ...]):
  import torch
  if os.getenv("THREADS"): torch.set_num_threads(int(os.environ["THREADS"]))
  rng = np.random.default_rng(0)
  q, k, v = (torch.tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=True) for _ in range(3))
  g = torch.tensor(rng.standard_normal(shape).astype(np.float32))
  def step():
    for t in (q, k, v): t.grad = None
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    (o * g).sum().backward()
  return step

def times(step, n: int) -> list[float]:
  out = []
  for _ in range(n):
    st = clock(); step(); out.append(clock() - st)
  return out

def main() -> None:
  from attograd.helpers import GlobalCounters
  n = int(os.getenv("STEPS", 10))
  for name in os.getenv("SHAPES", "small,large").split(","):
    shape = SHAPES[name]
    ours, hand, theirs = attograd_step(shape), attograd_step(shape, hand=True), torch_step(shape)
    for s in (ours, hand, theirs): s(); s(); s()  # compile, capture, warm up
    GlobalCounters.reset(); ours(); kernels = GlobalCounters.kernel_count
    GlobalCounters.reset(); hand(); kernels_hand = GlobalCounters.kernel_count
    r_ours, r_hand, r_torch = [], [], []
    for _ in range(0, n, 2):  # interleaved, so the machine's noise hits all alike
      r_ours += times(ours, 2); r_hand += times(hand, 2); r_torch += times(theirs, 2)
    med = statistics.median
    print(f"attention {name} (B, heads, T, head dim) {shape}, causal, forward + backward:")
    print(f"  torch                    {med(r_torch) * 1e3:8.2f} ms  ({min(r_torch) * 1e3:.2f}-{max(r_torch) * 1e3:.2f})")
    print(f"  attograd sdpa            {med(r_ours) * 1e3:8.2f} ms  ({min(r_ours) * 1e3:.2f}-{max(r_ours) * 1e3:.2f})  "
          f"{med(r_torch) / med(r_ours):.2f}x torch's speed, {kernels} kernels")
    print(f"  attograd hand-written    {med(r_hand) * 1e3:8.2f} ms  ({min(r_hand) * 1e3:.2f}-{max(r_hand) * 1e3:.2f})  "
          f"{med(r_torch) / med(r_hand):.2f}x torch's speed, {kernels_hand} kernels")

if __name__ == "__main__": main()
