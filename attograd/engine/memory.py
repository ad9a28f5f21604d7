"""The memory planner: buffers that are never needed at the same time share one allocation.
Used for the buffers a schedule creates and drops (a reduce read by two kernels, the layers of an MLP
in between) and for everything internal to a captured TinyJit graph."""
from __future__ import annotations
from typing import Container, Hashable, Sequence, TypeVar
from attograd.dtype import dtypes
from attograd.helpers import DEBUG
from attograd.runtime.device import Buffer

K = TypeVar("K", bound=Hashable)

def plan_slots(steps: Sequence[Sequence[K]], internal: dict[K, tuple[str, int]], kept: Container[K] = ()) -> tuple[dict[K, int], list[tuple[str, int]]]:
  """Give each internal buffer (key -> device, nbytes) a slot so that buffers used by overlapping
  ranges of steps never share one. A buffer lives from the first step that names it to the last; it is
  freed after that step's new buffers are placed, so a kernel never writes over its own inputs.
  A kept buffer outlives the steps: its slot is never freed, and it takes no free slot bigger than
  itself (it would hold the rest of it for as long as it lives)."""
  first: dict[K, int] = {}
  last: dict[K, int] = {}
  for i, step in enumerate(steps):
    for k in step:
      if k in internal:
        first.setdefault(k, i)
        last[k] = i
  slots: list[tuple[str, int]] = []
  free: list[int] = []
  slot_of: dict[K, int] = {}
  starting: dict[int, list[K]] = {}
  ending: dict[int, list[K]] = {}
  for k in first:
    starting.setdefault(first[k], []).append(k)
    if k not in kept: ending.setdefault(last[k], []).append(k)
  for i in range(len(steps)):
    for k in starting.get(i, []):
      device, nbytes = internal[k]
      fits = [s for s in free if slots[s][0] == device and (k not in kept or slots[s][1] <= nbytes)]
      if fits:
        # the smallest free slot that fits; else grow the biggest one (memory grows once, then is reused)
        s = min((s for s in fits if slots[s][1] >= nbytes), key=lambda s: slots[s][1], default=max(fits, key=lambda s: slots[s][1]))
        free.remove(s)
        slots[s] = (device, max(slots[s][1], nbytes))
      else:
        s = len(slots)
        slots.append((device, nbytes))
      slot_of[k] = s
    free.extend(slot_of[k] for k in ending.get(i, []))
  return slot_of, slots

def planned_buffers(steps: Sequence[Sequence[K]], internal: dict[K, Buffer], kept: Container[K] = ()) -> dict[K, Buffer]:
  """A Buffer for each internal key, living in shared memory where lifetimes allow."""
  slot_of, slots = plan_slots(steps, {k: (b.device, b.nbytes) for k, b in internal.items()}, kept)
  memory = [Buffer(device, nbytes, dtypes.uint8) for device, nbytes in slots]
  if DEBUG >= 2 and internal:
    before, after = sum(b.nbytes for b in internal.values()), sum(nbytes for _, nbytes in slots)
    print(f"memory plan: {len(internal)} buffers in {len(slots)} allocations, {after / 1e6:.2f} MB instead of {before / 1e6:.2f} MB")
  return {k: Buffer(b.device, b.size, b.dtype, base=memory[slot_of[k]]) for k, b in internal.items()}
