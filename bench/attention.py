"""Causal attention forward + backward (realized together, as a training step does, under TinyJit), attograd against
torch eager in the same run: kernels per step and the time of a step, for the small and the large transformer of
bench/transformer.py.

  python bench/attention.py            both shapes (B, heads, T, head dim): small (16, 4, 64, 16), large (16, 6, 256, 64)
  SHAPES=small python bench/attention.py
  STEPS=n   timed steps (median; the range printed); THREADS=1 for one core (then the times are the CPU time of this
            thread, time.thread_time, which a loaded machine disturbs less than the wall clock)
  FORWARD=1 also the forward alone (inference: nothing reads the probabilities) as today's three kernels and as the one
            fused kernel (schedule/flash.py, which the cost rule FLASH_MIN_KEYS picks only for rows of 2048 keys and up),
            both in this run; SHAPES may name (B, heads, T, head dim) directly, e.g. SHAPES=1x2x2048x64
  BACKWARD=1 forward + backward with the flash kernels (the backward recomputing the probabilities) and without, both
            in this run, next to torch (instead of the default comparison)
"""
from __future__ import annotations
import os, statistics, time
import numpy as np

SHAPES = {"small": (16, 4, 64, 16), "large": (16, 6, 256, 64)}

def clock() -> float: return time.thread_time() if os.getenv("THREADS") == "1" else time.perf_counter()

def attograd_step(shape: tuple[int, ...], hand: bool = False, flash_on: bool | None = None):
  """One step under TinyJit (the kernels replayed, as a training step runs), inputs fixed; flash_on forces the flash
  forward and backward (schedule/flash.py) on or off for its schedule (None: the cost rules' choice)."""
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
  if flash_on is not None:
    from attograd.schedule import flash, schedule
    from attograd.helpers import CACHELEVEL
    saved, level = (flash.FLASH_MIN_KEYS, flash.FLASH_BWD_MIN_KEYS, flash.FLASH_BWD_MIN_BYTES), CACHELEVEL.value
    flash.FLASH_MIN_KEYS = flash.FLASH_BWD_MIN_KEYS = flash.FLASH_BWD_MIN_BYTES = 0 if flash_on else 1 << 62
    CACHELEVEL.value = min(level, 1)
    schedule._schedule_cache.clear()
    try:
      for _ in range(3): step(q, k, v, g)  # compile, capture, warm up: the schedule is fixed from here
    finally: (flash.FLASH_MIN_KEYS, flash.FLASH_BWD_MIN_KEYS, flash.FLASH_BWD_MIN_BYTES), CACHELEVEL.value = saved, level; schedule._schedule_cache.clear()
  return lambda: step(q, k, v, g)

def backward_both(name: str, shape: tuple[int, ...], n: int) -> None:
  """Forward + backward with the flash kernels (one pass over the keys forward, the gradients recomputing the
  probabilities) and without (T x S buffers of scores, probabilities and dS), torch's in the same run."""
  from attograd.helpers import GlobalCounters
  plain, fl, theirs = attograd_step(shape, flash_on=False), attograd_step(shape, flash_on=True), torch_step(shape)
  theirs()
  counts = []
  for s in (plain, fl):
    GlobalCounters.reset(); s(); counts.append(GlobalCounters.kernel_count)
  rp, rf, rt = [], [], []
  for _ in range(0, n, 2): rp += times(plain, 2); rf += times(fl, 2); rt += times(theirs, 2)
  med = statistics.median
  print(f"attention {name} {shape}, causal, forward + backward, flash against the T x S buffers:")
  print(f"  torch                     {med(rt) * 1e3:9.2f} ms  ({min(rt) * 1e3:.2f}-{max(rt) * 1e3:.2f})")
  print(f"  attograd, {counts[0]} kernels      {med(rp) * 1e3:9.2f} ms  ({min(rp) * 1e3:.2f}-{max(rp) * 1e3:.2f})  {med(rt) / med(rp):.2f}x torch's speed")
  print(f"  attograd flash, {counts[1]} kernels {med(rf) * 1e3:9.2f} ms  ({min(rf) * 1e3:.2f}-{max(rf) * 1e3:.2f})  {med(rt) / med(rf):.2f}x torch's speed, "
        f"{med(rp) / med(rf):.2f}x the unfused")

def attograd_forward(shape: tuple[int, ...], fused: bool):
  """The causal forward alone under TinyJit, with the fused kernel forced on or off (its schedule is made here)."""
  from attograd import Tensor, TinyJit
  from attograd.schedule import flash, schedule
  from attograd.helpers import CACHELEVEL
  rng = np.random.default_rng(0)
  q, k, v = (Tensor(rng.standard_normal(shape).astype(np.float32)).realize() for _ in range(3))
  @TinyJit
  def fwd(q: Tensor, k: Tensor, v: Tensor) -> Tensor: return q.scaled_dot_product_attention(k, v, is_causal=True).realize()
  # (no schedule from memory or disk: those were made under the rule)
  saved, flash.FLASH_MIN_KEYS, level, CACHELEVEL.value = flash.FLASH_MIN_KEYS, (0 if fused else 1 << 30), CACHELEVEL.value, min(CACHELEVEL.value, 1)
  schedule._schedule_cache.clear()
  try:
    for _ in range(3): fwd(q, k, v)  # compile, capture, warm up: the schedule is fixed from here
  finally: flash.FLASH_MIN_KEYS, CACHELEVEL.value = saved, level; schedule._schedule_cache.clear()
  return lambda: fwd(q, k, v)

def torch_forward(shape: tuple[int, ...]):
  import torch
  if os.getenv("THREADS"): torch.set_num_threads(int(os.environ["THREADS"]))
  rng = np.random.default_rng(0)
  q, k, v = (torch.tensor(rng.standard_normal(shape).astype(np.float32)) for _ in range(3))
  def fwd():
    with torch.no_grad(): torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
  return fwd

def forward_only(name: str, shape: tuple[int, ...], n: int) -> None:
  from attograd.helpers import GlobalCounters
  three, fused, theirs = attograd_forward(shape, False), attograd_forward(shape, True), torch_forward(shape)
  theirs()
  counts = []
  for s in (three, fused):
    GlobalCounters.reset(); s(); counts.append(GlobalCounters.kernel_count)
  r3, rf, rt = [], [], []
  for _ in range(0, n, 2): r3 += times(three, 2); rf += times(fused, 2); rt += times(theirs, 2)
  med = statistics.median
  print(f"attention {name} {shape}, causal, forward only:")
  print(f"  torch                    {med(rt) * 1e3:8.2f} ms")
  print(f"  attograd {counts[0]} kernels        {med(r3) * 1e3:8.2f} ms  {med(rt) / med(r3):.2f}x torch's speed")
  print(f"  attograd fused, {counts[1]} kernel  {med(rf) * 1e3:8.2f} ms  {med(rt) / med(rf):.2f}x torch's speed, "
        f"{med(r3) / med(rf):.2f}x the {counts[0]} kernels'")

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
    shape = SHAPES[name] if name in SHAPES else tuple(int(x) for x in name.split("x"))
    if os.getenv("FORWARD") == "1": forward_only(name, shape, n)
    if os.getenv("BACKWARD") == "1": backward_both(name, shape, n); continue
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
