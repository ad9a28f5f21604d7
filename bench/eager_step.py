"""Where a training step without TinyJit spends the main thread's CPU: bench/transformer.py's small model, AdamW and
clipping by global norm, each phase timed with time.thread_time (CPU of this thread: the machine's other load barely
moves it, unlike wall time), medians over the steps. Then the same step against torch eager with one thread each, where
a thread's CPU time is the whole cost of a step (its kernels not deferred to the runner thread): the ratio says how far
from torch's speed the step is on an idle core.

  python bench/eager_step.py          STEPS=n (default 15) timed steps
"""
from __future__ import annotations
import collections, gc, os, statistics, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

WAITS = "host waiting for the deferred kernels (wall)"
OTHERS = "CPU of the other threads (runner, pool workers)"

def phases(steps: int) -> None:
  import transformer as T
  from attograd import Tensor
  from attograd.nn import optim
  from attograd.nn.state import get_parameters
  import attograd.engine.realize as R
  samples: dict[str, list[float]] = collections.defaultdict(list)
  acc: dict[str, float] = collections.defaultdict(float)
  def wrap(obj, name: str, label: str) -> None:
    f = getattr(obj, name)
    def timed(*a, **k):
      st = time.thread_time()
      try: return f(*a, **k)
      finally: acc[label] += time.thread_time() - st
    setattr(obj, name, timed)
  wrap(R, "runnable", "  realize: runnable (bind, read realized nodes)")
  # (a graph runnable leaves as it is is walked once, for that and its structure: the structure's walk counts here)
  wrap(R, "runnable_structure", "  realize: runnable (bind, read realized nodes)")
  # (a loop's graph its compiled structure recognises is not walked: the matcher's time counts here)
  wrap(R, "_matched", "  realize: runnable (bind, read realized nodes)")
  wrap(R, "schedule_template", "  realize: create_schedule (structure, template)")
  wrap(R, "fill_in", "  realize: create_schedule (structure, template)")
  wrap(R, "run_schedule", "  realize: run_schedule (plan, kernels)")
  # (a template whose planned run is kept runs without a schedule filled in: run_fresh, not run_schedule)
  wrap(R.PlannedRun, "run_fresh", "  realize: run_schedule (plan, kernels)")
  wrap(R.ExecPlan, "__call__", "    of which running the kernels")
  # a loop's kept plan runs on the pool's runner thread (runtime/threadpool.py Deferred): ExecPlan.__call__ only hands it
  # over, and the host waits for its kernels where it reads their results (.item()) or runs the next step
  from attograd.runtime import threadpool
  wait = threadpool._wait
  def timed_wait(*a) -> None:  # (wall time: a wait sleeps)
    st = time.perf_counter()
    try: wait(*a)
    finally: acc[WAITS] += time.perf_counter() - st
  threadpool._wait = timed_wait
  cfg = T.CONFIGS["small"]
  Tensor.manual_seed(0)
  model = T.attograd_model(cfg)
  params = get_parameters(model)
  opt = optim.AdamW(params, lr=3e-4, weight_decay=0.1)
  def ph(label: str, f):
    st = time.thread_time(); r = f(); acc[label] += time.thread_time() - st; return r
  def clip() -> None:
    norm = Tensor.stack(*[p.grad.square().sum() for p in params]).sum().sqrt()
    scale = (1.0 / (norm + 1e-6)).minimum(1.0)
    for p in params: p.grad = p.grad * scale
  def step(x: Tensor, y: Tensor) -> Tensor:
    with Tensor.train():
      ph("zero_grad", opt.zero_grad)
      loss = ph("forward", lambda: model(x).reshape(-1, cfg["vocab"]).cross_entropy(y.reshape(-1)))
      ph("backward", loss.backward)
      ph("clip by global norm", clip)
      ph("opt.step (build the update, realize all)", opt.step)
      return loss.realize()
  data = T.batches(cfg, 3 + steps, seed=3)
  for x, y in data[:3]: step(Tensor(x), Tensor(y)).item()
  # the cycle collector's passes during the timed steps, by generation (its cost grows with the objects each node
  # allocates and, for full passes, with everything alive): count and CPU time
  gcs: dict[int, list[float]] = collections.defaultdict(list)
  gc_start = [0.0]
  def on_gc(phase: str, info: dict) -> None:
    if phase == "start": gc_start[0] = time.thread_time()
    else: gcs[info["generation"]].append(time.thread_time() - gc_start[0])
  gc.callbacks.append(on_gc)
  totals = []
  for x, y in [(Tensor(x), Tensor(y)) for x, y in data[3:]]:
    before, st, proc = dict(acc), time.thread_time(), time.process_time()
    step(x, y).item()
    totals.append(time.thread_time() - st)
    acc[OTHERS] += time.process_time() - proc - totals[-1]
    for k in acc: samples[k].append(acc[k] - before.get(k, 0.0))
  print("main-thread CPU per no-JIT step (medians):")
  order = ["zero_grad", "forward", "backward", "clip by global norm", "opt.step (build the update, realize all)",
           "  realize: runnable (bind, read realized nodes)", "  realize: create_schedule (structure, template)",
           "  realize: run_schedule (plan, kernels)", "    of which running the kernels", WAITS, OTHERS]
  for k in order:
    print(f"  {k:48s} {statistics.median(samples[k]) * 1e3:7.2f} ms")
  print(f"  {'whole step (this thread)':48s} {statistics.median(totals) * 1e3:7.2f} ms (min {min(totals) * 1e3:.2f})")
  gc.callbacks.remove(on_gc)
  print("  cycle collector per step: " + ", ".join(f"gen{g} {len(gcs[g]) / steps:.2f} passes {sum(gcs[g]) / steps * 1e3:.2f} ms"
                                                  for g in range(3)))

def one_thread(steps: int) -> None:
  """torch eager and attograd without JIT, one thread each, interleaved: CPU time per step."""
  import torch
  torch.set_num_threads(1)
  import transformer as T
  from attograd import Tensor
  from attograd.codegen.opt import THREADS
  THREADS.value = 1
  import attograd.engine.realize as R
  R.DEFER = 0  # (the kernels on this thread: its CPU time is the step's whole cost)
  cfg = T.CONFIGS["small"]
  ours, theirs = T.attograd_step(cfg, jit=False), T.torch_step(cfg)
  def run(step, batch, conv) -> list[float]:
    out = []
    for x, y in batch:
      x, y = conv(x), conv(y)
      st = time.thread_time(); step(x, y).item(); out.append(time.thread_time() - st)
    return out
  run(ours, T.batches(cfg, 3, seed=2), Tensor); run(theirs, T.batches(cfg, 3, seed=2), torch.tensor)
  data, o, t = T.batches(cfg, steps, seed=4), [], []
  for i in range(0, steps, 4): o += run(ours, data[i:i + 4], Tensor); t += run(theirs, data[i:i + 4], torch.tensor)
  print(f"one thread each, CPU per step: torch eager {statistics.median(t) * 1e3:.1f} ms, attograd no JIT {statistics.median(o) * 1e3:.1f} ms: "
        f"{statistics.median(t) / statistics.median(o):.2f}x torch's speed (best steps {min(t) / min(o):.2f}x)")

if __name__ == "__main__":
  n = int(os.getenv("STEPS", 15))
  phases(n)
  one_thread(n)
