"""Devices side by side (issue 20): a plan's items on several devices run in lanes, one a device, each lane in program
order on a thread of its own, so CPU:0 and CPU:1 each compute on their own share of the cores at the same time. The
native kernels, copies and the all-reduce are ctypes calls or memoryview copies: each lets go of the GIL while it runs.

Ordering is per device, as a GPU stream's: every item touches the devices of its buffers (a kernel one, a COPY two, an
ALLREDUCE all of its parts'), and the items that touch one device run in program order. Any two items that share memory
share its device, so no read or write moves past another of the same buffer; it holds whatever memory a replay rebinds.
An item touching several devices runs in one lane and waits for the last earlier item of each other device it touches
(which waits, in turn, for what came before it there); the next item of those devices waits for it."""
from __future__ import annotations
import queue, threading, time
from typing import Any, Callable, Sequence
from attograd.helpers import ContextVar
from attograd.codegen.opt import THREADS

LANES = ContextVar("LANES", 1)  # LANES=0: a plan's items run one after another on the calling thread, as before

class _LaneLocal(threading.local):
  cores = 0  # the cores a kernel of this thread's lane may use (0: THREADS, no lanes running)
lane_local = _LaneLocal()

def lane_cores() -> int:
  """How many cores a threaded kernel launched now may use: its lane's share, or THREADS outside lanes."""
  return lane_local.cores or THREADS.value

class _Worker:
  """A thread that runs whatever lane it is handed, and is kept for the next plan (a training step runs one every call)."""
  def __init__(self, i: int):
    self.jobs: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=self.loop, name=f"lane{i}", daemon=True).start()
  def loop(self) -> None:
    while True: self.jobs.get()()
_workers: list[_Worker] = []

class Lanes:
  """The items of one plan (each with the devices it touches) split in lanes, with what each item waits for."""
  def __init__(self, devices_of: Sequence[tuple[str, ...]]):
    lane_of_device: dict[str, int] = {}
    for devs in devices_of: lane_of_device.setdefault(devs[0], len(lane_of_device))
    self.lane = [lane_of_device[devs[0]] for devs in devices_of]
    self.lanes: list[list[int]] = [[] for _ in lane_of_device]
    for i, ln in enumerate(self.lane): self.lanes[ln].append(i)
    last: dict[str, int] = {}  # the last item so far that touched each device
    self.waits: list[tuple[int, ...]] = []
    waited: set[int] = set()
    for i, devs in enumerate(devices_of):
      w = tuple(sorted({p for d in devs if (p := last.get(d)) is not None and self.lane[p] != self.lane[i]}))
      self.waits.append(w)
      waited.update(w)
      for d in devs: last[d] = i
    self.signals = sorted(waited)  # the items some other lane waits for: each gets an event
    self.cpu_s = [0.0] * len(self.lanes)  # each lane's thread CPU time in its last run (bench/shard.py shows the split)
  def __len__(self) -> int: return len(self.lanes)

  def run(self, call: Callable[[int], Any]) -> None:
    """call(i) for every item, each lane on its own thread (the first on the caller's), waits respected. The first error
    stops every lane (the items after it don't run) and is raised here."""
    events = {i: threading.Event() for i in self.signals}
    failed: list[BaseException] = []
    cores = max(1, THREADS.value // len(self.lanes))  # each device its share of the cores
    def run_lane(ln: int, done: threading.Event | None) -> None:
      items = self.lanes[ln]
      lane_local.cores, t0 = cores, time.thread_time()
      try:
        for i in items:
          for w in self.waits[i]: events[w].wait()
          if not failed:
            try: call(i)
            except BaseException as e: failed.append(e)
          if (ev := events.get(i)) is not None: ev.set()  # set even after a failure: no lane waits forever
      finally:
        lane_local.cores, self.cpu_s[ln] = 0, time.thread_time() - t0
        if done is not None: done.set()
    while len(_workers) < len(self.lanes) - 1: _workers.append(_Worker(len(_workers)))
    dones = [threading.Event() for _ in self.lanes[1:]]
    for ln, (w, done) in enumerate(zip(_workers, dones), 1): w.jobs.put(lambda ln=ln, done=done: run_lane(ln, done))
    run_lane(0, None)
    for d in dones: d.wait()
    if failed: raise failed[0]
