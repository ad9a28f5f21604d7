"""VIZ's cost on rewriting: bench/rewrite.py's cleanup pass over a transformer block's kernels, timed with the recorder
off and on, alternating in one process (the same graphs, caches on the nodes dropped before each run), best of N.
VIZ off runs the engine's own loop (patterns.tracker is None); on, the recording copy of it (uop/trace.py).

  python bench/viz.py [rounds]"""
import sys, time
from attograd import dtypes
from attograd.uop import trace
from attograd.uop.patterns import graph_rewrite
import attograd.schedule.schedule as sched
sys.path.insert(0, __file__.rsplit("/", 1)[0])
from rewrite import kernels_to_simplify

def main(rounds: int = 7) -> None:
  ks = kernels_to_simplify()
  raws = [sched._pushdown(value, shape, out_buf, dtypes.int32, cleanup=False)[0] for value, shape, out_buf in ks]
  def run() -> float:
    for raw in raws:
      for u in raw.toposort: u.__dict__.pop("_range", None); u.__dict__.pop("_fixed", None)
    st = time.perf_counter()
    outs = [graph_rewrite(raw, sched.kernel_cleanup, name="kernel_cleanup") for raw in raws]
    dt = time.perf_counter() - st
    for o in outs:
      for u in o.toposort: u.__dict__.pop("_range", None); u.__dict__.pop("_fixed", None)
    return dt
  off, on, steps = [], [], 0
  for _ in range(rounds):
    off.append(run())
    with trace.recording() as tr: on.append(run())
    steps = sum(len(p.steps) for p in tr.passes)
  print(f"cleanup of {len(raws)} kernels ({sum(len(r.toposort) for r in raws)} nodes, {steps} steps recorded), best of {rounds}:")
  print(f"VIZ off {min(off) * 1e3:.2f} ms, VIZ on {min(on) * 1e3:.2f} ms: {min(on) / min(off):.2f}x")

if __name__ == "__main__": main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
