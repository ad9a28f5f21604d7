"""The memory planner: buffers that are never needed at the same time share one allocation.
Used for the buffers a schedule creates and drops (a reduce read by two kernels, the layers of an MLP
in between) and for everything internal to a captured TinyJit graph."""
from __future__ import annotations
import bisect
from typing import Container, Hashable, Sequence, TypeVar
from attograd.dtype import dtypes
from attograd.helpers import DEBUG
from attograd.runtime.device import Buffer

K = TypeVar("K", bound=Hashable)

def plan_slots(steps: Sequence[Sequence[K]], internal: dict[K, tuple[str, int]], kept: Container[K] = ()) -> tuple[dict[K, int], list[tuple[str, int]]]:
  """Give each internal buffer (key -> device, nbytes) a slot so that buffers used by overlapping
  ranges of steps never share one. A buffer lives from the first step that names it to the last (a kernel never writes
  over its own inputs: one ending at a step and one starting there overlap). A kept buffer outlives the steps, and
  shares only a slot of its own size (a bigger one would stay held, all of it, for as long as the buffer lives).
  Biggest first, each into the first slot of its device whose buffers' lifetimes miss its own, else a new slot of its
  size: every slot is as big as its first buffer. (Placed in step order instead, a slot grown for one big buffer was
  taken later by small ones while the next big one grew another: a 128-token LLM prompt pass's dequantized weights,
  3.4 MiB each and used one at a time, held two slots of 3.4 MiB, 11.5 MiB of scratch in all where 5.8 do.)"""
  first: dict[K, int] = {}
  last: dict[K, int] = {}
  for i, step in enumerate(steps):
    for k in step:
      if k in internal:
        first.setdefault(k, i)
        last[k] = i
  end = len(steps)  # a kept buffer's lifetime runs past the last step
  slots: list[tuple[str, int]] = []
  lives: list[list[tuple[int, int]]] = []  # each slot's buffers' (first, last) steps, sorted
  slot_of: dict[K, int] = {}
  for k in sorted(first, key=lambda k: (-internal[k][1], first[k])):
    device, nbytes = internal[k]
    a, b = first[k], end if k in kept else last[k]
    for s, (d, size) in enumerate(slots):
      if d != device or (k in kept and size != nbytes): continue
      at = bisect.bisect_left(lives[s], (a, a))
      # the lifetimes in a slot never overlap: only the neighbours on each side can reach this one
      if (at == 0 or lives[s][at - 1][1] < a) and (at == len(lives[s]) or b < lives[s][at][0]): break
    else:
      s = len(slots)
      slots.append((device, nbytes)); lives.append([])
      at = 0
    lives[s].insert(at, (a, b))
    slot_of[k] = s
  return slot_of, slots

def planned_buffers(steps: Sequence[Sequence[K]], internal: dict[K, Buffer], kept: Container[K] = ()) -> dict[K, Buffer]:
  """A Buffer for each internal key, living in shared memory where lifetimes allow."""
  slot_of, slots = plan_slots(steps, {k: (b.device, b.nbytes) for k, b in internal.items()}, kept)
  memory = [Buffer(device, nbytes, dtypes.uint8) for device, nbytes in slots]
  if DEBUG >= 2 and internal:
    before, after = sum(b.nbytes for b in internal.values()), sum(nbytes for _, nbytes in slots)
    print(f"memory plan: {len(internal)} buffers in {len(slots)} allocations, {after / 1e6:.2f} MB instead of {before / 1e6:.2f} MB")
  return {k: Buffer(b.device, b.size, b.dtype, base=memory[slot_of[k]]) for k, b in internal.items()}
